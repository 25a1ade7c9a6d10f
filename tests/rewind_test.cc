// SPDX-License-Identifier: Apache-2.0
// Tests of Writer::Rewind (spec/RECOVERY.md section 5): the dead tokens of
// rewound chunks are never read, and no rewind wraps the epoch counter.

#include "support/fault_fs.h"
#include "support/kv_test_util.h"
#include "testing_hooks.h"

namespace kvfile {
namespace {

using namespace kvfile::test;

// Rewinds cut chunks on disk: their dead tokens (still stored, replaced by
// later appends) must never be read.
TEST_F(ReadManyTest, RewoundFileWithDeadTokens) {
  const Geometry g = MixedGeometry();
  Sequence q1 = MakeSequence(g, Dtype::kF16, 35, 1);
  Sequence q2 = Splice(q1, MakeSequence(g, Dtype::kF16, 35, 2), 13);
  Sequence q3 = Splice(q2, MakeSequence(g, Dtype::kF16, 35, 3), 25);
  {
    std::unique_ptr<Writer> w;
    ASSERT_OK(Writer::Create(Path(), g, kIdentity, Options(8), &w));
    ASSERT_OK(w->Append(Batch(q1, 0, 30)));  // chunks [0,8) [8,16) [16,24) on disk
    ASSERT_OK(w->Rewind(13));
    ASSERT_OK(w->Append(Batch(q2, 13, 17)));  // [13,21) [21,29) on disk
    ASSERT_OK(w->Rewind(25));
    ASSERT_OK(w->Append(Batch(q3, 25, 10)));
    ASSERT_OK(w->Close());
  }
  auto r = Open(Path());
  ASSERT_NE(r, nullptr);
  ASSERT_TRUE(std::equal(r->tokens().begin(), r->tokens().end(), q3.tokens.begin(), q3.tokens.end()));
  std::vector<std::pair<uint32_t, uint32_t>> shape;  // (stored, live) per chunk
  for (const ChunkInfo& c : r->chunks()) shape.push_back({c.stored_tokens, c.live_tokens});
  const std::vector<std::pair<uint32_t, uint32_t>> want_shape = {{8, 8}, {8, 5}, {8, 8}, {8, 4}, {8, 8}, {2, 2}};
  ASSERT_EQ(shape, want_shape);
  CheckReadManyOverChunks(*r, q3, ComputeExpected(q3));
}

// A writer that opens a file with an exhausted epoch counter refuses to
// rewind: a wrapped epoch would make the file unreadable.
TEST(EpochLimit, RewindAtTheLastEpochIsRefused) {
  Geometry g;
  ASSERT_TRUE(GetPreset("tiny", Dtype::kE4M3, &g).ok());
  testing::FaultFs fs;
  WriterOptions o;
  o.fs = &fs;
  o.chunk_tokens = 4;
  hooks::SetWriterSalt(99);
  std::unique_ptr<Writer> w;
  ASSERT_TRUE(Writer::Create("/e/y.kv", g, {"m", 1}, o, &w).ok());
  ASSERT_TRUE(w->Close().ok());
  // The empty file's active record (sequence 2, slot 0) rewritten with the
  // last epoch, as a file that was rewound 2^32 - 2 times would hold.
  testing::DiskImage img = fs.Image();
  format::CommitRecord c;
  c.sequence = 2;
  c.salt = 99;
  c.epoch = 0xFFFFFFFFu;
  format::EncodeCommitRecord(c, std::span<uint8_t, format::kCommitSlotSize>(img.at("/e/y.kv").data() + 4096, 4096));
  testing::FaultFs disk(img);
  o.fs = &disk;
  Status st = Writer::Open("/e/y.kv", o, &w);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const Sequence q = MakeSequence(g, Dtype::kF32, 5);
  ASSERT_TRUE(w->Append(Batch(q, 0, 5)).ok());
  ASSERT_TRUE(w->Sync().ok());
  st = w->Rewind(2);
  EXPECT_EQ(st.code(), Status::Code::kUnsupported) << st.ToString();
  EXPECT_NE(st.message().find("epoch counter is exhausted"), std::string::npos) << st.message();
  EXPECT_EQ(w->token_count(), 5u);
}

}  // namespace
}  // namespace kvfile
