// SPDX-License-Identifier: Apache-2.0
// Tests of the on-disk records of a .kv file (format/): file header, commit
// slots and chunk headers (encode -> decode round trips, byte positions, and
// every way a decoder must refuse), the chunk layout, and the geometry checks.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "format/chunk_layout.h"
#include "format/endian.h"
#include "format/geometry.h"
#include "format/header.h"
#include "format/kv_format.h"
#include "kvfile/status.h"

namespace kvfile::format {
namespace {

using Code = Status::Code;
using HeaderBytes = std::array<uint8_t, 4096>;
using SlotBytes = std::array<uint8_t, 4096>;
using ChunkHeadBytes = std::array<uint8_t, 64>;

// ---- helpers -------------------------------------------------------------------

testing::AssertionResult HasCode(const Status& st, Code code, const std::string& needle = "") {
  if (st.code() != code)
    return testing::AssertionFailure() << "expected code " << static_cast<int>(code) << ", got "
                                       << st.ToString();
  if (!needle.empty() && st.message().find(needle) == std::string::npos)
    return testing::AssertionFailure() << "message '" << st.message() << "' lacks '" << needle
                                       << "'";
  return testing::AssertionSuccess();
}

FileHeader SampleHeader() {
  FileHeader h;
  h.salt = 0x1122334455667788ull;
  h.chunk_tokens = 256;
  h.identity.model_id = "meta-llama/Llama-3.1-8B";
  h.identity.fingerprint = 0xDEADBEEFCAFEF00Dull;
  h.geometry.layers = 32;
  h.geometry.streams = {
      {"k", 8, 128, Dtype::kE4M3},
      {"v", 8, 128, Dtype::kE5M2},
      {"idx.x-1_", 3, 64, Dtype::kBF16},
  };
  return h;
}

HeaderBytes EncodeHeader(const FileHeader& h) {
  HeaderBytes b;
  b.fill(0xCC);  // the encoder must write every byte
  EncodeFileHeader(h, std::span<uint8_t, 4096>(b));
  return b;
}

// Recomputes the checksum so that a decoder sees a consistent record and must
// refuse it for the field itself.
void Reseal(std::array<uint8_t, 4096>& b) {
  StoreU64(b.data() + 4088, XXH3_64bits(b.data(), 4088));
}

Status DecodeHeader(const HeaderBytes& b, FileHeader* out = nullptr) {
  FileHeader tmp;
  return DecodeFileHeader(std::span<const uint8_t, 4096>(b), out ? out : &tmp);
}

bool SameHeader(const FileHeader& a, const FileHeader& b) {
  return a.major == b.major && a.minor == b.minor && a.required_flags == b.required_flags &&
         a.optional_flags == b.optional_flags && a.salt == b.salt &&
         a.chunk_tokens == b.chunk_tokens && a.identity == b.identity && a.geometry == b.geometry;
}

CommitRecord SampleCommit() {
  CommitRecord c;
  c.sequence = 7;
  c.salt = 0x1122334455667788ull;
  c.epoch = 3;
  c.tokens = 1000;
  c.end = 12288 + 5 * 4096;
  c.chunks = 4;
  return c;
}

SlotBytes EncodeSlot(const CommitRecord& c) {
  SlotBytes b;
  b.fill(0xCC);
  EncodeCommitRecord(c, std::span<uint8_t, 4096>(b));
  return b;
}

Status DecodeSlot(const SlotBytes& b, CommitRecord* out = nullptr) {
  CommitRecord tmp;
  return DecodeCommitRecord(std::span<const uint8_t, 4096>(b), out ? out : &tmp);
}

ChunkHeader SampleChunkHeader() {
  ChunkHeader c;
  c.token_count = 256;
  c.salt = 0x1122334455667788ull;
  c.first_token = 512;
  c.chunk_offset = 12288 + 8192;
  c.chunk_bytes = 8192;
  c.epoch = 2;
  c.append_end = 100;
  return c;
}

ChunkHeadBytes EncodeChunk(const ChunkHeader& c) {
  ChunkHeadBytes b;
  b.fill(0xCC);
  EncodeChunkHeader(c, std::span<uint8_t, 64>(b));
  return b;
}

// append_ends: the file header sets kFlagAppendEnds (version 2.1).
Status DecodeChunk(const ChunkHeadBytes& b, ChunkHeader* out = nullptr, bool append_ends = true) {
  ChunkHeader tmp;
  return DecodeChunkHeader(std::span<const uint8_t, 64>(b), append_ends, out ? out : &tmp);
}

bool SameChunk(const ChunkHeader& a, const ChunkHeader& b) {
  return a.token_count == b.token_count && a.salt == b.salt && a.first_token == b.first_token &&
         a.chunk_offset == b.chunk_offset && a.chunk_bytes == b.chunk_bytes && a.epoch == b.epoch &&
         a.append_end == b.append_end;
}

// Header byte offset of stream descriptor i.
constexpr size_t Desc(size_t i) { return 384 + 64 * i; }

// ---- checksum and endianness ----------------------------------------------------

TEST(Checksum, IsXxh3SeedZero) {
  // Published XXH3-64 value of the empty input.
  EXPECT_EQ(Checksum("", 0), 0x2D06800538D394C2ull);
  std::vector<uint8_t> data(5000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t n : {1u, 3u, 16u, 17u, 128u, 129u, 240u, 241u, 4088u, 5000u})
    EXPECT_EQ(Checksum(data.data(), n), XXH3_64bits(data.data(), n)) << n;
}

// AllZero reads eight bytes at a time: a nonzero byte anywhere (in the
// words, in the tail, at any alignment of the start) must be seen.
TEST(AllZero, SeesEveryNonzeroByteAtEveryAlignment) {
  std::vector<uint8_t> buf(64 + 8, 0);
  for (size_t start = 0; start < 8; ++start) {
    for (size_t n = 0; n <= 40; ++n) {
      std::span<const uint8_t> bytes(buf.data() + start, n);
      ASSERT_TRUE(AllZero(bytes)) << start << " " << n;
      for (size_t i = 0; i < n; ++i) {
        for (uint8_t v : {uint8_t{1}, uint8_t{0x80}, uint8_t{0xFF}}) {
          buf[start + i] = v;
          EXPECT_FALSE(AllZero(bytes)) << "start " << start << " length " << n << " byte " << i;
          buf[start + i] = 0;
        }
      }
      // Bytes just outside the span do not count.
      if (start > 0) buf[start - 1] = 0xFF;
      buf[start + n] = 0xFF;
      EXPECT_TRUE(AllZero(bytes)) << start << " " << n;
      if (start > 0) buf[start - 1] = 0;
      buf[start + n] = 0;
    }
  }
}

TEST(Endian, StoresLittleEndian) {
  uint8_t b[8] = {};
  StoreU16(b, 0x1234);
  EXPECT_EQ(b[0], 0x34);
  EXPECT_EQ(b[1], 0x12);
  StoreU32(b, 0x12345678u);
  EXPECT_EQ((std::array<uint8_t, 4>{b[0], b[1], b[2], b[3]}),
            (std::array<uint8_t, 4>{0x78, 0x56, 0x34, 0x12}));
  StoreU64(b, 0x0102030405060708ull);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(b[i], 8 - i);
  EXPECT_EQ(LoadU64(b), 0x0102030405060708ull);
  EXPECT_EQ(LoadU32(b), 0x05060708u);
  EXPECT_EQ(LoadU16(b), 0x0708u);
}

TEST(Dtype, NamesAndSizes) {
  EXPECT_STREQ(DtypeName(Dtype::kE4M3), "e4m3");
  EXPECT_STREQ(DtypeName(Dtype::kE5M2), "e5m2");
  EXPECT_STREQ(DtypeName(Dtype::kBF16), "bf16");
  EXPECT_STREQ(DtypeName(Dtype::kF16), "f16");
  EXPECT_STREQ(DtypeName(Dtype::kF32), "f32");
  EXPECT_STREQ(DtypeName(Dtype::kNvfp4), "nvfp4");
  EXPECT_STREQ(DtypeName(static_cast<Dtype>(7)), "invalid");
  EXPECT_EQ(ElementSize(Dtype::kE4M3), 1u);
  EXPECT_EQ(ElementSize(Dtype::kE5M2), 1u);
  EXPECT_EQ(ElementSize(Dtype::kBF16), 2u);
  EXPECT_EQ(ElementSize(Dtype::kF16), 2u);
  EXPECT_EQ(ElementSize(Dtype::kF32), 4u);
  EXPECT_EQ(ElementSize(Dtype::kNvfp4), 0u);  // no whole byte: CodeBytes
  // The values are on disk.
  EXPECT_EQ(static_cast<int>(Dtype::kE4M3), 1);
  EXPECT_EQ(static_cast<int>(Dtype::kE5M2), 2);
  EXPECT_EQ(static_cast<int>(Dtype::kBF16), 3);
  EXPECT_EQ(static_cast<int>(Dtype::kF16), 4);
  EXPECT_EQ(static_cast<int>(Dtype::kF32), 5);
  EXPECT_EQ(static_cast<int>(Dtype::kNvfp4), 6);
  EXPECT_FALSE(IsValidDtype(0));
  EXPECT_TRUE(IsValidDtype(6));
  EXPECT_FALSE(IsValidDtype(7));
  // Stored bytes of n elements: two nvfp4 codes share a byte.
  EXPECT_EQ(CodeBytes(Dtype::kNvfp4, 1024), 512u);
  EXPECT_EQ(CodeBytes(Dtype::kE4M3, 1024), 1024u);
  EXPECT_EQ(CodeBytes(Dtype::kBF16, 1024), 2048u);
  EXPECT_TRUE(IsQuantized(Dtype::kNvfp4) && IsNvfp4(Dtype::kNvfp4) && !IsFp8(Dtype::kNvfp4));
  EXPECT_TRUE(IsQuantized(Dtype::kE5M2) && !IsQuantized(Dtype::kF32) && !IsNvfp4(Dtype::kE4M3));
}

// The dtype table (spec/FORMAT.md 2.1): each dtype's parts and their bytes
// for q quantized rows of w elements; a byte that is no dtype has no size,
// no parts and no quantization (it was once 1 byte, raw).
TEST(Dtype, TablePartsAndSizes) {
  constexpr uint64_t q = 6, w = 32;  // e.g. 3 tokens x 2 rows of 32, or 6 tokens of 32 for nvfp4
  struct Want {
    Dtype d;
    Quantization quant;
    uint64_t codes, block_scales, row_scales;
  };
  for (const Want& x : {Want{Dtype::kE4M3, Quantization::kPerRow, q * w, 0, 4 * q},
                        Want{Dtype::kE5M2, Quantization::kPerRow, q * w, 0, 4 * q},
                        Want{Dtype::kBF16, Quantization::kNone, 2 * q * w, 0, 0},
                        Want{Dtype::kF16, Quantization::kNone, 2 * q * w, 0, 0},
                        Want{Dtype::kF32, Quantization::kNone, 4 * q * w, 0, 0},
                        Want{Dtype::kNvfp4, Quantization::kPerToken, q * w / 2, q * w / 16, 4 * q}}) {
    SCOPED_TRACE(DtypeName(x.d));
    const DtypeInfo* info = FindDtype(x.d);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->dtype, x.d);
    EXPECT_EQ(info->quantization, x.quant);
    EXPECT_EQ(PartBytes(x.d, DtypePart::kCodes, q, w), x.codes);
    EXPECT_EQ(PartBytes(x.d, DtypePart::kBlockScales, q, w), x.block_scales);
    EXPECT_EQ(PartBytes(x.d, DtypePart::kRowScales, q, w), x.row_scales);
    // The parts listed are exactly those with bytes, in section order.
    std::vector<DtypePart> have;
    for (DtypePart p : {DtypePart::kCodes, DtypePart::kBlockScales, DtypePart::kRowScales})
      if (PartBytes(x.d, p, q, w)) have.push_back(p);
    EXPECT_EQ(std::vector<DtypePart>(info->parts, info->parts + info->part_count), have);
  }
  for (uint8_t v : {uint8_t{0}, uint8_t{7}, uint8_t{255}}) {
    const Dtype d = static_cast<Dtype>(v);
    EXPECT_EQ(FindDtype(d), nullptr) << int(v);
    EXPECT_EQ(ElementSize(d), 0u) << int(v);
    EXPECT_EQ(CodeBytes(d, 64), 0u) << int(v);
    EXPECT_EQ(PartBytes(d, DtypePart::kCodes, q, w), 0u) << int(v);
    EXPECT_FALSE(IsFp8(d) || IsNvfp4(d) || IsQuantized(d)) << int(v);
  }
}

TEST(Dtype, ParseEveryNameAndRefuseTheRest) {
  for (uint8_t v = 1; v <= 6; ++v) {
    Dtype d = Dtype::kF32;
    ASSERT_TRUE(ParseDtype(DtypeName(static_cast<Dtype>(v)), &d).ok()) << int(v);
    EXPECT_EQ(d, static_cast<Dtype>(v));
  }
  for (const char* bad : {"", "E4M3", "e4m3 ", "fp8", "invalid", "q8_0"}) {
    Dtype d = Dtype::kBF16;
    Status st = ParseDtype(bad, &d);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << bad;
    EXPECT_EQ(st.message(), "unknown dtype '" + std::string(bad) + "' (e4m3, e5m2, bf16, f16, f32 or nvfp4)");
    EXPECT_EQ(d, Dtype::kBF16);  // untouched
  }
}

// ---- file header ------------------------------------------------------------------

TEST(FileHeader, RoundTrip) {
  FileHeader h = SampleHeader();
  h.optional_flags = 0x5;
  ASSERT_TRUE(ValidateFileHeader(h).ok());
  HeaderBytes b = EncodeHeader(h);
  FileHeader d;
  ASSERT_TRUE(DecodeHeader(b, &d).ok()) << DecodeHeader(b).ToString();
  EXPECT_TRUE(SameHeader(h, d));
  EXPECT_EQ(d.major, 2);
  EXPECT_EQ(d.minor, 1);
  EXPECT_EQ(d.identity.model_id, "meta-llama/Llama-3.1-8B");
  EXPECT_EQ(d.geometry.streams.size(), 3u);
  EXPECT_EQ(d.geometry.streams[2].name, "idx.x-1_");
  EXPECT_EQ(d.geometry.streams[2].rows_per_token, 3u);
  // Encoding is a pure function of the header.
  EXPECT_EQ(EncodeHeader(h), b);
}

TEST(FileHeader, RoundTripExtremes) {
  FileHeader h;
  h.salt = ~0ull;
  h.chunk_tokens = 65536;
  h.identity.model_id = std::string(255, 'x');
  h.identity.model_id[0] = static_cast<char>(0xE2);  // UTF-8 bytes pass through as bytes
  h.identity.model_id[1] = static_cast<char>(0x82);
  h.identity.model_id[2] = static_cast<char>(0xAC);
  h.identity.fingerprint = ~0ull;
  h.geometry.layers = 1024;
  for (int i = 0; i < 16; ++i)
    h.geometry.streams.push_back({"s" + std::to_string(i) + std::string(29 - (i >= 10), 'z'),
                                  1024, 65536, static_cast<Dtype>(1 + i % 5)});
  ASSERT_EQ(h.geometry.streams[0].name.size(), 31u);
  ASSERT_EQ(h.geometry.streams[15].name.size(), 31u);
  ASSERT_TRUE(ValidateFileHeader(h).ok()) << ValidateFileHeader(h).ToString();
  FileHeader d;
  ASSERT_TRUE(DecodeHeader(EncodeHeader(h), &d).ok());
  EXPECT_TRUE(SameHeader(h, d));

  // The smallest header: one layer, one stream of one element, empty model id.
  FileHeader s;
  s.salt = 1;
  s.chunk_tokens = 1;
  s.geometry.layers = 1;
  s.geometry.streams = {{"a", 1, 1, Dtype::kF32}};
  ASSERT_TRUE(DecodeHeader(EncodeHeader(s), &d).ok());
  EXPECT_TRUE(SameHeader(s, d));
}

TEST(FileHeader, V1RawHeaderDecodes) {
  FileHeader h = SampleHeader();
  h.major = 1;
  h.minor = 3;
  for (auto& s : h.geometry.streams) s.dtype = Dtype::kF16;
  ASSERT_TRUE(ValidateFileHeader(h).ok());
  FileHeader d;
  ASSERT_TRUE(DecodeHeader(EncodeHeader(h), &d).ok());
  EXPECT_TRUE(SameHeader(h, d));
  // v1 files hold no fp8 streams.
  h.geometry.streams[1].dtype = Dtype::kE4M3;
  EXPECT_TRUE(HasCode(ValidateFileHeader(h), Code::kInvalidArgument, "stream 'v'"));
  HeaderBytes b = EncodeHeader(h);
  EXPECT_TRUE(HasCode(DecodeHeader(b), Code::kCorruption, "v1"));
}

TEST(FileHeader, BytesSitWhereTheSpecSays) {
  // Offsets written as literals, independent of kv_format.h.
  FileHeader h = SampleHeader();
  h.optional_flags = 0xA1B2;
  HeaderBytes b = EncodeHeader(h);
  const uint8_t magic[8] = {0x89, 'K', 'V', 'F', '\r', '\n', 0x1A, '\n'};
  EXPECT_EQ(std::memcmp(b.data(), magic, 8), 0);
  EXPECT_EQ(b[8], 2);  // major, little-endian u16
  EXPECT_EQ(b[9], 0);
  EXPECT_EQ(LoadU16(b.data() + 10), 1);         // minor
  EXPECT_EQ(LoadU32(b.data() + 12), 4096u);     // header bytes
  EXPECT_EQ(LoadU64(b.data() + 16), 0u);        // required flags
  EXPECT_EQ(LoadU64(b.data() + 24), 0xA1B2u);   // optional flags
  EXPECT_EQ(LoadU64(b.data() + 32), 0x1122334455667788ull);
  EXPECT_EQ(b[32], 0x88);  // salt is little-endian
  EXPECT_EQ(LoadU64(b.data() + 40), 0xDEADBEEFCAFEF00Dull);
  EXPECT_EQ(LoadU32(b.data() + 48), 32u);       // layers
  EXPECT_EQ(LoadU32(b.data() + 52), 3u);        // streams
  EXPECT_EQ(LoadU32(b.data() + 56), 256u);      // chunk tokens
  EXPECT_EQ(LoadU32(b.data() + 60), 12288u);    // data offset
  EXPECT_EQ(LoadU32(b.data() + 64), 23u);       // model id length
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b.data() + 128), 23),
            "meta-llama/Llama-3.1-8B");
  EXPECT_EQ(b[128 + 23], 0);
  // Stream descriptors at 384, 64 bytes each: name[32], dtype u8 at 32,
  // rows u32 at 36, width u32 at 40.
  EXPECT_EQ(b[Desc(0)], 'k');
  EXPECT_EQ(b[Desc(0) + 1], 0);
  EXPECT_EQ(b[Desc(0) + 32], 1);
  EXPECT_EQ(LoadU32(b.data() + Desc(0) + 36), 8u);
  EXPECT_EQ(LoadU32(b.data() + Desc(0) + 40), 128u);
  EXPECT_EQ(b[Desc(1)], 'v');
  EXPECT_EQ(b[Desc(1) + 32], 2);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b.data() + Desc(2)), 8), "idx.x-1_");
  EXPECT_EQ(b[Desc(2) + 32], 3);
  EXPECT_EQ(LoadU32(b.data() + Desc(2) + 36), 3u);
  EXPECT_EQ(LoadU32(b.data() + Desc(2) + 40), 64u);
  // Everything else is zero: reserved areas, padding, unused descriptors.
  for (size_t i = 68; i < 128; ++i) ASSERT_EQ(b[i], 0) << i;
  for (size_t i = 128 + 23; i < 384; ++i) ASSERT_EQ(b[i], 0) << i;
  for (size_t i = Desc(3); i < 4088; ++i) ASSERT_EQ(b[i], 0) << i;
  // The checksum covers [0, 4088) and sits in the last 8 bytes.
  EXPECT_EQ(LoadU64(b.data() + 4088), XXH3_64bits(b.data(), 4088));
}

