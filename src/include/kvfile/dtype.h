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

// ---- The dtype table (spec/FORMAT.md section 2) ------------------------------
// A stored section of a stream holds the parts of its dtype, in this order
// (spec/FORMAT.md 5.2), each padded to 64 bytes.
enum class DtypePart : uint8_t {
  kCodes,        // the elements: raw values, fp8 codes, or nvfp4 codes two a byte
  kBlockScales,  // one E4M3 byte per block of elements (nvfp4: 16)
  kRowScales,    // one f32 per quantized row
};
// What one row scale covers: nothing (raw), one row of row_width elements
// (fp8), or one token's rows_per_token * row_width elements (nvfp4).
enum class Quantization : uint8_t { kNone, kPerRow, kPerToken };

struct DtypeInfo {
  Dtype dtype;
  const char* name;           // DtypeName's text
  Quantization quantization;
  uint8_t element_bits;       // bits of kCodes per element: 32, 16, 8 or 4
  uint8_t block_elements;     // elements per block scale; 0: no kBlockScales
  uint8_t part_count;         // parts[0, part_count) are stored, in order
  DtypePart parts[3];
};

// The dtypes, in value order: kDtypeTable[v - 1] describes value v.
inline constexpr DtypeInfo kDtypeTable[] = {
    {Dtype::kE4M3, "e4m3", Quantization::kPerRow, 8, 0, 2, {DtypePart::kCodes, DtypePart::kRowScales}},
    {Dtype::kE5M2, "e5m2", Quantization::kPerRow, 8, 0, 2, {DtypePart::kCodes, DtypePart::kRowScales}},
    {Dtype::kBF16, "bf16", Quantization::kNone, 16, 0, 1, {DtypePart::kCodes}},
    {Dtype::kF16, "f16", Quantization::kNone, 16, 0, 1, {DtypePart::kCodes}},
    {Dtype::kF32, "f32", Quantization::kNone, 32, 0, 1, {DtypePart::kCodes}},
    {Dtype::kNvfp4, "nvfp4", Quantization::kPerToken, 4, 16, 3,
     {DtypePart::kCodes, DtypePart::kBlockScales, DtypePart::kRowScales}},
};
inline constexpr uint8_t kDtypeCount = 6;  // the valid values are 1..kDtypeCount

// The table's row of a dtype: an exhaustive switch, so a new enumerator
// is a compile error (-Wswitch) until the table holds it.
inline constexpr size_t DtypeSlot(Dtype d) {
  switch (d) {
    case Dtype::kE4M3: return 0;
    case Dtype::kE5M2: return 1;
    case Dtype::kBF16: return 2;
    case Dtype::kF16: return 3;
    case Dtype::kF32: return 4;
    case Dtype::kNvfp4: return 5;
  }
  return kDtypeCount;  // not a Dtype value
}
static_assert(sizeof(kDtypeTable) / sizeof(kDtypeTable[0]) == kDtypeCount, "one table row per Dtype");
static_assert([] {
  for (size_t i = 0; i < kDtypeCount; ++i)
    if (DtypeSlot(kDtypeTable[i].dtype) != i || static_cast<size_t>(kDtypeTable[i].dtype) != i + 1) return false;
  return true;
}(), "kDtypeTable in value order");

// True for the byte values of a Dtype (1..kDtypeCount).
inline constexpr bool IsValidDtype(uint8_t v) { return v >= 1 && v <= kDtypeCount; }
// The table row of d; nullptr for a value that is not a Dtype.
inline constexpr const DtypeInfo* FindDtype(Dtype d) {
  size_t slot = DtypeSlot(d);
  return slot < kDtypeCount ? &kDtypeTable[slot] : nullptr;
}
// kE4M3 and kE5M2: stored as codes plus one scale per row.
inline constexpr bool IsFp8(Dtype d) {
  const DtypeInfo* i = FindDtype(d);
  return i && i->quantization == Quantization::kPerRow;
}
// kNvfp4: stored as packed codes, block scales and one scale per token.
inline constexpr bool IsNvfp4(Dtype d) {
  const DtypeInfo* i = FindDtype(d);
  return i && i->quantization == Quantization::kPerToken;
}
// Stored as codes and scales (fp8 or nvfp4), not as raw values.
inline constexpr bool IsQuantized(Dtype d) {
  const DtypeInfo* i = FindDtype(d);
  return i && i->quantization != Quantization::kNone;
}
// Bytes per element of a dtype whose elements are whole bytes (an fp8 code
// is one byte; scales not counted); 0 for nvfp4, whose two codes share a
// byte, and for a value that is not a Dtype: CodeBytes is the one rule for
// the bytes of stored elements.
inline constexpr size_t ElementSize(Dtype d) {
  const DtypeInfo* i = FindDtype(d);
  return i && i->element_bits % 8 == 0 ? i->element_bits / 8 : 0;
}
// Bytes of n stored elements, scales not counted: n / 2 for nvfp4 (n even),
// else n * ElementSize(d); 0 for a value that is not a Dtype.
inline constexpr uint64_t CodeBytes(Dtype d, uint64_t n) {
  const DtypeInfo* i = FindDtype(d);
  return i ? n * i->element_bits / 8 : 0;
}
// The rows a stream's section holds as the codec sees them: per token,
// rows_per_token rows of row_width elements, or for a per-token dtype
// (nvfp4) one row of rows_per_token * row_width elements.
struct CodecRows {
  uint32_t per_token;
  uint64_t width;
};
inline constexpr CodecRows CodecRowsOf(Dtype d, uint32_t rows_per_token, uint32_t row_width) {
  return IsNvfp4(d) ? CodecRows{1, uint64_t{rows_per_token} * row_width} : CodecRows{rows_per_token, row_width};
}
// Bytes of part p of dtype d for `rows` codec rows of `width` elements
// (CodecRowsOf); 0 for a part d does not store.
inline constexpr uint64_t PartBytes(Dtype d, DtypePart p, uint64_t rows, uint64_t width) {
  const DtypeInfo* i = FindDtype(d);
  if (!i) return 0;
  switch (p) {
    case DtypePart::kCodes: return rows * width * i->element_bits / 8;
    case DtypePart::kBlockScales: return i->block_elements ? rows * width / i->block_elements : 0;
    case DtypePart::kRowScales: return i->quantization != Quantization::kNone ? rows * 4 : 0;
  }
  return 0;
}
// "e4m3", "e5m2", "bf16", "f16", "f32", "nvfp4" ("invalid" for another value).
KVFILE_EXPORT const char* DtypeName(Dtype d);
// The dtype named `name` (DtypeName's text, exactly) into *out; else
// InvalidArgument "unknown dtype 'NAME' (e4m3, e5m2, bf16, f16, f32 or
// nvfp4)" and *out unchanged.
KVFILE_EXPORT Status ParseDtype(std::string_view name, Dtype* out);

}  // namespace kvfile
