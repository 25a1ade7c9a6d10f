// SPDX-License-Identifier: Apache-2.0
// kvfile::Dtype: the one element type of the library. It names a stream's
// storage dtype (the value is the byte written to disk, spec/FORMAT.md), the
// dtype rows are read or written as, and, as kE4M3 or kE5M2, the fp8 kind of
// the codec (kvfile/codec.h). The C API's kvfile_dtype has the same values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kvfile/export.h"
#include "kvfile/status.h"

namespace kvfile {

enum class Dtype : uint8_t {
  kE4M3 = 1,  // fp8 e4m3 code per element + one f32 scale per row
  kE5M2 = 2,  // fp8 e5m2 code per element + one f32 scale per row
  kBF16 = 3,  // raw bfloat16 (uint16_t bit patterns in memory)
  kF16 = 4,   // raw IEEE binary16 (uint16_t bit patterns in memory)
  kF32 = 5,   // raw IEEE binary32
  // NVFP4 (spec/CODEC.md 14): a token's rows_per_token * row_width elements
  // of a stream are one nvfp4 row: E2M1 codes two per byte (low nibble
  // first), one E4M3 block scale per 16 elements, one f32 row scale.
  kNvfp4 = 6,
};

// True for the byte values of a Dtype (1..6).
inline constexpr bool IsValidDtype(uint8_t v) { return v >= 1 && v <= 6; }
// kE4M3 and kE5M2: stored as codes plus one scale per row.
inline constexpr bool IsFp8(Dtype d) { return d == Dtype::kE4M3 || d == Dtype::kE5M2; }
// kNvfp4: stored as packed codes, block scales and one scale per token.
inline constexpr bool IsNvfp4(Dtype d) { return d == Dtype::kNvfp4; }
// Stored as codes and scales (fp8 or nvfp4), not as raw values.
inline constexpr bool IsQuantized(Dtype d) { return IsFp8(d) || IsNvfp4(d); }
// Bytes per element of a dtype whose elements are whole bytes (an fp8 code
// is one byte; scales not counted); 0 for nvfp4, whose two codes share a
// byte: CodeBytes is the one rule for the bytes of stored elements.
inline constexpr size_t ElementSize(Dtype d) {
  return d == Dtype::kF32 ? 4 : (d == Dtype::kBF16 || d == Dtype::kF16) ? 2 : IsNvfp4(d) ? 0 : 1;
}
// Bytes of n stored elements, scales not counted: n / 2 for nvfp4 (n even),
// else n * ElementSize(d).
inline constexpr uint64_t CodeBytes(Dtype d, uint64_t n) { return IsNvfp4(d) ? n / 2 : n * ElementSize(d); }
// "e4m3", "e5m2", "bf16", "f16", "f32", "nvfp4" ("invalid" for another value).
KVFILE_EXPORT const char* DtypeName(Dtype d);
// The dtype named `name` (DtypeName's text, exactly) into *out; else
// InvalidArgument "unknown dtype 'NAME' (e4m3, e5m2, bf16, f16, f32 or
// nvfp4)" and *out unchanged.
KVFILE_EXPORT Status ParseDtype(std::string_view name, Dtype* out);

}  // namespace kvfile
