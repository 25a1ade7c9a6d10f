// SPDX-License-Identifier: Apache-2.0
// ChunkBuilder: staging appended rows and sealing them into chunk bytes
// (see chunk_builder.h).
#include "writer/chunk_builder.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "kvfile/codec.h"
#include "codec/nvfp4.h"
#include "codec/row_check.h"
#include "format/endian.h"
#include "reader/parallel_chunks.h"

namespace kvfile::internal {

using namespace kvfile::format;

namespace {

bool IsRawInput(Dtype d) { return d == Dtype::kBF16 || d == Dtype::kF16 || d == Dtype::kF32; }

// The start of the writer's message for a row the codec's row check refused.
const char* RowFaultText(codec::RowFault f) {
  return f == codec::RowFault::kNonFiniteCode       ? "non-finite code in "
         : f == codec::RowFault::kInvalidScale      ? "invalid scale in "
         : f == codec::RowFault::kInvalidBlockScale ? "invalid block scale in "
                                                    : "non-finite value in ";
}

}  // namespace

uint64_t SealSection(const SectionLayout& sec, uint8_t* bytes) {
  uint64_t pad_begin = sec.offset;
  for (const SectionLayout::Part& part : sec.parts()) {
    if (part.bytes == 0) continue;
    std::memset(bytes + (pad_begin - sec.offset), 0, part.offset - pad_begin);
    pad_begin = part.offset + part.bytes;
  }
  std::memset(bytes + (pad_begin - sec.offset), 0, sec.end - pad_begin);
  return Checksum(bytes, sec.end - sec.offset);
}

void SealHead(const ChunkLayout& layout, const ChunkHeader& head, uint8_t* bytes) {
  uint64_t tokens_end = layout.tokens_offset + 4ull * head.token_count;
  std::memset(bytes + tokens_end, 0, layout.head_checksum_offset - tokens_end);
  EncodeChunkHeader(head, std::span<uint8_t, ch::kHeaderSize>(bytes, ch::kHeaderSize));
  StoreU64(bytes + layout.head_checksum_offset, Checksum(bytes, layout.head_checksum_offset));
}

Status ChunkBuilder::Init(const Geometry* g, uint32_t chunk_tokens, unsigned threads) {
  g_ = g;
  staged_ = 0;
  threads_ = threads == 0 ? std::max(1u, std::thread::hardware_concurrency()) : threads;
  return ComputeChunkLayout(*g, chunk_tokens, &full_);
}

bool ChunkBuilder::Allocate() {
  for (PageBuffer& b : staging_)
    if (b.size() == 0 && !b.Resize(AlignUp(full_.chunk_bytes, kBlockSize))) return false;
  return true;
}

// Work on `tokens` tokens of every section is spread over threads only
// where each thread gets at least kMinBytesPerThread of rows: below that,
// starting threads costs more than it saves.
Status ChunkBuilder::ForSections(uint64_t tokens, const std::function<Status(unsigned, size_t)>& task) const {
  constexpr uint64_t kMinBytesPerThread = uint64_t{1} << 20;
  const size_t sections = static_cast<size_t>(g_->layers) * g_->streams.size();
  const uint64_t bytes = tokens * (full_.chunk_bytes / std::max<uint32_t>(full_.token_count, 1));
  const unsigned workers = WorkerCount(static_cast<unsigned>(std::min<uint64_t>(threads_, bytes / kMinBytesPerThread)),
                                       sections, threads_);
  last_workers_ = workers;
  if (workers <= 1) {
    for (size_t i = 0; i < sections; ++i) KVFILE_RETURN_IF_ERROR(task(0, i));
    return Status::OK();
  }
  return ForEachChunk(0, sections, workers, task);
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
  // Each section is checked on its own; the first failing section in
  // (layer, stream) order is the one reported, however many threads run.
  auto check = [&](unsigned, size_t i) -> Status {
    const uint32_t layer = static_cast<uint32_t>(i / streams), s = static_cast<uint32_t>(i % streams);
    const RowBlock& blk = b.blocks[i];
    const StreamSpec& spec = g.streams[s];
    std::string where = "layer " + std::to_string(layer) + ", stream '" + spec.name + "'";
    // A stream absent from a layer (FORMAT.md 3.2) has no rows there.
    if (!g.InLayer(layer, s))
      return blk.data == nullptr ? Status::OK()
                                 : Status::InvalidArgument(where + ": rows given, but the stream is not in this layer");
    if (blk.data == nullptr) return Status::InvalidArgument(where + ": no rows given");
    bool prequantized = IsQuantized(blk.dtype);
    if (prequantized && blk.dtype != spec.dtype)
      return Status::InvalidArgument(where + ": codes are " + DtypeName(blk.dtype) +
                                     " but the stream stores " + DtypeName(spec.dtype));
    if (prequantized && blk.scales == nullptr)
      return Status::InvalidArgument(where + ": codes given without scales");
    if (IsNvfp4(blk.dtype) && blk.block_scales == nullptr)
      return Status::InvalidArgument(where + ": nvfp4 codes given without block scales");
    if (!prequantized && !IsRawInput(blk.dtype))
      return Status::InvalidArgument(where + ": invalid input dtype");
    if (!scan_values) return Status::OK();
    // Codes as the codec sees them; raw input row by row.
    const CodecRows cr = IsNvfp4(blk.dtype) ? CodecRowsOf(spec) : CodecRows{spec.rows_per_token, spec.row_width};
    codec::RowCheck rc =
        codec::CheckRows(blk.dtype, blk.data, blk.scales, n * cr.per_token, cr.width, blk.block_scales);
    if (!rc.ok())
      return Status::NonFinite(RowFaultText(rc.fault) + RowWhere(layer, s, first, rc.row, cr, IsNvfp4(blk.dtype)));
    return Status::OK();
  };
  return ForSections(scan_values ? n : 0, check);
}

Status ChunkBuilder::Stage(const AppendBatch& b, uint64_t from, uint32_t n, uint64_t sealed_tokens) {
  const Geometry& g = *g_;
  const uint32_t streams = static_cast<uint32_t>(g.streams.size());
  const uint64_t first = sealed_tokens + staged_;
  uint8_t* base = staging_[current_].data();
  // Sections are disjoint in the buffer: each is staged on its own, and a
  // bad value is reported for the first failing section in (layer, stream)
  // order, however many threads run.
  auto stage = [&](unsigned, size_t i) -> Status {
    const uint32_t layer = static_cast<uint32_t>(i / streams), s = static_cast<uint32_t>(i % streams);
    if (!full_.present(layer, s)) return Status::OK();
    const RowBlock& blk = b.blocks[i];
    const StreamSpec& spec = g.streams[s];
    const SectionLayout& sec = full_.section(layer, s);
    uint64_t rows_before = uint64_t{staged_} * spec.rows_per_token;
    uint64_t rows = uint64_t{n} * spec.rows_per_token;
    uint64_t src_row = from * spec.rows_per_token;
    if (IsNvfp4(spec.dtype)) return StageNvfp4(blk, layer, s, sec, from, n, first);
    size_t in_elem = ElementSize(blk.dtype);
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
        return Status::OK();
      }
      size_t bad_row;
      if (!codec::QuantizeRows(spec.dtype, blk.dtype, src, rows, spec.row_width, dst, scales, &bad_row))
        return Status::NonFinite("non-finite value in " + Where(layer, s, first + bad_row / spec.rows_per_token,
                                                                bad_row % spec.rows_per_token));
      return Status::OK();
    }
    size_t elems = rows * spec.row_width;
    codec::RowCheck rc = codec::CheckRows(blk.dtype, src, nullptr, rows, spec.row_width);
    if (!rc.ok())
      return Status::NonFinite(RowFaultText(rc.fault) +
                               Where(layer, s, first + rc.row / spec.rows_per_token, rc.row % spec.rows_per_token));
    codec::ConvertRaw(blk.dtype, src, elems, spec.dtype, dst);
    return Status::OK();
  };
  KVFILE_RETURN_IF_ERROR(ForSections(n, stage));
  for (uint32_t i = 0; i < n; ++i) StoreU32(base + full_.tokens_offset + 4ull * (staged_ + i), b.tokens[from + i]);
  staged_ += n;
  return Status::OK();
}

