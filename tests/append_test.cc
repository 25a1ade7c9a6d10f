// SPDX-License-Identifier: Apache-2.0
// Atomic appends (spec/RECOVERY.md, "Atomic appends"): an append is all or
// nothing across failed calls, Close() and crashes. The crash-state
// enumeration (crash_test.cc) checks the crash side exhaustively; these
// tests pin the error paths and the reader's and recovery's view of a file
// that holds part of an unfinished append.
#include <gtest/gtest.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>

#include "format/endian.h"
#include "format/kv_format.h"
#include "kvfile/presets.h"
#include "kvfile/reader.h"
#include "kvfile/verify.h"
#include "kvfile/writer.h"
#include "support/fault_fs.h"
#include "support/testing_hooks.h"

namespace kvfile {
namespace {

using testing::FaultFs;
using testing::FsOp;

const char* kPath = "/db/a.kv";

Geometry Tiny() {
  Geometry g;
  EXPECT_TRUE(GetPreset("tiny", Dtype::kE4M3, &g).ok());
  return g;
}

// n tokens with ids from `first`, rows a function of the id; with
// `nan_at` < n, that token's first value is NaN.
struct Batch {
  std::vector<uint32_t> ids;
  std::vector<std::vector<float>> rows;
  AppendBatch Make(bool continued = false) const {
    AppendBatch b;
    b.tokens = ids;
    b.continued = continued;
    for (const auto& r : rows) b.blocks.push_back({Dtype::kF32, r.data(), nullptr});
    return b;
  }
};

Batch Tokens(const Geometry& g, uint32_t first, uint32_t n, uint32_t nan_at = ~0u) {
  Batch b;
  for (uint32_t i = 0; i < n; ++i) b.ids.push_back(first + i);
  for (uint32_t l = 0; l < g.layers; ++l)
    for (const StreamSpec& s : g.streams) {
      std::vector<float> r(uint64_t{n} * s.ElementsPerToken());
      for (size_t i = 0; i < r.size(); ++i) r[i] = static_cast<float>((first * 31 + i * 7 + l) % 97) - 48.0f;
      if (nan_at < n) r[nan_at * s.ElementsPerToken()] = std::numeric_limits<float>::quiet_NaN();
      b.rows.push_back(std::move(r));
    }
  return b;
}

std::vector<uint32_t> Ids(uint32_t first, uint32_t n) {
  std::vector<uint32_t> v;
  for (uint32_t i = 0; i < n; ++i) v.push_back(first + i);
  return v;
}

std::vector<uint32_t> Concat(std::vector<uint32_t> a, const std::vector<uint32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<uint32_t> ReadTokens(FileSystem* fs, TailInfo* tail = nullptr) {
  ReaderOptions ro;
  ro.fs = fs;
  std::unique_ptr<Reader> r;
  Status st = Reader::Open(kPath, ro, &r);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (!st.ok()) return {};
  if (tail) *tail = r->tail();
  return {r->tokens().begin(), r->tokens().end()};
}

WriterOptions Options(FaultFs* fs, SyncMode mode, uint32_t chunk) {
  WriterOptions o;
  o.fs = fs;
  o.sync = mode;
  o.chunk_tokens = chunk;
  hooks::SetWriterSalt(77);
  return o;
}

// A later call of a multi-call append fails (a NaN): the whole append goes,
// also its chunks already on disk, and the writer goes on from before it.
TEST(AppendTest, AFailedCallDropsTheWholeAppendItBelongsTo) {
  for (SyncMode mode : {SyncMode::kNone, SyncMode::kChunk, SyncMode::kClose}) {
    FaultFs fs;
    const Geometry g = Tiny();
    std::unique_ptr<Writer> w;
    ASSERT_TRUE(hooks::CreateWriter(kPath, g, {"m", 1}, Options(&fs, mode, 4), &w).ok());
    ASSERT_TRUE(w->Append(Tokens(g, 100, 3).Make()).ok());
    ASSERT_TRUE(w->Append(Tokens(g, 200, 6).Make(/*continued=*/true)).ok());  // fills chunk 0, part of chunk 1
    ASSERT_EQ(w->token_count(), 9u);
    Status st = w->Append(Tokens(g, 300, 2, /*nan_at=*/1).Make());
    ASSERT_EQ(st.code(), Status::Code::kNonFinite) << st.ToString();
    EXPECT_NE(st.message().find("append dropped whole (6 tokens"), std::string::npos) << st.message();
    EXPECT_EQ(w->token_count(), 3u);
    ASSERT_TRUE(std::equal(w->tokens().begin(), w->tokens().end(), Ids(100, 3).begin()));
    // The writer is still usable, and the file never shows the dropped tokens.
    ASSERT_TRUE(w->Append(Tokens(g, 400, 5).Make()).ok());
    ASSERT_TRUE(w->Close().ok());
    EXPECT_EQ(ReadTokens(&fs), Concat(Ids(100, 3), Ids(400, 5)));
    VerifyOptions vo;
    vo.fs = &fs;
    VerifyReport rep;
    ASSERT_TRUE(VerifyFile(kPath, vo, &rep).ok());
    EXPECT_TRUE(rep.findings.empty()) << rep.findings[0].message;
  }
}

// A single call that fails leaves no trace, whether it fit the staging
// buffer or not.
TEST(AppendTest, ASingleFailedCallLeavesNoTrace) {
  FaultFs fs;
  const Geometry g = Tiny();
  std::unique_ptr<Writer> w;
  ASSERT_TRUE(hooks::CreateWriter(kPath, g, {"m", 1}, Options(&fs, SyncMode::kChunk, 4), &w).ok());
  ASSERT_TRUE(w->Append(Tokens(g, 100, 2).Make()).ok());
  size_t ops = fs.log().size();
  EXPECT_EQ(w->Append(Tokens(g, 200, 1, 0).Make()).code(), Status::Code::kNonFinite);
  EXPECT_EQ(w->Append(Tokens(g, 200, 11, 10).Make()).code(), Status::Code::kNonFinite);
  EXPECT_EQ(fs.log().size(), ops) << "a refused append touched the file";
  ASSERT_TRUE(w->Close().ok());
  EXPECT_EQ(ReadTokens(&fs), Ids(100, 2));
}

// Close() with an append still open drops it, says so, and keeps the
// finished appends; nothing of the open one stays in the file.
TEST(AppendTest, CloseDropsAnUnfinishedAppend) {
  for (uint32_t open_tokens : {2u, 9u}) {  // staged only; in chunks on disk too
    FaultFs fs;
    const Geometry g = Tiny();
    std::unique_ptr<Writer> w;
    ASSERT_TRUE(hooks::CreateWriter(kPath, g, {"m", 1}, Options(&fs, SyncMode::kClose, 4), &w).ok());
    ASSERT_TRUE(w->Append(Tokens(g, 100, 5).Make()).ok());
    ASSERT_TRUE(w->Append(Tokens(g, 200, open_tokens).Make(/*continued=*/true)).ok());
    Status st = w->Close();
    EXPECT_EQ(st.code(), Status::Code::kFailed);
    EXPECT_NE(st.message().find("unfinished append; its " + std::to_string(open_tokens) + " tokens were dropped"),
              std::string::npos)
        << st.message();
    TailInfo tail;
    EXPECT_EQ(ReadTokens(&fs, &tail), Ids(100, 5));
    EXPECT_EQ(tail.torn_tail_bytes, 0u) << "the dropped append's chunks are still in the file";
    EXPECT_EQ(w->durable_tokens(), 5u);
  }
}

// In a 2.0 file (no append ends) Close() must remove the open append's
// chunks itself: the next open would keep them whole.
TEST(AppendTest, CloseDropsAnUnfinishedAppendOfA20File) {
  std::ifstream in(std::string(KVFILE_TEST_DATA "/fixtures/example_v2_0.kv"), std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
  ASSERT_EQ(bytes.size(), 16384u);
  FaultFs fs({{kPath, bytes}});
  WriterOptions o;
  o.fs = &fs;
  std::unique_ptr<Writer> w;
  ASSERT_TRUE(Writer::Open(kPath, o, &w).ok());
  std::vector<float> k(4 * 5, 1.0f);  // 5 tokens: chunks of 2 reach the disk
  std::vector<uint16_t> idx(2 * 5, 0x3F80);
  std::vector<uint32_t> ids = Ids(500, 5);
  AppendBatch b;
  b.tokens = ids;
  b.continued = true;
  b.blocks = {{Dtype::kF32, k.data(), nullptr}, {Dtype::kBF16, idx.data(), nullptr}};
  ASSERT_TRUE(w->Append(b).ok());
  EXPECT_EQ(w->Close().code(), Status::Code::kFailed);
  TailInfo tail;
  EXPECT_EQ(ReadTokens(&fs, &tail), (std::vector<uint32_t>{101, 202}));
  EXPECT_EQ(tail.torn_tail_bytes, 0u);
}

// A rewind inside an open append to the end of the chunks on disk makes
// that an append end: Close() commits it.
TEST(AppendTest, RewindInsideAnOpenAppendToTheChunksOnDisk) {
  FaultFs fs;
  const Geometry g = Tiny();
  std::unique_ptr<Writer> w;
  ASSERT_TRUE(hooks::CreateWriter(kPath, g, {"m", 1}, Options(&fs, SyncMode::kClose, 4), &w).ok());
  ASSERT_TRUE(w->Append(Tokens(g, 100, 10).Make(/*continued=*/true)).ok());  // 8 tokens in chunks
  ASSERT_TRUE(w->Rewind(8).ok());
  ASSERT_TRUE(w->Close().ok());
  EXPECT_EQ(w->durable_tokens(), 8u);
  EXPECT_EQ(ReadTokens(&fs), Ids(100, 8));
}

// Sync() inside an open append acknowledges the finished appends only.
TEST(AppendTest, SyncAcknowledgesFinishedAppendsOnly) {
  FaultFs fs;
  const Geometry g = Tiny();
  std::unique_ptr<Writer> w;
  ASSERT_TRUE(hooks::CreateWriter(kPath, g, {"m", 1}, Options(&fs, SyncMode::kNone, 4), &w).ok());
  ASSERT_TRUE(w->Append(Tokens(g, 100, 3).Make()).ok());
  ASSERT_TRUE(w->Append(Tokens(g, 200, 6).Make(true)).ok());
  ASSERT_TRUE(w->Sync().ok());
  EXPECT_EQ(w->durable_tokens(), 3u);
  EXPECT_EQ(ReadTokens(&fs), Ids(100, 3));
  ASSERT_TRUE(w->Append(Tokens(g, 300, 1).Make()).ok());  // ends the append
  ASSERT_TRUE(w->Sync().ok());
  EXPECT_EQ(w->durable_tokens(), 10u);
  EXPECT_EQ(ReadTokens(&fs), Concat(Concat(Ids(100, 3), Ids(200, 6)), Ids(300, 1)));
}

// What a crash (or a killed process) leaves in the middle of an append:
// whole chunks of it past the commit record. Readers stop at the last
// append end; verify calls the rest a torn tail (a warning); a writable
// open cuts it and appends after the last whole append.
TEST(AppendTest, ChunksOfAnUnfinishedAppendAreATornTail) {
  FaultFs fs;
  const Geometry g = Tiny();
  testing::DiskImage at_crash;
  {
    std::unique_ptr<Writer> w;
    ASSERT_TRUE(hooks::CreateWriter(kPath, g, {"m", 1}, Options(&fs, SyncMode::kNone, 4), &w).ok());
    ASSERT_TRUE(w->Append(Tokens(g, 100, 3).Make()).ok());
    ASSERT_TRUE(w->Append(Tokens(g, 200, 10).Make(true)).ok());  // chunks [0,4), [4,8), [8,12) written
    ASSERT_TRUE(w->Flush().ok());                                 // and [12,13) too
    at_crash = fs.Image();  // the process dies here, before Close
  }
  FaultFs disk(at_crash);
  TailInfo tail;
  EXPECT_EQ(ReadTokens(&disk, &tail), Ids(100, 3));
  EXPECT_GT(tail.torn_tail_bytes, 0u);
  EXPECT_FALSE(tail.valid_data_follows);
  EXPECT_NE(tail.torn_reason.find("part of an append that did not finish"), std::string::npos) << tail.torn_reason;
  VerifyOptions vo;
  vo.fs = &disk;
  VerifyReport rep;
  ASSERT_TRUE(VerifyFile(kPath, vo, &rep).ok());
  EXPECT_FALSE(rep.HasErrors()) << rep.findings[0].message;
  EXPECT_EQ(rep.tokens, 3u);
  std::unique_ptr<Writer> w;
  ASSERT_TRUE(Writer::Open(kPath, Options(&disk, SyncMode::kClose, 4), &w).ok());
  EXPECT_EQ(w->token_count(), 3u);
  EXPECT_GT(w->recovery().truncated_bytes, 0u);
  ASSERT_TRUE(w->Append(Tokens(g, 500, 2).Make()).ok());
  ASSERT_TRUE(w->Close().ok());
  EXPECT_EQ(ReadTokens(&disk, &tail), Concat(Ids(100, 3), Ids(500, 2)));
  EXPECT_EQ(tail.torn_tail_bytes, 0u);
}

// An I/O error in the middle of an append: the writer stops, and the file
// is cut back to its last commit, so a retry of the same append after a
// reopen cannot duplicate tokens.
TEST(AppendTest, AnIoErrorCutsTheFileBackToItsLastCommit) {
  FaultFs fs;
  const Geometry g = Tiny();
  std::unique_ptr<Writer> w;
  ASSERT_TRUE(hooks::CreateWriter(kPath, g, {"m", 1}, Options(&fs, SyncMode::kClose, 4), &w).ok());
  ASSERT_TRUE(w->Append(Tokens(g, 100, 4).Make()).ok());
  ASSERT_TRUE(w->Sync().ok());
  ASSERT_TRUE(w->Append(Tokens(g, 200, 4).Make(true)).ok());  // one chunk written past the commit
  fs.FailOn(FsOp::kWrite, 1, ENOSPC, /*persistent=*/false);      // the second chunk's write fails
  Status st = w->Append(Tokens(g, 300, 8).Make());
  ASSERT_EQ(st.code(), Status::Code::kIOError) << st.ToString();
  TailInfo tail;
  EXPECT_EQ(ReadTokens(&fs, &tail), Ids(100, 4));
  EXPECT_EQ(tail.torn_tail_bytes, 0u) << "the failed append's chunks are still in the file";
  EXPECT_EQ(tail.file_size, tail.valid_end);
  w.reset();
  ASSERT_TRUE(Writer::Open(kPath, Options(&fs, SyncMode::kClose, 4), &w).ok());
  EXPECT_EQ(w->token_count(), 4u);
}

// A 2.0 file (written before append ends existed) stays 2.0 when appended
// to: its chunks carry no append end, and readers keep 2.0's rule (whole
// uncommitted chunks count).
TEST(AppendTest, A20FileStays20) {
  std::ifstream in(std::string(KVFILE_TEST_DATA "/fixtures/example_v2_0.kv"), std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
  ASSERT_EQ(bytes.size(), 16384u);
  FaultFs fs({{kPath, bytes}});
  std::unique_ptr<Writer> w;
  WriterOptions o;
  o.fs = &fs;
  ASSERT_TRUE(Writer::Open(kPath, o, &w).ok());
  Geometry g = w->geometry();
  std::vector<float> k(4, 1.0f);
  std::vector<uint16_t> idx(2, 0x3F80);
  uint32_t id = 7;
  AppendBatch b;
  b.tokens = std::span<const uint32_t>(&id, 1);
  b.blocks = {{Dtype::kF32, k.data(), nullptr}, {Dtype::kBF16, idx.data(), nullptr}};
  ASSERT_TRUE(w->Append(b).ok());
  ASSERT_TRUE(w->Close().ok());
  ReaderOptions ro;
  ro.fs = &fs;
  std::unique_ptr<Reader> r;
  ASSERT_TRUE(Reader::Open(kPath, ro, &r).ok());
  EXPECT_EQ(r->major_version(), 2);
  EXPECT_EQ(r->minor_version(), 0);
  EXPECT_EQ(r->token_count(), 3u);
  const std::vector<uint8_t> after = fs.Image().at(kPath);
  EXPECT_EQ(format::LoadU32(after.data() + 16384 + format::ch::kAppendEnd), 0u) << "a 2.0 chunk got an append end";
}

}  // namespace
}  // namespace kvfile
