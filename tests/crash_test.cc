// SPDX-License-Identifier: Apache-2.0
// Simulated power loss: every workload runs against FaultFs, which records
// each write, sync, truncate, rename and directory sync the library makes.
// After every prefix of those operations, every crash state FaultFs can build
// (unsynced writes kept, dropped, zeroed, garbage, torn at 512-byte
// boundaries; directory changes lost) must open, hold every acknowledged
// token bit for bit, return nothing damaged, and form a prefix of what was
// appended (or of the rewound sequence). Recovery by a writable open must
// then keep exactly those tokens and accept new appends.
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "kvfile/codec.h"
#include "kvfile/presets.h"
#include "kvfile/reader.h"
#include "kvfile/writer.h"
#include "support/fault_fs.h"
#include "support/testing_hooks.h"

namespace kvfile {
namespace {

using testing::CrashState;
using testing::FaultFs;
using testing::FsOp;

const char* kPath = "/db/session.kv";

Geometry Tiny() {
  Geometry g;
  EXPECT_TRUE(GetPreset("tiny", Dtype::kE4M3, &g).ok());
  return g;
}

// The f32 rows of token `id` for (layer, stream): a pure function of them.
std::vector<float> RowsOf(const Geometry& g, uint32_t id, uint32_t layer, uint32_t stream) {
  const StreamSpec& s = g.streams[stream];
  std::vector<float> rows(s.ElementsPerToken());
  uint64_t x = (uint64_t{id} * 0x9E3779B97F4A7C15ull) ^ (layer * 131 + stream * 7 + 1);
  for (float& v : rows) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<float>(static_cast<int64_t>(x >> 40) - (1 << 23)) / 65536.0f;
  }
  return rows;
}

// Drives a Writer and records, after each call, how far the operation log
// had got, which token sequence was current and how much of it was
// acknowledged durable.
class Workload {
 public:
  explicit Workload(SyncMode mode, uint32_t chunk_tokens, Geometry g = Tiny()) : g_(std::move(g)) {
    options_.fs = &fs_;
    options_.sync = mode;
    options_.chunk_tokens = chunk_tokens;
    hooks::SetWriterSalt(0xABCDEF);
    versions_.push_back({{}, 0});
  }

