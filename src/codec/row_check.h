// SPDX-License-Identifier: Apache-2.0
// The one check of stored rows that every reader and writer applies
// (spec/CODEC.md section 8): raw rows must be finite; fp8 rows must hold
// valid codes and one valid scale per row. Callers turn the fault into
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
};

struct RowCheck {
  RowFault fault = RowFault::kNone;
  size_t row = 0;  // the row of the fault (rows are counted from `data`)
  bool ok() const { return fault == RowFault::kNone; }
};

// Checks `rows` rows of `width` elements stored as `dtype` (bf16, f16, f32,
// e4m3 or e5m2) at `data`; for fp8, `scales` holds one scale per row.
// Reports the first fault: all codes of the block are checked before any
// scale, so a bad code is reported even when an earlier row's scale is bad.
RowCheck CheckRows(Dtype dtype, const void* data, const float* scales, size_t rows, size_t width);

}  // namespace kvfile::codec
