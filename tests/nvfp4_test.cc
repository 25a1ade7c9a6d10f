// SPDX-License-Identifier: Apache-2.0
// Tests of the NVFP4 scalar reference (src/codec/nvfp4_scalar.cc) against
// spec/CODEC.md section 14 and NVIDIA's host conversions (tests/vectors/,
// made by tools/vectors/nvfp4_vectors.cc).
#include "codec/nvfp4.h"

#include "kvfile/codec.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

namespace kvfile::codec::nvfp4 {
namespace {

std::vector<uint8_t> ReadVector(const std::string& name) {
  // (appended in place: GCC 12 sees a false array-bounds overflow in
  // string(literal) + "..." + name at -O2)
  std::string path = KVFILE_TEST_DATA;
  path.append("/vectors/").append(name);
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << name;
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FF;
  if (e == 0) {
    const float v = std::ldexp(static_cast<float>(m), -24);
    return sign ? -v : v;
  }
  if (e == 31) return FromBits(sign | 0x7F800000u | (m << 13));
  return FromBits(sign | ((e + 112) << 23) | (m << 13));
}

TEST(Nvfp4Element, EveryBf16PatternMatchesNvidia) {
  const auto expected = ReadVector("e2m1_from_bf16.bin");
  ASSERT_EQ(expected.size(), 65536u);
  for (uint32_t h = 0; h < 65536; ++h) {
    ASSERT_EQ(EncodeE2M1(FromBits(h << 16)), expected[h]) << std::hex << "bf16 0x" << h;
  }
}

TEST(Nvfp4Element, EveryF16PatternMatchesNvidia) {
  const auto expected = ReadVector("e2m1_from_f16.bin");
  ASSERT_EQ(expected.size(), 65536u);
  for (uint32_t h = 0; h < 65536; ++h) {
    ASSERT_EQ(EncodeE2M1(F16ToF32(static_cast<uint16_t>(h))), expected[h]) << std::hex << "f16 0x" << h;
  }
}

TEST(Nvfp4Element, DecodeTableMatchesNvidia) {
  const auto bytes = ReadVector("e2m1_to_f32.bin");
  ASSERT_EQ(bytes.size(), 64u);
  for (uint8_t c = 0; c < 16; ++c) {
    float expected;
    std::memcpy(&expected, &bytes[4 * c], 4);
    uint32_t a, b;
    const float got = DecodeE2M1(c);
    std::memcpy(&a, &got, 4);
    std::memcpy(&b, &expected, 4);
    EXPECT_EQ(a, b) << "code " << int(c);
  }
}

// The ties and boundaries of spec/CODEC.md 14.2, one by one.
TEST(Nvfp4Element, TiesGoToTheEvenCodeAndLargeValuesSaturate) {
  const struct {
    float x;
    uint8_t code;
  } cases[] = {
      {0.0f, 0x0},   {-0.0f, 0x8},  {0.25f, 0x0},     {0.2500001f, 0x1}, {0.75f, 0x2},
      {0.7499999f, 0x1}, {1.25f, 0x2}, {1.2500001f, 0x3}, {1.75f, 0x4},  {2.5f, 0x4},
      {2.5000002f, 0x5}, {3.5f, 0x6}, {5.0f, 0x6},       {5.0000005f, 0x7}, {6.0f, 0x7},
      {1e30f, 0x7},  {-1e30f, 0xF}, {-3.0f, 0xD},      {-1e-30f, 0x8},
      {INFINITY, 0x7}, {-INFINITY, 0xF}, {NAN, 0x7},
  };
  for (const auto& c : cases) EXPECT_EQ(EncodeE2M1(c.x), c.code) << c.x;
}

TEST(Nvfp4Row, KvLikeRowsMatchNvidiaByteForByte) {
  const auto raw = ReadVector("rows_bf16.bin");
  const auto codes = ReadVector("rows_nvfp4_codes.bin");
  const auto blocks = ReadVector("rows_nvfp4_block_scales.bin");
  const auto scales = ReadVector("rows_nvfp4_scales.bin");
  constexpr size_t kWidth = 128;
  const size_t rows = raw.size() / (2 * kWidth);
  ASSERT_EQ(rows, 4096u);
  ASSERT_EQ(codes.size(), rows * kWidth / 2);
  ASSERT_EQ(blocks.size(), rows * kWidth / kBlock);
  ASSERT_EQ(scales.size(), rows * 4);
  size_t zero_blocks = 0, saturated_blocks = 0;
  for (size_t r = 0; r < rows; ++r) {
    float x[kWidth];
    for (size_t i = 0; i < kWidth; ++i) {
      uint16_t h;
      std::memcpy(&h, &raw[2 * (r * kWidth + i)], 2);
      x[i] = FromBits(static_cast<uint32_t>(h) << 16);
    }
    uint8_t packed[kWidth / 2], block_codes[kWidth / kBlock];
    float scale;
    ASSERT_TRUE(QuantizeRow(x, kWidth, packed, block_codes, &scale)) << "row " << r;
    ASSERT_EQ(0, std::memcmp(&scale, &scales[4 * r], 4)) << "row scale of row " << r;
    ASSERT_EQ(0, std::memcmp(block_codes, &blocks[r * kWidth / kBlock], kWidth / kBlock))
        << "block scales of row " << r;
    ASSERT_EQ(0, std::memcmp(packed, &codes[r * kWidth / 2], kWidth / 2)) << "codes of row " << r;
    for (uint8_t b : block_codes) {
      zero_blocks += b == 0;
      saturated_blocks += b == 0x7E;
    }
  }
  // The vectors exercise both ends of the block scale range.
  EXPECT_GT(zero_blocks, 0u);
  EXPECT_GT(saturated_blocks, 0u);
}

TEST(Nvfp4Row, WorkedExample) {
  // spec/CODEC.md 14.7: amax 12 gives the row scale 12 / 2688 (rounded); the
  // first block's scale code is 0x7E (448: its amax is the row's), the
  // second block's amax 0.75 gives about 28: code 0x5E.
  float x[32] = {};
  x[0] = 12.0f;
  x[1] = -6.0f;
  x[2] = 1.0f;
  x[3] = -0.0f;
  x[16] = 0.75f;
  x[17] = -0.375f;
  x[18] = 0.1f;
  uint8_t packed[16], blocks[2];
  float scale;
  ASSERT_TRUE(QuantizeRow(x, 32, packed, blocks, &scale));
  EXPECT_EQ(scale, 12.0f / 2688.0f);
  EXPECT_EQ(blocks[0], 0x7E);
  EXPECT_EQ(blocks[1], kvfile::codec::EncodeElement(0.75f / scale / 6.0f, kvfile::Dtype::kE4M3));
  const float d0 = 448.0f * scale;
  EXPECT_EQ(packed[0], static_cast<uint8_t>(EncodeE2M1(12.0f / d0) | EncodeE2M1(-6.0f / d0) << 4));
  EXPECT_EQ(blocks[1], 0x5E);
  EXPECT_EQ(packed[0], 0xD7);  // 6 (0x7), then -3 (0xD) in the high nibble
  EXPECT_EQ(packed[1], 0x81);  // 0.5 (0x1), then -0 (0x8)
  float out[32];
  DequantizeRow(packed, blocks, scale, 32, out);
  EXPECT_EQ(out[0], 6.0f * d0);
  EXPECT_TRUE(std::signbit(out[3]));
}

TEST(Nvfp4Row, ZeroRowAndZeroBlocks) {
  float x[32] = {};
  x[5] = -0.0f;
  uint8_t packed[16], blocks[2];
  float scale = 0;
  ASSERT_TRUE(QuantizeRow(x, 32, packed, blocks, &scale));
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(blocks[0], 0);
  EXPECT_EQ(blocks[1], 0);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(packed[i], i == 2 ? 0x80 : 0x00) << i;
  // A block far below its row: its scale code is 0 and its elements are signed zeros.
  float y[32] = {};
  y[0] = 1000.0f;
  y[16] = -1e-3f;
  y[17] = 1e-3f;
  ASSERT_TRUE(QuantizeRow(y, 32, packed, blocks, &scale));
  EXPECT_EQ(blocks[1], 0);
  EXPECT_EQ(packed[8], 0x08);
  float out[32];
  DequantizeRow(packed, blocks, scale, 32, out);
  EXPECT_EQ(out[16], 0.0f);
  EXPECT_TRUE(std::signbit(out[16]));
  EXPECT_FALSE(std::signbit(out[17]));
}

TEST(Nvfp4Row, TinyRowScaleIsRaisedToFltMin) {
  float x[16] = {};
  x[0] = 0x1p-140f;  // amax / 2688 is below FLT_MIN
  uint8_t packed[8], blocks[1];
  float scale;
  ASSERT_TRUE(QuantizeRow(x, 16, packed, blocks, &scale));
  EXPECT_EQ(scale, 0x1p-126f);
  EXPECT_EQ(RowScale(0x1p-140f), 0x1p-126f);
  EXPECT_EQ(RowScale(0.0f), 1.0f);
}

TEST(Nvfp4Row, NonFiniteInputIsRefused) {
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    float x[16] = {};
    x[9] = bad;
    uint8_t packed[8], blocks[1];
    float scale;
    EXPECT_FALSE(QuantizeRow(x, 16, packed, blocks, &scale)) << bad;
  }
}

TEST(Nvfp4Row, DecodeIsCodeTimesBlockDivisor) {
  uint8_t packed[8], blocks[1] = {0x38};  // block scale 1.0
  for (int i = 0; i < 8; ++i) packed[i] = static_cast<uint8_t>(2 * i | (2 * i + 1) << 4);
  float out[16];
  DequantizeRow(packed, blocks, 0.5f, 16, out);
  for (uint8_t c = 0; c < 16; ++c) EXPECT_EQ(out[c], DecodeE2M1(c) * 0.5f) << int(c);
}

TEST(Nvfp4Validation, BlockScalesWithTheSignBitOrNanAreInvalid) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t b[3] = {0x10, static_cast<uint8_t>(c), 0x20};
    EXPECT_EQ(FindInvalidBlockScale(b, 3), c < 0x7F ? 3u : 1u) << c;
  }
}

}  // namespace
}  // namespace kvfile::codec::nvfp4

