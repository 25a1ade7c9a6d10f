// SPDX-License-Identifier: Apache-2.0
// The row check of spec/CODEC.md sections 8 and 14.6 (see row_check.h).

#include "codec/row_check.h"

#include "codec/nvfp4.h"

namespace kvfile::codec {

RowCheck CheckRows(Dtype dtype, const void* data, const float* scales, size_t rows, size_t width,
                   const uint8_t* block_scales) {
  const size_t elems = rows * width;
  if (dtype == Dtype::kNvfp4) {
    const size_t blocks = elems / nvfp4::kBlock;
    const size_t bad = nvfp4::FindInvalidBlockScale(block_scales, blocks);
    if (bad < blocks) return {RowFault::kInvalidBlockScale, bad / (width / nvfp4::kBlock)};
    const size_t bad_scale = FindInvalidScale(scales, rows);
    if (bad_scale < rows) return {RowFault::kInvalidScale, bad_scale};
    return {};
  }
  if (dtype != Dtype::kE4M3 && dtype != Dtype::kE5M2) {
    const size_t bad = FindNonFinite(dtype, data, elems);
    if (bad < elems) return {RowFault::kNonFiniteValue, bad / width};
    return {};
  }
  const size_t bad = FindInvalidCode(dtype, static_cast<const uint8_t*>(data), elems);
  if (bad < elems) return {RowFault::kNonFiniteCode, bad / width};
  const size_t bad_scale = FindInvalidScale(scales, rows);
  if (bad_scale < rows) return {RowFault::kInvalidScale, bad_scale};
  return {};
}

}  // namespace kvfile::codec