TEST(FileHeader, EveryBitFlipIsRefused) {
  const HeaderBytes good = EncodeHeader(SampleHeader());
  ASSERT_TRUE(DecodeHeader(good).ok());
  int refused = 0;
  for (size_t bit = 0; bit < 4096 * 8; ++bit) {
    HeaderBytes b = good;
    b[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    Status st = DecodeHeader(b);
    size_t byte = bit / 8;
    // A flipped major version byte is read as a version from elsewhere.
    Code want = (byte == 8 || byte == 9) ? Code::kUnsupported : Code::kCorruption;
    ASSERT_EQ(st.code(), want) << "bit " << bit << ": " << st.ToString();
    ++refused;
  }
  EXPECT_EQ(refused, 32768);
}

TEST(FileHeader, EveryResealedByteChangeIsRefusedOrDecodedDifferently) {
  // No byte of the header may be silently ignored: after any single-byte change
  // (with a matching checksum) the decoder refuses the header or decodes a
  // different one.
  const FileHeader h = SampleHeader();
  const HeaderBytes good = EncodeHeader(h);
  for (size_t i = 0; i < 4088; ++i) {
    for (uint8_t x : {uint8_t{0x01}, uint8_t{0x80}}) {
      HeaderBytes b = good;
      b[i] ^= x;
      Reseal(b);
      FileHeader d;
      Status st = DecodeHeader(b, &d);
      if (st.ok()) {
        ASSERT_FALSE(SameHeader(h, d)) << "byte " << i << " is ignored";
      }
    }
  }
}

TEST(FileHeader, BadMagic) {
  for (size_t i = 0; i < 8; ++i) {
    HeaderBytes b = EncodeHeader(SampleHeader());
    b[i] ^= 0x20;
    Reseal(b);
    EXPECT_TRUE(HasCode(DecodeHeader(b), Code::kCorruption, "magic")) << i;
  }
  HeaderBytes zeros{};
  EXPECT_TRUE(HasCode(DecodeHeader(zeros), Code::kCorruption, "magic"));
}

TEST(FileHeader, ChecksumMismatch) {
  HeaderBytes b = EncodeHeader(SampleHeader());
  b[200] ^= 1;  // model id padding; without a reseal the checksum catches it first
  EXPECT_TRUE(HasCode(DecodeHeader(b), Code::kCorruption, "checksum"));
  HeaderBytes c = EncodeHeader(SampleHeader());
  c[4095] ^= 0x40;  // the stored checksum itself
  EXPECT_TRUE(HasCode(DecodeHeader(c), Code::kCorruption, "checksum"));
}

TEST(FileHeader, ReservedBytesMustBeZero) {
  const HeaderBytes good = EncodeHeader(SampleHeader());  // 3 streams, model id of 23 bytes
  std::vector<size_t> reserved;
  for (size_t i = 68; i < 128; ++i) reserved.push_back(i);               // after model id length
  for (size_t i = 128 + 23; i < 384; ++i) reserved.push_back(i);         // model id padding
  for (size_t i = Desc(3); i < 4088; ++i) reserved.push_back(i);         // unused descriptors + tail
  for (size_t s = 0; s < 3; ++s) {
    size_t name_len = s == 2 ? 8 : 1;
    for (size_t i = name_len + 1; i < 32; ++i) reserved.push_back(Desc(s) + i);  // name padding
    for (size_t i = 33; i < 36; ++i) reserved.push_back(Desc(s) + i);
    for (size_t i = 44; i < 64; ++i) reserved.push_back(Desc(s) + i);
  }
  for (size_t i : reserved) {
    HeaderBytes b = good;
    b[i] = 0x01;
    Reseal(b);
    ASSERT_TRUE(HasCode(DecodeHeader(b), Code::kCorruption)) << "byte " << i;
  }
  // The message names where.
  HeaderBytes b = good;
  b[100] = 7;
  Reseal(b);
  EXPECT_TRUE(HasCode(DecodeHeader(b), Code::kCorruption, "reserved header bytes"));
  HeaderBytes c = good;
  c[Desc(1) + 50] = 7;
  Reseal(c);
  EXPECT_TRUE(HasCode(DecodeHeader(c), Code::kCorruption, "reserved stream descriptor"));
  HeaderBytes d = good;
  d[Desc(5)] = 'x';
  Reseal(d);
  EXPECT_TRUE(HasCode(DecodeHeader(d), Code::kCorruption, "unused stream descriptor"));
  HeaderBytes e = good;
  e[300] = 'x';
  Reseal(e);
  EXPECT_TRUE(HasCode(DecodeHeader(e), Code::kCorruption, "model id padding"));
}

// Sets a little-endian u32 field of an encoded header and reseals it.
HeaderBytes WithU32(size_t offset, uint32_t v) {
  HeaderBytes b = EncodeHeader(SampleHeader());
  StoreU32(b.data() + offset, v);
  Reseal(b);
  return b;
}

TEST(FileHeader, LayerCountLimits) {
  EXPECT_TRUE(HasCode(DecodeHeader(WithU32(48, 0)), Code::kCorruption, "layer count"));
  EXPECT_TRUE(HasCode(DecodeHeader(WithU32(48, 1025)), Code::kCorruption, "layer count"));
  EXPECT_TRUE(HasCode(DecodeHeader(WithU32(48, 0xFFFFFFFFu)), Code::kCorruption, "layer count"));
  FileHeader d;
  ASSERT_TRUE(DecodeHeader(WithU32(48, 1024), &d).ok());
  EXPECT_EQ(d.geometry.layers, 1024u);
  ASSERT_TRUE(DecodeHeader(WithU32(48, 1), &d).ok());
  EXPECT_EQ(d.geometry.layers, 1u);
}

TEST(FileHeader, StreamCountLimits) {
  EXPECT_TRUE(HasCode(DecodeHeader(WithU32(52, 0)), Code::kCorruption, "stream count"));
  EXPECT_TRUE(HasCode(DecodeHeader(WithU32(52, 17)), Code::kCorruption, "stream count"));
  EXPECT_TRUE(HasCode(DecodeHeader(WithU32(52, 0xFFFFFFFFu)), Code::kCorruption, "stream count"));
  // 16 streams: the maximum.
  FileHeader h = SampleHeader();
  h.geometry.streams.clear();
  for (int i = 0; i < 16; ++i) h.geometry.streams.push_back({"s" + std::to_string(i), 1, 8, Dtype::kE4M3});
  FileHeader d;
  ASSERT_TRUE(DecodeHeader(EncodeHeader(h), &d).ok());
  EXPECT_EQ(d.geometry.streams.size(), 16u);
  // Fewer streams than descriptors in use: the extra descriptor is not zero.
  EXPECT_TRUE(HasCode(DecodeHeader(WithU32(52, 2)), Code::kCorruption, "unused stream descriptor"));
}

TEST(FileHeader, RowsPerTokenLimits) {
  EXPECT_TRUE(HasCode(DecodeHeader(WithU32(Desc(1) + 36, 0)), Code::kCorruption, "rows per token"));
  EXPECT_TRUE(HasCode(DecodeHeader(WithU32(Desc(1) + 36, 1025)), Code::kCorruption, "rows per token"));
  FileHeader d;
  ASSERT_TRUE(DecodeHeader(WithU32(Desc(1) + 36, 1024), &d).ok());
  EXPECT_EQ(d.geometry.streams[1].rows_per_token, 1024u);
}

TEST(FileHeader, RowWidthLimits) {
  EXPECT_TRUE(HasCode(DecodeHeader(WithU32(Desc(2) + 40, 0)), Code::kCorruption, "row width"));
  EXPECT_TRUE(HasCode(DecodeHeader(WithU32(Desc(2) + 40, 65537)), Code::kCorruption, "row width"));
  FileHeader d;
  ASSERT_TRUE(DecodeHeader(WithU32(Desc(2) + 40, 65536), &d).ok());
  EXPECT_EQ(d.geometry.streams[2].row_width, 65536u);
}

TEST(FileHeader, ChunkTokensLimits) {
  EXPECT_TRUE(HasCode(DecodeHeader(WithU32(56, 0)), Code::kCorruption, "chunk tokens"));
  EXPECT_TRUE(HasCode(DecodeHeader(WithU32(56, 65537)), Code::kCorruption, "chunk tokens"));
  FileHeader d;
  ASSERT_TRUE(DecodeHeader(WithU32(56, 65536), &d).ok());
  EXPECT_EQ(d.chunk_tokens, 65536u);
  ASSERT_TRUE(DecodeHeader(WithU32(56, 1), &d).ok());
  EXPECT_EQ(d.chunk_tokens, 1u);
}

TEST(FileHeader, OtherFixedFields) {
  EXPECT_TRUE(HasCode(DecodeHeader(WithU32(12, 4097)), Code::kCorruption, "header size"));
  EXPECT_TRUE(HasCode(DecodeHeader(WithU32(12, 0)), Code::kCorruption, "header size"));
  EXPECT_TRUE(HasCode(DecodeHeader(WithU32(60, 12289)), Code::kCorruption, "data offset"));
  EXPECT_TRUE(HasCode(DecodeHeader(WithU32(60, 4096)), Code::kCorruption, "data offset"));
  EXPECT_TRUE(HasCode(DecodeHeader(WithU32(64, 256)), Code::kCorruption, "model id length"));
  EXPECT_TRUE(HasCode(DecodeHeader(WithU32(64, 0xFFFFFFFFu)), Code::kCorruption, "model id length"));
  // A length shorter than the stored id leaves nonzero "padding".
  EXPECT_TRUE(HasCode(DecodeHeader(WithU32(64, 5)), Code::kCorruption, "model id"));
  // A length covering a NUL.
  EXPECT_TRUE(HasCode(DecodeHeader(WithU32(64, 24)), Code::kCorruption, "model id"));
  HeaderBytes b = EncodeHeader(SampleHeader());
  StoreU64(b.data() + 32, 0);
  Reseal(b);
  EXPECT_TRUE(HasCode(DecodeHeader(b), Code::kCorruption, "salt"));
}

TEST(FileHeader, InvalidStreamDescriptors) {
  for (uint8_t dtype : {uint8_t{0}, uint8_t{7}, uint8_t{0xFF}}) {
    HeaderBytes b = EncodeHeader(SampleHeader());
    b[Desc(1) + 32] = dtype;
    Reseal(b);
    EXPECT_TRUE(HasCode(DecodeHeader(b), Code::kCorruption, "dtype")) << int(dtype);
  }
  HeaderBytes upper = EncodeHeader(SampleHeader());
  upper[Desc(0)] = 'K';
  Reseal(upper);
  EXPECT_TRUE(HasCode(DecodeHeader(upper), Code::kCorruption, "stream name"));
  HeaderBytes empty = EncodeHeader(SampleHeader());
  empty[Desc(0)] = 0;
  Reseal(empty);
  EXPECT_TRUE(HasCode(DecodeHeader(empty), Code::kCorruption));
  HeaderBytes dup = EncodeHeader(SampleHeader());
  dup[Desc(1)] = 'k';  // "k" twice
  Reseal(dup);
  EXPECT_TRUE(HasCode(DecodeHeader(dup), Code::kCorruption, "twice"));
  HeaderBytes full = EncodeHeader(SampleHeader());
  std::memset(full.data() + Desc(0), 'a', 32);  // 32 name bytes, no NUL
  Reseal(full);
  EXPECT_TRUE(HasCode(DecodeHeader(full), Code::kCorruption));
}

TEST(FileHeader, UnknownMajorVersionIsUnsupported) {
  for (uint16_t major : {uint16_t{0}, uint16_t{3}, uint16_t{4}, uint16_t{0xFFFF}}) {
    HeaderBytes b = EncodeHeader(SampleHeader());
    StoreU16(b.data() + 8, major);
    Reseal(b);
    EXPECT_TRUE(HasCode(DecodeHeader(b), Code::kUnsupported, std::to_string(major))) << major;
    // A future version may change the checksum too: still "unsupported".
    b[4090] ^= 0xFF;
    EXPECT_TRUE(HasCode(DecodeHeader(b), Code::kUnsupported)) << major;
  }
  // A future version with the rest of its header laid out differently.
  HeaderBytes f{};
  std::memcpy(f.data(), kFileMagic, 8);
  StoreU16(f.data() + 8, 3);
  std::memset(f.data() + 12, 0xAB, 4000);
  EXPECT_TRUE(HasCode(DecodeHeader(f), Code::kUnsupported));
}

TEST(FileHeader, NewerMinorVersionIsAccepted) {
  HeaderBytes b = EncodeHeader(SampleHeader());
  StoreU16(b.data() + 10, 7);
  Reseal(b);
  FileHeader d;
  ASSERT_TRUE(DecodeHeader(b, &d).ok());
  EXPECT_EQ(d.minor, 7);
}

TEST(FileHeader, TheAppendEndsFlagIsKnownInV2Only) {
  HeaderBytes b = EncodeHeader(SampleHeader());
  StoreU64(b.data() + 16, kFlagAppendEnds);
  Reseal(b);
  FileHeader d;
  ASSERT_TRUE(DecodeHeader(b, &d).ok());
  EXPECT_EQ(d.required_flags, kFlagAppendEnds);
  StoreU16(b.data() + 8, 1);  // the same flag in a v1 header
  Reseal(b);
  EXPECT_TRUE(HasCode(DecodeHeader(b), Code::kUnsupported, "required flags"));
}

TEST(FileHeader, UnknownRequiredFlagsAreUnsupported) {
  // Bit 1 (NVFP4) is known since 2.2, bit 2 (LAYER_SETS) since 2.3: bits
  // from 3 up are not.
  for (uint64_t flags : {uint64_t{8}, uint64_t{0x10}, uint64_t{9}, uint64_t{0xF}, uint64_t{1} << 63, ~uint64_t{0}}) {
    HeaderBytes b = EncodeHeader(SampleHeader());
    StoreU64(b.data() + 16, flags);
    Reseal(b);
    EXPECT_TRUE(HasCode(DecodeHeader(b), Code::kUnsupported, "required flags")) << flags;
  }
}

TEST(FileHeader, RequiredFlagsMessageShowsTheFlagsInHex) {
  // The message prints "0x" before the value, so the value must be hex.
  HeaderBytes b = EncodeHeader(SampleHeader());
  StoreU64(b.data() + 16, 0x10);
  Reseal(b);
  Status st = DecodeHeader(b);
  EXPECT_TRUE(HasCode(st, Code::kUnsupported, "0x10")) << st.message();
  EXPECT_EQ(st.message().find("0x16"), std::string::npos) << st.message();
}

// A header with an nvfp4 stream (2.2): the NVFP4 flag (bit 1) is set
// exactly when a stream is nvfp4; v1 has no nvfp4.
FileHeader Nvfp4Header() {
  FileHeader h = SampleHeader();
  h.minor = kMinorNvfp4;
  h.required_flags = kFlagAppendEnds | kFlagNvfp4;
  h.geometry.streams[1].dtype = Dtype::kNvfp4;
  return h;
}

TEST(FileHeader, Nvfp4StreamAndItsFlagGoTogether) {
  EXPECT_EQ(kFlagNvfp4, 2u);
  HeaderBytes b = EncodeHeader(Nvfp4Header());
  EXPECT_EQ(b[Desc(1) + 32], 6);
  EXPECT_EQ(LoadU64(b.data() + 16), 3u);
  EXPECT_EQ(LoadU16(b.data() + 10), 2u);
  FileHeader d;
  ASSERT_TRUE(DecodeHeader(b, &d).ok());
  EXPECT_EQ(d.geometry, Nvfp4Header().geometry);
  EXPECT_EQ(d.required_flags, 3u);
  // The stream without the flag, the flag without the stream: invalid.
  HeaderBytes no_flag = b;
  StoreU64(no_flag.data() + 16, kFlagAppendEnds);
  Reseal(no_flag);
  EXPECT_TRUE(HasCode(DecodeHeader(no_flag), Code::kCorruption, "nvfp4 stream without the NVFP4 required flag"));
  HeaderBytes no_stream = b;
  no_stream[Desc(1) + 32] = 2;
  Reseal(no_stream);
  EXPECT_TRUE(HasCode(DecodeHeader(no_stream), Code::kCorruption, "NVFP4 required flag without an nvfp4 stream"));
  FileHeader v1 = Nvfp4Header();
  v1.major = kMajorV1;
  v1.minor = 0;
  v1.required_flags = 0;
  v1.geometry.streams[0].dtype = Dtype::kBF16;  // only "v" is not raw
  EXPECT_TRUE(HasCode(ValidateFileHeader(v1), Code::kInvalidArgument, "stream 'v': v1 files store raw rows only"));
}

// A stream in some layers only (2.3): its layer set is the header's bitmap
// at 1408 + 128 * stream, with the LAYER_SETS flag (bit 2) set exactly then;
// a header without the flag keeps those bytes reserved (zero).
FileHeader LayerSetHeader() {
  FileHeader h = SampleHeader();
  h.minor = kMinorLayerSets;
  h.required_flags = kFlagAppendEnds | kFlagLayerSets;
  h.geometry.streams[2].layers = {0, 9, 31};
  return h;
}

TEST(FileHeader, LayerSetsAndTheirFlagGoTogether) {
  EXPECT_EQ(kFlagLayerSets, 4u);
  HeaderBytes b = EncodeHeader(LayerSetHeader());
  EXPECT_EQ(LoadU16(b.data() + 10), 3u);
  EXPECT_EQ(LoadU64(b.data() + 16), 5u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(b[1408 + i], 0xFF) << i;  // "k": 32 layers
  EXPECT_EQ(b[1408 + 4], 0);
  EXPECT_EQ(b[1408 + 256 + 0], 0x01);  // "idx.x-1_": layers 0, 9, 31
  EXPECT_EQ(b[1408 + 256 + 1], 0x02);
  EXPECT_EQ(b[1408 + 256 + 3], 0x80);
  EXPECT_TRUE(std::all_of(b.begin() + 1408 + 3 * 128, b.begin() + 4088, [](uint8_t x) { return x == 0; }));
  FileHeader d;
  ASSERT_TRUE(DecodeHeader(b, &d).ok());
  EXPECT_EQ(d.geometry, LayerSetHeader().geometry);
  // Without the flag the bitmaps are reserved bytes.
  HeaderBytes no_flag = b;
  StoreU64(no_flag.data() + 16, kFlagAppendEnds);
  Reseal(no_flag);
  EXPECT_TRUE(HasCode(DecodeHeader(no_flag), Code::kCorruption, "reserved header bytes are not zero (header offset 1408)"));
  // A layer past the layer count, a stream in no layer, an unused
  // descriptor's bitmap, the flag with every stream in every layer.
  HeaderBytes past = b;
  past[1408 + 256 + 4] = 1;
  Reseal(past);
  EXPECT_TRUE(HasCode(DecodeHeader(past), Code::kCorruption, "stream 'idx.x-1_' is in layer 32 of 32 (offset 1664)"));
  HeaderBytes none = b;
  std::memset(none.data() + 1408 + 256, 0, 128);
  Reseal(none);
  EXPECT_TRUE(HasCode(DecodeHeader(none), Code::kCorruption, "stream 'idx.x-1_' is in no layer (offset 1664)"));
  HeaderBytes unused = b;
  unused[1408 + 3 * 128] = 1;
  Reseal(unused);
  EXPECT_TRUE(HasCode(DecodeHeader(unused), Code::kCorruption, "unused layer set 3 is not zero (offset 1792)"));
  HeaderBytes full = b;
  std::memset(full.data() + 1408 + 256, 0xFF, 4);
  Reseal(full);
  EXPECT_TRUE(HasCode(DecodeHeader(full), Code::kCorruption, "the LAYER_SETS required flag with every stream in every layer"));
  // v1 has none; a layer list must be ascending and not every layer.
  FileHeader v1 = LayerSetHeader();
  v1.major = kMajorV1;
  v1.minor = 0;
  v1.required_flags = 0;
  for (StreamSpec& s : v1.geometry.streams) s.dtype = Dtype::kBF16;
  EXPECT_TRUE(HasCode(ValidateFileHeader(v1), Code::kInvalidArgument, "v1 files keep every stream in every layer"));
  Geometry g = LayerSetHeader().geometry;
  g.streams[2].layers = {9, 0};
  EXPECT_TRUE(HasCode(g.Validate(), Code::kInvalidArgument, "stream 'idx.x-1_': its layers are not ascending without repeats"));
  g.streams[2].layers.clear();
  for (uint32_t l = 0; l < 32; ++l) g.streams[2].layers.push_back(l);
  EXPECT_TRUE(HasCode(g.Validate(), Code::kInvalidArgument, "stream 'idx.x-1_': lists every layer"));
}

TEST(LayerList, ParsesAndFormatsRanges) {
  std::vector<uint32_t> l;
  ASSERT_TRUE(ParseLayerList("0..3,7,9..10", &l).ok());
  EXPECT_EQ(l, (std::vector<uint32_t>{0, 1, 2, 3, 7, 9, 10}));
  EXPECT_EQ(FormatLayerList(l), "0..3,7,9,10");
  EXPECT_EQ(ParseLayerList("3,2", &l).message(), "layer list '3,2': layers are not ascending without repeats");
  EXPECT_EQ(ParseLayerList("1,,2", &l).message(), "layer list '1,,2': '' is not a layer number or a range A..B");
  EXPECT_EQ(ParseLayerList("5..1", &l).message(), "layer list '5..1': range '5..1' runs backwards");
  EXPECT_EQ(ParseLayerList("1024", &l).message(), "layer list '1024': layer 1024 is past the format's 1024 layers");
}

TEST(FileHeader, UnknownOptionalFlagsAreKept) {
  HeaderBytes b = EncodeHeader(SampleHeader());
  StoreU64(b.data() + 24, 0xFFFF0000FFFF0000ull);
  Reseal(b);
  FileHeader d;
  ASSERT_TRUE(DecodeHeader(b, &d).ok());
  EXPECT_EQ(d.optional_flags, 0xFFFF0000FFFF0000ull);
}

TEST(FileHeader, ValidateRefusesBadHeaders) {
  FileHeader h = SampleHeader();
  ASSERT_TRUE(ValidateFileHeader(h).ok());
  FileHeader a = h;
  a.identity.model_id = std::string(256, 'm');
  EXPECT_TRUE(HasCode(ValidateFileHeader(a), Code::kInvalidArgument, "model id"));
  a.identity.model_id = std::string(255, 'm');
  EXPECT_TRUE(ValidateFileHeader(a).ok());
  a.identity.model_id = std::string("ab\0cd", 5);
  EXPECT_TRUE(HasCode(ValidateFileHeader(a), Code::kInvalidArgument, "NUL"));
  FileHeader c = h;
  c.chunk_tokens = 0;
  EXPECT_TRUE(HasCode(ValidateFileHeader(c), Code::kInvalidArgument, "chunk tokens"));
  c.chunk_tokens = 65537;
  EXPECT_TRUE(HasCode(ValidateFileHeader(c), Code::kInvalidArgument, "chunk tokens"));
  FileHeader s = h;
  s.salt = 0;
  EXPECT_TRUE(HasCode(ValidateFileHeader(s), Code::kInvalidArgument, "salt"));
  FileHeader m = h;
  m.major = 3;
  EXPECT_TRUE(HasCode(ValidateFileHeader(m), Code::kInvalidArgument, "major"));
  FileHeader g = h;
  g.geometry.layers = 0;
  EXPECT_TRUE(HasCode(ValidateFileHeader(g), Code::kInvalidArgument, "layer count"));
}

// ---- commit slots ---------------------------------------------------------------

TEST(CommitRecord, RoundTrip) {
  CommitRecord c = SampleCommit();
  SlotBytes b = EncodeSlot(c);
  CommitRecord d;
  ASSERT_TRUE(DecodeSlot(b, &d).ok()) << DecodeSlot(b).ToString();
  EXPECT_EQ(c, d);
  // The empty state a new file starts with.
  CommitRecord e;
  e.sequence = 2;
  e.salt = 9;
  e.epoch = 1;
  ASSERT_TRUE(DecodeSlot(EncodeSlot(e), &d).ok());
  EXPECT_EQ(e, d);
  EXPECT_EQ(d.end, 12288u);
  // Large values survive.
  CommitRecord big;
  big.sequence = ~0ull;
  big.salt = ~0ull;
  big.epoch = ~0u;
  big.tokens = 1ull << 40;
  big.chunks = 1ull << 30;
  big.end = 12288 + (1ull << 50);
  ASSERT_TRUE(DecodeSlot(EncodeSlot(big), &d).ok());
  EXPECT_EQ(big, d);
}

TEST(CommitRecord, BytesSitWhereTheSpecSays) {
  SlotBytes b = EncodeSlot(SampleCommit());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b.data()), 4), "KVCM");
  for (size_t i = 4; i < 8; ++i) EXPECT_EQ(b[i], 0);
  EXPECT_EQ(LoadU64(b.data() + 8), 7u);
  EXPECT_EQ(LoadU64(b.data() + 16), 0x1122334455667788ull);
  EXPECT_EQ(LoadU32(b.data() + 24), 3u);
  for (size_t i = 28; i < 32; ++i) EXPECT_EQ(b[i], 0);
  EXPECT_EQ(LoadU64(b.data() + 32), 1000u);
  EXPECT_EQ(LoadU64(b.data() + 40), 12288u + 5 * 4096);
  EXPECT_EQ(LoadU64(b.data() + 48), 4u);
  for (size_t i = 56; i < 4088; ++i) ASSERT_EQ(b[i], 0) << i;
  EXPECT_EQ(LoadU64(b.data() + 4088), XXH3_64bits(b.data(), 4088));
}