namespace kvfile::codec::nvfp4 {
namespace {

// Rows of f32 values as src (narrowed for bf16/f16 into *narrow).
const void* AsDtype(const std::vector<float>& rows, Dtype src, std::vector<uint16_t>* narrow) {
  if (src == Dtype::kF32) return rows.data();
  narrow->resize(rows.size());
  ConvertRaw(Dtype::kF32, rows.data(), rows.size(), src, narrow->data());
  return narrow->data();
}

// The packed codes, block scales and row scales of `rows` rows of n.
struct Quantized {
  std::vector<uint8_t> codes, blocks;
  std::vector<float> scales;
};
Quantized QuantizeWith(Isa isa, Dtype src, const void* input, size_t rows, size_t n) {
  Quantized q{std::vector<uint8_t>(rows * n / 2), std::vector<uint8_t>(rows * n / kBlock), std::vector<float>(rows)};
  size_t bad = 0;
  EXPECT_TRUE(QuantizeRows(src, input, rows, n, q.codes.data(), q.blocks.data(), q.scales.data(), &bad, isa));
  return q;
}

// Random KV-like rows (normal values with a few outlier channels, zero
// blocks, tiny rows) in every raw dtype, through every instruction-set path:
// codes, block scales, row scales and decoded output equal the scalar path's.
TEST(Nvfp4Paths, EveryIsaMatchesTheScalarReference) {
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  constexpr size_t kRows = 257, kN = 128;
  std::vector<float> rows(kRows * kN);
  for (size_t r = 0; r < kRows; ++r) {
    const float row_scale = std::ldexp(1.0f, static_cast<int>(r % 60) - 40);
    for (size_t i = 0; i < kN; ++i) {
      float v = normal(rng) * row_scale;
      if (i % 37 == 5) v *= 40.0f;                // outlier channels
      if (r % 7 == 3 && i >= 32 && i < 48) v = 0;  // a zero block
      if (r % 11 == 4 && i >= 64 && i < 80) v *= 1e-6f;  // a block far below the row
      if (r % 13 == 0) v = (i % 2) ? -0.0f : 0.0f;       // an all-zero row
      rows[r * kN + i] = v;
    }
  }
  for (Dtype src : {Dtype::kF32, Dtype::kBF16, Dtype::kF16}) {
    std::vector<uint16_t> narrow(kRows * kN);
    const void* input = rows.data();
    if (src != Dtype::kF32) {
      ConvertRaw(Dtype::kF32, rows.data(), rows.size(), src, narrow.data());
      input = narrow.data();
    }
    std::vector<uint8_t> ref_codes(kRows * kN / 2), ref_blocks(kRows * kN / kBlock);
    std::vector<float> ref_scales(kRows);
    size_t bad = 0;
    ASSERT_TRUE(QuantizeRows(src, input, kRows, kN, ref_codes.data(), ref_blocks.data(),
                             ref_scales.data(), &bad, Isa::kScalar));
    for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
      if (!IsaSupported(isa)) {
        std::printf("skipped: %s not supported here\n", IsaName(isa));
        continue;
      }
      std::vector<uint8_t> codes(ref_codes.size()), blocks(ref_blocks.size());
      std::vector<float> scales(kRows);
      ASSERT_TRUE(QuantizeRows(src, input, kRows, kN, codes.data(), blocks.data(), scales.data(),
                               &bad, isa));
      EXPECT_EQ(codes, ref_codes) << IsaName(isa) << " src " << int(src);
      EXPECT_EQ(blocks, ref_blocks) << IsaName(isa);
      EXPECT_EQ(0, std::memcmp(scales.data(), ref_scales.data(), kRows * 4)) << IsaName(isa);
      for (Dtype dst : {Dtype::kF32, Dtype::kBF16, Dtype::kF16}) {
        const size_t bytes = kRows * kN * kvfile::ElementSize(dst);
        std::vector<uint8_t> ref_out(bytes), out(bytes);
        DequantizeRows(ref_codes.data(), ref_blocks.data(), ref_scales.data(), kRows, kN, dst,
                       ref_out.data(), Isa::kScalar);
        DequantizeRows(ref_codes.data(), ref_blocks.data(), ref_scales.data(), kRows, kN, dst,
                       out.data(), isa);
        EXPECT_EQ(out, ref_out) << IsaName(isa) << " dst " << int(dst);
      }
    }
  }
}

// Elements at, and a few ulps around, t * D for every E2M1 decision
// threshold t and the divisor D of their block (the vector paths decide by
// comparing elements with precomputed thresholds, not by dividing): rows of
// 17 blocks (a group of 16 and one more), block maxima from the row's amax
// down to 2^-40 of it (tiny and zero block scales), rows whose amax is
// subnormal (row scale FLT_MIN), and a non-finite element in the last
// block. Every path gives the reference's bytes.
TEST(Nvfp4Paths, ElementsAroundEveryThresholdMatchTheReference) {
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  constexpr size_t kRows = 600, kN = 17 * kBlock;
  const float kT[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f};
  std::vector<float> rows(kRows * kN);
  for (size_t r = 0; r < kRows; ++r) {
    float* row = &rows[r * kN];
    const float amax = r % 50 == 7 ? 3e-39f * (1.0f + unit(rng)) : std::ldexp(1.0f + unit(rng), int(r % 40) - 20);
    const float scale = RowScale(amax);
    for (size_t b = 0; b < kN / kBlock; ++b) {
      float* block = row + b * kBlock;
      float bmax = b == r % 17 ? amax : amax * std::ldexp(unit(rng), -int(rng() % 41));
      if (r % 9 == 1 && b == 3) bmax = 0;
      block[0] = (rng() & 1) ? -bmax : bmax;
      const float d = BlockDivisor(BlockScaleCode(bmax, scale), scale);
      for (size_t i = 1; i < kBlock; ++i) {
        float y = kT[rng() % 8] * d;
        uint32_t bits;
        std::memcpy(&bits, &y, 4);
        bits = bits + static_cast<uint32_t>(rng() % 5) - 2u;
        std::memcpy(&y, &bits, 4);
        if (!(y <= bmax)) y = bmax;
        block[i] = (rng() & 1) ? -y : y;
      }
    }
  }
  for (Dtype src : {Dtype::kF32, Dtype::kBF16}) {
    std::vector<uint16_t> narrow;
    const void* input = AsDtype(rows, src, &narrow);
    const Quantized ref = QuantizeWith(Isa::kScalar, src, input, kRows, kN);
    for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
      if (!IsaSupported(isa)) continue;
      const Quantized q = QuantizeWith(isa, src, input, kRows, kN);
      EXPECT_EQ(q.codes, ref.codes) << IsaName(isa) << " src " << int(src);
      EXPECT_EQ(q.blocks, ref.blocks) << IsaName(isa);
      EXPECT_EQ(0, std::memcmp(q.scales.data(), ref.scales.data(), kRows * 4)) << IsaName(isa);
    }
  }
  rows[5 * kN + kN - 1] = -INFINITY;  // the last element of row 5's 17th block
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupported(isa)) continue;
    std::vector<uint8_t> codes(kRows * kN / 2), blocks(kRows * kN / kBlock);
    std::vector<float> scales(kRows);
    size_t bad = 0;
    EXPECT_FALSE(QuantizeRows(Dtype::kF32, rows.data(), kRows, kN, codes.data(), blocks.data(), scales.data(),
                              &bad, isa));
    EXPECT_EQ(bad, 5u) << IsaName(isa);
  }
}

