// SPDX-License-Identifier: Apache-2.0
// Section offsets inside a chunk (see chunk_layout.h for the picture).
#include "format/chunk_layout.h"

namespace kvfile::format {

// With the limits of kv_format.h every product below is < 2^45 and every sum
// over sections < 2^59, so plain u64 arithmetic cannot overflow; the geometry
// must have passed Validate(), which DecodeFileHeader guarantees.
uint64_t HeadBytes(const Geometry& g, uint32_t token_count) {
  uint64_t n = ch::kHeaderSize + 8ull * g.SectionCount() + 4ull * token_count + 8;
  return AlignUp(n, kSectionAlign);
}

Status ComputeChunkLayout(const Geometry& g, uint32_t token_count, ChunkLayout* out) {
  if (token_count == 0 || token_count > kMaxChunkTokens)
    return Status::InvalidArgument("chunk token count " + std::to_string(token_count) +
                                   " outside 1..65536");
  ChunkLayout l;
  l.token_count = token_count;
  l.layers = g.layers;
  l.streams = static_cast<uint32_t>(g.streams.size());
  l.section_checksums_offset = ch::kHeaderSize;
  l.tokens_offset = ch::kHeaderSize + 8ull * g.SectionCount();
  l.head_bytes = HeadBytes(g, token_count);
  l.head_checksum_offset = l.head_bytes - 8;
  l.sections.reserve(g.SectionCount());
  l.section_index.assign(static_cast<size_t>(l.layers) * l.streams, ChunkLayout::kAbsent);
  uint64_t pos = l.head_bytes;
  for (uint32_t layer = 0; layer < l.layers; ++layer) {
    for (uint32_t s = 0; s < l.streams; ++s) {
      if (!g.InLayer(layer, s)) continue;
      const StreamSpec& spec = g.streams[s];
      l.section_index[static_cast<size_t>(layer) * l.streams + s] = static_cast<uint32_t>(l.sections.size());
      SectionLayout& sec = l.sections.emplace_back();
      sec.layer = layer;
      sec.stream = s;
      // The dtype's parts in order, each padded to 64; a part the dtype
      // does not store has 0 bytes at the position it would have.
      const CodecRows cr = CodecRowsOf(spec);
      const uint64_t rows = uint64_t{token_count} * cr.per_token;
      for (DtypePart part : {DtypePart::kCodes, DtypePart::kBlockScales, DtypePart::kRowScales}) {
        const uint64_t bytes = PartBytes(spec.dtype, part, rows, cr.width);
        sec.set_part(part, {pos, bytes});
        pos = AlignUp(pos + bytes, kSectionAlign);
      }
      if (pos > kMaxChunkBytes)
        return Status::InvalidArgument("a chunk of " + std::to_string(token_count) +
                                       " tokens would exceed 1 GiB; use fewer tokens per chunk");
    }
  }
  l.chunk_bytes = AlignUp(pos, kBlockSize);
  if (l.chunk_bytes > kMaxChunkBytes)
    return Status::InvalidArgument("a chunk of " + std::to_string(token_count) +
                                   " tokens would exceed 1 GiB; use fewer tokens per chunk");
  for (size_t i = 0; i < l.sections.size(); ++i)
    l.sections[i].end = i + 1 < l.sections.size() ? l.sections[i + 1].offset : l.chunk_bytes;
  *out = std::move(l);
  return Status::OK();
}

}  // namespace kvfile::format

namespace kvfile {

Status ChunkBytes(const Geometry& g, uint32_t tokens, uint64_t* bytes) {
  format::ChunkLayout layout;
  KVFILE_RETURN_IF_ERROR(format::ComputeChunkLayout(g, tokens, &layout));
  *bytes = layout.chunk_bytes;
  return Status::OK();
}

}  // namespace kvfile