TEST(CommitRecord, EveryBitFlipIsRefused) {
  const SlotBytes good = EncodeSlot(SampleCommit());
  ASSERT_TRUE(DecodeSlot(good).ok());
  for (size_t bit = 0; bit < 4096 * 8; ++bit) {
    SlotBytes b = good;
    b[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    Status st = DecodeSlot(b);
    ASSERT_EQ(st.code(), Code::kCorruption) << "bit " << bit << ": " << st.ToString();
  }
}

TEST(CommitRecord, EveryResealedByteChangeIsRefusedOrDecodedDifferently) {
  const CommitRecord c = SampleCommit();
  const SlotBytes good = EncodeSlot(c);
  for (size_t i = 0; i < 4088; ++i) {
    SlotBytes b = good;
    b[i] ^= 0x01;
    Reseal(b);
    CommitRecord d;
    Status st = DecodeSlot(b, &d);
    if (st.ok()) {
      ASSERT_NE(c, d) << "byte " << i << " is ignored";
    }
  }
}

TEST(CommitRecord, BadMagic) {
  for (size_t i = 0; i < 4; ++i) {
    SlotBytes b = EncodeSlot(SampleCommit());
    b[i] ^= 0x01;
    Reseal(b);
    EXPECT_TRUE(HasCode(DecodeSlot(b), Code::kCorruption, "magic")) << i;
  }
  SlotBytes zeros{};
  EXPECT_TRUE(HasCode(DecodeSlot(zeros), Code::kCorruption));
}

TEST(CommitRecord, ChecksumMismatch) {
  SlotBytes b = EncodeSlot(SampleCommit());
  b[33] ^= 0x04;  // tokens
  EXPECT_TRUE(HasCode(DecodeSlot(b), Code::kCorruption, "checksum"));
}

TEST(CommitRecord, ReservedBytesMustBeZero) {
  const SlotBytes good = EncodeSlot(SampleCommit());
  std::vector<size_t> reserved;
  for (size_t i = 4; i < 8; ++i) reserved.push_back(i);
  for (size_t i = 28; i < 32; ++i) reserved.push_back(i);
  for (size_t i = 56; i < 4088; ++i) reserved.push_back(i);
  for (size_t i : reserved) {
    SlotBytes b = good;
    b[i] = 0x80;
    Reseal(b);
    ASSERT_TRUE(HasCode(DecodeSlot(b), Code::kCorruption, "reserved")) << "byte " << i;
  }
}

TEST(CommitRecord, InconsistentFieldsAreRefused) {
  auto refused = [](CommitRecord c) { return DecodeSlot(EncodeSlot(c)).code() == Code::kCorruption; };
  CommitRecord c = SampleCommit();
  c.sequence = 0;
  EXPECT_TRUE(refused(c));
  c = SampleCommit();
  c.epoch = 0;  // epochs start at 1
  EXPECT_TRUE(refused(c));
  c.epoch = 0xFFFFFFFFu;
  EXPECT_FALSE(refused(c));
  c = SampleCommit();
  c.end = 12288 + 5 * 4096 + 1;  // not a block boundary
  EXPECT_TRUE(refused(c));
  c.end = 8192;  // before the data
  EXPECT_TRUE(refused(c));
  c = SampleCommit();
  c.chunks = 6;  // more chunks than 4096-byte blocks (5)
  EXPECT_TRUE(refused(c));
  c.chunks = 5;
  EXPECT_FALSE(refused(c));
  c = SampleCommit();
  c.tokens = 3;  // fewer tokens than chunks (4)
  EXPECT_TRUE(refused(c));
  c.tokens = 4;
  EXPECT_FALSE(refused(c));
  c = SampleCommit();
  c.chunks = 0;  // tokens without chunks
  EXPECT_TRUE(refused(c));
  c = SampleCommit();
  c.tokens = 0;  // chunks without tokens
  EXPECT_TRUE(refused(c));
  c = SampleCommit();
  c.end = 12288;  // chunks and tokens, but no bytes
  EXPECT_TRUE(refused(c));
  c.tokens = 0;
  c.chunks = 0;
  EXPECT_FALSE(refused(c));
  c.end = 12288 + 4096;  // bytes but no chunks
  EXPECT_TRUE(refused(c));
}

// ---- chunk headers ----------------------------------------------------------------

TEST(ChunkHeader, RoundTrip) {
  ChunkHeader c = SampleChunkHeader();
  ChunkHeadBytes b = EncodeChunk(c);
  ChunkHeader d;
  ASSERT_TRUE(DecodeChunk(b, &d).ok()) << DecodeChunk(b).ToString();
  EXPECT_TRUE(SameChunk(c, d));
  ChunkHeader e;
  e.token_count = 65536;
  e.salt = ~0ull;
  e.first_token = ~0ull;
  e.chunk_offset = ~0ull;
  e.chunk_bytes = 1ull << 30;
  e.epoch = ~0u;
  e.append_end = 65536;
  ASSERT_TRUE(DecodeChunk(EncodeChunk(e), &d).ok());
  EXPECT_TRUE(SameChunk(e, d));
  e.token_count = 1;
  e.chunk_bytes = 4096;
  e.append_end = 0;
  ASSERT_TRUE(DecodeChunk(EncodeChunk(e), &d).ok());
  EXPECT_TRUE(SameChunk(e, d));
}

TEST(ChunkHeader, BytesSitWhereTheSpecSays) {
  ChunkHeadBytes b = EncodeChunk(SampleChunkHeader());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b.data()), 4), "KVCK");
  EXPECT_EQ(LoadU32(b.data() + 4), 256u);
  EXPECT_EQ(LoadU64(b.data() + 8), 0x1122334455667788ull);
  EXPECT_EQ(LoadU64(b.data() + 16), 512u);
  EXPECT_EQ(LoadU64(b.data() + 24), 12288u + 8192);
  EXPECT_EQ(LoadU64(b.data() + 32), 8192u);
  EXPECT_EQ(LoadU32(b.data() + 40), 2u);
  EXPECT_EQ(LoadU32(b.data() + 44), 100u);
  for (size_t i = 48; i < 64; ++i) EXPECT_EQ(b[i], 0) << i;
}

