// SPDX-License-Identifier: Apache-2.0
// Injected I/O errors: EIO and ENOSPC on the Nth write, and EIO on the Nth
// fsync, once and persistently. In every case the writer reports the error
// with the path, refuses everything after it (a failed fsync is fatal: the
// kernel may have dropped the dirty pages), never acknowledges more, and
// every state a crash could leave at that point still opens with every
// token acknowledged before the failure.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>

#include "kvfile/presets.h"
#include "kvfile/reader.h"
#include "kvfile/writer.h"
#include "support/fault_fs.h"

namespace kvfile {
namespace {

using testing::CrashState;
using testing::FaultFs;
using testing::FsOp;

const char* kPath = "/db/f.kv";

struct Outcome {
  uint64_t acked = 0;       // durable_tokens() after the last successful call
  bool failed = false;      // some call failed
  std::string first_error;
};

// Appends 40 tokens of tiny rows in varied pieces with syncs in between,
// stopping at the first failure; then checks that later calls fail too.
Outcome RunWorkload(FaultFs& fs, SyncMode mode) {
  Geometry g;
  EXPECT_TRUE(GetPreset("tiny", Dtype::kE4M3, &g).ok());
  WriterOptions opt;
  opt.fs = &fs;
  opt.sync = mode;
  opt.chunk_tokens = 4;
  std::unique_ptr<Writer> w;
  Outcome out;
  Status st = Writer::Create(kPath, g, {"m", 1}, opt, &w);
  if (!st.ok()) {
    out.failed = true;
    out.first_error = st.message();
    return out;
  }
  std::vector<float> rows(40 * 2 * 16, 0.5f);
  std::vector<uint32_t> ids(40);
  for (uint32_t i = 0; i < 40; ++i) ids[i] = i + 7;
  uint32_t done = 0;
  int step = 0;
  while (done < 40) {
    uint32_t n = std::min<uint32_t>(40 - done, 1 + step % 6);
    AppendBatch b;
    b.tokens = std::span<const uint32_t>(ids).subspan(done, n);
    for (uint32_t i = 0; i < g.layers * g.streams.size(); ++i)
      b.blocks.push_back({Dtype::kF32, rows.data(), nullptr});
    st = w->Append(b);
    if (st.ok()) out.acked = w->durable_tokens();
    if (st.ok() && step % 3 == 2) st = w->Sync();
    if (!st.ok()) break;
    out.acked = w->durable_tokens();
    done += n;
    ++step;
  }
  if (st.ok()) st = w->Close();
  if (st.ok()) {
    out.acked = 40;
    return out;
  }
  out.failed = true;
  out.first_error = st.message();
  // Once failed, always failed, and nothing more is acknowledged.
  AppendBatch b;
  b.tokens = std::span<const uint32_t>(ids).subspan(0, 1);
  for (uint32_t i = 0; i < g.layers * g.streams.size(); ++i) b.blocks.push_back({Dtype::kF32, rows.data(), nullptr});
  Status again = w->Append(b);
  EXPECT_FALSE(again.ok());
  EXPECT_EQ(again.code(), Status::Code::kFailed) << again.ToString();
  EXPECT_FALSE(w->Sync().ok());
  EXPECT_EQ(w->durable_tokens(), out.acked);
  return out;
}

// Every crash state of the log as it stands holds >= acked tokens.
void CheckSurvivors(const FaultFs& fs, uint64_t acked, bool file_must_exist) {
  size_t states = testing::EnumerateCrashStates(fs.log(), fs.log().size(), [&](const CrashState& s) {
    SCOPED_TRACE(s.description);
    if (!s.image.count(kPath)) {
      ASSERT_FALSE(file_must_exist);
      return;
    }
    FaultFs disk(s.image);
    ReaderOptions ro;
    ro.fs = &disk;
    std::unique_ptr<Reader> r;
    Status st = Reader::Open(kPath, ro, &r);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_GE(r->token_count(), acked);
    for (uint64_t t = 0; t < r->token_count(); ++t) ASSERT_EQ(r->tokens()[t], t + 7);
  });
  EXPECT_GT(states, 0u);
}

struct FaultCase {
  FsOp::Kind kind;
  int err;
  bool persistent;
  const char* name;
};

class FaultTest : public ::testing::TestWithParam<FaultCase> {};

TEST_P(FaultTest, EveryPositionInEveryMode) {
  const FaultCase& fc = GetParam();
  int failures_seen = 0;
  for (SyncMode mode : {SyncMode::kChunk, SyncMode::kClose, SyncMode::kNone}) {
    for (int nth = 0; nth < 40; ++nth) {
      SCOPED_TRACE(std::string(fc.name) + " at operation " + std::to_string(nth) + ", mode " +
                   std::to_string(static_cast<int>(mode)));
      FaultFs fs;
      fs.FailOn(fc.kind, nth, fc.err, fc.persistent);
      Outcome o = RunWorkload(fs, mode);
      if (!o.failed) continue;  // the workload made fewer operations of that kind
      ++failures_seen;
      EXPECT_NE(o.first_error.find(std::strerror(fc.err)), std::string::npos) << o.first_error;
      EXPECT_NE(o.first_error.find("/db/f.kv"), std::string::npos) << o.first_error;
      CheckSurvivors(fs, o.acked, /*file_must_exist=*/o.acked > 0);
    }
  }
  EXPECT_GT(failures_seen, 10) << "the fault was hardly ever hit";
}

INSTANTIATE_TEST_SUITE_P(
    Faults, FaultTest,
    ::testing::Values(FaultCase{FsOp::kWrite, EIO, false, "EIO on a write, once"},
                      FaultCase{FsOp::kWrite, EIO, true, "EIO on every write from then on"},
                      FaultCase{FsOp::kWrite, ENOSPC, true, "ENOSPC on a write"},
                      FaultCase{FsOp::kSync, EIO, false, "EIO on an fsync, once"},
                      FaultCase{FsOp::kSync, EIO, true, "EIO on every fsync from then on"},
                      FaultCase{FsOp::kSync, ENOSPC, false, "ENOSPC on an fsync"}),
    [](const ::testing::TestParamInfo<FaultCase>& p) { return std::to_string(p.index); });

}  // namespace
}  // namespace kvfile