// One nvfp4 section's part of Stage: a token's R*W elements are one nvfp4
// row (spec/FORMAT.md 5.2). Codes from the caller get the reader's checks;
// raw rows are quantized, and a non-finite one is named by token and row.
Status ChunkBuilder::StageNvfp4(const RowBlock& blk, uint32_t layer, uint32_t s, const SectionLayout& sec,
                                uint64_t from, uint32_t n, uint64_t first) {
  const StreamSpec& spec = g_->streams[s];
  const CodecRows cr = CodecRowsOf(spec);
  uint8_t* base = staging_[current_].data();
  uint8_t* codes = base + sec.offset + staged_ * cr.width / 2;
  uint8_t* block_scales = base + sec.block_scales_offset + staged_ * cr.width / codec::nvfp4::kBlock;
  float* scales = reinterpret_cast<float*>(base + sec.scales_offset) + staged_;
  if (IsNvfp4(blk.dtype)) {
    const uint8_t* src = static_cast<const uint8_t*>(blk.data) + from * cr.width / 2;
    const uint8_t* src_blocks = blk.block_scales + from * cr.width / codec::nvfp4::kBlock;
    codec::RowCheck rc = codec::CheckRows(Dtype::kNvfp4, src, blk.scales + from, n, cr.width, src_blocks);
    if (!rc.ok()) return Status::NonFinite(RowFaultText(rc.fault) + RowWhere(layer, s, first, rc.row, cr, true));
    std::memcpy(codes, src, n * cr.width / 2);
    std::memcpy(block_scales, src_blocks, n * cr.width / codec::nvfp4::kBlock);
    std::memcpy(scales, blk.scales + from, n * sizeof(float));
    return Status::OK();
  }
  const size_t in_elem = ElementSize(blk.dtype);
  const uint8_t* src = static_cast<const uint8_t*>(blk.data) + from * cr.width * in_elem;
  size_t bad_token;
  if (codec::nvfp4::QuantizeRows(blk.dtype, src, n, cr.width, codes, block_scales, scales, &bad_token))
    return Status::OK();
  size_t bad = codec::FindNonFinite(blk.dtype, src + bad_token * cr.width * in_elem, cr.width);
  return Status::NonFinite("non-finite value in " + Where(layer, s, first + bad_token, bad / spec.row_width));
}

