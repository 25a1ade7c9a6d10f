// SPDX-License-Identifier: Apache-2.0
// Unit tests of the codec's row check (src/codec/row_check.h, spec/CODEC.md
// section 8): every rejection class at its boundaries, which fault and row
// are reported first, and that every scale the quantizer writes passes.

#include "codec/row_check.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

namespace kvfile::codec {
namespace {

constexpr size_t kRows = 4;
constexpr size_t kWidth = 5;  // not a power of two: rows are elems / width

float F(uint32_t bits) { return std::bit_cast<float>(bits); }

// kRows x kWidth elements of `dtype`, all finite (small positive values).
std::vector<uint8_t> FiniteRaw(Dtype dtype) {
  const size_t es = ElementSize(dtype);
  std::vector<uint8_t> v(kRows * kWidth * es);
  for (size_t i = 0; i < kRows * kWidth; ++i) {
    if (dtype == Dtype::kF32) {
      const float x = 0.25f * static_cast<float>(i + 1);
      std::memcpy(&v[i * 4], &x, 4);
    } else {
      const uint16_t h = dtype == Dtype::kBF16 ? static_cast<uint16_t>(0x3E80 + i)   // ~0.25
                                               : static_cast<uint16_t>(0x3400 + i);  // 0.25
      std::memcpy(&v[i * 2], &h, 2);
    }
  }
  return v;
}

void Put(Dtype dtype, std::vector<uint8_t>* v, size_t elem, uint32_t bits) {
  if (dtype == Dtype::kF32) {
    std::memcpy(&(*v)[elem * 4], &bits, 4);
  } else {
    const auto h = static_cast<uint16_t>(bits);
    std::memcpy(&(*v)[elem * 2], &h, 2);
  }
}

struct RawCase {
  Dtype dtype;
  std::vector<uint32_t> accepted;  // finite extremes
  std::vector<uint32_t> refused;   // every kind of non-finite pattern
};

std::vector<RawCase> RawCases() {
  return {
      {Dtype::kBF16,
       {0x7F7F, 0xFF7F, 0x0001, 0x8001, 0x0000, 0x8000},
       {0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0x7FFF, 0xFFFF}},
      {Dtype::kF16,
       {0x7BFF, 0xFBFF, 0x0001, 0x8001, 0x0000, 0x8000},
       {0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01, 0x7FFF, 0xFFFF}},
      {Dtype::kF32,
       {0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x80000001, 0x00000000, 0x80000000},
       {0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF, 0xFFFFFFFF}},
  };
}

TEST(RowCheck, RawRowsAcceptFiniteExtremes) {
  for (const RawCase& c : RawCases()) {
    for (uint32_t bits : c.accepted) {
      std::vector<uint8_t> v = FiniteRaw(c.dtype);
      Put(c.dtype, &v, 2 * kWidth + 3, bits);
      const RowCheck rc = CheckRows(c.dtype, v.data(), nullptr, kRows, kWidth);
      EXPECT_TRUE(rc.ok()) << DtypeName(c.dtype) << " 0x" << std::hex << bits;
      EXPECT_EQ(rc.fault, RowFault::kNone);
    }
  }
}

TEST(RowCheck, RawRowsRefuseEveryNonFinitePatternWithItsRow) {
  for (const RawCase& c : RawCases()) {
    for (uint32_t bits : c.refused) {
      for (size_t elem : {size_t{0}, kWidth - 1, kWidth, 2 * kWidth + 3, kRows * kWidth - 1}) {
        std::vector<uint8_t> v = FiniteRaw(c.dtype);
        Put(c.dtype, &v, elem, bits);
        const RowCheck rc = CheckRows(c.dtype, v.data(), nullptr, kRows, kWidth);
        EXPECT_EQ(rc.fault, RowFault::kNonFiniteValue)
            << DtypeName(c.dtype) << " 0x" << std::hex << bits << " at " << std::dec << elem;
        EXPECT_EQ(rc.row, elem / kWidth);
        EXPECT_FALSE(rc.ok());
      }
    }
  }
}

TEST(RowCheck, RawRowsReportTheFirstBadRow) {
  std::vector<uint8_t> v = FiniteRaw(Dtype::kF32);
  Put(Dtype::kF32, &v, 3 * kWidth + 0, 0x7F800000);
  Put(Dtype::kF32, &v, 1 * kWidth + 4, 0x7FC00000);
  const RowCheck rc = CheckRows(Dtype::kF32, v.data(), nullptr, kRows, kWidth);
  EXPECT_EQ(rc.fault, RowFault::kNonFiniteValue);
  EXPECT_EQ(rc.row, 1u);
  // Only the rows asked for are looked at.
  EXPECT_TRUE(CheckRows(Dtype::kF32, v.data(), nullptr, 1, kWidth).ok());
}

std::vector<float> ValidScales() { return std::vector<float>(kRows, 1.0f); }

TEST(RowCheck, EveryInvalidCodeIsRefusedAndEveryValidOneAccepted) {
  for (Dtype dtype : {Dtype::kE4M3, Dtype::kE5M2}) {
    const std::vector<float> scales = ValidScales();
    for (unsigned code = 0; code < 256; ++code) {
      std::vector<uint8_t> codes(kRows * kWidth, 0x38);
      codes[2 * kWidth + 1] = static_cast<uint8_t>(code);
      const uint8_t mag = code & 0x7F;
      const bool invalid = dtype == Dtype::kE4M3 ? mag == 0x7F : mag >= 0x7C;
      const RowCheck rc = CheckRows(dtype, codes.data(), scales.data(), kRows, kWidth);
      if (invalid) {
        EXPECT_EQ(rc.fault, RowFault::kNonFiniteCode) << DtypeName(dtype) << " code " << code;
        EXPECT_EQ(rc.row, 2u);
      } else {
        EXPECT_TRUE(rc.ok()) << DtypeName(dtype) << " code " << code;
      }
    }
  }
}

TEST(RowCheck, ScalesAreValidFromFltMinToFltMax) {
  const uint32_t valid[] = {0x00800000, 0x00800001, 0x3F800000, 0x7F7FFFFE, 0x7F7FFFFF};
  const uint32_t invalid[] = {
      0x00000000,  // +0
      0x80000000,  // -0
      0x00000001,  // smallest subnormal
      0x007FFFFF,  // largest subnormal, just below FLT_MIN
      0x80800000,  // -FLT_MIN
      0xBF800000,  // -1
      0xFF7FFFFF,  // -FLT_MAX
      0x7F800000,  // +Inf
      0xFF800000,  // -Inf
      0x7FC00000,  // quiet NaN
      0x7F800001,  // signalling NaN
      0xFFFFFFFF,  // negative NaN
  };
  const std::vector<uint8_t> codes(kRows * kWidth, 0x38);
  for (uint32_t bits : valid) {
    std::vector<float> scales = ValidScales();
    scales[3] = F(bits);
    EXPECT_TRUE(CheckRows(Dtype::kE4M3, codes.data(), scales.data(), kRows, kWidth).ok())
        << "0x" << std::hex << bits;
  }
  for (uint32_t bits : invalid) {
    for (size_t row = 0; row < kRows; ++row) {
      std::vector<float> scales = ValidScales();
      scales[row] = F(bits);
      const RowCheck rc = CheckRows(Dtype::kE5M2, codes.data(), scales.data(), kRows, kWidth);
      EXPECT_EQ(rc.fault, RowFault::kInvalidScale) << "0x" << std::hex << bits;
      EXPECT_EQ(rc.row, row);
    }
  }
}

TEST(RowCheck, CodesAreCheckedBeforeScales) {
  std::vector<uint8_t> codes(kRows * kWidth, 0x38);
  std::vector<float> scales = ValidScales();
  scales[0] = 0.0f;
  scales[2] = F(0x7FC00000);
  // Two bad scales: the first row's is reported.
  RowCheck rc = CheckRows(Dtype::kE4M3, codes.data(), scales.data(), kRows, kWidth);
  EXPECT_EQ(rc.fault, RowFault::kInvalidScale);
  EXPECT_EQ(rc.row, 0u);
  // A bad code in a later row than a bad scale is still reported first.
  codes[3 * kWidth + 2] = 0xFF;
  rc = CheckRows(Dtype::kE4M3, codes.data(), scales.data(), kRows, kWidth);
  EXPECT_EQ(rc.fault, RowFault::kNonFiniteCode);
  EXPECT_EQ(rc.row, 3u);
}

TEST(RowCheck, NoRowsAndEmptyRows) {
  EXPECT_TRUE(CheckRows(Dtype::kBF16, nullptr, nullptr, 0, kWidth).ok());
  EXPECT_TRUE(CheckRows(Dtype::kE4M3, nullptr, nullptr, 0, kWidth).ok());
  // Rows of width 0 have no elements but still a scale each.
  const float scales[2] = {1.0f, -1.0f};
  const RowCheck rc = CheckRows(Dtype::kE4M3, nullptr, scales, 2, 0);
  EXPECT_EQ(rc.fault, RowFault::kInvalidScale);
  EXPECT_EQ(rc.row, 1u);
}

// What the writer stores must pass what the readers check: the all-zero row
// (scale 1.0), a row of subnormals (scale raised to FLT_MIN) and a row at
// FLT_MAX (the largest scale) from every raw dtype into both kinds.
// A byte that is no dtype is refused, not checked as raw values (it was
// once "ok": FindNonFinite finds nothing in a dtype it does not know).
TEST(RowCheck, AValueThatIsNoDtypeIsRefused) {
  const float rows[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  const float scales[2] = {1.0f, 1.0f};
  for (uint8_t v : {uint8_t{0}, uint8_t{7}, uint8_t{200}}) {
    RowCheck rc = CheckRows(static_cast<Dtype>(v), rows, scales, 2, 2);
    EXPECT_EQ(rc.fault, RowFault::kInvalidDtype) << int(v);
    EXPECT_STREQ(RowFaultText(rc.fault), "invalid dtype");
  }
  EXPECT_STREQ(RowFaultText(RowFault::kNonFiniteValue), "non-finite value");
  EXPECT_STREQ(RowFaultText(RowFault::kNonFiniteCode), "non-finite code");
  EXPECT_STREQ(RowFaultText(RowFault::kInvalidScale), "invalid scale");
  EXPECT_STREQ(RowFaultText(RowFault::kInvalidBlockScale), "invalid block scale");
  EXPECT_STREQ(RowFaultText(RowFault::kNone), "");
}

TEST(RowCheck, EveryScaleTheQuantizerWritesPasses) {
  for (Dtype kind : {Dtype::kE4M3, Dtype::kE5M2}) {
    const Dtype stored = kind;
    std::vector<float> rows(3 * kWidth, 0.0f);
    for (size_t i = 0; i < kWidth; ++i) {
      rows[kWidth + i] = F(0x00000001u + static_cast<uint32_t>(i));  // f32 subnormals
      rows[2 * kWidth + i] = i % 2 ? -F(0x7F7FFFFF) : F(0x7F7FFFFF);
    }
    std::vector<uint8_t> codes(rows.size());
    std::vector<float> scales(3);
    size_t bad = 99;
    ASSERT_TRUE(QuantizeRows(kind, Dtype::kF32, rows.data(), 3, kWidth, codes.data(), scales.data(), &bad));
    EXPECT_EQ(std::bit_cast<uint32_t>(scales[0]), 0x3F800000u);
    EXPECT_EQ(std::bit_cast<uint32_t>(scales[1]), 0x00800000u);
    const RowCheck rc = CheckRows(stored, codes.data(), scales.data(), 3, kWidth);
    EXPECT_TRUE(rc.ok()) << static_cast<int>(rc.fault) << " row " << rc.row;
  }
}

}  // namespace
}  // namespace kvfile::codec
