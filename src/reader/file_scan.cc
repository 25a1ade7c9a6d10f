// SPDX-License-Identifier: Apache-2.0
// The scan of a .kv file at open (see file_scan.h).
#include "reader/file_scan.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "codec/row_check.h"
#include "kvfile/codec.h"
#include "format/endian.h"
#include "writer/commit_log.h"

namespace kvfile::internal {

using namespace kvfile::format;

std::string ChunkWhere(size_t index, uint64_t offset) {
  return "chunk " + std::to_string(index) + " at offset " + std::to_string(offset);
}

Status LayoutCache::Get(uint32_t token_count, const ChunkLayout** out) {
  auto it = layouts_.find(token_count);
  if (it == layouts_.end()) {
    // Files hold a nominal chunk size and a few short chunks; a file with
    // many distinct sizes must not grow the cache without bound.
    if (layouts_.size() >= kMaxCachedLayouts) layouts_.clear();
    ChunkLayout layout;
    KVFILE_RETURN_IF_ERROR(ComputeChunkLayout(*geometry_, token_count, &layout));
    it = layouts_.emplace(token_count, std::move(layout)).first;
  }
  *out = &it->second;
  return Status::OK();
}

namespace {

// Reads and checks one chunk head at `offset` (its first FirstHeadRead
// bytes may come `prefetched`). On success fills *chunk (its
// info.live_tokens = stored tokens) and *tokens with its token ids, and
// appends its section checksums to *checksums (nothing on failure).
// `limit` is where the chunk must end at the latest.
// How many bytes ReadChunkHead reads first at `offset`: the head of a chunk
// of the nominal size (a larger head needs a second read).
uint64_t FirstHeadRead(const FileHeader& h, uint64_t offset, uint64_t limit) {
  return std::min<uint64_t>(HeadBytes(h.geometry, h.chunk_tokens), limit - offset);
}

// `cut`, if given, is set when the chunk fails only because it runs past
// `limit`: its header fields, and its head if that is all there, are sound.
Status ReadChunkHead(File& file, const FileHeader& h, LayoutCache& layouts, uint64_t offset,
                     uint64_t limit, ScannedChunk* chunk, PageVector<uint64_t>* checksums,
                     std::vector<uint32_t>* tokens, std::vector<uint8_t>* buf,
                     const uint8_t* prefetched = nullptr, bool* cut = nullptr) {
  if (cut != nullptr) *cut = false;
  if (limit - offset < ch::kHeaderSize) {
    if (cut != nullptr) *cut = true;
    return Status::Corruption("incomplete chunk header");
  }
  uint64_t guess = FirstHeadRead(h, offset, limit);
  if (prefetched != nullptr) {
    buf->assign(prefetched, prefetched + guess);
  } else {
    buf->resize(guess);
    KVFILE_RETURN_IF_ERROR(file.ReadAt(offset, buf->data(), guess));
  }
  ChunkHeader c;
  KVFILE_RETURN_IF_ERROR(DecodeChunkHeader(std::span<const uint8_t, ch::kHeaderSize>(buf->data(), ch::kHeaderSize),
                                           (h.required_flags & kFlagAppendEnds) != 0, &c));
  if (c.salt != h.salt) {
    // Another file's chunk is whole under its own salt: its head checksum
    // (which covers the salt) matches. A head that fails it is damage here,
    // a flipped salt bit included.
    uint64_t other_head = HeadBytes(h.geometry, c.token_count);
    if (other_head > ch::kHeaderSize && other_head <= c.chunk_bytes && other_head <= limit - offset) {
      buf->resize(std::max<uint64_t>(other_head, guess));
      if (other_head > guess)
        KVFILE_RETURN_IF_ERROR(file.ReadAt(offset + guess, buf->data() + guess, other_head - guess));
      if (LoadU64(buf->data() + other_head - 8) == Checksum(buf->data(), other_head - 8))
        return Status::Corruption("chunk belongs to another file (salt mismatch)");
    }
    return Status::Corruption("chunk head damaged (its salt does not match the file's, and its checksum fails)");
  }
  if (c.chunk_offset != offset)
    return Status::Corruption("chunk records offset " + std::to_string(c.chunk_offset) +
                              " (moved or duplicated)");
  // The head is checked before the full layout is computed: a hostile file
  // must not make the scan build layouts (memory) for heads that are junk.
  uint64_t head_bytes = HeadBytes(h.geometry, c.token_count);
  if (c.chunk_bytes > limit - offset) {
    // A head that is all there must check out before the chunk counts as
    // cut rather than damaged (a flipped size field looks like a cut).
    if (head_bytes <= c.chunk_bytes && head_bytes <= limit - offset) {
      buf->resize(std::max<uint64_t>(head_bytes, guess));
      if (head_bytes > guess)
        KVFILE_RETURN_IF_ERROR(file.ReadAt(offset + guess, buf->data() + guess, head_bytes - guess));
      if (LoadU64(buf->data() + head_bytes - 8) != Checksum(buf->data(), head_bytes - 8))
        return Status::Corruption("chunk head checksum mismatch");
    }
    if (cut != nullptr) *cut = true;
    return Status::Corruption("incomplete chunk: needs " + std::to_string(c.chunk_bytes) +
                              " bytes, " + std::to_string(limit - offset) + " present");
  }
  if (head_bytes > c.chunk_bytes)
    return Status::Corruption("chunk size " + std::to_string(c.chunk_bytes) + " is too small for " +
                              std::to_string(c.token_count) + " tokens of this geometry");
  if (head_bytes > guess) {
    buf->resize(head_bytes);
    KVFILE_RETURN_IF_ERROR(file.ReadAt(offset + guess, buf->data() + guess, head_bytes - guess));
  }
  const uint8_t* p = buf->data();
  uint64_t head_checksum_offset = head_bytes - 8;
  if (!ChecksumMatches(LoadU64(p + head_checksum_offset), Checksum(p, head_checksum_offset)))
    return Status::Corruption("chunk head checksum mismatch");
  const ChunkLayout* layout;
  KVFILE_RETURN_IF_ERROR(layouts.Get(c.token_count, &layout));
  if (layout->chunk_bytes != c.chunk_bytes)
    return Status::Corruption("chunk size " + std::to_string(c.chunk_bytes) + " does not match " +
                              std::to_string(c.token_count) + " tokens of this geometry");
  uint64_t tokens_end = layout->tokens_offset + 4ull * c.token_count;
  if (!AllZero(std::span<const uint8_t>(p + tokens_end, layout->head_checksum_offset - tokens_end)))
    return Status::Corruption("chunk head padding is not zero");
  chunk->info = ChunkInfo{};
  chunk->info.offset = offset;
  chunk->info.bytes = c.chunk_bytes;
  chunk->info.first_token = c.first_token;
  chunk->info.stored_tokens = c.token_count;
  chunk->info.live_tokens = c.token_count;
  chunk->info.epoch = c.epoch;
  chunk->info.head_checksum = LoadU64(p + layout->head_checksum_offset);
  chunk->append_end = c.append_end;
  for (size_t i = 0; i < layout->sections.size(); ++i)
    checksums->push_back(LoadU64(p + layout->section_checksums_offset + 8 * i));
  tokens->resize(c.token_count);
  for (uint32_t i = 0; i < c.token_count; ++i)
    (*tokens)[i] = LoadU32(p + layout->tokens_offset + 4ull * i);
  return Status::OK();
}

// Reads the heads of the next committed chunks in batches (File::ReadBatch)
// at the offsets they have if they are all of the nominal size, which they
// are but for short ones a sync or a rewind left. A miss costs one batch.
// An open of a file of 10,000 chunks is 10,000 head reads: batched, they
// are a few hundred system calls instead of 10,000.
class HeadPrefetcher {
 public:
  HeadPrefetcher(File& file, const FileHeader& h, LayoutCache& layouts, uint64_t limit)
      : file_(file), h_(h), limit_(limit) {
    const ChunkLayout* nominal;
    if (layouts.Get(h.chunk_tokens, &nominal).ok() && HeadBytes(h.geometry, h.chunk_tokens) <= kMaxHead)
      stride_ = nominal->chunk_bytes;
  }

