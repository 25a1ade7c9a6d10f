// SPDX-License-Identifier: Apache-2.0
// DirectChunk: one chunk written straight into a writer's file, section by
// section, without staging. For a caller whose rows are already in the
// file's dtypes and checked (unpack of a pack member,
// PackReader::Materialize): the rows go from the caller's buffer to the
// file with no staging copy and no chunk-sized buffer.
//
// The chunk's bytes are sealed as ChunkBuilder seals them (SealSection,
// SealHead); the chunk joins the writer's sequence only at Finish(), as the
// next tokens, ending one append; what makes it durable and committed is
// the writer's (its sync mode, Sync(), Close()). Finish() also asks the
// kernel to start writing the chunk back (write_behind.h), so the disk
// works while the next chunk is prepared. A failed write leaves the writer
// unusable, as a failed chunk write does.
//
// DirectChunk reaches the writer only through DirectChunkSink below, which
// the writer (Writer::Impl) implements: the head of the next chunk, the
// file's end for its bytes, and the counting of the finished chunk. It sees
// nothing else of the writer (not its file, staging or commit log).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "format/chunk_layout.h"
#include "format/header.h"
#include "kvfile/writer.h"

namespace kvfile::internal {

// What a writer offers a chunk written whole into its file.
class DirectChunkSink {
 public:
  // The head (salt, first token, offset, epoch, append end, token_count)
  // and the layout of the next chunk, of `n` tokens, at the file's end; its
  // earlier chunk's write has completed. Fails if the writer is unusable,
  // if tokens are staged or an append is open, or if n is not in 1..the
  // writer's chunk size.
  virtual Status BeginDirectChunk(uint32_t n, format::ChunkHeader* head, format::ChunkLayout* layout) = 0;
  // The file's path, for messages.
  virtual const std::string& DirectChunkPath() const = 0;
  // Queues the write of `n` bytes at file offset `offset` (no sync). On a
  // failure it waits for what was queued (the bytes are the caller's again)
  // and the writer is unusable.
  virtual Status QueueChunkBytes(uint64_t offset, const uint8_t* bytes, size_t n) = 0;
  // Waits for the queued writes; a failure makes the writer unusable.
  virtual Status WaitChunkBytes() = 0;
  // Waits for the queued writes of an abandoned chunk; a failure is
  // dropped (the chunk never counts).
  virtual void AbandonChunkBytes() = 0;
  // Writes the chunk's head (`head_bytes`, sealed), starts its writeback
  // and counts the chunk, every byte of it written, as the sequence's next
  // tokens, `tokens`, which end an append; in SyncMode::kChunk it commits.
  virtual Status EndDirectChunk(const format::ChunkHeader& head, std::span<const uint8_t> head_bytes,
                                std::span<const uint32_t> tokens) = 0;

 protected:
  ~DirectChunkSink() = default;
};

class DirectChunk {
 public:
  DirectChunk() = default;
  DirectChunk(const DirectChunk&) = delete;
  DirectChunk& operator=(const DirectChunk&) = delete;
  // Waits for sections still queued (a chunk abandoned on an error): their
  // buffers are the caller's again only after that. The chunk does not
  // count; its bytes lie past the writer's end, where the next chunk or a
  // cut at the next open goes.
  ~DirectChunk();

  // Starts the next chunk of `w`, of `n` tokens (1 .. the writer's chunk
  // size), at the file's end. Nothing may be staged in `w`.
  Status Begin(Writer& w, uint32_t n);
  const format::ChunkLayout& layout() const { return layout_; }
  // Queues the write of section i (sections in order, from 0): `bytes`
  // holds the section's [offset, end) with its arrays in place; its padding
  // is zeroed here, then it is checksummed. The bytes must stay untouched
  // until Wait() or Finish() returns, or the DirectChunk is destroyed (so a
  // caller fills one buffer while the other is written).
  Status WriteSection(size_t i, uint8_t* bytes);
  // Waits for the sections queued so far.
  Status Wait();
  // Once every section is queued: waits for them, writes the head, with
  // `tokens` (the chunk's n token ids), and counts the chunk in the
  // writer's sequence.
  Status Finish(std::span<const uint32_t> tokens);

 private:
  DirectChunkSink* sink_ = nullptr;
  format::ChunkLayout layout_;
  format::ChunkHeader head_;
  std::vector<uint64_t> checksums_;
  size_t sections_written_ = 0;
  bool queued_ = false;  // sections queued since the last wait
  std::vector<uint8_t> head_bytes_;
};

}  // namespace kvfile::internal