// Where a row the row check refused lies: `row` counts rows of `cr` from
// the batch's first token `first`; a row of nvfp4 codes is a whole token.
std::string ChunkBuilder::RowWhere(uint32_t layer, uint32_t stream, uint64_t first, uint64_t row,
                                   const CodecRows& cr, bool nvfp4_codes) const {
  if (nvfp4_codes)
    return "layer " + std::to_string(layer) + ", stream '" + g_->streams[stream].name + "', token " +
           std::to_string(first + row);
  return Where(layer, stream, first + row / cr.per_token, row % cr.per_token);
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
      for (size_t k = 0; k < 3; ++k)
        if (to.parts()[k].bytes > 0)
          std::memmove(base + to.parts()[k].offset, base + from.parts()[k].offset, to.parts()[k].bytes);
    }
    layout = &short_layout;
  }
  // Zero every padding byte: the staging buffer is reused, and padding is
  // part of what the checksums cover.
  for (size_t i = 0; i < layout->sections.size(); ++i) {
    const SectionLayout& sec = layout->sections[i];
    StoreU64(base + layout->section_checksums_offset + 8 * i, SealSection(sec, base + sec.offset));
  }
  head.token_count = staged_;
  head.chunk_bytes = layout->chunk_bytes;
  SealHead(*layout, head, base);
  *chunk = std::span<const uint8_t>(base, layout->chunk_bytes);
  return Status::OK();
}

}  // namespace kvfile::internal