  // The FirstHeadRead bytes at `offset`, or nullptr (read them yourself).
  const uint8_t* Get(uint64_t offset) {
    if (stride_ == 0 || offset >= limit_) return nullptr;
    if (offset < start_ || (offset - start_) % stride_ != 0 || (offset - start_) / stride_ >= count_) Fill(offset);
    if (count_ == 0) return nullptr;
    uint64_t k = (offset - start_) / stride_;
    return data_.data() + k * slot_;
  }

 private:
  static constexpr uint64_t kMaxHead = 64u << 10;
  static constexpr uint64_t kBatch = 64;

  void Fill(uint64_t offset) {
    start_ = offset;
    slot_ = HeadBytes(h_.geometry, h_.chunk_tokens);
    count_ = std::min<uint64_t>(kBatch, (limit_ - offset + stride_ - 1) / stride_);
    data_.resize(count_ * slot_);
    requests_.clear();
    for (uint64_t k = 0; k < count_; ++k) {
      uint64_t at = offset + k * stride_;
      requests_.push_back({at, data_.data() + k * slot_, FirstHeadRead(h_, at, limit_)});
    }
    if (!file_.ReadBatch(requests_).ok()) count_ = 0;  // ReadChunkHead reports the error itself
  }

  File& file_;
  const FileHeader& h_;
  uint64_t limit_;
  uint64_t stride_ = 0;  // nominal chunk bytes; 0: no prefetching
  uint64_t start_ = 0, count_ = 0, slot_ = 0;
  std::vector<uint8_t> data_;
  std::vector<ReadRequest> requests_;
};

// Links `next` after the chunks already in *r: checks the token sequence
// rule and cuts the previous chunk's live tokens where a rewind left it.
Status LinkChunk(ScanResult* r, ScannedChunk* next, bool committed) {
  uint64_t count = r->tokens.size();  // live tokens so far (the new ones not yet added)
  if (r->chunks.empty()) {
    if (next->info.first_token != 0)
      return Status::Corruption("first chunk starts at token " +
                                std::to_string(next->info.first_token) + ", not 0");
    return Status::OK();
  }
  ChunkInfo& prev = r->chunks.back().info;
  uint64_t prev_end = prev.first_token + prev.live_tokens;
  uint64_t first = next->info.first_token;
  if (next->info.epoch < prev.epoch)
    return Status::Corruption("chunk epoch " + std::to_string(next->info.epoch) +
                              " is older than the chunk before it (" +
                              std::to_string(prev.epoch) + ")");
  if (first == prev_end) return Status::OK();
  // Only a rewind (a newer epoch) may cut into the previous chunk, and only
  // a committed chunk can follow a rewind inside the committed region.
  if (first > prev.first_token && first < prev_end && next->info.epoch > prev.epoch && committed) {
    uint64_t drop = prev_end - first;
    prev.live_tokens = static_cast<uint32_t>(first - prev.first_token);
    r->tokens.resize(count - drop);
    return Status::OK();
  }
  return Status::Corruption("chunk starts at token " + std::to_string(first) + " but " +
                            std::to_string(prev_end) + " tokens precede it");
}

// True if a valid chunk head of this file and epoch starts at some block
// boundary in [from, size): then the damage at the tail is not a torn tail.
//
// Holes of a sparse file are skipped (File::NextData), so that the search
// costs reads in proportion to the bytes the tail holds, not to its
// apparent size (a 16 GiB hole took 25 s to read block by block). This
// cannot change the answer: a hole reads as zeros, and a block whose first
// 64 bytes are zeros lacks the chunk magic, so the loop below would skip
// it anyway. Only blocks whose whole chunk header lies in a hole are
// skipped; NextData is asked only when a header reads as zeros.
bool ValidChunkFollows(File& file, const ScanResult& r, LayoutCache& layouts, uint64_t from,
                       uint64_t size, uint64_t* found_at) {
  std::vector<uint8_t> buf;
  std::vector<uint32_t> scratch_tokens;
  PageVector<uint64_t> scratch_checksums;
  uint8_t head[ch::kHeaderSize];
  for (uint64_t pos = AlignUp(from, kBlockSize); pos + ch::kHeaderSize <= size; pos += kBlockSize) {
    if (!file.ReadAt(pos, head, sizeof head).ok()) return false;
    if (AllZero(std::span<const uint8_t>(head, sizeof head))) {
      // [pos, data) is a hole: the first block boundary whose header can
      // hold a byte of data is the first one past data - kHeaderSize.
      uint64_t data;
      if (file.NextData(pos, &data).ok() && data > pos) {
        uint64_t next = AlignUp(data - ch::kHeaderSize + 1, kBlockSize);
        if (next > pos) pos = next - kBlockSize;  // the loop adds a block
      }
      continue;
    }
    if (std::memcmp(head, ch::kMagic, sizeof ch::kMagic) != 0) continue;
    if (LoadU64(head + ch::kSalt) != r.header.salt) continue;
    ScannedChunk c;
    if (!ReadChunkHead(file, r.header, layouts, pos, size, &c, &scratch_checksums, &scratch_tokens, &buf).ok()) continue;
    if (c.info.epoch != r.commit.epoch) continue;  // stale chunks of an older epoch are expected
    *found_at = pos;
    return true;
  }
  return false;
}

}  // namespace

Status ReadAndCheckChunk(File& file, const Geometry& g, LayoutCache& layouts,
                         const ScannedChunk& c, const uint64_t* section_checksums, PageBuffer* buf) {
  const ChunkLayout* layout;
  KVFILE_RETURN_IF_ERROR(layouts.Get(c.info.stored_tokens, &layout));
  // The head, then one section at a time: a buffer of one section stays in
  // the core's cache while it is checksummed and its values checked, so
  // every byte crosses memory once (a whole chunk would not fit).
  uint64_t head_bytes = layout->head_checksum_offset + 8;
  uint64_t largest = head_bytes;
  for (const SectionLayout& sec : layout->sections) largest = std::max(largest, sec.end - sec.offset);
  if (buf->size() < largest && !buf->Resize(largest))
    return Status::IOError("no memory for a section of " + std::to_string(largest) + " bytes");
  uint8_t* p = buf->data();
  file.WillRead(c.info.offset, c.info.bytes);  // the whole chunk, in order (a remote File fetches ahead)
  KVFILE_RETURN_IF_ERROR(file.ReadAt(c.info.offset, p, head_bytes));
  if (!ChecksumMatches(LoadU64(p + layout->head_checksum_offset), Checksum(p, layout->head_checksum_offset)) ||
      LoadU64(p + layout->head_checksum_offset) != c.info.head_checksum)
    return Status::Corruption("chunk head checksum mismatch");
  for (size_t i = 0; i < layout->sections.size(); ++i) {
    const SectionLayout& sec = layout->sections[i];
    const uint32_t l = sec.layer, s = sec.stream;
    // Built only on failure (a string per section cost more than checking it in small files).
    auto where = [&] { return "layer " + std::to_string(l) + " stream '" + g.streams[s].name + "'"; };
    KVFILE_RETURN_IF_ERROR(file.ReadAt(c.info.offset + sec.offset, p, sec.end - sec.offset));
    if (!ChecksumMatches(section_checksums[i], Checksum(p, sec.end - sec.offset)))
      return Status::Corruption("payload checksum mismatch in " + where() + " (section at offset " +
                                std::to_string(c.info.offset + sec.offset) + ")");
    Status st = CheckSectionPadding(sec, p, c.info.offset);
    if (st.ok()) st = CheckSectionValues(g.streams[s], sec, p, c.info.first_token, 0, c.info.stored_tokens);
    if (!st.ok()) return st.WithContext(where());
  }
  return Status::OK();
}

Status CheckSectionPadding(const SectionLayout& sec, const uint8_t* section, uint64_t chunk_offset) {
  // The gaps before, between and after the section's arrays.
  uint64_t begin = sec.offset;
  for (size_t k = 0; k <= 3; ++k) {
    const bool last = k == 3;
    if (!last && sec.parts()[k].bytes == 0) continue;
    uint64_t end = last ? sec.end : sec.parts()[k].offset;
    if (end > begin && !AllZero(std::span<const uint8_t>(section + (begin - sec.offset), end - begin))) {
      uint64_t i = begin;
      while (section[i - sec.offset] == 0) ++i;
      return Status::Corruption("nonzero section padding at offset " + std::to_string(chunk_offset + i));
    }
    if (!last) begin = sec.parts()[k].offset + sec.parts()[k].bytes;
  }
  return Status::OK();
}

Status CheckSectionValues(const StreamSpec& spec, const SectionLayout& sec, const uint8_t* section,
                          uint64_t chunk_first_token, uint32_t first, uint32_t count) {
  const CodecRows cr = CodecRowsOf(spec);
  uint64_t row0 = uint64_t{first} * cr.per_token;
  uint64_t rows = uint64_t{count} * cr.per_token;
  const float* scales =
      IsQuantized(spec.dtype) ? reinterpret_cast<const float*>(section + (sec.scales_offset - sec.offset)) + row0
                              : nullptr;
  const uint8_t* block_scales =
      IsNvfp4(spec.dtype) ? section + (sec.block_scales_offset - sec.offset) + row0 * cr.width / 16 : nullptr;
  codec::RowCheck rc = codec::CheckRows(spec.dtype, section + CodeBytes(spec.dtype, row0 * cr.width), scales,
                                        rows, cr.width, block_scales);
  if (rc.ok()) return Status::OK();
  const char* what = rc.fault == codec::RowFault::kNonFiniteCode       ? "non-finite code at token "
                     : rc.fault == codec::RowFault::kInvalidScale      ? "invalid scale at token "
                     : rc.fault == codec::RowFault::kInvalidBlockScale ? "invalid block scale at token "
                                                                       : "non-finite value at token ";
  return Status::Corruption(what + std::to_string(chunk_first_token + first + rc.row / cr.per_token));
}

namespace {
// The bytes of both commit slots, or empty if they cannot be read.
std::vector<uint8_t> CommitSlotBytes(File& file) {
  std::vector<uint8_t> slots(kDataOffset - kCommitSlotOffset[0]);
  if (!file.ReadAt(kCommitSlotOffset[0], slots.data(), slots.size()).ok()) return {};
  return slots;
}
}  // namespace

Status ScanSettledFile(File& file, ScanResult* out, DamageLocation* where) {
  for (int attempt = 0;; ++attempt) {
    const std::vector<uint8_t> before = CommitSlotBytes(file);
    Status st = ScanFile(file, out, where);
    const bool suspect = st.ok() ? out->tail.committed_data_missing : st.IsDataError();
    if (!suspect || attempt == 2 || before.empty() || CommitSlotBytes(file) == before) return st;
  }
}

Status ExplainReadFailure(File& file, const ScanResult& scan, uint64_t read_end, const std::string& path,
                          Status error) {
  if (!error.IsDataError()) return error;
  const Status changed =
      Status::Busy(path + ": changed while being read (rewound or repaired by another process); read it again");
  uint64_t size = 0;
  if (!file.Size(&size).ok()) return error;
  if (size < read_end) return changed;
  // Not zeroed: ReadAt fills it, and this runs once per damaged section read.
  const auto fixed = std::make_unique_for_overwrite<uint8_t[]>(kDataOffset);
  CommitSlots now;
  if (file.ReadAt(0, fixed.get(), kDataOffset).ok() &&
      ReadCommitSlots({fixed.get(), kDataOffset}, scan.header.salt, &now) &&
      now.newest.epoch != scan.commit.epoch)
    return changed;
  return error;
}

namespace {

// ScanFile's state and its phases, one job each, in the order ScanFile runs
// them: the header, the commit slots, the tables' reservation, the walk of
// the committed chain, then either the valid prefix of a file cut inside
// committed data, or the commit record's cut of the last chunk, the walk
// past the record, the unfinished append and the classification of the
// tail. A phase that finds damage returns it and sets *where.
class FileScan {
 public:
  FileScan(File& file, DamageLocation* where) : file_(file), where_(where) {}

