// SPDX-License-Identifier: Apache-2.0
// ChunkBuilder: the writer's staging buffers and the sealing of staged tokens
// into the bytes of one chunk (spec/FORMAT.md, "Chunks"). No file system:
// it fills memory and hands back the sealed bytes; the writer writes them.
//
// Two buffers: tokens gather in one while the chunk sealed from the other
// may still be in flight. The caller says when the sealed buffer may be
// reused (Advance) only after its write has completed.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "format/chunk_layout.h"
#include "format/header.h"
#include "io/page_buffer.h"
#include "kvfile/row_block.h"
#include "kvfile/status.h"

namespace kvfile::internal {

// The two steps of sealing a chunk, shared by ChunkBuilder::Seal and by
// DirectChunk (direct_chunk.h), which writes chunks without staging them.
//
// Zeroes the padding of one section, whose bytes [sec.offset, sec.end) of
// the chunk are at `bytes` (its arrays already in place), and returns the
// section's checksum.
uint64_t SealSection(const format::SectionLayout& sec, uint8_t* bytes);
// Completes the head at `bytes` ([0, layout.head_bytes) of the chunk): the
// section checksums and head.token_count token ids must be in place; this
// zeroes the padding after the tokens, encodes `head` (its token_count and
// chunk_bytes must be the layout's) and stores the head checksum.
void SealHead(const format::ChunkLayout& layout, const format::ChunkHeader& head, uint8_t* bytes);

class ChunkBuilder {
 public:
  // Layout for chunks of `chunk_tokens` tokens of geometry `g` (kept by
  // pointer: it must outlive the builder). Allocates nothing. Validate and
  // Stage spread a large batch's sections over up to `threads` threads (0:
  // one per core); the bytes and the errors do not depend on the count.
  Status Init(const format::Geometry* g, uint32_t chunk_tokens, unsigned threads = 1);

  // Both staging buffers, zeroed, at once (nothing staged yet). False when
  // memory runs out; then nothing is allocated that was not before.
  bool Allocate();
  uint64_t buffer_bytes() const { return full_.chunk_bytes; }

  const format::ChunkLayout& full_layout() const { return full_; }
  uint32_t capacity() const { return full_.token_count; }
  uint32_t staged() const { return staged_; }
  uint32_t room() const { return full_.token_count - staged_; }
  // Threads the last Validate or Stage ran on (1: the calling thread only).
  unsigned last_workers() const { return last_workers_; }

  // Checks the shape of the batch (block count, dtypes, scales present)
  // and, with scan_values, every value in it. `sealed_tokens` is the
  // sequence index of the first staged token (for messages).
  Status Validate(const AppendBatch& b, bool scan_values, uint64_t sealed_tokens) const;
  // Copies tokens [from, from + n) of the batch after the staged ones
  // (n <= room()), quantizing raw rows for fp8 and nvfp4 streams. On a bad value
  // nothing is counted as staged.
  Status Stage(const AppendBatch& b, uint64_t from, uint32_t n, uint64_t sealed_tokens);
  // Keeps only the first n staged tokens (n <= staged()).
  void KeepStaged(uint32_t n) { staged_ = n; }

  // Seals the staged tokens (staged() > 0) into a chunk in the current
  // buffer: `head` gives salt, first_token, chunk_offset, epoch and
  // append_end; token_count and chunk_bytes are the builder's. *chunk is
  // the chunk's bytes, valid until the buffer is staged into again.
  Status Seal(format::ChunkHeader head, std::span<const uint8_t>* chunk);
  // Starts staging into the other buffer (its earlier chunk's write must
  // have completed).
  void Advance() {
    staged_ = 0;
    current_ ^= 1;
  }

 private:
  // Runs task(worker, section) for every (layer, stream) section in order
  // of layer then stream, on threads where `tokens` tokens of work make it
  // pay; the first failing section's status.
  Status ForSections(uint64_t tokens, const std::function<Status(unsigned, size_t)>& task) const;
  std::string Where(uint32_t layer, uint32_t stream, uint64_t token, uint64_t row) const;
  std::string RowWhere(uint32_t layer, uint32_t stream, uint64_t first, uint64_t row,
                       const format::CodecRows& cr, bool per_token_codes) const;

  const format::Geometry* g_ = nullptr;
  format::ChunkLayout full_;  // layout of a chunk of capacity() tokens
  PageBuffer staging_[2];     // page-aligned, so also kBlockSize-aligned
  int current_ = 0;
  uint32_t staged_ = 0;  // tokens in staging_[current_]
  unsigned threads_ = 1;
  mutable unsigned last_workers_ = 1;
};

}  // namespace kvfile::internal
