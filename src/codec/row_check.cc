// SPDX-License-Identifier: Apache-2.0
// The row check of spec/CODEC.md sections 8 and 14.6 (see row_check.h),
// by the dtype's row of the codec table (dtype_codec.h).

#include "codec/row_check.h"

#include "codec/dtype_codec.h"

namespace kvfile::codec {

RowCheck CheckRows(Dtype dtype, const void* data, const float* scales, size_t rows, size_t width,
                   const uint8_t* block_scales) {
  const DtypeCodec* codec = CodecOf(dtype);
  if (codec == nullptr) return {RowFault::kInvalidDtype, 0};
  return codec->check(dtype, PartsIn{data, block_scales, scales}, rows, width);
}

const char* RowFaultText(RowFault f) {
  switch (f) {
    case RowFault::kNone: return "";
    case RowFault::kNonFiniteValue: return "non-finite value";
    case RowFault::kNonFiniteCode: return "non-finite code";
    case RowFault::kInvalidScale: return "invalid scale";
    case RowFault::kInvalidBlockScale: return "invalid block scale";
    case RowFault::kInvalidDtype: return "invalid dtype";
  }
  return "invalid dtype";
}

}  // namespace kvfile::codec