  // 1. The file's size, its magic and its header (the fixed region's first
  // block; the fixed region is kept for the slots).
  Status ReadHeader() {
    KVFILE_RETURN_IF_ERROR(file_.Size(&size_));
    r_.tail.file_size = size_;
    fixed_.resize(kDataOffset);
    if (size_ < sizeof kFileMagic)
      return Status::Corruption("not a kvfile: only " + std::to_string(size_) + " bytes");
    if (size_ < kDataOffset) {
      KVFILE_RETURN_IF_ERROR(file_.ReadAt(0, fixed_.data(), sizeof kFileMagic));
      where_->offset = 0;
      if (std::memcmp(fixed_.data(), kFileMagic, sizeof kFileMagic) != 0)
        return Status::Corruption("not a kvfile: bad magic at offset 0");
      where_->offset = static_cast<int64_t>(size_);  // where the missing bytes start
      return Status::Corruption("truncated: " + std::to_string(size_) +
                                " bytes, shorter than the 12288-byte header and commit slots");
    }
    KVFILE_RETURN_IF_ERROR(file_.ReadAt(0, fixed_.data(), kDataOffset));
    where_->offset = 0;
    return DecodeFileHeader(std::span<const uint8_t, kHeaderSize>(fixed_.data(), kHeaderSize), &r_.header);
  }

