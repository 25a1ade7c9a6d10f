// SPDX-License-Identifier: Apache-2.0
// ChunkBuilder: staging appended rows and sealing them into chunk bytes
// (see chunk_builder.h).
#include "writer/chunk_builder.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "kvfile/codec.h"
#include "codec/dtype_codec.h"
#include "codec/row_check.h"
#include "format/endian.h"
#include "reader/parallel_chunks.h"

namespace kvfile::internal {

using namespace kvfile::format;

namespace {

// A RowBlock's pointer to one part of its codes.
const void* BlockPart(const RowBlock& blk, DtypePart p) {
  switch (p) {
    case DtypePart::kCodes: return blk.data;
    case DtypePart::kBlockScales: return blk.block_scales;
    case DtypePart::kRowScales: return blk.scales;
  }
  return nullptr;
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
    const DtypeInfo* in = FindDtype(blk.dtype);
    if (in == nullptr) return Status::InvalidArgument(where + ": invalid input dtype");
    const bool prequantized = in->quantization != Quantization::kNone;
    if (prequantized && blk.dtype != spec.dtype)
      return Status::InvalidArgument(where + ": codes are " + DtypeName(blk.dtype) +
                                     " but the stream stores " + DtypeName(spec.dtype));
    // Codes come with every other part of their dtype (row scales named first).
    for (size_t k = in->part_count; k-- > 1;) {
      if (BlockPart(blk, in->parts[k]) != nullptr) continue;
      return Status::InvalidArgument(where + (in->parts[k] == DtypePart::kRowScales
                                                  ? std::string(": codes given without scales")
                                                  : std::string(": ") + in->name + " codes given without block scales"));
    }
    if (!scan_values) return Status::OK();
    // Codes as the codec sees them; raw input row by row.
    const CodecRows cr = CodecRowsOf(blk.dtype, spec.rows_per_token, spec.row_width);
    codec::RowCheck rc =
        codec::CheckRows(blk.dtype, blk.data, blk.scales, n * cr.per_token, cr.width, blk.block_scales);
    if (!rc.ok())
      return Status::NonFinite(std::string(codec::RowFaultText(rc.fault)) + " in " +
                               RowWhere(layer, s, first, rc.row, cr, in->quantization == Quantization::kPerToken));
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
    const CodecRows cr = CodecRowsOf(spec);
    // The section's parts at the first token staged now.
    const codec::PartsOut dst =
        codec::AtRow(spec.dtype, SectionParts(sec, base + sec.offset), uint64_t{staged_} * cr.per_token, cr.width);
    const DtypeInfo* in = FindDtype(blk.dtype);
    if (in == nullptr) return Status::InvalidArgument(Where(layer, s, first, 0) + ": invalid input dtype");
    if (in->quantization != Quantization::kNone) {
      // Codes from the caller (of the stream's dtype: Validate) get the
      // checks a reader would make, then are copied part by part.
      const codec::PartsIn src =
          codec::AtRow(blk.dtype, codec::PartsIn{blk.data, blk.block_scales, blk.scales}, from * cr.per_token, cr.width);
      codec::RowCheck rc = codec::CodecOf(blk.dtype)->check(blk.dtype, src, n * cr.per_token, cr.width);
      if (!rc.ok())
        return Status::NonFinite(std::string(codec::RowFaultText(rc.fault)) + " in " +
                                 RowWhere(layer, s, first, rc.row, cr, in->quantization == Quantization::kPerToken));
      codec::CopyParts(spec.dtype, src, n * cr.per_token, cr.width, dst);
      return Status::OK();
    }
    // Raw rows are encoded into the stream's parts (quantized, or converted);
    // a non-finite one is named by token and row.
    const uint64_t elems_per_token = spec.ElementsPerToken();
    const uint8_t* src = static_cast<const uint8_t*>(blk.data) + CodeBytes(blk.dtype, from * elems_per_token);
    size_t bad_row;
    if (codec::CodecOf(spec.dtype)->encode(spec.dtype, blk.dtype, src, n * cr.per_token, cr.width, dst, &bad_row))
      return Status::OK();
    const uint64_t bad_token = bad_row / cr.per_token;
    const size_t bad =
        codec::FindNonFinite(blk.dtype, src + CodeBytes(blk.dtype, bad_token * elems_per_token), elems_per_token);
    return Status::NonFinite("non-finite value in " + Where(layer, s, first + bad_token, bad / spec.row_width));
  };
  KVFILE_RETURN_IF_ERROR(ForSections(n, stage));
  for (uint32_t i = 0; i < n; ++i) StoreU32(base + full_.tokens_offset + 4ull * (staged_ + i), b.tokens[from + i]);
  staged_ += n;
  return Status::OK();
}

// Where a row the row check refused lies: `row` counts rows of `cr` from
// the batch's first token `first`; a row of per-token codes (nvfp4) is a
// whole token.
std::string ChunkBuilder::RowWhere(uint32_t layer, uint32_t stream, uint64_t first, uint64_t row,
                                   const CodecRows& cr, bool per_token_codes) const {
  if (per_token_codes)
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
