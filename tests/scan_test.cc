// SPDX-License-Identifier: Apache-2.0
// Tests of the checks of src/reader/file_scan.cc, through Reader::Open and reads:
// chunk heads and token ids of committed chunks at open, section padding,
// codes and scales behind valid checksums, headers of other versions,
// commit slots, files that are not kvfiles.

#include "support/kv_test_util.h"
#include "support/testing_hooks.h"

namespace kvfile {
namespace {

using namespace kvfile::test;

TEST_F(DamageTest, DamagedScalesAndPaddingAreCaught) {
  ASSERT_NO_FATAL_FAILURE(Write());
  // A scale byte of chunk 0 layer 0 'v', and the zero padding at the end of
  // chunk 2 (part of the last section, layer 1 'v').
  XorByte(Path(), ChunkOffset(0) + layout8_.section(0, 1).scales_offset + 5, 0x10);
  ChunkLayout layout4;
  ASSERT_OK(ComputeChunkLayout(g_, 4, &layout4));
  ASSERT_GT(layout4.chunk_bytes, layout4.sections.back().scales_offset + layout4.sections.back().scales_bytes);
  XorByte(Path(), ChunkOffset(2) + 4000, 0x80);
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(Path(), {}, &r));
  std::vector<float> scales(40, 3.0f);
  Bytes codes(20 * 32, 0x33);
  EXPECT_TRUE(HasCode(r->ReadCodes(0, 1, 0, 1, codes.data(), scales.data()), Code::kCorruption, {"chunk 0"}));
  EXPECT_TRUE(std::all_of(scales.begin(), scales.end(), [](float f) { return f == 3.0f; }));
  EXPECT_TRUE(std::all_of(codes.begin(), codes.end(), [](uint8_t c) { return c == 0x33; }));
  EXPECT_TRUE(HasCode(r->ReadRows(1, 1, 19, 20, Dtype::kF32, codes.data()), Code::kCorruption, {"chunk 2"}));
  EXPECT_TRUE(std::all_of(codes.begin(), codes.end(), [](uint8_t c) { return c == 0x33; }));
  CheckRange(*r, q_, e_, 1, 1, 0, 16, Dtype::kF32);
  CheckRange(*r, q_, e_, 0, 0, 0, 20, Dtype::kF32);
}

TEST_F(DamageTest, InvalidCodesAndScalesWithValidChecksumsAreRefused) {
  ASSERT_NO_FATAL_FAILURE(Write());
  // Chunk 1, layer 0 'k': a NaN code (0x7F) in token 10; layer 1 'v': a zero
  // scale for token 13 row 0. Checksums resealed so only the values are wrong.
  uint8_t nan_code = 0x7F;
  PokeBytes(Path(), ChunkOffset(1) + layout8_.section(0, 0).offset + 2 * 32 + 3, &nan_code, 1);
  float zero = 0.0f;
  PokeBytes(Path(), ChunkOffset(1) + layout8_.section(1, 1).scales_offset + 5 * 2 * 4, &zero, 4);
  Reseal(Path(), ChunkOffset(1), layout8_);
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(Path(), {}, &r));
  Bytes dst(20 * 32 * 4, 0x5A);
  std::vector<float> scales(40, 2.0f);
  EXPECT_TRUE(HasCode(r->ReadRows(0, 0, 0, 20, Dtype::kF32, dst.data()), Code::kCorruption,
                      {"chunk 1", "non-finite code at token 10"}));
  EXPECT_TRUE(HasCode(r->ReadCodes(0, 0, 9, 11, dst.data(), scales.data()), Code::kCorruption,
                      {"non-finite code at token 10"}));
  EXPECT_TRUE(HasCode(r->ReadRows(1, 1, 12, 20, Dtype::kBF16, dst.data()), Code::kCorruption,
                      {"invalid scale at token 13"}));
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](uint8_t c) { return c == 0x5A; }));
  EXPECT_TRUE(std::all_of(scales.begin(), scales.end(), [](float f) { return f == 2.0f; }));
  EXPECT_TRUE(HasCode(hooks::ReaderAccess::VerifyChunk(*r, 1), Code::kCorruption, {"non-finite code at token 10"}));
  // Rows of the same sections outside the bad tokens still read.
  CheckRange(*r, q_, e_, 0, 0, 11, 20, Dtype::kF32);
  CheckRange(*r, q_, e_, 1, 1, 0, 13, Dtype::kF32);
}

TEST_F(DamageTest, DamagedTokenIdsOfACommittedChunkFailOpen) {
  ASSERT_NO_FATAL_FAILURE(Write());
  XorByte(Path(), ChunkOffset(1) + layout8_.tokens_offset + 4 * 3 + 1, 0x04);
  std::unique_ptr<Reader> r;
  Status st = Reader::Open(Path(), {}, &r);
  EXPECT_TRUE(HasCode(st, Code::kCorruption, {Path(), "chunk 1 at offset 16384", "checksum"}));
  EXPECT_EQ(r, nullptr);
}