  // 2. The commit slots. The newest valid one wins; a damaged one is
  // remembered (verify reports it) but is not fatal: a crash while writing
  // a slot tears it. Both damaged: an error.
  Status ReadSlots() {
    CommitSlots slots;
    bool have = ReadCommitSlots(fixed_, r_.header.salt, &slots);
    r_.commit = slots.newest;
    r_.active_slot = slots.active_slot;
    r_.slot_errors = slots.errors;
    for (int i = 0; i < 2; ++i) {
      r_.slots[i].valid = slots.valid[i];
      r_.slots[i].sequence = slots.sequence[i];
      r_.slots[i].error = slots.reason[i];
    }
    where_->offset = static_cast<int64_t>(kCommitSlotOffset[0]);
    if (!have) return Status::Corruption("both commit slots are damaged: " + r_.slot_errors[0]);
    // A file shorter than its commit record lost committed bytes: the scan
    // keeps the whole chunks before the cut, and records the loss (open for
    // reading goes on, open for writing and verify refuse; RECOVERY.md).
    truncated_ = size_ < r_.commit.end;
    committed_limit_ = std::min(size_, r_.commit.end);
    return Status::OK();
  }

  // 3. The committed region's tables, reserved up front for what the commit
  // record claims (growing them chunk by chunk would fault fresh pages in
  // again and again), but bounded by the file's size (a chunk takes at
  // least a block, a token 4 bytes, a section checksum 8) and by
  // kMaxReserveBytes a table: the size of a sparse file is no more to be
  // trusted than the record. Past that, a table grows (doubling) only as
  // chunks are read and checked, so that its memory stays a bounded
  // multiple of the chunk heads actually in the file.
  void ReserveTables() {
    r_.sections = r_.header.geometry.SectionCount();
    constexpr uint64_t kMaxReserveBytes = uint64_t{1} << 20;
    uint64_t committed_bytes = committed_limit_ > kDataOffset ? committed_limit_ - kDataOffset : 0;
    uint64_t expect_chunks = std::min<uint64_t>(r_.commit.chunks, committed_bytes / kBlockSize);
    r_.chunks.reserve(std::min<uint64_t>(expect_chunks, kMaxReserveBytes / sizeof(ScannedChunk)));
    r_.section_checksums.reserve(
        std::min({expect_chunks * r_.sections, committed_bytes / 8, kMaxReserveBytes / sizeof(uint64_t)}));
    r_.tokens.reserve(std::min({r_.commit.tokens, committed_bytes / 4, kMaxReserveBytes / sizeof(uint32_t)}));
  }