TEST(ChunkHeader, EveryByteChangeIsRefusedOrDecodedDifferently) {
  const ChunkHeader c = SampleChunkHeader();
  const ChunkHeadBytes good = EncodeChunk(c);
  for (size_t i = 0; i < 64; ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      ChunkHeadBytes b = good;
      b[i] ^= static_cast<uint8_t>(1u << bit);
      ChunkHeader d;
      Status st = DecodeChunk(b, &d);
      if (st.ok()) {
        ASSERT_FALSE(SameChunk(c, d)) << "byte " << i << " bit " << bit << " is ignored";
      } else {
        ASSERT_EQ(st.code(), Code::kCorruption);
      }
    }
  }
}

TEST(ChunkHeader, BadMagic) {
  for (size_t i = 0; i < 4; ++i) {
    ChunkHeadBytes b = EncodeChunk(SampleChunkHeader());
    b[i] ^= 0x10;
    EXPECT_TRUE(HasCode(DecodeChunk(b), Code::kCorruption, "magic")) << i;
  }
}

TEST(ChunkHeader, ReservedBytesMustBeZero) {
  for (size_t i = 48; i < 64; ++i) {
    ChunkHeadBytes b = EncodeChunk(SampleChunkHeader());
    b[i] = 1;
    EXPECT_TRUE(HasCode(DecodeChunk(b), Code::kCorruption, "reserved")) << i;
  }
}

