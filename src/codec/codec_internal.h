// SPDX-License-Identifier: Apache-2.0
// Internal interface between the codec's public wrappers (codec.cc) and its
// per-instruction-set kernels (codec_scalar.cc, codec_avx2.cc, codec_avx512.cc).
//
// Each ISA translation unit is compiled with its own -m flags, so nothing here
// may be an inline function or template with external linkage that an ISA unit
// would instantiate: the linker could keep the AVX-512 copy and hand it to the
// scalar path. This header therefore declares only plain functions, data, and
// functions of internal linkage.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvfile/codec.h"

namespace kvfile::codec::internal {

// One set of block kernels. All sets give bit-identical results; the scalar
// set is the reference the others are tested against.
struct Kernels {
  // Same contract as the public QuantizeRows (src_dtype is kBF16, kF16 or kF32).
  bool (*quantize_rows)(Dtype kind, Dtype src_dtype, const void* src, size_t rows, size_t width,
                        uint8_t* codes, float* scales, size_t* bad_row);
  // Same contract as the public DequantizeRows (dst_dtype is kBF16, kF16 or kF32).
  void (*dequantize_rows)(Dtype kind, const uint8_t* codes, const float* scales, size_t rows,
                          size_t width, Dtype dst_dtype, void* dst);
  // Same contract as the public FindInvalidCode.
  size_t (*find_invalid_code)(Dtype kind, const uint8_t* codes, size_t n);
  // codes[i] = EncodeElement(x[i], kind) for i in [0, n): the element
  // conversion applied to values that are already scaled. Any f32 input,
  // including NaN and Inf, gives the same code as EncodeElement.
  void (*encode_scaled)(Dtype kind, const float* x, size_t n, uint8_t* codes);
  // Same contract as the public ConvertRaw.
  void (*convert_raw)(Dtype src_dtype, const void* src, size_t n, Dtype dst_dtype, void* dst);
  // Same contract as the public FindNonFinite.
  size_t (*find_non_finite)(Dtype dtype, const void* src, size_t n);
};

extern const Kernels kScalarKernels;
extern const Kernels kAvx2Kernels;
extern const Kernels kAvx512Kernels;

// The kernel set for `isa` (kBest resolved; an ISA this CPU lacks resolves to
// the widest supported one below it).
const Kernels& KernelsFor(Isa isa);
Isa ResolveIsa(Isa isa);

// The scalar kernels' encode_scaled: EncodeElement over a block. Defined in
// codec.cc next to EncodeElement so that the element conversion inlines.
void EncodeScaledReference(Dtype kind, const float* x, size_t n, uint8_t* codes);

// Per-kind constants of the fp8 formats, shared by all paths.
inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE5M2Max = 57344.0f;
inline constexpr uint8_t kE4M3MaxCode = 0x7E;
inline constexpr uint8_t kE5M2MaxCode = 0x7B;
inline constexpr uint8_t kNanCode = 0x7F;

// Bit patterns of the largest finite bf16 / f16 magnitudes, and of f32 +Inf.
inline constexpr uint16_t kBf16MaxBits = 0x7F7F;
inline constexpr uint16_t kF16MaxBits = 0x7BFF;
inline constexpr uint32_t kF32InfBits = 0x7F800000u;

// The row scale for a row whose largest magnitude is `amax` (finite, >= 0):
// 1.0f for amax == 0, else max(amax / M, FLT_MIN) with an IEEE f32 division.
// Internal linkage (an unnamed namespace), so that every ISA unit inlines its
// own copy compiled with its own flags and the linker never merges them; an
// IEEE division gives the same bits whatever the unit.
namespace {
inline float RowScale(float amax, Dtype kind) {
  if (amax == 0.0f) return 1.0f;
  const float scale = amax / (kind == Dtype::kE4M3 ? kE4M3Max : kE5M2Max);
  constexpr float kFltMin = 0x1p-126f;
  return scale < kFltMin ? kFltMin : scale;
}
}  // namespace

}  // namespace kvfile::codec::internal