  // 4. The committed region: every chunk must check out and link to the
  // one before it. In a file cut inside it, the walk stops at the chunk the
  // file ends in (cut_reason_ says why).
  Status WalkCommitted() {
    HeadPrefetcher prefetch(file_, r_.header, layouts_, committed_limit_);
    for (uint64_t i = 0; i < r_.commit.chunks; ++i) {
      ScannedChunk c;
      bool cut = false;
      Status st = ReadChunkHead(file_, r_.header, layouts_, pos_, committed_limit_, &c, &r_.section_checksums,
                                &chunk_tokens_, &buf_, prefetch.Get(pos_), &cut);
      if (!st.ok() && cut && truncated_) {
        // The file ends inside this chunk (or right before it): the chunks
        // before it are the valid prefix.
        r_.section_checksums.resize(r_.chunks.size() * r_.sections);
        cut_reason_ = ChunkWhere(i, pos_) + ": " + st.message();
        break;
      }
      if (st.ok() && c.info.epoch > r_.commit.epoch)
        st = Status::Corruption("chunk epoch " + std::to_string(c.info.epoch) +
                                " is newer than the commit record's");
      if (st.ok()) st = LinkChunk(&r_, &c, true);
      if (!st.ok()) {
        *where_ = {static_cast<int64_t>(i), static_cast<int64_t>(pos_)};
        return Status::Corruption(ChunkWhere(i, pos_) + ": " + st.message());
      }
      c.info.committed = true;
      r_.tokens.insert(r_.tokens.end(), chunk_tokens_.begin(), chunk_tokens_.end());
      pos_ += c.info.bytes;
      r_.chunks.push_back(std::move(c));
    }
    return Status::OK();
  }