// bf16 and f16 rows (the AVX-512 path compares 16-bit patterns with
// thresholds rounded up to the dtype): elements at and a few patterns
// around t * D for every decision threshold t, in rows of 36 blocks (two
// full groups of 16 and four more), block maxima from the row's amax down
// to 2^-30 of it, zero blocks, all-zero rows and, for f16, subnormal rows.
// Every path gives the reference's bytes.
TEST(Nvfp4Paths, SixteenBitElementsAroundEveryThresholdMatchTheReference) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  constexpr size_t kRows = 400, kN = 36 * kBlock;
  const float kT[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f};
  for (Dtype dt : {Dtype::kBF16, Dtype::kF16}) {
    const auto narrow = [dt](float v) {
      uint16_t h;
      ConvertRaw(Dtype::kF32, &v, 1, dt, &h);
      return h;
    };
    const auto widen = [dt](uint16_t h) {
      float v;
      ConvertRaw(dt, &h, 1, Dtype::kF32, &v);
      return v;
    };
    // Row maxima 2^-20 .. 2^15 for f16 (subnormal at the bottom), 2^-40 .. 2^41 for bf16.
    const int lowest = dt == Dtype::kF16 ? -20 : -40, span = dt == Dtype::kF16 ? 35 : 81;
    std::vector<uint16_t> rows(kRows * kN);
    for (size_t r = 0; r < kRows; ++r) {
      uint16_t* row = &rows[r * kN];
      if (r % 37 == 0) {  // an all-zero row, signs mixed
        for (size_t i = 0; i < kN; ++i) row[i] = (i % 3 == 0) ? 0x8000 : 0;
        continue;
      }
      const float amax = widen(narrow(std::ldexp(1.0f + unit(rng), lowest + static_cast<int>(r % span))));
      const float scale = RowScale(amax);
      for (size_t b = 0; b < kN / kBlock; ++b) {
        uint16_t* block = row + b * kBlock;
        float bmax = b == r % 36 ? amax : widen(narrow(amax * std::ldexp(unit(rng), -static_cast<int>(rng() % 31))));
        if (r % 9 == 1 && b == 3) bmax = 0;
        const uint16_t top = narrow(bmax);
        block[0] = static_cast<uint16_t>(top | ((rng() & 1) << 15));
        const float d = BlockDivisor(BlockScaleCode(bmax, scale), scale);
        for (size_t i = 1; i < kBlock; ++i) {
          int h = narrow(kT[rng() % 8] * d) + static_cast<int>(rng() % 5) - 2;
          h = h < 0 ? 0 : h > top ? top : h;
          block[i] = static_cast<uint16_t>(h | ((rng() & 1) << 15));
        }
      }
    }
    const Quantized ref = QuantizeWith(Isa::kScalar, dt, rows.data(), kRows, kN);
    for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
      if (!IsaSupported(isa)) continue;
      const Quantized q = QuantizeWith(isa, dt, rows.data(), kRows, kN);
      EXPECT_EQ(q.codes, ref.codes) << IsaName(isa) << " src " << int(dt);
      EXPECT_EQ(q.blocks, ref.blocks) << IsaName(isa) << " src " << int(dt);
      EXPECT_EQ(0, std::memcmp(q.scales.data(), ref.scales.data(), kRows * 4)) << IsaName(isa);
    }
  }
}