// In a 2.0 file (no kFlagAppendEnds) the append_end bytes are reserved.
TEST(ChunkHeader, AppendEndIsReservedWithoutTheFlag) {
  ChunkHeader c = SampleChunkHeader();
  ChunkHeader d;
  EXPECT_TRUE(HasCode(DecodeChunk(EncodeChunk(c), &d, /*append_ends=*/false), Code::kCorruption, "reserved"));
  c.append_end = 0;
  ASSERT_TRUE(DecodeChunk(EncodeChunk(c), &d, /*append_ends=*/false).ok());
  EXPECT_EQ(d.append_end, 0u);
  for (size_t i = 44; i < 64; ++i) {
    ChunkHeadBytes b = EncodeChunk(c);
    b[i] = 1;
    EXPECT_TRUE(HasCode(DecodeChunk(b, nullptr, false), Code::kCorruption, "reserved")) << i;
  }
}

TEST(ChunkHeader, AppendEndAtMostTheTokenCount) {
  ChunkHeader c = SampleChunkHeader();
  c.append_end = c.token_count;
  EXPECT_TRUE(DecodeChunk(EncodeChunk(c)).ok());
  c.append_end = c.token_count + 1;
  EXPECT_TRUE(HasCode(DecodeChunk(EncodeChunk(c)), Code::kCorruption, "append end"));
  c.append_end = ~0u;
  EXPECT_TRUE(HasCode(DecodeChunk(EncodeChunk(c)), Code::kCorruption, "append end"));
}

