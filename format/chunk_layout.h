// SPDX-License-Identifier: Apache-2.0
// Where everything sits inside one chunk, computed from the geometry and the
// chunk's token count. Reader and writer both use this single definition.
//
//   [0, 64)                 chunk header
//   [64, 64 + 8*N)          section checksums, u64, one per section in
//                           section order; N = L*S, or with layer sets the
//                           (layer, stream) pairs present
//   [.., + 4*T)             token ids, u32
//   zero padding, then head checksum u64 in the last 8 bytes of the head;
//                           the head is a multiple of 64 bytes
//   sections, layer-major:  for layer l, stream s (if present in l): rows [T][R][W] of the
//                           stream's dtype, zero pad to 64, and for fp8
//                           streams the scales f32[T][R], zero pad to 64.
//                           An nvfp4 section (one row of R*W per token):
//                           codes u8[T][R*W/2], zero pad to 64, block
//                           scales u8[T][R*W/16], zero pad to 64, row
//                           scales f32[T], zero pad to 64.
//   the last section's zero padding runs to the chunk's end, a multiple of 4096.
// Section i spans [offset_i, offset_{i+1}) (the last one to chunk_bytes) and
// its checksum covers all of it, padding included, so every byte of a chunk
// is covered by exactly one checksum.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "codec/dtype_codec.h"
#include "format/geometry.h"
#include "kvfile/status.h"

namespace kvfile::format {

struct SectionLayout {
  uint32_t layer = 0;          // which (layer, stream) the section holds
  uint32_t stream = 0;
  uint64_t offset = 0;         // from the chunk's start, multiple of 64
  uint64_t data_bytes = 0;     // T*R*W*element size (T*R*W/2 for nvfp4)
  uint64_t block_scales_offset = 0;  // from the chunk's start; nvfp4 only
  uint64_t block_scales_bytes = 0;   // T*R*W/16 for nvfp4 streams, else 0
  uint64_t scales_offset = 0;  // from the chunk's start; fp8 and nvfp4 streams
  uint64_t scales_bytes = 0;   // T*R*4 for fp8, T*4 for nvfp4, else 0
  uint64_t end = 0;            // next section's offset, or chunk_bytes

  // The section's arrays in order, as (offset, bytes): data, block scales,
  // scales; an absent one has 0 bytes. The rest of [offset, end) is padding.
  struct Part {
    uint64_t offset;
    uint64_t bytes;
  };
  std::array<Part, 3> parts() const {
    return {{{offset, data_bytes}, {block_scales_offset, block_scales_bytes}, {scales_offset, scales_bytes}}};
  }
  // One part of the dtype's table (kvfile/dtype.h), as (offset, bytes).
  Part part(DtypePart p) const {
    switch (p) {
      case DtypePart::kCodes: return {offset, data_bytes};
      case DtypePart::kBlockScales: return {block_scales_offset, block_scales_bytes};
      case DtypePart::kRowScales: return {scales_offset, scales_bytes};
    }
    return {end, 0};
  }
  void set_part(DtypePart p, Part v) {
    switch (p) {
      case DtypePart::kCodes: offset = v.offset, data_bytes = v.bytes; return;
      case DtypePart::kBlockScales: block_scales_offset = v.offset, block_scales_bytes = v.bytes; return;
      case DtypePart::kRowScales: scales_offset = v.offset, scales_bytes = v.bytes; return;
    }
  }
};

struct ChunkLayout {
  uint32_t token_count = 0;
  uint32_t layers = 0;
  uint32_t streams = 0;
  uint64_t section_checksums_offset = ch::kHeaderSize;
  uint64_t tokens_offset = 0;
  uint64_t head_checksum_offset = 0;  // = head_bytes - 8
  uint64_t head_bytes = 0;
  uint64_t chunk_bytes = 0;
  std::vector<SectionLayout> sections;  // the sections present, in order
  // sections[] index of (layer, stream) at layer * streams + stream, or
  // kAbsent where the stream is not in the layer.
  std::vector<uint32_t> section_index;
  static constexpr uint32_t kAbsent = ~uint32_t{0};

  bool present(uint32_t layer, uint32_t stream) const { return index(layer, stream) != kAbsent; }
  // The section's index (and checksum index); kAbsent if not present.
  uint32_t index(uint32_t layer, uint32_t stream) const {
    return section_index[static_cast<size_t>(layer) * streams + stream];
  }
  // Only for a (layer, stream) present.
  const SectionLayout& section(uint32_t layer, uint32_t stream) const { return sections[index(layer, stream)]; }
};

// The rows a stream's section holds as the codec sees them (kvfile/dtype.h).
using kvfile::CodecRows;
inline CodecRows CodecRowsOf(const StreamSpec& s) { return kvfile::CodecRowsOf(s.dtype, s.rows_per_token, s.row_width); }

// The parts of section `sec` in memory, `bytes` at the section's first
// byte; a part the dtype does not store is nullptr.
template <class Parts, class Byte>
Parts SectionPartsT(const SectionLayout& sec, Byte* bytes) {
  Parts p;
  for (DtypePart part : {DtypePart::kCodes, DtypePart::kBlockScales, DtypePart::kRowScales}) {
    const SectionLayout::Part at = sec.part(part);
    if (at.bytes) p.set_part(part, bytes + (at.offset - sec.offset));
  }
  return p;
}
inline codec::PartsIn SectionParts(const SectionLayout& sec, const uint8_t* bytes) {
  return SectionPartsT<codec::PartsIn>(sec, bytes);
}
inline codec::PartsOut SectionParts(const SectionLayout& sec, uint8_t* bytes) {
  return SectionPartsT<codec::PartsOut>(sec, bytes);
}

// Fails (kInvalidArgument) if the chunk would exceed kMaxChunkBytes; all arithmetic
// is checked, so any geometry that passed Geometry::Validate() is safe here.
Status ComputeChunkLayout(const Geometry& g, uint32_t token_count, ChunkLayout* out);

// The size of the head alone (header, checksums, tokens, head checksum).
uint64_t HeadBytes(const Geometry& g, uint32_t token_count);

inline constexpr uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace kvfile::format
