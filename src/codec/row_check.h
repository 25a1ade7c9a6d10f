// SPDX-License-Identifier: Apache-2.0
// The one check of stored rows that every reader and writer applies
// (spec/CODEC.md sections 8 and 14.6): raw rows must be finite; fp8 rows
// must hold valid codes and one valid scale per row; nvfp4 rows valid block
// scales and one valid row scale. Callers turn the fault into
// their own message; the rule itself lives only here.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvfile/codec.h"

namespace kvfile::codec {

// What CheckRows found first.
enum class RowFault : uint8_t {
  kNone,
  kNonFiniteValue,  // a NaN or infinite element in a raw row (8.3)
  kNonFiniteCode,   // an invalid fp8 code (8.1)
  kInvalidScale,    // a scale outside 0x00800000..0x7F7FFFFF (8.2)
  kInvalidBlockScale,  // an nvfp4 block scale with bit 7 set, or 0x7F (14.6)
  kInvalidDtype,       // `dtype` is not a Dtype value (nothing checked)
};

// The fault as the messages of every caller name it: "non-finite value",
// "non-finite code", "invalid scale", "invalid block scale", "invalid
// dtype"; "" for kNone.
const char* RowFaultText(RowFault f);

struct RowCheck {
  RowFault fault = RowFault::kNone;
  size_t row = 0;  // the row of the fault (rows are counted from `data`)
  bool ok() const { return fault == RowFault::kNone; }
};

// Checks `rows` rows of `width` elements stored as `dtype` (bf16, f16, f32,
// e4m3, e5m2 or nvfp4) at `data`; for fp8 and nvfp4, `scales` holds one
// scale per row, and for nvfp4 (width a multiple of 16, `data` packed codes)
// `block_scales` holds width / 16 block scales per row.
// Reports the first fault: all codes of the block are checked before any
// scale, so a bad code is reported even when an earlier row's scale is bad;
// for nvfp4 (every code valid) all block scales before any row scale.
RowCheck CheckRows(Dtype dtype, const void* data, const float* scales, size_t rows, size_t width,
                   const uint8_t* block_scales = nullptr);

}  // namespace kvfile::codec
