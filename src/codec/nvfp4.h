// SPDX-License-Identifier: Apache-2.0
// NVFP4: the 4-bit tier of the codec (spec/CODEC.md, section 14).
//
// A row of n elements (n a multiple of 16) becomes n E2M1 codes packed two
// per byte (low nibble first), n / 16 E4M3 block scales and one f32 row
// scale. This file declares the scalar reference, which follows the
// specification step by step; vector paths are tested against it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvfile/codec.h"

namespace kvfile::codec::nvfp4 {

// Elements per block scale.
inline constexpr size_t kBlock = 16;
// The row range: the largest E2M1 magnitude (6) times the largest E4M3 one (448).
inline constexpr float kRowRange = 2688.0f;
// Largest E2M1 magnitude.
inline constexpr float kE2M1Max = 6.0f;

// The E2M1 code (low four bits: sign bit 3, exponent bits 2-1, mantissa bit
// 0) of an f32: round to nearest, ties to even, saturating at +-6; the sign of
// zero is kept; NaN gives 0x7.
uint8_t EncodeE2M1(float x);
// The value of an E2M1 code (its low four bits): +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}.
float DecodeE2M1(uint8_t code);

// The row scale of a row whose largest magnitude is amax (finite, >= 0):
// 1.0 for amax == 0, else max(amax / 2688, FLT_MIN), one f32 division.
float RowScale(float amax);
// The E4M3 block scale code of a block whose largest magnitude is
// block_amax under the row scale: ENC_e4m3((block_amax / row_scale) / 6).
uint8_t BlockScaleCode(float block_amax, float row_scale);
// The divisor of a block's elements: DEC_e4m3(block_code) * row_scale, one
// f32 multiplication (0 for a zero block code).
float BlockDivisor(uint8_t block_code, float row_scale);

// Quantizes one row of n f32 elements (n a multiple of kBlock). Returns false,
// writing nothing defined, when an element is NaN or infinite. Writes n / 2
// packed bytes, n / kBlock block scale codes and the row scale.
bool QuantizeRow(const float* x, size_t n, uint8_t* packed, uint8_t* block_scales,
                 float* row_scale);
// The value of one code under its block's divisor (spec/CODEC.md 14.4): a
// zero code (0x0, 0x8) is the zero of its sign whatever the divisor (+Inf
// included, where the product would be NaN); any other code is
// DEC_e2m1(code) * divisor, one f32 multiplication (+-Inf on overflow).
float DecodeScaled(uint8_t code, float divisor);
// Dequantizes one row to f32: DecodeScaled(code, BlockDivisor(block, row_scale)).
void DequantizeRow(const uint8_t* packed, const uint8_t* block_scales, float row_scale, size_t n,
                   float* out);

// Validation of stored data (spec/CODEC.md 14.6): the index of the first
// invalid block scale code (bit 7 set, or 0x7F) in [0, n), or n. Every E2M1
// code is valid; row scales follow the fp8 rule (FindInvalidScale).
size_t FindInvalidBlockScale(const uint8_t* block_scales, size_t n);

// ---- Block operations (every instruction-set path, identical bytes) ----
// Quantizes `rows` rows of n elements of src_dtype (kBF16, kF16, kF32), n a
// multiple of kBlock: rows * n / 2 packed bytes, rows * n / kBlock block
// scales, `rows` row scales. A row with NaN or Inf: false, *bad_row = its
// index (the first such row), outputs unspecified.
bool QuantizeRows(Dtype src_dtype, const void* src, size_t rows, size_t n, uint8_t* packed,
                  uint8_t* block_scales, float* row_scales, size_t* bad_row,
                  Isa isa = Isa::kBest);
// Decodes into dst_dtype (kBF16, kF16, kF32), rounded to nearest even and
// clamped to the finite range. Precondition: scales valid (14.5).
void DequantizeRows(const uint8_t* packed, const uint8_t* block_scales, const float* row_scales,
                    size_t rows, size_t n, Dtype dst_dtype, void* dst, Isa isa = Isa::kBest);

namespace internal {
// One instruction set's row kernels. quantize_row reads a row of src_dtype
// (it may widen it into scratch, n floats); dequantize_row writes dst_dtype
// (it may decode into scratch first), rounded and clamped as in 14.4.
struct Kernels {
  bool (*quantize_row)(Dtype src_dtype, const void* src, size_t n, uint8_t* packed,
                       uint8_t* block_scales, float* row_scale, float* scratch);
  void (*dequantize_row)(const uint8_t* packed, const uint8_t* block_scales, float row_scale,
                         size_t n, Dtype dst_dtype, void* out, float* scratch);
};

// The element decisions of the vector paths, which do not divide. A code's
// magnitude is the number of the seven conditions below that fl(|x| / D)
// meets (spec/CODEC.md 14.2: ties go to the even code). Each is a condition on the real quotient |x| / D,
// against the midpoint next to the threshold t (t and every such midpoint
// fit in 25 bits, D in 24: their product is exact in double):
//   q > t  <=>  |x| / D > t + ulp(t) / 2 (a tie rounds to t, whose last
//   mantissa bit is 0);  q >= t  <=>  |x| / D >= t - ulp(t) / 2.
// So each condition is |x| >= X, X the least f32 above (or at) the exact
// product: no division per element, and the same codes as the reference.
struct Threshold {
  double midpoint;
  bool strict;
};
inline constexpr Threshold kThresholds[7] = {
    {0.25 + 0x1p-26, true},  {0.75 - 0x1p-25, false}, {1.25 + 0x1p-24, true}, {1.75 - 0x1p-24, false},
    {2.5 + 0x1p-23, true},   {3.5 - 0x1p-23, false},  {5.0 + 0x1p-22, true},
};

extern const Kernels kScalarKernels;
extern const Kernels kAvx2Kernels;
extern const Kernels kAvx512Kernels;
}  // namespace internal

}  // namespace kvfile::codec::nvfp4