  bool truncated() const { return truncated_; }

  // 5a. A file shorter than its commit record: the whole chunks before the
  // cut are what it holds, and the loss is recorded in the tail.
  Status KeepPrefixBeforeCut() {
    if (cut_reason_.empty()) {
      // Every committed chunk is there, yet they end before the record's end.
      *where_ = {-1, static_cast<int64_t>(pos_)};
      return Status::Corruption("committed chunks end at " + std::to_string(pos_) + " but the commit record says " +
                                std::to_string(r_.commit.end));
    }
    // The commit record's token count speaks of the chunk it ends in, which
    // is gone: the kept chunks are whole, their live counts come from the
    // chain. Nothing past the cut is read: it is all committed data.
    r_.tail.valid_end = pos_;
    r_.tail.torn_tail_bytes = size_ - pos_;
    r_.tail.torn_reason = cut_reason_;
    r_.tail.committed_data_missing = true;
    r_.tail.committed_chunks_missing = r_.commit.chunks - r_.chunks.size();
    r_.tail.committed_tokens_missing =
        r_.commit.tokens > r_.tokens.size() ? r_.commit.tokens - r_.tokens.size() : 0;
    r_.tail.committed_bytes_missing = r_.commit.end - size_;
    return Status::OK();
  }

  // 5b. The committed chunks must end where the record says, and its token
  // count fall in the last of them. The record may cut that chunk: a rewind
  // (the chunk is of an older epoch), or, in files with append ends, an
  // append that ends inside it while later appends go on in the chunks
  // after it (same epoch: those continue after its stored tokens, FORMAT.md
  // 5.4; cut_tokens_ keeps what was cut, to be put back if they do).
  Status ApplyCommitRecord() {
    *where_ = {-1, static_cast<int64_t>(pos_)};
    if (pos_ != r_.commit.end)
      return Status::Corruption("committed chunks end at " + std::to_string(pos_) + " but the commit record says " +
                                std::to_string(r_.commit.end));
    append_ends_ = (r_.header.required_flags & kFlagAppendEnds) != 0;
    if (r_.chunks.empty()) {
      if (r_.commit.tokens != 0) return Status::Corruption("commit record counts tokens but no chunks");
      return Status::OK();
    }
    ChunkInfo& last = r_.chunks.back().info;
    uint64_t last_end = last.first_token + last.live_tokens;
    if (r_.commit.tokens <= last.first_token || r_.commit.tokens > last_end)
      return Status::Corruption("commit record's token count " + std::to_string(r_.commit.tokens) +
                                " does not fall in the last committed chunk");
    uint64_t drop = last_end - r_.commit.tokens;
    chain_next_ = r_.commit.tokens;
    if (append_ends_ && last.epoch == r_.commit.epoch) {
      chain_next_ = last_end;
      cut_tokens_.assign(r_.tokens.end() - static_cast<ptrdiff_t>(drop), r_.tokens.end());
    }
    last.live_tokens -= static_cast<uint32_t>(drop);
    r_.tokens.resize(r_.tokens.size() - drop);
    return Status::OK();
  }

