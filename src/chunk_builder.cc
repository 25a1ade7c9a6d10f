// SPDX-License-Identifier: Apache-2.0
// ChunkBuilder: staging appended rows and sealing them into chunk bytes
// (see chunk_builder.h).
#include "chunk_builder.h"

#include <cstring>

#include "kvfile/codec.h"
#include "codec/row_check.h"
#include "format/endian.h"

namespace kvfile::internal {

using namespace kvfile::format;

namespace {

bool IsRawInput(Dtype d) { return d == Dtype::kBF16 || d == Dtype::kF16 || d == Dtype::kF32; }

// The start of the writer's message for a row the codec's row check refused.
const char* RowFaultText(codec::RowFault f) {
  return f == codec::RowFault::kNonFiniteCode  ? "non-finite code in "
         : f == codec::RowFault::kInvalidScale ? "invalid scale in "
                                               : "non-finite value in ";
}

}  // namespace

Status ChunkBuilder::Init(const Geometry* g, uint32_t chunk_tokens) {
  g_ = g;
  staged_ = 0;
  return ComputeChunkLayout(*g, chunk_tokens, &full_);
}

bool ChunkBuilder::Allocate() {
  for (PageBuffer& b : staging_)
    if (b.size() == 0 && !b.Resize(AlignUp(full_.chunk_bytes, kBlockSize))) return false;
  return true;
}

std::string ChunkBuilder::Where(uint32_t layer, uint32_t stream, uint64_t token, uint64_t row) const {
  return "layer " + std::to_string(layer) + ", stream '" + g_->streams[stream].name + "', token " +
         std::to_string(token) + ", row " + std::to_string(row);
}

Status ChunkBuilder::Validate(const AppendBatch& b, bool scan_values, uint64_t sealed_tokens) const {
  const Geometry& g = *g_;
  const uint32_t streams = static_cast<uint32_t>(g.streams.size());
  const uint64_t first = sealed_tokens + staged_;
  size_t expected = static_cast<size_t>(g.layers) * streams;
  if (b.blocks.size() != expected)
    return Status::InvalidArgument("append has " + std::to_string(b.blocks.size()) +
                                   " row blocks; the geometry needs layers x streams = " +
                                   std::to_string(expected));
  uint64_t n = b.tokens.size();
  for (uint32_t layer = 0; layer < g.layers; ++layer) {
    for (uint32_t s = 0; s < streams; ++s) {
      const RowBlock& blk = b.blocks[static_cast<size_t>(layer) * streams + s];
      const StreamSpec& spec = g.streams[s];
      std::string where = "layer " + std::to_string(layer) + ", stream '" + spec.name + "'";
      if (blk.data == nullptr) return Status::InvalidArgument(where + ": no rows given");
      bool prequantized = IsFp8(blk.dtype);
      if (prequantized && blk.dtype != spec.dtype)
        return Status::InvalidArgument(where + ": codes are " + DtypeName(blk.dtype) +
                                       " but the stream stores " + DtypeName(spec.dtype));
      if (prequantized && blk.scales == nullptr)
        return Status::InvalidArgument(where + ": codes given without scales");
      if (!prequantized && !IsRawInput(blk.dtype))
        return Status::InvalidArgument(where + ": invalid input dtype");
      if (!scan_values) continue;
      uint64_t rows = n * spec.rows_per_token;
      codec::RowCheck rc = codec::CheckRows(blk.dtype, blk.data, blk.scales, rows, spec.row_width);
      if (!rc.ok())
        return Status::NonFinite(RowFaultText(rc.fault) +
                                 Where(layer, s, first + rc.row / spec.rows_per_token, rc.row % spec.rows_per_token));
    }
  }
  return Status::OK();
}

Status ChunkBuilder::Stage(const AppendBatch& b, uint64_t from, uint32_t n, uint64_t sealed_tokens) {
  const Geometry& g = *g_;
  const uint32_t streams = static_cast<uint32_t>(g.streams.size());
  const uint64_t first = sealed_tokens + staged_;
  uint8_t* base = staging_[current_].data();
  for (uint32_t layer = 0; layer < g.layers; ++layer) {
    for (uint32_t s = 0; s < streams; ++s) {
      const RowBlock& blk = b.blocks[static_cast<size_t>(layer) * streams + s];
      const StreamSpec& spec = g.streams[s];
      const SectionLayout& sec = full_.section(layer, s);
      uint64_t rows_before = uint64_t{staged_} * spec.rows_per_token;
      uint64_t rows = uint64_t{n} * spec.rows_per_token;
      uint64_t src_row = from * spec.rows_per_token;
      size_t in_elem = blk.dtype == Dtype::kF32 ? 4 : IsFp8(blk.dtype) ? 1 : 2;
      const uint8_t* src = static_cast<const uint8_t*>(blk.data) + src_row * spec.row_width * in_elem;
      uint8_t* dst = base + sec.offset + rows_before * spec.row_width * ElementSize(spec.dtype);
      if (IsFp8(spec.dtype)) {
        float* scales = reinterpret_cast<float*>(base + sec.scales_offset) + rows_before;
        if (IsFp8(blk.dtype)) {
          // Codes from the caller get the checks a reader would make.
          size_t elems = rows * spec.row_width;
          codec::RowCheck rc = codec::CheckRows(blk.dtype, src, blk.scales + src_row, rows, spec.row_width);
          if (!rc.ok())
            return Status::NonFinite(RowFaultText(rc.fault) +
                                     Where(layer, s, first + rc.row / spec.rows_per_token, rc.row % spec.rows_per_token));
          std::memcpy(dst, src, elems);
          std::memcpy(scales, blk.scales + src_row, rows * 4);
          continue;
        }
        size_t bad_row;
        if (!codec::QuantizeRows(spec.dtype, blk.dtype, src, rows, spec.row_width, dst, scales,
                                 &bad_row))
          return Status::NonFinite("non-finite value in " + Where(layer, s, first + bad_row / spec.rows_per_token,
                                                                  bad_row % spec.rows_per_token));
      } else {
        size_t elems = rows * spec.row_width;
        codec::RowCheck rc = codec::CheckRows(blk.dtype, src, nullptr, rows, spec.row_width);
        if (!rc.ok())
          return Status::NonFinite(RowFaultText(rc.fault) +
                                   Where(layer, s, first + rc.row / spec.rows_per_token, rc.row % spec.rows_per_token));
        codec::ConvertRaw(blk.dtype, src, elems, spec.dtype, dst);
      }
    }
  }
  for (uint32_t i = 0; i < n; ++i) StoreU32(base + full_.tokens_offset + 4ull * (staged_ + i), b.tokens[from + i]);
  staged_ += n;
  return Status::OK();
}

// Every byte of the sealed chunk is written here or by Stage: the head
// (header, checksums, tokens, padding), each section's rows and scales, and
// every padding byte (zeroed). So nothing a buffer held before (a full
// chunk, or a short one whose sections were moved down) shows through.
Status ChunkBuilder::Seal(ChunkHeader head, std::span<const uint8_t>* chunk) {
  uint8_t* base = staging_[current_].data();
  ChunkLayout short_layout;
  const ChunkLayout* layout = &full_;
  if (staged_ < full_.token_count) {
    // A short chunk has a smaller head and smaller sections: move every
    // section down to its place in the short layout. Destinations never lie
    // above their sources, so ascending order with memmove is safe.
    KVFILE_RETURN_IF_ERROR(ComputeChunkLayout(*g_, staged_, &short_layout));
    for (size_t i = 0; i < short_layout.sections.size(); ++i) {
      const SectionLayout& from = full_.sections[i];
      const SectionLayout& to = short_layout.sections[i];
      std::memmove(base + to.offset, base + from.offset, to.data_bytes);
      if (to.scales_bytes > 0) std::memmove(base + to.scales_offset, base + from.scales_offset, to.scales_bytes);
    }
    layout = &short_layout;
  }
  // Zero every padding byte: the staging buffer is reused, and padding is
  // part of what the checksums cover.
  uint64_t tokens_end = layout->tokens_offset + 4ull * staged_;
  std::memset(base + tokens_end, 0, layout->head_checksum_offset - tokens_end);
  for (const SectionLayout& sec : layout->sections) {
    uint64_t data_end = sec.offset + sec.data_bytes;
    if (sec.scales_bytes > 0) {
      std::memset(base + data_end, 0, sec.scales_offset - data_end);
      data_end = sec.scales_offset + sec.scales_bytes;
    }
    std::memset(base + data_end, 0, sec.end - data_end);
  }
  head.token_count = staged_;
  head.chunk_bytes = layout->chunk_bytes;
  EncodeChunkHeader(head, std::span<uint8_t, ch::kHeaderSize>(base, ch::kHeaderSize));
  for (size_t i = 0; i < layout->sections.size(); ++i) {
    const SectionLayout& sec = layout->sections[i];
    StoreU64(base + layout->section_checksums_offset + 8 * i, Checksum(base + sec.offset, sec.end - sec.offset));
  }
  StoreU64(base + layout->head_checksum_offset, Checksum(base, layout->head_checksum_offset));
  *chunk = std::span<const uint8_t>(base, layout->chunk_bytes);
  return Status::OK();
}

}  // namespace kvfile::internal