TEST(Nvfp4Paths, EveryCodeAndBlockScaleDecodesAlike) {
  // All 256 byte values as packed pairs under every valid block scale.
  std::vector<uint8_t> packed(128 * 8), blocks(128);
  for (size_t b = 0; b < 127; ++b) {
    blocks[b] = static_cast<uint8_t>(b);
    for (size_t j = 0; j < 8; ++j) packed[b * 8 + j] = static_cast<uint8_t>(b * 8 + j + b);
  }
  blocks[127] = 0x7E;
  const float scale = 0.37f;
  std::vector<float> ref(128 * 16), out(128 * 16);
  DequantizeRows(packed.data(), blocks.data(), &scale, 1, 128 * 16, Dtype::kF32, ref.data(),
                 Isa::kScalar);
  for (size_t e = 0; e < 16; ++e) {
    const uint8_t code = static_cast<uint8_t>((packed[e / 2] >> ((e % 2) * 4)) & 0xF);
    EXPECT_EQ(ref[e], DecodeE2M1(code) * BlockDivisor(blocks[0], scale));
  }
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupported(isa)) continue;
    DequantizeRows(packed.data(), blocks.data(), &scale, 1, 128 * 16, Dtype::kF32, out.data(), isa);
    EXPECT_EQ(0, std::memcmp(out.data(), ref.data(), ref.size() * 4)) << IsaName(isa);
  }
}