  // 6. Past the committed region: whole, checked chunks of this epoch that
  // continue the chain, up to the first that is not (torn_reason_ says
  // why). Returns where that one starts (the file's size if none).
  uint64_t WalkPastCommit() {
    committed_chunks_ = r_.chunks.size();
    while (pos_ < size_) {
      ScannedChunk c;
      Status st =
          ReadChunkHead(file_, r_.header, layouts_, pos_, size_, &c, &r_.section_checksums, &chunk_tokens_, &buf_);
      if (st.ok() && c.info.epoch != r_.commit.epoch)
        st = Status::Corruption("stale chunk of epoch " + std::to_string(c.info.epoch) + " (current epoch " +
                                std::to_string(r_.commit.epoch) + ")");
      if (st.ok() && c.info.first_token != chain_next_)
        st = Status::Corruption("chunk starts at token " + std::to_string(c.info.first_token) + " but " +
                                std::to_string(chain_next_) + " tokens precede it");
      if (st.ok())
        st = ReadAndCheckChunk(file_, r_.header.geometry, layouts_, c, r_.SectionChecksums(r_.chunks.size()),
                               &whole_);
      if (!st.ok()) {
        r_.section_checksums.resize(r_.chunks.size() * r_.sections);
        torn_reason_ = ChunkWhere(r_.chunks.size(), pos_) + ": " + st.message();
        break;
      }
      if (!cut_tokens_.empty()) {
        // The appends go on past the commit record's cut: undo it.
        r_.chunks.back().info.live_tokens = r_.chunks.back().info.stored_tokens;
        r_.tokens.insert(r_.tokens.end(), cut_tokens_.begin(), cut_tokens_.end());
        cut_tokens_.clear();
      }
      r_.tokens.insert(r_.tokens.end(), chunk_tokens_.begin(), chunk_tokens_.end());
      chain_next_ = c.info.first_token + c.info.stored_tokens;
      pos_ += c.info.bytes;
      r_.chunks.push_back(std::move(c));
    }
    return pos_;
  }