TEST(ChunkHeader, TokenCountLimits) {
  ChunkHeader c = SampleChunkHeader();
  c.token_count = 0;
  EXPECT_TRUE(HasCode(DecodeChunk(EncodeChunk(c)), Code::kCorruption, "token count"));
  c.token_count = 65537;
  EXPECT_TRUE(HasCode(DecodeChunk(EncodeChunk(c)), Code::kCorruption, "token count"));
  c.token_count = 65536;
  EXPECT_TRUE(DecodeChunk(EncodeChunk(c)).ok());
}

TEST(ChunkHeader, ChunkBytesLimits) {
  ChunkHeader c = SampleChunkHeader();
  for (uint64_t bytes : {uint64_t{0}, uint64_t{64}, uint64_t{4095}, uint64_t{4097},
                         uint64_t{8192 + 64}, (uint64_t{1} << 30) + 4096, ~uint64_t{0} - 4095}) {
    c.chunk_bytes = bytes;
    EXPECT_TRUE(HasCode(DecodeChunk(EncodeChunk(c)), Code::kCorruption, "chunk size")) << bytes;
  }
  c.chunk_bytes = uint64_t{1} << 30;
  EXPECT_TRUE(DecodeChunk(EncodeChunk(c)).ok());
}

// ---- chunk layout -------------------------------------------------------------------

Geometry Tiny(Dtype d = Dtype::kE4M3) {
  Geometry g;
  g.layers = 2;
  g.streams = {{"k", 2, 16, d}, {"v", 2, 16, d}};
  return g;
}

TEST(ChunkLayout, TinyThreeTokensByHand) {
  // tiny: 2 layers; streams k, v: 2 rows of 16 e4m3 codes per token. T = 3.
  // head: 64 (header) + 8*2*2 = 32 (section checksums) -> tokens at 96;
  //       96 + 4*3 = 108, + 8 (head checksum) = 116 -> aligned to 64: 128.
  //       head checksum at 128 - 8 = 120.
  // each section: 3 tokens * 2 rows = 6 rows; codes 6*16 = 96 bytes -> 128
  //       (64-aligned), scales 6*4 = 24 bytes -> 64; 192 bytes per section.
  //   (0,k): 128, scales at 128+128 = 256, end 320
  //   (0,v): 320, scales at 448, end 512
  //   (1,k): 512, scales at 640, end 704
  //   (1,v): 704, scales at 832, data ends at 896 -> chunk is 4096 bytes.
  ChunkLayout l;
  ASSERT_TRUE(ComputeChunkLayout(Tiny(), 3, &l).ok());
  EXPECT_EQ(l.token_count, 3u);
  EXPECT_EQ(l.layers, 2u);
  EXPECT_EQ(l.streams, 2u);
  EXPECT_EQ(l.section_checksums_offset, 64u);
  EXPECT_EQ(l.tokens_offset, 96u);
  EXPECT_EQ(l.head_bytes, 128u);
  EXPECT_EQ(l.head_checksum_offset, 120u);
  EXPECT_EQ(l.chunk_bytes, 4096u);
  ASSERT_EQ(l.sections.size(), 4u);
  const uint64_t want[4][4] = {
      // offset, scales_offset, end, (data_bytes, scales_bytes are 96 and 24)
      {128, 256, 320, 0},
      {320, 448, 512, 0},
      {512, 640, 704, 0},
      {704, 832, 4096, 0},
  };
  for (size_t i = 0; i < 4; ++i) {
    const SectionLayout& s = l.sections[i];
    EXPECT_EQ(s.offset, want[i][0]) << i;
    EXPECT_EQ(s.data_bytes, 96u) << i;
    EXPECT_EQ(s.scales_offset, want[i][1]) << i;
    EXPECT_EQ(s.scales_bytes, 24u) << i;
    EXPECT_EQ(s.end, want[i][2]) << i;
  }
  EXPECT_EQ(&l.section(1, 0), &l.sections[2]);
  EXPECT_EQ(HeadBytes(Tiny(), 3), 128u);
}

TEST(ChunkLayout, TinyOneTokenByHand) {
  // T = 1: head 64 + 32 + 4 + 8 = 108 -> 128. Section: 2 rows; codes 32 -> 64,
  // scales 8 -> 64; 128 bytes each: 128, 256, 384, 512; data ends at 640.
  ChunkLayout l;
  ASSERT_TRUE(ComputeChunkLayout(Tiny(Dtype::kE5M2), 1, &l).ok());
  EXPECT_EQ(l.head_bytes, 128u);
  EXPECT_EQ(l.chunk_bytes, 4096u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(l.sections[i].offset, 128u + 128 * i);
    EXPECT_EQ(l.sections[i].data_bytes, 32u);
    EXPECT_EQ(l.sections[i].scales_offset, 192u + 128 * i);
    EXPECT_EQ(l.sections[i].scales_bytes, 8u);
  }
  EXPECT_EQ(l.sections[3].end, 4096u);
}

TEST(ChunkLayout, MixedRawAndFp8ByHand) {
  // 1 layer; "latent" 1 row of 512 e4m3, "indexer" 1 row of 128 bf16.
  // T = 6: head 64 + 8*2 = 80 (tokens) + 24 = 104, + 8 = 112 -> 128.
  // latent: codes 6*512 = 3072 -> [128, 3200); scales 24 -> [3200, 3264).
  // indexer: 6*128*2 = 1536 bytes at 3264 -> 4800, no scales (scales_offset
  // is where they would be: 4800); chunk = 8192.
  Geometry g;
  g.layers = 1;
  g.streams = {{"latent", 1, 512, Dtype::kE4M3}, {"indexer", 1, 128, Dtype::kBF16}};
  ChunkLayout l;
  ASSERT_TRUE(ComputeChunkLayout(g, 6, &l).ok());
  EXPECT_EQ(l.tokens_offset, 80u);
  EXPECT_EQ(l.head_bytes, 128u);
  EXPECT_EQ(l.head_checksum_offset, 120u);
  EXPECT_EQ(l.sections[0].offset, 128u);
  EXPECT_EQ(l.sections[0].data_bytes, 3072u);
  EXPECT_EQ(l.sections[0].scales_offset, 3200u);
  EXPECT_EQ(l.sections[0].scales_bytes, 24u);
  EXPECT_EQ(l.sections[0].end, 3264u);
  EXPECT_EQ(l.sections[1].offset, 3264u);
  EXPECT_EQ(l.sections[1].data_bytes, 1536u);
  EXPECT_EQ(l.sections[1].scales_bytes, 0u);
  EXPECT_EQ(l.sections[1].scales_offset, 4800u);
  EXPECT_EQ(l.sections[1].end, 8192u);
  EXPECT_EQ(l.chunk_bytes, 8192u);
  // T = 5: latent [128, 2688) + scales [2688, 2752); indexer 1280 bytes
  // [2752, 4032): fits one block exactly -> 4096.
  ASSERT_TRUE(ComputeChunkLayout(g, 5, &l).ok());
  EXPECT_EQ(l.sections[1].offset, 2752u);
  EXPECT_EQ(l.chunk_bytes, 4096u);
}