  void Create() {
    ASSERT_TRUE(hooks::CreateWriter(kPath, g_, {"m", 1}, options_, &w_).ok());
    created_ops_ = fs_.log().size();
    Checkpoint();
  }
  void Reopen() {
    w_.reset();
    Status st = Writer::Open(kPath, options_, &w_);
    ASSERT_TRUE(st.ok()) << st.ToString();
    Checkpoint();
  }
  void Append(uint32_t n) { AppendInCalls({n}); }
  // One append made of several calls (AppendBatch::continued on all but
  // the last): only its end is an append end.
  void AppendInCalls(std::vector<uint32_t> parts) {
    for (size_t i = 0; i < parts.size(); ++i) {
      AppendCall(parts[i], i + 1 < parts.size());
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  void AppendCall(uint32_t n, bool continued) {
    std::vector<uint32_t> ids;
    for (uint32_t i = 0; i < n; ++i) ids.push_back(next_id_++);
    std::vector<std::vector<float>> data;
    AppendBatch b;
    b.tokens = ids;
    b.continued = continued;
    for (uint32_t l = 0; l < g_.layers; ++l)
      for (uint32_t s = 0; s < g_.streams.size(); ++s) {
        std::vector<float> block;
        for (uint32_t id : ids) {
          auto r = RowsOf(g_, id, l, s);
          block.insert(block.end(), r.begin(), r.end());
        }
        data.push_back(std::move(block));
      }
    for (auto& d : data) b.blocks.push_back({Dtype::kF32, d.data(), nullptr});
    ASSERT_TRUE(w_->Append(b).ok());
    auto& cur = versions_.back().tokens;
    cur.insert(cur.end(), ids.begin(), ids.end());
    if (!continued) versions_.back().ends.push_back(cur.size());
    Checkpoint();
  }
  void Sync() {
    ASSERT_TRUE(w_->Sync().ok());
    Checkpoint();
  }
  void Rewind(uint64_t n) {
    // The rewound sequence becomes a new version before the call: during
    // the call a crash may leave either.
    // While it runs, a crash state of the new version keeps at least what
    // was durable of its first n tokens; once it returns, what the writer
    // then reports durable (n when it rewound chunks on disk; the old count
    // when it only dropped staged tokens, which were never durable).
    Version next{std::vector<uint32_t>(versions_.back().tokens.begin(),
                                       versions_.back().tokens.begin() + static_cast<ptrdiff_t>(n)),
                 std::min<uint64_t>(n, w_->durable_tokens()), {}};
    // The append ends before n stay ends; n itself becomes one.
    for (uint64_t e : versions_.back().ends)
      if (e < n) next.ends.push_back(e);
    next.ends.push_back(n);
    versions_.push_back(std::move(next));
    ASSERT_TRUE(w_->Rewind(n).ok());
    versions_.back().rewound_to = w_->durable_tokens();
    Checkpoint();
  }
  void Close() {
    ASSERT_TRUE(w_->Close().ok());
    Checkpoint();
  }
  void Flush() {
    ASSERT_TRUE(w_->Flush().ok());
    Checkpoint();
  }
  // Close() with an append still open: it drops that append, as a rewind
  // to the last append end would, and says so.
  void CloseDroppingTheOpenAppend() {
    uint64_t end = versions_.back().ends.back();
    Version next{std::vector<uint32_t>(versions_.back().tokens.begin(),
                                       versions_.back().tokens.begin() + static_cast<ptrdiff_t>(end)),
                 std::min<uint64_t>(end, w_->durable_tokens()), versions_.back().ends};
    versions_.push_back(std::move(next));
    ASSERT_EQ(w_->Close().code(), Status::Code::kFailed);
    versions_.back().rewound_to = w_->durable_tokens();
    Checkpoint();
  }

  // Checks every crash state after every operation prefix; returns how many.
  size_t CheckAllCrashStates() {
    size_t states = 0;
    const auto& log = fs_.log();
    for (size_t k = 0; k <= log.size(); ++k) {
      states += testing::EnumerateCrashStates(log, k, [&](const CrashState& s) { CheckState(k, s); });
      if (::testing::Test::HasFailure()) break;
    }
    return states;
  }

 private:
  struct Version {
    std::vector<uint32_t> tokens;
    uint64_t rewound_to;  // tokens every crash state of this version keeps
    // Token counts at which an append of this version ended (0 included):
    // a crash state must hold exactly one of them (RECOVERY.md, atomic appends).
    std::vector<uint64_t> ends = {0};
  };
  struct Point {
    size_t ops;
    size_t version;
    uint64_t acked;
  };

  void Checkpoint() {
    points_.push_back({fs_.log().size(), versions_.size() - 1, w_ ? w_->durable_tokens() : 0});
  }

  void CheckState(size_t k, const CrashState& s) {
    SCOPED_TRACE("after " + std::to_string(k) + " operations: " + s.description);
    // The last call that had returned by then.
    const Point* last = nullptr;
    for (const Point& p : points_)
      if (p.ops <= k) last = &p;
    if (!s.image.count(kPath)) {
      ASSERT_TRUE(k < created_ops_) << "the file vanished after Create returned";
      return;
    }
    FaultFs disk(s.image);
    ReaderOptions ro;
    ro.fs = &disk;
    std::unique_ptr<Reader> r;
    Status st = Reader::Open(kPath, ro, &r);
    ASSERT_TRUE(st.ok()) << st.ToString();
    std::vector<uint32_t> got(r->tokens().begin(), r->tokens().end());
    // Which versions may it be? The one current at the last returned call,
    // or any started after it (a call in progress).
    size_t first_version = last ? last->version : 0;
    size_t last_version = first_version;
    for (const Point& p : points_)
      if (p.ops > k) {
        last_version = p.version;
        break;
      }
    if (last_version < first_version || (last && last == &points_.back())) last_version = versions_.size() - 1;
    bool matched = false;
    for (size_t v = first_version; v <= last_version && !matched; ++v) {
      const auto& want = versions_[v].tokens;
      uint64_t need = v == first_version && last ? last->acked : versions_[v].rewound_to;
      if (v == first_version && last && versions_[v].rewound_to > need) need = versions_[v].rewound_to;
      if (got.size() < need || got.size() > want.size()) continue;
      const auto& ends = versions_[v].ends;
      if (std::find(ends.begin(), ends.end(), got.size()) == ends.end()) continue;
      matched = std::equal(got.begin(), got.end(), want.begin());
    }
    ASSERT_TRUE(matched) << "file holds " << got.size() << " tokens, not a prefix of whole appends of an allowed "
                         << "sequence with " << (last ? last->acked : 0) << " acknowledged";
    CheckRows(*r, got);
    // Recovery: a writable open keeps exactly these tokens and appends after them.
    std::unique_ptr<Writer> w;
    WriterOptions wo;
    wo.fs = &disk;
    st = Writer::Open(kPath, wo, &w);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_EQ(w->token_count(), got.size());
    ASSERT_TRUE(w->Close().ok());
    r.reset();
    ASSERT_TRUE(Reader::Open(kPath, ro, &r).ok());
    ASSERT_EQ(r->token_count(), got.size());
    EXPECT_EQ(r->tail().torn_tail_bytes, 0u) << "recovery left a torn tail";
  }

  void CheckRows(Reader& r, const std::vector<uint32_t>& ids) {
    if (ids.empty()) return;
    for (uint32_t l = 0; l < g_.layers; ++l)
      for (uint32_t s = 0; s < g_.streams.size(); ++s) {
        const StreamSpec& spec = g_.streams[s];
        size_t rows = ids.size() * spec.rows_per_token;
        size_t elems = rows * spec.row_width;
        std::vector<float> in;
        for (uint32_t id : ids) {
          auto x = RowsOf(g_, id, l, s);
          in.insert(in.end(), x.begin(), x.end());
        }
        if (!IsFp8(spec.dtype)) {
          // Raw streams store the input converted to their dtype, exactly.
          size_t bytes = elems * ElementSize(spec.dtype);
          std::vector<uint8_t> got(bytes), want(bytes);
          Status st = r.ReadRows(l, s, 0, ids.size(), spec.dtype, got.data());
          ASSERT_TRUE(st.ok()) << st.ToString();
          codec::ConvertRaw(Dtype::kF32, in.data(), elems, spec.dtype, want.data());
          ASSERT_EQ(got, want) << "layer " << l << " stream " << s;
          continue;
        }
        std::vector<uint8_t> codes(elems), want_codes(elems);
        std::vector<float> scales(rows), want_scales(rows);
        Status st = r.ReadCodes(l, s, 0, ids.size(), codes.data(), scales.data());
        ASSERT_TRUE(st.ok()) << st.ToString();
        size_t bad;
        auto kind = spec.dtype == Dtype::kE5M2 ? Dtype::kE5M2 : Dtype::kE4M3;
        ASSERT_TRUE(codec::QuantizeRows(kind, Dtype::kF32, in.data(), rows, spec.row_width,
                                        want_codes.data(), want_scales.data(), &bad));
        ASSERT_EQ(codes, want_codes) << "layer " << l << " stream " << s;
        ASSERT_EQ(0, std::memcmp(scales.data(), want_scales.data(), rows * 4));
      }
  }

  Geometry g_;
  FaultFs fs_;
  WriterOptions options_;
  std::unique_ptr<Writer> w_;
  size_t created_ops_ = 0;
  uint32_t next_id_ = 1000;
  std::vector<Version> versions_;
  std::vector<Point> points_;
};

size_t g_total_states = 0;

class CrashTest : public ::testing::Test {
 protected:
  static void TearDownTestSuite() {
    std::printf("[ crash states checked in this suite: %zu ]\n", g_total_states);
  }
  void Check(Workload& w) {
    size_t n = w.CheckAllCrashStates();
    g_total_states += n;
    RecordProperty("crash_states", static_cast<int>(n));
    std::printf("[ %zu crash states ]\n", n);
  }
};

TEST_F(CrashTest, SyncModeChunkAppendsOfVariedSizes) {
  for (uint32_t chunk : {3u, 4u, 8u}) {
    Workload w(SyncMode::kChunk, chunk);
    w.Create();
    for (uint32_t n : {1u, 3u, 5u, 2u, 7u, 4u}) w.Append(n);
    w.Close();
    Check(w);
  }
}

TEST_F(CrashTest, SyncModeCloseWithChunksThatDoNotDivide) {
  for (uint32_t chunk : {5u, 7u}) {
    Workload w(SyncMode::kClose, chunk);
    w.Create();
    for (uint32_t n : {2u, 9u, 1u, 6u}) w.Append(n);
    w.Close();
    Check(w);
  }
}

TEST_F(CrashTest, SyncModeNoneWithExplicitSyncs) {
  Workload w(SyncMode::kNone, 4);
  w.Create();
  w.Append(6);
  w.Sync();
  w.Append(5);
  w.Append(3);
  w.Sync();
  w.Append(4);
  w.Close();
  Check(w);
}

TEST_F(CrashTest, RewindMidChunkAndAtBoundary) {
  for (auto [mode, chunk] : {std::pair{SyncMode::kChunk, 4u}, std::pair{SyncMode::kNone, 4u},
                              std::pair{SyncMode::kChunk, 3u}, std::pair{SyncMode::kClose, 5u}}) {
    Workload w(mode, chunk);
    w.Create();
    w.Append(14);
    w.Sync();
    w.Rewind(6);  // inside a chunk
    w.Append(5);
    w.Sync();
    w.Rewind(8);  // a chunk boundary when chunks hold 4
    w.Append(3);
    w.Rewind(2);
    w.Append(1);
    w.Close();
    Check(w);
  }
}

// Chunks of several 4096-byte blocks, streams of three dtypes (the torn
// write lands inside sections, scales and padding).
TEST_F(CrashTest, MixedDtypesAndMultiBlockChunks) {
  Geometry g;
  g.layers = 3;
  g.streams = {{"k", 2, 24, Dtype::kE4M3}, {"v", 2, 40, Dtype::kE5M2}, {"indexer", 1, 8, Dtype::kBF16}};
  for (auto [mode, chunk] : {std::pair{SyncMode::kChunk, 13u}, std::pair{SyncMode::kNone, 13u},
                              std::pair{SyncMode::kClose, 5u}, std::pair{SyncMode::kChunk, 29u}}) {
    Workload w(mode, chunk, g);
    w.Create();
    w.Append(5);
    w.Append(17);
    w.Sync();
    w.Append(9);
    w.Rewind(20);
    w.Append(11);
    w.Close();
    Check(w);
  }
}

TEST_F(CrashTest, ManySmallAppendsAcrossChunkSizes) {
  for (uint32_t chunk : {1u, 2u, 3u, 6u, 8u, 16u}) {
    for (SyncMode mode : {SyncMode::kChunk, SyncMode::kClose, SyncMode::kNone}) {
      Workload w(mode, chunk);
      w.Create();
      for (int i = 0; i < 12; ++i) w.Append(1 + (i * 5) % 4);
      if (mode != SyncMode::kChunk) w.Sync();
      w.Rewind(7);
      w.Append(3);
      w.Close();
      Check(w);
    }
  }
}

TEST_F(CrashTest, ReopenAndAppend) {
  for (auto [mode, chunk] : {std::pair{SyncMode::kClose, 4u}, std::pair{SyncMode::kChunk, 7u},
                              std::pair{SyncMode::kNone, 3u}}) {
    Workload w(mode, chunk);
    w.Create();
    w.Append(10);
    w.Close();
    w.Reopen();
    w.Append(6);
    w.Rewind(12);
    w.Append(2);
    w.Close();
    Check(w);
  }
}

// Appends that span several calls (AppendBatch::continued) and several
// chunks, in every sync mode: a crash never leaves a part of one, even
// where whole chunks of it reached the disk.
TEST_F(CrashTest, MultiCallAppendsAreAllOrNothingInEverySyncMode) {
  for (SyncMode mode : {SyncMode::kChunk, SyncMode::kClose, SyncMode::kNone}) {
    for (uint32_t chunk : {2u, 3u, 5u}) {
      Workload w(mode, chunk);
      w.Create();
      w.Append(2);
      w.AppendInCalls({3, 4, 2});
      if (mode == SyncMode::kNone) w.Sync();
      w.AppendInCalls({1, 6});
      w.Append(4);
      w.AppendInCalls({5, 1, 1});
      w.Close();
      Check(w);
    }
  }
}

// Sync() while an append is open commits only the appends that ended, and
// the open one goes on after it.
TEST_F(CrashTest, SyncInsideAnOpenAppendCommitsOnlyFinishedOnes) {
  for (SyncMode mode : {SyncMode::kChunk, SyncMode::kClose, SyncMode::kNone}) {
    Workload w(mode, 4);
    w.Create();
    w.Append(3);
    w.AppendCall(6, /*continued=*/true);
    w.Sync();
    w.AppendCall(3, /*continued=*/false);
    w.Sync();
    w.Append(2);
    w.Close();
    Check(w);
  }
}

// The open append meets a Flush, a rewind (to the end of the chunks on
// disk, inside it) and a Close that drops it.
TEST_F(CrashTest, OpenAppendsMeetFlushRewindAndClose) {
  for (SyncMode mode : {SyncMode::kChunk, SyncMode::kClose, SyncMode::kNone}) {
    Workload w(mode, 4);
    w.Create();
    w.Append(3);
    w.AppendCall(3, /*continued=*/true);
    w.Flush();
    w.AppendCall(6, /*continued=*/true);  // tokens 6..11: chunks up to token 12 on disk
    w.Rewind(8);                           // inside the open append, at a chunk boundary
    w.Append(2);
    if (mode == SyncMode::kNone) w.Sync();
    w.AppendCall(7, /*continued=*/true);
    w.CloseDroppingTheOpenAppend();
    Check(w);
  }
}

}  // namespace
}  // namespace kvfile