  // 7. In a file with append ends, the data past the commit record ends at
  // the last append end: whole chunks after it hold part of an append that
  // never finished, and are dropped with the tail.
  void DropUnfinishedAppend() {
    if (!append_ends_ || r_.chunks.size() <= committed_chunks_) return;
    size_t keep = r_.chunks.size();
    while (keep > committed_chunks_ && r_.chunks[keep - 1].append_end == 0) --keep;
    if (keep < r_.chunks.size()) {
      const ChunkInfo& first_dropped = r_.chunks[keep].info;
      torn_reason_ = ChunkWhere(keep, first_dropped.offset) +
                     ": part of an append that did not finish (no append ends in it or after it)";
      pos_ = first_dropped.offset;
    }
    uint64_t end_tokens;
    if (keep > committed_chunks_) {
      ScannedChunk& k = r_.chunks[keep - 1];
      k.info.live_tokens = k.append_end;
      end_tokens = k.info.first_token + k.append_end;
    } else {
      // No append ended past the record: back to what the record says.
      if (committed_chunks_ > 0) {
        ChunkInfo& last = r_.chunks[committed_chunks_ - 1].info;
        last.live_tokens = static_cast<uint32_t>(r_.commit.tokens - last.first_token);
      }
      end_tokens = r_.commit.tokens;
    }
    r_.chunks.resize(keep);
    r_.section_checksums.resize(keep * r_.sections);
    r_.tokens.resize(end_tokens);
  }

  // 8. The tail: where the valid data ends, what is cut and why, and
  // whether a valid chunk of this file and epoch lies past `scan_stop`
  // (where the walk past the record stopped). Past the commit record a
  // crash can leave a damaged chunk before a whole one (writes reach the
  // disk in any order until a sync), so that is not an open error: nothing
  // acknowledged is lost. It is recorded, and verify reports it, because a
  // bit flip looks the same.
  void ClassifyTail(uint64_t scan_stop) {
    r_.tail.valid_end = pos_;
    r_.tail.torn_tail_bytes = size_ - pos_;
    r_.tail.torn_reason = torn_reason_;
    if (scan_stop < size_) {
      uint64_t found_at;
      if (ValidChunkFollows(file_, r_, layouts_, scan_stop + 1, size_, &found_at)) {
        r_.tail.valid_data_follows = true;
        r_.tail.valid_data_offset = found_at;
      }
    }
  }

  ScanResult Take() { return std::move(r_); }

 private:
  File& file_;
  DamageLocation* where_;
  ScanResult r_;
  LayoutCache layouts_{&r_.header.geometry};
  uint64_t size_ = 0;
  std::vector<uint8_t> fixed_;  // the header and the commit slots
  bool truncated_ = false;      // the file ends before its commit record's end
  uint64_t committed_limit_ = 0;
  uint64_t pos_ = kDataOffset;  // the next chunk's offset
  std::string cut_reason_;      // a truncated file: why the chunk at the cut is not whole
  bool append_ends_ = false;
  uint64_t chain_next_ = 0;          // first_token the next uncommitted chunk must have
  std::vector<uint32_t> cut_tokens_;  // what the commit record cut from the last chunk
  size_t committed_chunks_ = 0;
  std::string torn_reason_;
  // Scratch reused chunk after chunk.
  std::vector<uint8_t> buf_;
  PageBuffer whole_;
  std::vector<uint32_t> chunk_tokens_;
};

}  // namespace

Status ScanFile(File& file, ScanResult* out, DamageLocation* where) {
  DamageLocation unused;
  FileScan scan(file, where != nullptr ? where : &unused);
  KVFILE_RETURN_IF_ERROR(scan.ReadHeader());
  KVFILE_RETURN_IF_ERROR(scan.ReadSlots());
  scan.ReserveTables();
  KVFILE_RETURN_IF_ERROR(scan.WalkCommitted());
  if (scan.truncated()) {
    KVFILE_RETURN_IF_ERROR(scan.KeepPrefixBeforeCut());
  } else {
    KVFILE_RETURN_IF_ERROR(scan.ApplyCommitRecord());
    const uint64_t scan_stop = scan.WalkPastCommit();
    scan.DropUnfinishedAppend();
    scan.ClassifyTail(scan_stop);
  }
  *out = scan.Take();
  return Status::OK();
}

}  // namespace kvfile::internal
