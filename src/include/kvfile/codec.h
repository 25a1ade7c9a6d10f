// SPDX-License-Identifier: Apache-2.0
// The fp8 row codec: f32/bf16/f16 rows <-> fp8 (e4m3 or e5m2) codes plus one
// f32 scale per row, exactly as spec/CODEC.md defines it; at the end, the 4-bit
// NVFP4 rows (codes, block scales and a row scale, section 14).
//
// Every function works on whole blocks of rows; there is no per-element call
// in the hot path. Each block function has a scalar reference and vectorized
// paths (AVX2, AVX-512) chosen at run time; all paths give identical bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvfile/export.h"
#include "kvfile/dtype.h"
#include "kvfile/status.h"

namespace kvfile::codec {

// The fp8 kind of a code is a kvfile::Dtype: kE4M3 or kE5M2. Every `kind`
// argument below must be one of the two.
using kvfile::Dtype;

// Instruction-set paths. kBest picks the widest one this CPU supports.
enum class Isa : uint8_t { kScalar, kAvx2, kAvx512, kBest };
KVFILE_EXPORT Isa BestIsa();                      // what kBest resolves to on this machine
KVFILE_EXPORT bool IsaSupported(Isa isa);         // kScalar and kBest are always supported
KVFILE_EXPORT const char* IsaName(Isa isa);       // "scalar", "avx2", "avx512"

// Largest finite magnitude of each kind: 448 (e4m3) and 57344 (e5m2).
KVFILE_EXPORT float Fp8MaxFinite(Dtype kind);

// ---- Element conversions (reference semantics; used by tests and tables) ----
// f32 -> fp8: round to nearest, ties to even; finite overflow and +-Inf
// saturate to +-max; NaN -> 0x7F; the sign of zero is kept.
KVFILE_EXPORT uint8_t EncodeElement(float x, Dtype kind);
// fp8 -> f32, exact. NaN codes give a quiet NaN, e5m2 Inf codes give +-Inf.
KVFILE_EXPORT float DecodeElement(uint8_t code, Dtype kind);
// True for the codes the encoder never emits and readers refuse
// (e4m3: 0x7F, 0xFF; e5m2: 0x7C-0x7F, 0xFC-0xFF).
KVFILE_EXPORT bool IsNonFiniteCode(uint8_t code, Dtype kind);

// Round-to-nearest-even conversions of one f32 into the raw dtypes, clamped to
// the destination's finite range, signed zero kept.
KVFILE_EXPORT uint16_t F32ToBf16(float x);
KVFILE_EXPORT uint16_t F32ToF16(float x);
KVFILE_EXPORT float Bf16ToF32(uint16_t bits);
KVFILE_EXPORT float F16ToF32(uint16_t bits);

// ---- Block operations -------------------------------------------------------
// Quantizes `rows` rows of `width` elements. `src` holds rows*width elements
// of `src_dtype` (kBF16/kF16 as u16 bit patterns, kF32 as float), row after
// row. Writes rows*width codes and `rows` scales.
// If a row holds a NaN or Inf, returns false with *bad_row set to the first
// such row; codes and scales are then unspecified.
KVFILE_EXPORT bool QuantizeRows(Dtype kind, Dtype src_dtype, const void* src, size_t rows, size_t width,
                  uint8_t* codes, float* scales, size_t* bad_row, Isa isa = Isa::kBest);

// Decodes rows*width codes with their `rows` scales into `dst` as `dst_dtype`
// (kBF16, kF16 or kF32): value = table[code] * scale in f32, then rounded to
// nearest even into dst_dtype and clamped to its finite range.
// Precondition: no non-finite code and every scale finite and positive
// (callers validate with FindInvalidCode / FindInvalidScale first).
KVFILE_EXPORT void DequantizeRows(Dtype kind, const uint8_t* codes, const float* scales, size_t rows,
                    size_t width, Dtype dst_dtype, void* dst, Isa isa = Isa::kBest);

// Index of the first non-finite code in codes[0, n), or n if there is none.
KVFILE_EXPORT size_t FindInvalidCode(Dtype kind, const uint8_t* codes, size_t n, Isa isa = Isa::kBest);
// Index of the first scale that is not a finite number > 0, or n.
KVFILE_EXPORT size_t FindInvalidScale(const float* scales, size_t n);

// Converts n raw elements between kBF16, kF16 and kF32 (same dtype: a copy).
// Narrowing rounds to nearest even and clamps to the finite range.
KVFILE_EXPORT void ConvertRaw(Dtype src_dtype, const void* src, size_t n, Dtype dst_dtype, void* dst);

// Index of the first non-finite element in a raw block of n elements, or n.
KVFILE_EXPORT size_t FindNonFinite(Dtype dtype, const void* src, size_t n);

// ---- NVFP4 (spec/CODEC.md section 14) -----------------------------------------
// Elements per E4M3 block scale.
inline constexpr size_t kNvfp4Block = 16;
// Quantizes `rows` rows of `width` elements of src_dtype (kBF16, kF16, kF32),
// width a multiple of kNvfp4Block: rows*width/2 packed E2M1 bytes (low nibble
// first), rows*width/16 E4M3 block scales, `rows` f32 row scales. A row with
// NaN or Inf: false, *bad_row its index; a width that is not a multiple of
// 16 or another src_dtype: false, *bad_row = rows.
KVFILE_EXPORT bool QuantizeNvfp4Rows(Dtype src_dtype, const void* src, size_t rows, size_t width,
                                     uint8_t* packed, uint8_t* block_scales, float* row_scales,
                                     size_t* bad_row, Isa isa = Isa::kBest);
// Decodes such rows into dst_dtype (kBF16, kF16, kF32), rounded to nearest
// even and clamped to its finite range. Precondition: every block scale and
// row scale valid (spec/CODEC.md 14.5).
KVFILE_EXPORT void DequantizeNvfp4Rows(const uint8_t* packed, const uint8_t* block_scales,
                                       const float* row_scales, size_t rows, size_t width,
                                       Dtype dst_dtype, void* dst, Isa isa = Isa::kBest);

}  // namespace kvfile::codec