// ---- 14.4 under extreme row scales ----

uint32_t F32Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

// f32 rounding (RNE) of an exact double, overflowing to +-Inf as an f32
// multiplication does: from 2^128 - 2^103 (halfway past FLT_MAX, a tie that
// goes to the even Inf) up.
float RoundToF32(double x) {
  if (std::fabs(x) >= 0x1.ffffffp127) return x < 0 ? -INFINITY : INFINITY;
  return static_cast<float>(x);
}

// RND_bf16 and RND_f16 (spec/CODEC.md 5.1) of a finite f32, computed here
// independently of the codec: nearest even, clamped to the finite range.
uint16_t ReferenceBf16(float v) {
  const uint32_t b = F32Bits(v), mag = b & 0x7FFFFFFFu;
  const uint32_t rounded = (mag + 0x7FFFu + ((mag >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(((b >> 16) & 0x8000u) | std::min<uint32_t>(rounded, 0x7F7Fu));
}
uint16_t ReferenceF16(float v) {
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(v));
  if (a == 0) return sign;
  if (a >= 65520.0) return static_cast<uint16_t>(sign | 0x7BFF);  // rounds past 65504: clamped
  int e;
  std::frexp(a, &e);
  const int q = std::max(e - 11, -24);  // the f16 step at a: 11 significant bits, subnormal below 2^-14
  const auto steps = static_cast<int>(std::nearbyint(std::ldexp(a, -q)));  // RNE, exact in double
  return static_cast<uint16_t>(sign | (((q + 25) << 10) + steps - 1024));
}

// Row scales at the edges of 8.2's valid range: where DEC_e4m3(B) * S
// overflows to +Inf for the larger block scales, where it just does not,
// the largest a conforming encoder writes (amax / 2688 with amax = FLT_MAX),
// FLT_MIN (subnormal divisors and products), and random valid patterns.
std::vector<float> ExtremeRowScales() {
  std::vector<float> s = {FromBits(0x7F7FFFFF),
                          FromBits(0x7F7FFFFE),
                          FromBits(0x7F000000),
                          FLT_MAX / 448.0f,
                          std::nextafter(FLT_MAX / 448.0f, INFINITY),
                          FLT_MAX / 2688.0f,
                          std::ldexp(1.0f, 120),
                          1.0f,
                          0.37f,
                          FromBits(0x00800000),
                          FromBits(0x00800001)};
  std::mt19937 rng(27);
  for (int i = 0; i < 24; ++i) s.push_back(FromBits(0x00800000u + static_cast<uint32_t>(rng() % (0x7F7FFFFFu - 0x00800000u + 1))));
  return s;
}

// The decoded f32 of a code under block scale B and row scale S, computed
// here from NVIDIA's element values (e2m1_to_f32.bin, e4m3_to_f32.bin made
// with cuda_fp4.hpp / cuda_fp8.hpp) and spec/CODEC.md 14.4: D = DEC_e4m3(B) * S
// and DEC4(code) * D, each an f32 multiplication (exact products in
// double, rounded once); a zero code is the zero of its sign; +-Inf is
// clamped to +-FLT_MAX (section 7 step 2).
float ReferenceDecode(float e2m1_value, float e4m3_value, float row_scale) {
  const float divisor = RoundToF32(static_cast<double>(e4m3_value) * row_scale);
  if (e2m1_value == 0) return e2m1_value;
  const float v = RoundToF32(static_cast<double>(e2m1_value) * divisor);
  return std::isinf(v) ? std::copysign(FLT_MAX, v) : v;
}

// Every code under every valid block scale and each extreme row scale,
// decoded by every instruction-set path into every output dtype: the same
// bits as the reference above on each path. (Before 14.4 defined zero codes,
// a divisor of +Inf made 0 * Inf: NaN on the scalar path, -FLT_MAX on AVX2
// and AVX-512.)
TEST(Nvfp4Paths, ExtremeRowScalesDecodeToTheReferenceOnEveryPath) {
  const auto e2m1_raw = ReadVector("e2m1_to_f32.bin");
  const auto e4m3_raw = ReadVector("e4m3_to_f32.bin");
  ASSERT_EQ(e2m1_raw.size(), 16u * 4);
  ASSERT_EQ(e4m3_raw.size(), 256u * 4);
  float e2m1[16], e4m3[256];
  std::memcpy(e2m1, e2m1_raw.data(), sizeof e2m1);
  std::memcpy(e4m3, e4m3_raw.data(), sizeof e4m3);
  // The codes' and block scales' values are NVIDIA's.
  for (uint8_t c = 0; c < 16; ++c) ASSERT_EQ(F32Bits(DecodeE2M1(c)), F32Bits(e2m1[c])) << int{c};
  for (int b = 0; b < 0x7F; ++b) {
    ASSERT_EQ(F32Bits(DecodeElement(static_cast<uint8_t>(b), Dtype::kE4M3)), F32Bits(e4m3[b])) << b;
  }

  // One row per scale: block b has block scale b (0x00 .. 0x7E) and holds
  // the 16 codes in order (element i of a block has code i).
  const std::vector<float> scales = ExtremeRowScales();
  constexpr size_t kBlocks = 0x7F, kN = kBlocks * kBlock;
  const size_t rows = scales.size();
  std::vector<uint8_t> packed(rows * kN / 2), blocks(rows * kBlocks);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t b = 0; b < kBlocks; ++b) {
      blocks[r * kBlocks + b] = static_cast<uint8_t>(b);
      for (size_t j = 0; j < 8; ++j) packed[(r * kBlocks + b) * 8 + j] = static_cast<uint8_t>(2 * j | (2 * j + 1) << 4);
    }
  }
  std::vector<float> want(rows * kN);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t e = 0; e < kN; ++e) want[r * kN + e] = ReferenceDecode(e2m1[e % 16], e4m3[e / 16], scales[r]);
  }
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupported(isa)) {
      std::printf("skipped: %s not supported here\n", IsaName(isa));
      continue;
    }
    for (Dtype dt : {Dtype::kF32, Dtype::kBF16, Dtype::kF16}) {
      std::vector<uint8_t> out(rows * kN * ElementSize(dt));
      DequantizeRows(packed.data(), blocks.data(), scales.data(), rows, kN, dt, out.data(), isa);
      size_t mismatches = 0;
      for (size_t i = 0; i < rows * kN; ++i) {
        uint32_t got = 0, expected;
        if (dt == Dtype::kF32) {
          std::memcpy(&got, &out[i * 4], 4);
          expected = F32Bits(want[i]);
        } else {
          uint16_t h;
          std::memcpy(&h, &out[i * 2], 2);
          got = h;
          expected = dt == Dtype::kBF16 ? ReferenceBf16(want[i]) : ReferenceF16(want[i]);
        }
        if (got != expected && mismatches++ < 5) {
          ADD_FAILURE() << IsaName(isa) << " " << DtypeName(dt) << ": row scale 0x" << std::hex
                        << F32Bits(scales[i / kN]) << ", block scale 0x" << (i % kN) / 16 << ", code 0x"
                        << i % 16 << ": got 0x" << got << ", want 0x" << expected;
        }
      }
      EXPECT_EQ(mismatches, 0u) << IsaName(isa) << " " << DtypeName(dt);
    }
  }
}