void CheckLayoutInvariants(const Geometry& g, uint32_t t);

TEST(ChunkLayout, ExactFitNeedsNoExtraBlock) {
  // 1 layer, one bf16 stream of 1 row x 1984; T = 1.
  // head: 64 + 8 (one section checksum) + 4 (one token) + 8 = 84 -> 128.
  // data: 1984 * 2 = 3968 bytes at 128: ends at 4096 exactly, so the chunk
  // is one block with no padding at all.
  Geometry g;
  g.layers = 1;
  g.streams = {{"x", 1, 1984, Dtype::kBF16}};
  ChunkLayout l;
  ASSERT_TRUE(ComputeChunkLayout(g, 1, &l).ok());
  EXPECT_EQ(l.head_bytes, 128u);
  EXPECT_EQ(l.sections[0].offset, 128u);
  EXPECT_EQ(l.sections[0].data_bytes, 3968u);
  EXPECT_EQ(l.sections[0].end, 4096u);
  EXPECT_EQ(l.chunk_bytes, 4096u);
  // T = 2: head 64 + 8 + 8 + 8 = 88 -> 128; data 7936 -> ends at 8064 -> 8192.
  ASSERT_TRUE(ComputeChunkLayout(g, 2, &l).ok());
  EXPECT_EQ(l.chunk_bytes, 8192u);
  CheckLayoutInvariants(g, 1);
  CheckLayoutInvariants(g, 2);
}

TEST(ChunkLayout, LlamaFullChunkByHand) {
  // 32 layers, k and v: 8 rows of 128 e4m3 per token; T = 256.
  // head: 64 + 8*64 = 576 (tokens) + 1024 = 1600, + 8 = 1608 -> 1664.
  // section: 2048 rows; codes 262144, scales 8192: 270336 bytes, all aligned.
  // 64 sections: 1664 + 64*270336 = 17303168 -> 4225 blocks = 17305600.
  Geometry g;
  g.layers = 32;
  g.streams = {{"k", 8, 128, Dtype::kE4M3}, {"v", 8, 128, Dtype::kE4M3}};
  ChunkLayout l;
  ASSERT_TRUE(ComputeChunkLayout(g, 256, &l).ok());
  EXPECT_EQ(l.tokens_offset, 576u);
  EXPECT_EQ(l.head_bytes, 1664u);
  EXPECT_EQ(l.sections[0].offset, 1664u);
  EXPECT_EQ(l.sections[0].end - l.sections[0].offset, 270336u);
  EXPECT_EQ(l.sections[63].offset, 1664u + 63 * 270336);
  EXPECT_EQ(l.chunk_bytes, 17305600u);
  EXPECT_EQ(g.PayloadBytesPerToken(), 32u * 2 * 8 * (128 + 4));
}

TEST(ChunkLayout, Nvfp4ByHand) {
  // 1 layer, "k" 8 rows x 128 nvfp4: one nvfp4 row of 1024 elements per
  // token. T = 3: head 64 + 8 + 12 + 8 = 92 -> 128. codes 3 * 512 = 1536
  // at [128, 1664); block scales 3 * 64 = 192 at [1664, 1856); row scales
  // 12 at [1856, 1868), padded to 1920; the chunk is one block.
  Geometry g;
  g.layers = 1;
  g.streams = {{"k", 8, 128, Dtype::kNvfp4}};
  ChunkLayout l;
  ASSERT_TRUE(ComputeChunkLayout(g, 3, &l).ok());
  const SectionLayout& s = l.sections[0];
  EXPECT_EQ(s.offset, 128u);
  EXPECT_EQ(s.data_bytes, 1536u);
  EXPECT_EQ(s.block_scales_offset, 1664u);
  EXPECT_EQ(s.block_scales_bytes, 192u);
  EXPECT_EQ(s.scales_offset, 1856u);
  EXPECT_EQ(s.scales_bytes, 12u);
  EXPECT_EQ(s.end, 4096u);
  EXPECT_EQ(l.chunk_bytes, 4096u);
  // "v" 1 x 16 after it, T = 1: k's codes 512 [128, 640), blocks 64
  // [640, 704), scale [704, 708) -> 768; v: codes 8 [768, 776), block 1 at
  // 832, scale 4 at 896 -> 960.
  g.streams.push_back({"v", 1, 16, Dtype::kNvfp4});
  ASSERT_TRUE(ComputeChunkLayout(g, 1, &l).ok());
  EXPECT_EQ(l.sections[0].end, 768u);
  EXPECT_EQ(l.sections[1].data_bytes, 8u);
  EXPECT_EQ(l.sections[1].block_scales_offset, 832u);
  EXPECT_EQ(l.sections[1].block_scales_bytes, 1u);
  EXPECT_EQ(l.sections[1].scales_offset, 896u);
  EXPECT_EQ(l.sections[1].scales_bytes, 4u);
  CheckLayoutInvariants(g, 1);
  CheckLayoutInvariants(g, 3);
}

TEST(ChunkLayout, LlamaNvfp4IsUnder029OfBf16) {
  // llama-3.1-8b, T = 256: a section is codes 256 * 512 = 131072, block
  // scales 256 * 64 = 16384, row scales 1024: 148480 bytes, all aligned.
  // 1664 + 64 * 148480 = 9504384 -> 2321 blocks = 9506816 bytes; in bf16
  // 1664 + 64 * 524288 = 33555096 -> 8193 blocks = 33558528: 0.2833x.
  Geometry g;
  g.layers = 32;
  g.streams = {{"k", 8, 128, Dtype::kNvfp4}, {"v", 8, 128, Dtype::kNvfp4}};
  ChunkLayout l;
  ASSERT_TRUE(ComputeChunkLayout(g, 256, &l).ok());
  EXPECT_EQ(l.sections[0].end - l.sections[0].offset, 148480u);
  EXPECT_EQ(l.chunk_bytes, 9506816u);
  EXPECT_EQ(g.PayloadBytesPerToken(), 32u * 2 * (512 + 64 + 4));
  Geometry bf16 = g;
  for (StreamSpec& s : bf16.streams) s.dtype = Dtype::kBF16;
  ChunkLayout lb;
  ASSERT_TRUE(ComputeChunkLayout(bf16, 256, &lb).ok());
  EXPECT_EQ(lb.chunk_bytes, 33558528u);
  EXPECT_LE(static_cast<double>(l.chunk_bytes) / static_cast<double>(lb.chunk_bytes), 0.2833);
}

// Checks the invariants every layout must satisfy.
void CheckLayoutInvariants(const Geometry& g, uint32_t t) {
  SCOPED_TRACE("tokens " + std::to_string(t));
  ChunkLayout l;
  ASSERT_TRUE(ComputeChunkLayout(g, t, &l).ok());
  const uint64_t n = uint64_t{g.layers} * g.streams.size();
  ASSERT_EQ(l.sections.size(), n);
  EXPECT_EQ(l.section_checksums_offset, 64u);
  EXPECT_EQ(l.tokens_offset, 64 + 8 * n);
  EXPECT_EQ(l.head_bytes % 64, 0u);
  EXPECT_EQ(l.head_bytes, HeadBytes(g, t));
  EXPECT_EQ(l.head_checksum_offset, l.head_bytes - 8);
  EXPECT_GE(l.head_checksum_offset, l.tokens_offset + 4ull * t);
  EXPECT_LT(l.head_checksum_offset, l.tokens_offset + 4ull * t + 64);  // minimal head
  EXPECT_EQ(l.chunk_bytes % 4096, 0u);
  uint64_t pos = l.head_bytes;
  uint64_t payload = 0;
  for (uint32_t layer = 0; layer < g.layers; ++layer) {
    for (uint32_t s = 0; s < g.streams.size(); ++s) {
      const StreamSpec& spec = g.streams[s];
      const SectionLayout& sec = l.section(layer, s);
      ASSERT_EQ(sec.offset, pos) << "layer " << layer << " stream " << s;  // contiguous
      ASSERT_EQ(sec.offset % 64, 0u);
      uint64_t rows = uint64_t{t} * spec.rows_per_token;
      ASSERT_EQ(sec.data_bytes, CodeBytes(spec.dtype, rows * spec.row_width));
      uint64_t data_end = sec.offset + sec.data_bytes;
      if (IsNvfp4(spec.dtype)) {
        ASSERT_EQ(sec.block_scales_bytes, rows * spec.row_width / 16);
        ASSERT_EQ(sec.block_scales_offset, AlignUp(data_end, 64));
        ASSERT_EQ(sec.scales_bytes, uint64_t{t} * 4);
        ASSERT_EQ(sec.scales_offset, AlignUp(sec.block_scales_offset + sec.block_scales_bytes, 64));
        data_end = sec.scales_offset + sec.scales_bytes;
      } else if (IsFp8(spec.dtype)) {
        ASSERT_EQ(sec.block_scales_bytes, 0u);
        ASSERT_EQ(sec.scales_bytes, rows * 4);
        ASSERT_EQ(sec.scales_offset % 64, 0u);
        ASSERT_GE(sec.scales_offset, data_end);
        ASSERT_LT(sec.scales_offset, data_end + 64);
        data_end = sec.scales_offset + sec.scales_bytes;
      } else {
        ASSERT_EQ(sec.scales_bytes, 0u);
      }
      ASSERT_GE(sec.end, data_end);
      payload += sec.data_bytes + sec.block_scales_bytes + sec.scales_bytes;
      bool last = layer + 1 == g.layers && s + 1 == g.streams.size();
      if (last) {
        ASSERT_EQ(sec.end, l.chunk_bytes);
        ASSERT_LT(l.chunk_bytes - AlignUp(data_end, 64), 4096u);  // minimal chunk
      } else {
        ASSERT_EQ(sec.end, AlignUp(data_end, 64));  // no gap between sections
      }
      pos = sec.end;
    }
  }
  EXPECT_EQ(pos, l.chunk_bytes);
  EXPECT_EQ(payload, t * g.PayloadBytesPerToken());
}

