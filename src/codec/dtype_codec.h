// SPDX-License-Identifier: Apache-2.0
// The codec side of the dtype table (kvfile/dtype.h): for each stored
// dtype, the codec entry points that write, read and check its parts. The
// chunk builder, the reader and the row check dispatch through it instead
// of testing for fp8 or nvfp4; a row per Dtype, checked at compile time.
#pragma once

#include <cstddef>
#include <cstdint>

#include "codec/row_check.h"
#include "kvfile/dtype.h"

namespace kvfile::codec {

// One section's parts in memory (kvfile/dtype.h, DtypePart), each at the
// same codec row; a part the dtype does not store is nullptr.
struct PartsIn {
  const void* codes = nullptr;
  const uint8_t* block_scales = nullptr;
  const float* row_scales = nullptr;

  const void* part(DtypePart p) const {
    switch (p) {
      case DtypePart::kCodes: return codes;
      case DtypePart::kBlockScales: return block_scales;
      case DtypePart::kRowScales: return row_scales;
    }
    return nullptr;
  }
  void set_part(DtypePart p, const void* v) {
    switch (p) {
      case DtypePart::kCodes: codes = v; return;
      case DtypePart::kBlockScales: block_scales = static_cast<const uint8_t*>(v); return;
      case DtypePart::kRowScales: row_scales = static_cast<const float*>(v); return;
    }
  }
};
struct PartsOut {
  void* codes = nullptr;
  uint8_t* block_scales = nullptr;
  float* row_scales = nullptr;

  void* part(DtypePart p) const {
    switch (p) {
      case DtypePart::kCodes: return codes;
      case DtypePart::kBlockScales: return block_scales;
      case DtypePart::kRowScales: return row_scales;
    }
    return nullptr;
  }
  void set_part(DtypePart p, void* v) {
    switch (p) {
      case DtypePart::kCodes: codes = v; return;
      case DtypePart::kBlockScales: block_scales = static_cast<uint8_t*>(v); return;
      case DtypePart::kRowScales: row_scales = static_cast<float*>(v); return;
    }
  }
  operator PartsIn() const { return {codes, block_scales, row_scales}; }
};

// The parts advanced by `rows` codec rows of `width` elements of dtype d.
PartsIn AtRow(Dtype d, const PartsIn& p, uint64_t rows, uint64_t width);
PartsOut AtRow(Dtype d, const PartsOut& p, uint64_t rows, uint64_t width);
// Copies `rows` codec rows of `width` elements of every part d stores.
void CopyParts(Dtype d, const PartsIn& from, uint64_t rows, uint64_t width, const PartsOut& to);
// Zeroes `rows` codec rows of `width` elements of every part d stores.
void ZeroParts(Dtype d, uint64_t rows, uint64_t width, const PartsOut& to);
// True when every part d stores has a pointer (false for an invalid d).
bool HasEveryPart(Dtype d, const PartsIn& p);

struct DtypeCodec {
  Dtype dtype;
  // `rows` raw rows of src_dtype (bf16, f16 or f32) into the stored parts:
  // quantized, or converted for a raw dtype. A row with NaN or Inf: false,
  // *bad_row its index (outputs unspecified).
  bool (*encode)(Dtype stored, Dtype src_dtype, const void* src, size_t rows, size_t width, const PartsOut& out,
                 size_t* bad_row);
  // `rows` checked stored rows into dst_dtype (bf16, f16 or f32).
  void (*decode)(Dtype stored, const PartsIn& in, size_t rows, size_t width, Dtype dst_dtype, void* dst);
  // The row check of stored rows (spec/CODEC.md 8 and 14.6): the first fault.
  RowCheck (*check)(Dtype stored, const PartsIn& in, size_t rows, size_t width);
};

// The codec row of a valid dtype (IsValidDtype); nullptr for another value.
const DtypeCodec* CodecOf(Dtype d);

}  // namespace kvfile::codec