// The case of the report, byte for byte: block scale 448 under the row
// scale FLT_MAX (valid by 14.5) makes the divisor +Inf. Zero codes are
// zeros of their sign, the others the dtype's largest finite value with
// the code's sign, on every path.
TEST(Nvfp4Paths, ZeroCodesUnderAnInfiniteDivisorAreSignedZeros) {
  const uint8_t packed[8] = {0x80, 0x91, 0x80, 0x80, 0x80, 0x80, 0x80, 0xF7};  // codes 0 8 1 9 0 8 ... 7 F
  const uint8_t block = 0x7E;
  const float scale = FromBits(0x7F7FFFFF);
  ASSERT_TRUE(std::isinf(BlockDivisor(block, scale)));
  const uint32_t want_f32[4] = {0x00000000, 0x80000000, 0x7F7FFFFF, 0xFF7FFFFF};
  const uint16_t want_bf16[4] = {0x0000, 0x8000, 0x7F7F, 0xFF7F};
  const uint16_t want_f16[4] = {0x0000, 0x8000, 0x7BFF, 0xFBFF};
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupported(isa)) continue;
    uint32_t f[16];
    uint16_t bf[16], h[16];
    DequantizeRows(packed, &block, &scale, 1, 16, Dtype::kF32, f, isa);
    DequantizeRows(packed, &block, &scale, 1, 16, Dtype::kBF16, bf, isa);
    DequantizeRows(packed, &block, &scale, 1, 16, Dtype::kF16, h, isa);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(f[i], want_f32[i]) << IsaName(isa) << " element " << i;
      EXPECT_EQ(bf[i], want_bf16[i]) << IsaName(isa) << " element " << i;
      EXPECT_EQ(h[i], want_f16[i]) << IsaName(isa) << " element " << i;
    }
    EXPECT_EQ(f[14], 0x7F7FFFFFu) << IsaName(isa);  // code 7: 6 * Inf
    EXPECT_EQ(f[15], 0xFF7FFFFFu) << IsaName(isa);  // code F: -6 * Inf
  }
}

