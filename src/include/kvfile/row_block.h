// SPDX-License-Identifier: Apache-2.0
// RowBlock and AppendBatch: what one Writer::Append hands over (writer.h,
// which includes this header). On their own so that the library's parts
// that take rows (the chunk builder) need not include the writer.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvfile/dtype.h"

namespace kvfile {

// The rows of one (layer, stream) for the tokens of one append, row after
// row: [tokens][rows_per_token][row_width].
struct RowBlock {
  // kBF16/kF16 (u16 bit patterns) or kF32 input rows, or codes already
  // quantized with the stream's own fp8 dtype (then `scales` holds one f32
  // per row and must be valid). For an nvfp4 stream, codes are kNvfp4: per
  // token, `data` holds rows*width/2 packed code bytes, `block_scales`
  // rows*width/16 E4M3 codes and `scales` one f32 (spec/FORMAT.md 5.2).
  Dtype dtype = Dtype::kBF16;
  const void* data = nullptr;
  const float* scales = nullptr;
  const uint8_t* block_scales = nullptr;  // nvfp4 codes only
};

// One append: token ids and, for every layer and stream, a RowBlock; where a
// stream is absent from a layer (StreamSpec::layers), a RowBlock without
// data (data == nullptr).
// blocks[layer * stream_count + stream].
//
// An append is all or nothing (spec/RECOVERY.md): after a failure or a
// crash the file holds whole appends only. An append too large to hold in
// memory at once can span several calls: every batch but the last sets
// `continued`; the append ends with the first batch that does not.
struct AppendBatch {
  std::span<const uint32_t> tokens;
  std::vector<RowBlock> blocks;
  bool continued = false;  // more of this same append follows in the next Append()
};

}  // namespace kvfile
