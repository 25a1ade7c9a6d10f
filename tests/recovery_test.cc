// SPDX-License-Identifier: Apache-2.0
// Tests of opening a file after a crash (spec/RECOVERY.md section 6): damaged
// or truncated uncommitted chunks end the valid data at the last append end,
// a cut inside committed data is reported (and refused by a writer unless
// asked), garbage after the last chunk is a torn tail.

#include "support/kv_test_util.h"

namespace kvfile {
namespace {

using namespace kvfile::test;

TEST_F(DamageTest, UncommittedChunks) {
  // sync kNone: no chunk is committed. Damage in an uncommitted chunk ends
  // the valid data there (nothing acknowledged is lost), and the data before
  // it ends at the last append end (appends of 1, 10, 3 and 6 tokens: ends
  // at 1, 11, 14, 20); a valid chunk after the damage is reported in the
  // tail info.
  ASSERT_NO_FATAL_FAILURE(Write(SyncMode::kNone));
  XorByte(Path(), ChunkOffset(2) + layout8_.tokens_offset, 0x01);
  {
    std::unique_ptr<Reader> r;
    ASSERT_OK(Reader::Open(Path(), {}, &r));
    EXPECT_EQ(r->token_count(), 14u);
    EXPECT_EQ(r->chunks().size(), 2u);
    EXPECT_EQ(r->tail().valid_end, ChunkOffset(2));
    EXPECT_EQ(r->tail().torn_tail_bytes, 4096u);
    EXPECT_NE(r->tail().torn_reason.find("chunk 2 at offset 20480"), std::string::npos)
        << r->tail().torn_reason;
    EXPECT_FALSE(r->tail().valid_data_follows);
  }
  XorByte(Path(), ChunkOffset(2) + layout8_.tokens_offset, 0x01);  // repair
  // Payload damage in an uncommitted chunk is found at open too (every byte
  // of an uncommitted chunk is checked), and chunk 2 after it is valid.
  XorByte(Path(), ChunkOffset(1) + layout8_.section(1, 1).offset + 3, 0x01);
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(Path(), {}, &r));
  EXPECT_EQ(r->token_count(), 1u);
  EXPECT_EQ(r->chunks().size(), 1u);
  EXPECT_EQ(r->tail().valid_end, ChunkOffset(1));
  EXPECT_EQ(r->tail().torn_tail_bytes, 8192u);
  EXPECT_NE(r->tail().torn_reason.find("chunk 1 at offset 16384"), std::string::npos)
      << r->tail().torn_reason;
  EXPECT_NE(r->tail().torn_reason.find("layer 1 stream 'v'"), std::string::npos)
      << r->tail().torn_reason;
  EXPECT_TRUE(r->tail().valid_data_follows);
  EXPECT_EQ(r->tail().valid_data_offset, ChunkOffset(2));
  CheckRange(*r, q_, e_, 1, 1, 0, 1, Dtype::kF32);
  Bytes dst(32 * 4, 0x77);
  EXPECT_TRUE(HasCode(r->ReadRows(1, 1, 0, 2, Dtype::kF32, dst.data()), Code::kInvalidArgument));
}

// ---- truncation ---------------------------------------------------------------------------------

TEST_F(DamageTest, TruncatedUncommittedTailIsDropped) {
  ASSERT_NO_FATAL_FAILURE(Write(SyncMode::kNone));
  for (uint64_t cut : {uint64_t{2048}, uint64_t{10}, uint64_t{64}, uint64_t{4095}}) {
    SCOPED_TRACE(cut);
    std::filesystem::copy_file(Path(), Path("t.kv"), std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(Path("t.kv"), ChunkOffset(2) + cut);
    std::unique_ptr<Reader> r;
    ASSERT_OK(Reader::Open(Path("t.kv"), {}, &r));
    EXPECT_EQ(r->token_count(), 14u);  // the last append end in chunks 0-1
    EXPECT_EQ(r->chunks().size(), 2u);
    EXPECT_EQ(r->tail().valid_end, ChunkOffset(2));
    EXPECT_EQ(r->tail().file_size, ChunkOffset(2) + cut);
    EXPECT_EQ(r->tail().torn_tail_bytes, cut);
    EXPECT_FALSE(r->tail().torn_reason.empty());
    for (uint32_t s = 0; s < 2; ++s) CheckRange(*r, q_, e_, 1, s, 0, 14, Dtype::kF32);
  }
  // Cut exactly at a chunk boundary: nothing torn.
  std::filesystem::resize_file(Path(), ChunkOffset(2));
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(Path(), {}, &r));
  EXPECT_EQ(r->token_count(), 14u);
  EXPECT_EQ(r->tail().torn_tail_bytes, 0u);
}

TEST_F(DamageTest, TruncatedFixedRegionFailsOpen) {
  ASSERT_NO_FATAL_FAILURE(Write(SyncMode::kClose));
  for (uint64_t size : {uint64_t{12287}, uint64_t{5000}}) {
    SCOPED_TRACE(size);
    std::filesystem::copy_file(Path(), Path("t.kv"), std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(Path("t.kv"), size);
    std::unique_ptr<Reader> r;
    EXPECT_TRUE(HasCode(Reader::Open(Path("t.kv"), {}, &r), Code::kCorruption, {"truncated"}));
  }
}

// Cut inside the committed region: the reader returns the whole chunks
// before the cut and records what the commit record vouched for.
TEST_F(DamageTest, TruncatedCommittedRegionReadsAsTheWholeChunksBefore) {
  ASSERT_NO_FATAL_FAILURE(Write(SyncMode::kClose));
  std::unique_ptr<Reader> whole;
  ASSERT_OK(Reader::Open(Path(), {}, &whole));
  uint64_t committed_end = whole->tail().file_size;
  struct Case { uint64_t size, tokens, valid_end; };
  for (Case c : {Case{ChunkOffset(2) + 2048, 16, ChunkOffset(2)}, Case{ChunkOffset(1) + 100, 8, ChunkOffset(1)},
                 Case{ChunkOffset(2), 16, ChunkOffset(2)}, Case{ChunkOffset(0), 0, ChunkOffset(0)}}) {
    SCOPED_TRACE(c.size);
    std::filesystem::copy_file(Path(), Path("t.kv"), std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(Path("t.kv"), c.size);
    std::unique_ptr<Reader> r;
    ASSERT_OK(Reader::Open(Path("t.kv"), {}, &r));
    EXPECT_EQ(r->token_count(), c.tokens);
    EXPECT_TRUE(std::equal(r->tokens().begin(), r->tokens().end(), whole->tokens().begin()));
    EXPECT_TRUE(r->tail().committed_data_missing);
    EXPECT_EQ(r->tail().valid_end, c.valid_end);
    EXPECT_EQ(r->tail().torn_tail_bytes, c.size - c.valid_end);
    EXPECT_EQ(r->tail().committed_tokens_missing, whole->token_count() - c.tokens);
    EXPECT_EQ(r->tail().committed_bytes_missing, committed_end - c.size);
    if (c.tokens > 0) CheckRange(*r, q_, e_, 1, 0, 0, c.tokens, Dtype::kF32);
    VerifyReport rep;
    ASSERT_OK(VerifyFile(Path("t.kv"), {}, &rep));
    ASSERT_EQ(rep.findings.size(), 1u);
    EXPECT_TRUE(rep.findings[0].error);
    EXPECT_EQ(rep.findings[0].offset, static_cast<int64_t>(c.size));
    EXPECT_NE(rep.findings[0].message.find("file truncated: committed data missing"), std::string::npos)
        << rep.findings[0].message;
  }
}

// A writer must not drop acknowledged tokens behind the caller's back.
TEST_F(DamageTest, WriterRefusesAFileCutInsideCommittedData) {
  ASSERT_NO_FATAL_FAILURE(Write(SyncMode::kClose));
  std::filesystem::resize_file(Path(), ChunkOffset(1) + 100);
  Bytes before = ReadFileBytes(Path());
  std::unique_ptr<Writer> w;
  EXPECT_TRUE(HasCode(Writer::Open(Path(), {}, &w), Code::kCorruption,
                      {"file truncated", "kvfile repair --force"}));
  EXPECT_EQ(ReadFileBytes(Path()), before);
  // With the explicit option the file is cut to its prefix and recommitted.
  WriterOptions o;
  o.drop_missing_committed = true;
  ASSERT_OK(Writer::Open(Path(), o, &w));
  EXPECT_EQ(w->token_count(), 8u);
  ASSERT_OK(w->Close());
  EXPECT_EQ(std::filesystem::file_size(Path()), ChunkOffset(1));
  VerifyReport rep;
  ASSERT_OK(VerifyFile(Path(), {}, &rep));
  EXPECT_TRUE(rep.findings.empty()) << rep.findings[0].message;
  EXPECT_EQ(rep.tokens, 8u);
}

TEST_F(DamageTest, GarbageAfterTheLastChunkIsATornTail) {
  ASSERT_NO_FATAL_FAILURE(Write(SyncMode::kClose));
  Bytes zeros(5000, 0);
  PokeBytes(Path(), ChunkOffset(3), zeros.data(), zeros.size());
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(Path(), {}, &r));
  EXPECT_EQ(r->token_count(), 20u);
  EXPECT_EQ(r->tail().torn_tail_bytes, 5000u);
  EXPECT_EQ(r->tail().valid_end, ChunkOffset(3));
}

}  // namespace
}  // namespace kvfile