TEST(Nvfp4Paths, NonFiniteRowsAndBadWidthsAreReported) {
  std::vector<float> x(4 * 32, 1.0f);
  x[2 * 32 + 17] = NAN;
  x[3 * 32 + 1] = INFINITY;
  std::vector<uint8_t> codes(4 * 16), blocks(8);
  std::vector<float> scales(4);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupported(isa)) continue;
    size_t bad = 99;
    EXPECT_FALSE(QuantizeRows(Dtype::kF32, x.data(), 4, 32, codes.data(), blocks.data(),
                              scales.data(), &bad, isa));
    EXPECT_EQ(bad, 2u) << IsaName(isa);
  }
  size_t bad = 99;
  EXPECT_FALSE(QuantizeRows(Dtype::kF32, x.data(), 1, 24, codes.data(), blocks.data(),
                            scales.data(), &bad));
  EXPECT_EQ(bad, 1u);  // a width that is not a multiple of 16: no row is valid
}

}  // namespace
}  // namespace kvfile::codec::nvfp4

namespace kvfile::codec::nvfp4 {
namespace {

TEST(Nvfp4Paths, KvLikeRowsMatchNvidiaOnEveryIsa) {
  const auto raw = ReadVector("rows_bf16.bin");
  const auto codes = ReadVector("rows_nvfp4_codes.bin");
  const auto blocks = ReadVector("rows_nvfp4_block_scales.bin");
  const auto scales = ReadVector("rows_nvfp4_scales.bin");
  const size_t rows = 4096, n = 128;
  ASSERT_EQ(raw.size(), rows * n * 2);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupported(isa)) {
      std::printf("skipped: %s not supported here\n", IsaName(isa));
      continue;
    }
    std::vector<uint8_t> c(rows * n / 2), b(rows * n / kBlock);
    std::vector<uint8_t> s(rows * 4);
    size_t bad = 0;
    ASSERT_TRUE(QuantizeRows(Dtype::kBF16, raw.data(), rows, n, c.data(), b.data(),
                             reinterpret_cast<float*>(s.data()), &bad, isa));
    EXPECT_EQ(c, codes) << IsaName(isa);
    EXPECT_EQ(b, blocks) << IsaName(isa);
    EXPECT_EQ(s, scales) << IsaName(isa);
  }
}

}  // namespace
}  // namespace kvfile::codec::nvfp4