TEST_F(DamageTest, EveryBitOfACommittedChunkHeadIsChecked) {
  ASSERT_NO_FATAL_FAILURE(Write());
  const uint64_t base = ChunkOffset(1);
  const Bytes original = ReadFileBytes(Path());
  for (uint64_t byte = 0; byte < layout8_.head_bytes; ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      uint8_t v = static_cast<uint8_t>(original[base + byte] ^ (1u << bit));
      PokeBytes(Path(), base + byte, &v, 1);
      std::unique_ptr<Reader> r;
      Status st = Reader::Open(Path(), {}, &r);
      ASSERT_TRUE(HasCode(st, Code::kCorruption, {"chunk 1 at offset 16384"}))
          << "byte " << byte << " bit " << bit;
      PokeBytes(Path(), base + byte, &original[base + byte], 1);
    }
  }
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(Path(), {}, &r));
}


// Writes a header and two empty commit slots, as Create would, for `h`.
void WriteBareFile(const std::string& path, const format::FileHeader& h) {
  Bytes f(format::kDataOffset);
  format::EncodeFileHeader(h, std::span<uint8_t, 4096>(f.data(), 4096));
  format::CommitRecord c;
  c.salt = h.salt;
  c.epoch = 1;
  for (uint64_t seq = 1; seq <= 2; ++seq) {
    c.sequence = seq;
    format::EncodeCommitRecord(c, std::span<uint8_t, 4096>(f.data() + 4096 * (1 + seq % 2), 4096));
  }
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(f.data()),
                                               static_cast<std::streamsize>(f.size()));
}

TEST_F(KvFileTest, OpenTellsUnsupportedFromDamaged) {
  format::FileHeader h;
  h.salt = 42;
  h.chunk_tokens = 8;
  h.identity = kIdentity;
  h.geometry = Preset("tiny", Dtype::kE4M3);
  WriteBareFile(Path("v2.kv"), h);
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(Path("v2.kv"), {}, &r));  // the bare file itself is valid
  EXPECT_EQ(r->token_count(), 0u);
  EXPECT_EQ(r->salt(), 42u);

  format::FileHeader v3 = h;
  v3.major = 3;
  WriteBareFile(Path("v3.kv"), v3);
  EXPECT_TRUE(HasCode(Reader::Open(Path("v3.kv"), {}, &r), Code::kUnsupported, {"version 3"}));
  format::FileHeader flags = h;
  flags.required_flags = 8;  // bit 3: unknown (bits 0..2 are APPEND_ENDS, NVFP4, LAYER_SETS)
  WriteBareFile(Path("flags.kv"), flags);
  EXPECT_TRUE(HasCode(Reader::Open(Path("flags.kv"), {}, &r), Code::kUnsupported, {"required flags"}));
  format::FileHeader v1 = h;
  v1.major = 1;
  for (auto& s : v1.geometry.streams) s.dtype = Dtype::kBF16;
  WriteBareFile(Path("v1.kv"), v1);
  ASSERT_OK(Reader::Open(Path("v1.kv"), {}, &r));  // v1 is read through the same Reader
  EXPECT_EQ(r->major_version(), 1);
  format::FileHeader v1_fp8 = h;
  v1_fp8.major = 1;  // a v1 header with an fp8 stream is invalid
  std::vector<uint8_t> raw_header(4096);
  format::EncodeFileHeader(v1_fp8, std::span<uint8_t, 4096>(raw_header.data(), 4096));
  format::FileHeader decoded;
  EXPECT_TRUE(HasCode(format::DecodeFileHeader(std::span<const uint8_t, 4096>(raw_header.data(), 4096), &decoded),
                      Code::kCorruption, {"v1 files store raw rows only"}));

  // Not kvfiles at all.
  r.reset();
  EXPECT_TRUE(HasCode(Reader::Open(Path("missing.kv"), {}, &r), Code::kNotFound));
  { std::ofstream(Path("empty.kv")); }
  EXPECT_TRUE(HasCode(Reader::Open(Path("empty.kv"), {}, &r), Code::kCorruption, {"not a kvfile"}));
  { std::ofstream(Path("text.kv")) << "just some text that is not a kvfile\n"; }
  EXPECT_TRUE(HasCode(Reader::Open(Path("text.kv"), {}, &r), Code::kCorruption, {"magic"}));
  EXPECT_EQ(r, nullptr);
  // Both commit slots damaged.
  Bytes f = ReadFileBytes(Path("v2.kv"));
  f[4096 + 100] ^= 1;
  f[8192 + 100] ^= 1;
  std::ofstream(Path("slots.kv"), std::ios::binary).write(reinterpret_cast<const char*>(f.data()),
                                                          static_cast<std::streamsize>(f.size()));
  EXPECT_TRUE(HasCode(Reader::Open(Path("slots.kv"), {}, &r), Code::kCorruption, {"commit slot"}));
  // One damaged slot is survivable: the other one is used.
  f[4096 + 100] ^= 1;
  std::ofstream(Path("slot1.kv"), std::ios::binary).write(reinterpret_cast<const char*>(f.data()),
                                                          static_cast<std::streamsize>(f.size()));
  ASSERT_OK(Reader::Open(Path("slot1.kv"), {}, &r));
}

}  // namespace
}  // namespace kvfile
