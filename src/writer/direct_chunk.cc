// SPDX-License-Identifier: Apache-2.0
// DirectChunk (see direct_chunk.h) and the writer's side of it.
#include "writer/direct_chunk.h"

#include "writer/chunk_builder.h"
#include "format/endian.h"
#include "writer/writer_impl.h"

namespace kvfile {

using namespace kvfile::format;

Status Writer::Impl::BeginDirectChunk(uint32_t n, ChunkHeader* head, ChunkLayout* layout) {
  KVFILE_RETURN_IF_ERROR(CheckUsable());
  if (builder.staged() != 0 || append_open)
    return Status::Failed(path + ": a chunk written whole needs an empty staging buffer");
  if (n == 0 || n > builder.capacity())
    return Status::InvalidArgument(path + ": a chunk of " + std::to_string(n) + " tokens; this writer's hold 1.." +
                                   std::to_string(builder.capacity()));
  // The earlier chunk's write must be complete: this one goes after it.
  KVFILE_RETURN_IF_ERROR(WaitInFlight());
  KVFILE_RETURN_IF_ERROR(ComputeChunkLayout(g(), n, layout).WithContext(path));
  ChunkHeader ch;
  ch.salt = header.salt;
  ch.first_token = disk_tokens;
  ch.chunk_offset = end;
  ch.epoch = log.durable().epoch;
  // Its last token ends an append (FORMAT.md 5.3).
  if (append_ends) ch.append_end = n;
  ch.token_count = n;
  ch.chunk_bytes = layout->chunk_bytes;
  *head = ch;
  return Status::OK();
}

Status Writer::Impl::QueueChunkBytes(uint64_t offset, const uint8_t* bytes, size_t n) {
  Status st = file->SubmitWrite(offset, bytes, n, false);
  if (st.ok()) return st;
  (void)file->WaitWrites();  // the buffers are the caller's again only after this
  return Fail(st);
}

Status Writer::Impl::WaitChunkBytes() {
  Status st = file->WaitWrites();
  if (!st.ok()) return Fail(st);
  return Status::OK();
}

void Writer::Impl::AbandonChunkBytes() { (void)file->WaitWrites(); }

Status Writer::Impl::EndDirectChunk(const ChunkHeader& head, std::span<const uint8_t> head_bytes,
                                    std::span<const uint32_t> chunk_tokens) {
  Status st = file->WriteAt(head.chunk_offset, head_bytes.data(), head_bytes.size());
  if (!st.ok()) return Fail(st);
  // The whole chunk is written: its writeback can start while the caller
  // prepares the next one.
  write_behind.Start(*file, path, head.chunk_offset, head.chunk_bytes);
  tokens.insert(tokens.end(), chunk_tokens.begin(), chunk_tokens.end());
  append_end = tokens.size();
  if (append_ends) disk_append_end = append_end;
  log.DataWritten();
  chunks.push_back({end, head.chunk_bytes, disk_tokens});
  end += head.chunk_bytes;
  disk_tokens += head.token_count;
  if (options.sync == SyncMode::kChunk) return CommitDurably();
  return Status::OK();
}

namespace internal {

Status DirectChunk::Begin(Writer& w, uint32_t n) {
  sink_ = &WriterAccess::DirectChunks(w);
  KVFILE_RETURN_IF_ERROR(sink_->BeginDirectChunk(n, &head_, &layout_));
  checksums_.assign(layout_.sections.size(), 0);
  sections_written_ = 0;
  return Status::OK();
}

DirectChunk::~DirectChunk() {
  if (queued_) sink_->AbandonChunkBytes();
}

Status DirectChunk::WriteSection(size_t i, uint8_t* bytes) {
  if (i != sections_written_)
    return Status::InvalidArgument(sink_->DirectChunkPath() + ": section " + std::to_string(i) +
                                   " written out of order");
  const SectionLayout& sec = layout_.sections[i];
  checksums_[i] = SealSection(sec, bytes);
  queued_ = true;
  Status st = sink_->QueueChunkBytes(head_.chunk_offset + sec.offset, bytes, sec.end - sec.offset);
  if (!st.ok()) {
    queued_ = false;  // the sink waited for what was queued
    return st;
  }
  ++sections_written_;
  return Status::OK();
}

Status DirectChunk::Wait() {
  queued_ = false;
  return sink_->WaitChunkBytes();
}

Status DirectChunk::Finish(std::span<const uint32_t> tokens) {
  if (sections_written_ != layout_.sections.size())
    return Status::InvalidArgument(sink_->DirectChunkPath() + ": a chunk finished before all its sections were written");
  if (tokens.size() != head_.token_count)
    return Status::InvalidArgument(sink_->DirectChunkPath() + ": a chunk of " + std::to_string(head_.token_count) +
                                   " tokens given " + std::to_string(tokens.size()) + " token ids");
  KVFILE_RETURN_IF_ERROR(Wait());
  head_bytes_.resize(layout_.head_bytes);
  uint8_t* h = head_bytes_.data();
  for (size_t i = 0; i < checksums_.size(); ++i) StoreU64(h + layout_.section_checksums_offset + 8 * i, checksums_[i]);
  for (size_t i = 0; i < tokens.size(); ++i) StoreU32(h + layout_.tokens_offset + 4 * i, tokens[i]);
  SealHead(layout_, head_, h);
  return sink_->EndDirectChunk(head_, head_bytes_, tokens);
}

}  // namespace internal

}  // namespace kvfile