TEST(ChunkLayout, InvariantsOverGeometries) {
  std::vector<Geometry> geoms;
  geoms.push_back(Tiny());
  Geometry llama;
  llama.layers = 32;
  llama.streams = {{"k", 8, 128, Dtype::kE5M2}, {"v", 8, 128, Dtype::kE5M2}};
  geoms.push_back(llama);
  Geometry dsa;
  dsa.layers = 61;
  dsa.streams = {{"latent", 1, 512, Dtype::kE4M3}, {"rope", 1, 64, Dtype::kE4M3},
                 {"indexer", 1, 128, Dtype::kBF16}};
  geoms.push_back(dsa);
  Geometry odd;  // widths that are not multiples of anything
  odd.layers = 3;
  odd.streams = {{"a", 3, 7, Dtype::kE4M3}, {"b", 1, 5, Dtype::kF16}, {"c", 2, 3, Dtype::kF32},
                 {"d", 1, 1, Dtype::kE5M2}};
  geoms.push_back(odd);
  Geometry nv;  // nvfp4 next to fp8 and raw; 3 x 16 and 1 x 32 elements per token
  nv.layers = 2;
  nv.streams = {{"k", 3, 16, Dtype::kNvfp4}, {"v", 1, 32, Dtype::kNvfp4}, {"x", 2, 3, Dtype::kE4M3},
                {"y", 1, 5, Dtype::kBF16}};
  geoms.push_back(nv);
  for (const Geometry& g : geoms)
    for (uint32_t t : {1u, 2u, 3u, 7u, 37u, 64u, 255u, 256u}) CheckLayoutInvariants(g, t);
}

TEST(ChunkLayout, RefusesBadTokenCounts) {
  ChunkLayout l;
  EXPECT_FALSE(ComputeChunkLayout(Tiny(), 0, &l).ok());
  EXPECT_FALSE(ComputeChunkLayout(Tiny(), 65537, &l).ok());
  EXPECT_TRUE(ComputeChunkLayout(Tiny(), 65536, &l).ok());
  EXPECT_EQ(l.chunk_bytes % 4096, 0u);
}

TEST(ChunkLayout, RefusesChunksOverOneGiB) {
  // llama: 67584 payload bytes per token; 65536 tokens are ~4.1 GiB.
  Geometry g;
  g.layers = 32;
  g.streams = {{"k", 8, 128, Dtype::kE4M3}, {"v", 8, 128, Dtype::kE4M3}};
  ChunkLayout l;
  EXPECT_FALSE(ComputeChunkLayout(g, 65536, &l).ok());
  // The largest that fits, by hand. Per section and token: 8*128 codes and
  // 8*4 scale bytes; for an even T both are multiples of 64, so no padding.
  // T = 15886: head 64 + 512 + 63544 + 8 = 64128 (already 64-aligned);
  //   64128 + 64 * 15886 * 1056 = 1073703552 -> next 4096 multiple: 1073704960
  //   <= 2^30 = 1073741824.
  // T = 15887: head 64192, plus 64 sections of 15887 * 1056 bytes and 32
  //   bytes of scale padding each (odd T): 64192 + 1073707008 + 2048 =
  //   1073773248 > 2^30: refused.
  EXPECT_TRUE(ComputeChunkLayout(g, 15886, &l).ok());
  EXPECT_EQ(l.chunk_bytes, 1073704960u);
  EXPECT_FALSE(ComputeChunkLayout(g, 15887, &l).ok());
  // The largest geometry the limits allow: refused without overflow.
  Geometry huge;
  huge.layers = 1024;
  for (int i = 0; i < 16; ++i) huge.streams.push_back({"s" + std::to_string(i), 1024, 65536, Dtype::kF32});
  ASSERT_TRUE(huge.Validate().ok());
  EXPECT_FALSE(ComputeChunkLayout(huge, 65536, &l).ok());
  EXPECT_FALSE(ComputeChunkLayout(huge, 1, &l).ok());
}

// ---- geometry ----------------------------------------------------------------------

TEST(Geometry, ValidateAcceptsLimits) {
  EXPECT_TRUE(Tiny().Validate().ok());
  Geometry g;
  g.layers = 1024;
  for (int i = 0; i < 16; ++i) g.streams.push_back({"s" + std::to_string(i), 1024, 65536, Dtype::kE5M2});
  EXPECT_TRUE(g.Validate().ok());
  g.layers = 1;
  g.streams = {{"a", 1, 1, Dtype::kF32}};
  EXPECT_TRUE(g.Validate().ok());
}

TEST(Geometry, ValidateNamesTheProblem) {
  auto check = [](const Geometry& g, const std::string& needle) {
    Status st = g.Validate();
    EXPECT_TRUE(HasCode(st, Code::kInvalidArgument, needle));
  };
  Geometry g = Tiny();
  g.layers = 0;
  check(g, "layer count 0");
  g.layers = 1025;
  check(g, "layer count 1025");
  g = Tiny();
  g.streams.clear();
  check(g, "stream count 0");
  for (int i = 0; i < 17; ++i) g.streams.push_back({"s" + std::to_string(i), 1, 1, Dtype::kE4M3});
  check(g, "stream count 17");
  for (const char* bad : {"", "K", "a b", "a/b", "ü", "0123456789012345678901234567890x"}) {
    g = Tiny();
    g.streams[1].name = bad;
    check(g, "stream name '" + std::string(bad) + "'");
  }
  g = Tiny();
  g.streams[1].name = "k";
  check(g, "stream name 'k' appears twice");
  g = Tiny();
  g.streams[0].dtype = static_cast<Dtype>(0);
  check(g, "stream 'k' has an invalid dtype");
  g.streams[0].dtype = static_cast<Dtype>(7);
  check(g, "stream 'k' has an invalid dtype");
  // nvfp4: rows x width must be a multiple of 16.
  g = Tiny();
  g.streams[1] = {"v", 3, 8, Dtype::kNvfp4};
  check(g, "stream 'v': nvfp4 needs rows x width (24) to be a multiple of 16");
  g.streams[1] = {"v", 3, 16, Dtype::kNvfp4};
  EXPECT_TRUE(g.Validate().ok());
  g.streams[1] = {"v", 2, 8, Dtype::kNvfp4};  // 16 elements per token: one block
  EXPECT_TRUE(g.Validate().ok());
  g = Tiny();
  g.streams[1].rows_per_token = 0;
  check(g, "stream 'v': rows per token 0");
  g.streams[1].rows_per_token = 1025;
  check(g, "stream 'v': rows per token 1025");
  g = Tiny();
  g.streams[0].row_width = 0;
  check(g, "stream 'k': row width 0");
  g.streams[0].row_width = 65537;
  check(g, "stream 'k': row width 65537");
  // Several problems: the first stream's is reported.
  g = Tiny();
  g.streams[0].row_width = 0;
  g.streams[1].rows_per_token = 0;
  check(g, "stream 'k'");
}

TEST(Geometry, StreamNames) {
  EXPECT_TRUE(IsValidStreamName("k"));
  EXPECT_TRUE(IsValidStreamName("a-z_0.9"));
  EXPECT_TRUE(IsValidStreamName(std::string(31, 'x')));
  EXPECT_FALSE(IsValidStreamName(std::string(32, 'x')));
  EXPECT_FALSE(IsValidStreamName(""));
  EXPECT_FALSE(IsValidStreamName("A"));
  EXPECT_FALSE(IsValidStreamName("a b"));
  EXPECT_FALSE(IsValidStreamName(std::string("a\0b", 3)));
  EXPECT_FALSE(IsValidStreamName("a+b"));
}

TEST(Geometry, FindStreamAndPayload) {
  Geometry g = Tiny();
  EXPECT_EQ(g.FindStream("k"), 0u);
  EXPECT_EQ(g.FindStream("v"), 1u);
  EXPECT_FALSE(g.FindStream("q").has_value());
  // 2 layers * 2 streams * 2 rows * (16 codes + 4 scale bytes) = 160.
  EXPECT_EQ(g.PayloadBytesPerToken(), 160u);
  Geometry dsa;
  dsa.layers = 61;
  dsa.streams = {{"latent", 1, 512, Dtype::kE4M3}, {"rope", 1, 64, Dtype::kE4M3},
                 {"indexer", 1, 128, Dtype::kBF16}};
  // 61 * (516 + 68 + 256) = 51240.
  EXPECT_EQ(dsa.PayloadBytesPerToken(), 51240u);
  EXPECT_EQ(g.streams[0].ElementsPerToken(), 32u);
}

TEST(CheckExpected, NamesTheFirstDifference) {
  ModelIdentity id{"org/model", 0x0123456789ABCDEFull};
  Geometry g = Tiny();
  EXPECT_TRUE(CheckExpected(id, g, id, g).ok());

  auto mismatch = [&](const ModelIdentity& eid, const Geometry& eg, const std::string& needle) {
    Status st = CheckExpected(id, g, eid, eg);
    EXPECT_TRUE(HasCode(st, Code::kMismatch, needle)) << needle;
    EXPECT_EQ(st.message().rfind(needle, 0), 0u) << st.message();  // named first
  };
  ModelIdentity other_id{"org/other", id.fingerprint};
  mismatch(other_id, g, "model id: file has 'org/model', expected 'org/other'");
  ModelIdentity other_fp{id.model_id, 0x1ull};
  mismatch(other_fp, g, "model fingerprint: file has 0123456789abcdef, expected 0000000000000001");
  Geometry e = g;
  e.layers = 3;
  mismatch(id, e, "layer count: file has 2, expected 3");
  e = g;
  e.streams.push_back({"q", 1, 1, Dtype::kE4M3});
  mismatch(id, e, "stream count: file has 2, expected 3");
  e = g;
  e.streams[1].name = "w";
  mismatch(id, e, "stream 1 name: file has 'v', expected 'w'");
  e = g;
  e.streams[0].rows_per_token = 4;
  mismatch(id, e, "stream 'k' rows per token: file has 2, expected 4");
  e = g;
  e.streams[0].row_width = 64;
  mismatch(id, e, "stream 'k' row width: file has 16, expected 64");
  e = g;
  e.streams[1].dtype = Dtype::kE5M2;
  mismatch(id, e, "stream 'v' dtype: file has e4m3, expected e5m2");

  // Several differences: the first in the order identity, layers, streams.
  e = g;
  e.layers = 9;
  e.streams[0].row_width = 64;
  mismatch(other_id, e, "model id");
  mismatch(id, e, "layer count");
  e = g;
  e.streams[0].dtype = Dtype::kE5M2;
  e.streams[1].row_width = 64;
  mismatch(id, e, "stream 'k' dtype");
  e = g;
  e.streams[1].row_width = 64;
  e.streams[1].dtype = Dtype::kBF16;
  mismatch(id, e, "stream 'v' row width");
}

}  // namespace
}  // namespace kvfile::format
