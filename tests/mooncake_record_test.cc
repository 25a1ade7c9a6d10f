// SPDX-License-Identifier: Apache-2.0
// Mooncake FP8 codec record v1 (kvfile/formats/mooncake.h): the golden record of
// Mooncake's tests both ways (tests/fixtures/seeds/, written from the wire
// format by make_fixtures.py), every validation rule, every truncation and
// every bit flip, the group rule across rows without a scale floor, and the
// key <-> file name mapping.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>

#include "kvfile/codec.h"
#include "kvfile/formats/mooncake.h"

namespace kvfile::mooncake {
namespace {

std::vector<uint8_t> Fixture(const char* name) {
  std::ifstream in(std::string(KVFILE_TEST_DATA "/fixtures/seeds/").append(name), std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// CRC-32/IEEE bit by bit (reflected polynomial 0xEDB88320), written here
// independently of zlib, over the record with bytes 24..27 as zero.
uint32_t BitwiseCrc(const std::vector<uint8_t>& r) {
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < r.size(); ++i) {
    crc ^= (i >= 24 && i < 28) ? 0 : r[i];
    for (int b = 0; b < 8; ++b) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

void Reseal(std::vector<uint8_t>* r) {
  uint32_t c = BitwiseCrc(*r);
  std::memcpy(r->data() + 24, &c, 4);
}

const uint16_t kGoldenValues[4] = {0x5F00, 0xDF00, 0x3C00, 0x8000};  // fp16 448, -448, 1, -0.0

RecordDesc GoldenDesc() {
  RecordDesc d;
  d.dtype = SourceDtype::kF16;
  d.group_size = 4;
  d.shape = {4};
  return d;
}

TEST(MooncakeRecord, GoldenFixtureIsTheSpecifiedBytes) {
  std::vector<uint8_t> f = Fixture("mooncake_golden_fp16.mckv");
  ASSERT_EQ(f.size(), 48u);
  const uint8_t head[24] = {'M', 'C', 'K', 'V', 'F', 'P', '8', 0, 1, 0, 1, 1, 4, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(std::memcmp(f.data(), head, 24), 0);
  EXPECT_EQ(BitwiseCrc(f), 0xF4135101u);
  EXPECT_EQ(RecordCrc(f), 0xF4135101u);
  const uint8_t tail[16] = {4, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x00, 0x80, 0x3F, 0x7E, 0xFE, 0x38, 0x80};
  EXPECT_EQ(std::memcmp(f.data() + 32, tail, 16), 0);
}

TEST(MooncakeRecord, EncodeGolden) {
  std::vector<uint8_t> rec;
  ASSERT_TRUE(EncodeValues(GoldenDesc(), kGoldenValues, &rec).ok());
  EXPECT_EQ(rec, Fixture("mooncake_golden_fp16.mckv"));
  float scale = 1.0f;
  const uint8_t codes[4] = {0x7E, 0xFE, 0x38, 0x80};
  std::vector<uint8_t> rec2;
  ASSERT_TRUE(EncodeCodes(GoldenDesc(), &scale, codes, &rec2).ok());
  EXPECT_EQ(rec2, rec);
}

TEST(MooncakeRecord, DecodeGolden) {
  std::vector<uint8_t> f = Fixture("mooncake_golden_fp16.mckv");
  RecordView v;
  ASSERT_TRUE(ParseRecord(f, &v).ok());
  EXPECT_EQ(v.desc.dtype, SourceDtype::kF16);
  EXPECT_EQ(v.desc.group_size, 4u);
  EXPECT_EQ(v.desc.shape, std::vector<uint64_t>{4});
  EXPECT_EQ(v.elements, 4u);
  EXPECT_EQ(v.groups, 1u);
  EXPECT_EQ(std::bit_cast<uint32_t>(v.scale(0)), 0x3F800000u);
  uint16_t out[4] = {1, 1, 1, 1};
  DecodeValues(v, out);
  EXPECT_EQ(std::memcmp(out, kGoldenValues, sizeof out), 0);
  float f32[4];
  DecodeF32(v, f32);
  EXPECT_EQ(f32[0], 448.0f);
  EXPECT_EQ(f32[1], -448.0f);
  EXPECT_EQ(f32[2], 1.0f);
  EXPECT_EQ(std::bit_cast<uint32_t>(f32[3]), 0x80000000u);
}

// Groups of 4 over a [2, 3] bf16 tensor cross the row boundary; the second
// group is short (2 elements); its tiny amax gives a subnormal scale (no
// FLT_MIN floor in Mooncake's rule).
TEST(MooncakeRecord, GroupsCrossRowsAndScalesHaveNoFloor) {
  RecordDesc d;
  d.dtype = SourceDtype::kBF16;
  d.group_size = 4;
  d.shape = {2, 3};
  // bf16: 3.0, -1.5, 0.25 | 6.0, 2^-130, -2^-131
  const uint16_t v[6] = {0x4040, 0xBFC0, 0x3E80, 0x40C0, 0x0008, 0x8004};
  std::vector<uint8_t> rec;
  ASSERT_TRUE(EncodeValues(d, v, &rec).ok());
  ASSERT_EQ(rec.size(), 32u + 16 + 8 + 6);
  RecordView r;
  ASSERT_TRUE(ParseRecord(rec, &r).ok());
  ASSERT_EQ(r.groups, 2u);
  EXPECT_EQ(r.scale(0), 6.0f / 448.0f);
  float tiny = std::ldexp(1.0f, -130);
  EXPECT_EQ(r.scale(1), tiny / 448.0f);
  EXPECT_LT(r.scale(1), 1.17549435e-38f);  // subnormal: kvfile's rule would floor it
  for (int i = 0; i < 6; ++i) {
    float x = codec::Bf16ToF32(v[i]);
    EXPECT_EQ(r.codes[i], codec::EncodeElement(x / r.scale(i / 4), Dtype::kE4M3)) << i;
  }
  EXPECT_EQ(r.codes[3], 0x7E);  // the group's amax
  EXPECT_EQ(r.codes[4], 0x7E);
}

TEST(MooncakeRecord, AllZeroGroupHasScaleOne) {
  RecordDesc d;
  d.dtype = SourceDtype::kBF16;
  d.group_size = 2;
  d.shape = {2};
  const uint16_t v[2] = {0x8000, 0x0000};
  std::vector<uint8_t> rec;
  ASSERT_TRUE(EncodeValues(d, v, &rec).ok());
  RecordView r;
  ASSERT_TRUE(ParseRecord(rec, &r).ok());
  EXPECT_EQ(r.scale(0), 1.0f);
  EXPECT_EQ(r.codes[0], 0x80);
  EXPECT_EQ(r.codes[1], 0x00);
}

TEST(MooncakeRecord, EncoderRefusals) {
  uint16_t v[4] = {0x3C00, 0x7C00, 0, 0};  // fp16 +Inf
  std::vector<uint8_t> rec = {9};
  Status st = EncodeValues(GoldenDesc(), v, &rec);
  EXPECT_EQ(st.code(), Status::Code::kNonFinite);
  EXPECT_EQ(st.message(), "element 1 is not finite");
  EXPECT_EQ(rec, std::vector<uint8_t>{9});
  float bad_scale = 0.0f;
  uint8_t codes[4] = {0, 0, 0, 0};
  EXPECT_EQ(EncodeCodes(GoldenDesc(), &bad_scale, codes, &rec).code(), Status::Code::kInvalidArgument);
  float scale = 1.0f;
  codes[2] = 0xFF;
  EXPECT_EQ(EncodeCodes(GoldenDesc(), &scale, codes, &rec).message(), "code 2 is a NaN code");
  RecordDesc d = GoldenDesc();
  d.shape = {};
  EXPECT_EQ(EncodeValues(d, v, &rec).code(), Status::Code::kInvalidArgument);
  d.shape = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_EQ(EncodeValues(d, v, &rec).code(), Status::Code::kInvalidArgument);
  d.shape = {4};
  d.group_size = 0;
  EXPECT_EQ(EncodeValues(d, v, &rec).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(rec, std::vector<uint8_t>{9});
}

// Each rule alone (the CRC resealed so that only that rule is broken).
TEST(MooncakeRecord, ParserRules) {
  const std::vector<uint8_t> good = Fixture("mooncake_golden_fp16.mckv");
  struct Case {
    const char* what;
    std::function<void(std::vector<uint8_t>*)> edit;
    bool reseal;
    const char* message;
  };
  std::vector<Case> cases = {
      {"magic", [](auto* r) { (*r)[0] = 'X'; }, true, "bad magic (not MCKVFP8\\0)"},
      {"version", [](auto* r) { (*r)[8] = 2; }, true, "record version 2 (only version 1 is known)"},
      {"reserved", [](auto* r) { (*r)[30] = 1; }, true, "reserved field is not zero"},
      {"crc", [](auto* r) { (*r)[24] ^= 1; }, false, "CRC32 mismatch"},
      {"dtype", [](auto* r) { (*r)[10] = 3; }, true, "source dtype 3 is neither 1 nor 2"},
      {"rank 0", [](auto* r) { (*r)[11] = 0; }, true, "rank 0 is not in 1..8"},
      {"rank 9", [](auto* r) { (*r)[11] = 9; }, true, "rank 9 is not in 1..8"},
      {"group 0", [](auto* r) { (*r)[12] = 0; }, true, "descriptor: group size 0"},
      {"count", [](auto* r) { (*r)[16] = 5; }, true, "element count 5 is not the shape's 4"},
      {"dimension 0", [](auto* r) { (*r)[32] = 0; }, true, "descriptor: a shape dimension is 0"},
      {"trailing byte", [](auto* r) { r->push_back(0); }, true, "record is 49 bytes; its descriptor needs 48"},
      {"scale 0", [](auto* r) { std::memset(r->data() + 40, 0, 4); }, true, "scale 0 is not finite and > 0"},
      {"scale -1", [](auto* r) { (*r)[43] = 0xBF; }, true, "scale 0 is not finite and > 0"},
      {"scale inf", [](auto* r) { const uint8_t b[4] = {0, 0, 0x80, 0x7F}; std::memcpy(r->data() + 40, b, 4); },
       true, "scale 0 is not finite and > 0"},
      {"scale nan", [](auto* r) { const uint8_t b[4] = {0, 0, 0xC0, 0x7F}; std::memcpy(r->data() + 40, b, 4); },
       true, "scale 0 is not finite and > 0"},
      {"nan code", [](auto* r) { (*r)[46] = 0x7F; }, true, "code 2 is a NaN code"},
      {"-nan code", [](auto* r) { (*r)[47] = 0xFF; }, true, "code 3 is a NaN code"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<uint8_t> r = good;
    c.edit(&r);
    if (c.reseal) Reseal(&r);
    RecordView v;
    v.elements = 77;
    Status st = ParseRecord(r, &v);
    EXPECT_EQ(st.code(), Status::Code::kCorruption);
    EXPECT_EQ(st.message(), c.message);
    EXPECT_EQ(v.elements, 77u);  // *out untouched
  }
  // A subnormal scale is valid in Mooncake's format.
  std::vector<uint8_t> r = good;
  const uint8_t sub[4] = {1, 0, 0, 0};
  std::memcpy(r.data() + 40, sub, 4);
  Reseal(&r);
  RecordView v;
  EXPECT_TRUE(ParseRecord(r, &v).ok());
}

std::vector<uint8_t> LargerRecord() {
  RecordDesc d;
  d.dtype = SourceDtype::kBF16;
  d.group_size = 5;
  d.shape = {3, 2, 4};
  std::vector<uint16_t> v(24);
  for (int i = 0; i < 24; ++i) v[i] = codec::F32ToBf16(std::sin(0.7f * static_cast<float>(i)) * static_cast<float>(i + 1));
  std::vector<uint8_t> rec;
  EXPECT_TRUE(EncodeValues(d, v.data(), &rec).ok());
  return rec;
}

// FindGroupBeyondDtype: the group whose largest code x scale rounds to
// infinity in the record's dtype, at exactly the rounding boundary (fp16:
// 448 x 146.25 = 65520; bf16: 256 x 2^-8 x 0x7F7F8000), and never a group of
// Mooncake's encoder (the dtypes' largest values, either sign).
TEST(MooncakeRecord, GroupsBeyondTheSourceDtype) {
  RecordDesc d;
  d.group_size = 2;
  d.shape = {2, 2};
  struct Case {
    SourceDtype dtype;
    uint8_t code;  // of group 1's first element; group 0 holds 1.0 x scale 1
    uint32_t scale_bits;
    uint64_t want;
  };
  const uint32_t f16_bound = std::bit_cast<uint32_t>(146.25f);
  const Case cases[] = {
      {SourceDtype::kF16, 0x7E, f16_bound, 1},      {SourceDtype::kF16, 0xFE, f16_bound, 1},
      {SourceDtype::kF16, 0x7E, f16_bound - 1, 2},  {SourceDtype::kF16, 0x7D, f16_bound, 2},
      {SourceDtype::kBF16, 0x78, 0x7B7F8000u, 1},   {SourceDtype::kBF16, 0xF8, 0x7B7F8000u, 1},
      {SourceDtype::kBF16, 0x78, 0x7B7F7FFFu, 2},   {SourceDtype::kBF16, 0x7E, 0x7F7FFFFFu, 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.code) + " " + std::to_string(c.scale_bits));
    d.dtype = c.dtype;
    const float scales[2] = {1.0f, std::bit_cast<float>(c.scale_bits)};
    const uint8_t codes[4] = {0x38, 0xB8, c.code, 0x01};
    std::vector<uint8_t> rec;
    ASSERT_TRUE(EncodeCodes(d, scales, codes, &rec).ok());
    RecordView v;
    ASSERT_TRUE(ParseRecord(rec, &v).ok());
    EXPECT_EQ(FindGroupBeyondDtype(v), c.want);
  }
  const uint16_t f16[4] = {0x7BFF, 0xFBFF, 0x0001, 0x8001};
  const uint16_t bf16[4] = {0x7F7F, 0xFF7F, 0x0001, 0x8001};
  for (SourceDtype dt : {SourceDtype::kF16, SourceDtype::kBF16}) {
    d.dtype = dt;
    std::vector<uint8_t> rec;
    ASSERT_TRUE(EncodeValues(d, dt == SourceDtype::kF16 ? f16 : bf16, &rec).ok());
    RecordView v;
    ASSERT_TRUE(ParseRecord(rec, &v).ok());
    EXPECT_EQ(FindGroupBeyondDtype(v), 2u);
  }
  EXPECT_EQ(SourceDtypeName(SourceDtype::kF16), "fp16 (1)");
  EXPECT_EQ(SourceDtypeName(SourceDtype::kBF16), "bf16 (2)");
}

TEST(MooncakeRecord, EveryTruncationIsRefused) {
  for (const std::vector<uint8_t>& full : {Fixture("mooncake_golden_fp16.mckv"), LargerRecord()}) {
    for (size_t n = 0; n < full.size(); ++n) {
      std::vector<uint8_t> cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
      RecordView v;
      Status st = ParseRecord(cut, &v);
      EXPECT_EQ(st.code(), Status::Code::kCorruption) << n;
    }
  }
}

TEST(MooncakeRecord, EveryBitFlipIsRefused) {
  // CRC-32 detects every single-bit error, so every flip is refused, most
  // by the CRC and those in the CRC field itself by the CRC too.
  for (const std::vector<uint8_t>& full : {Fixture("mooncake_golden_fp16.mckv"), LargerRecord()}) {
    for (size_t bit = 0; bit < full.size() * 8; ++bit) {
      std::vector<uint8_t> r = full;
      r[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      RecordView v;
      Status st = ParseRecord(r, &v);
      EXPECT_EQ(st.code(), Status::Code::kCorruption) << bit;
    }
  }
}

TEST(MooncakeRecord, KeysAndFileNames) {
  EXPECT_EQ(FormatId(128), "fp8-e4m3fn-v1-g128");
  std::string key = RepresentationKey(512, "kvfile/00000000000000ab/latent/L3/T0-256");
  EXPECT_EQ(key, "__mc_codec__/fp8-e4m3fn-v1-g512/kvfile/00000000000000ab/latent/L3/T0-256");
  std::string name = FileNameForKey(key);
  EXPECT_EQ(name, "__mc_codec__%2Ffp8-e4m3fn-v1-g512%2Fkvfile%2F00000000000000ab%2Flatent%2FL3%2FT0-256");
  std::string back;
  ASSERT_TRUE(KeyFromFileName(name, &back));
  EXPECT_EQ(back, key);
  EXPECT_EQ(FileNameForKey(".."), "%2E%2E");
  EXPECT_EQ(FileNameForKey("a b%"), "a%20b%25");
  for (const char* bad : {"a/b", "%2f", "%41", "%4", "%", "a%ZZ", "x y"}) EXPECT_FALSE(KeyFromFileName(bad, &back)) << bad;
}

}  // namespace
}  // namespace kvfile::mooncake
