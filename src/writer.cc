// Writer: staging buffer -> whole chunks -> commit slots (see writer.h and
// spec/RECOVERY.md for the order of writes that makes this crash safe).
#include "kvfile/writer.h"

#include <sys/random.h>
#include <xxhash.h>
#include <time.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kvfile/codec.h"
#include "kvfile/format/chunk_layout.h"
#include "kvfile/format/endian.h"
#include "kvfile/format/header.h"
#include "atomic_replace.h"
#include "codec/row_check.h"
#include "file_scan.h"
#include "page_buffer.h"

namespace kvfile {

using namespace kvfile::format;

namespace {

Status RandomSalt(uint64_t* salt) {
  do {
    if (getrandom(salt, sizeof *salt, 0) != sizeof *salt)
      return ErrnoStatus("getrandom", errno);
  } while (*salt == 0);
  return Status::OK();
}

using internal::LockWithGrace;  // atomic_replace.h

// Staging buffers of a writer that opens an existing file hold at most this
// much each, whatever nominal chunk size the file's header names.
constexpr uint64_t kOpenMaxChunkBytes = uint64_t{64} << 20;

// Opens `path` for writing and takes its writer lock, making sure the file
// locked is still the one the path names: another process may have renamed
// a new file over it (an upgrade, a create with overwrite) while this one
// waited for the lock.
Status OpenLocked(FileSystem& fs, const std::string& path, std::unique_ptr<File>* out) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    std::unique_ptr<File> file;
    KVFILE_RETURN_IF_ERROR(fs.Open(path, OpenMode::kReadWrite, &file));
    KVFILE_RETURN_IF_ERROR(LockWithGrace(*file));
    FileId locked, named;
    KVFILE_RETURN_IF_ERROR(file->Id(&locked));
    Status st = fs.PathId(path, &named);
    if (st.ok() && locked == named) {
      *out = std::move(file);
      return Status::OK();
    }
    if (!st.ok() && st.code() != Status::Code::kNotFound) return st;
  }
  return Status::Busy(path + ": the file keeps being replaced while opening it");
}

// The start of the writer's message for a row the codec's row check refused.
const char* RowFaultText(codec::RowFault f) {
  return f == codec::RowFault::kNonFiniteCode  ? "non-finite code in "
         : f == codec::RowFault::kInvalidScale ? "invalid scale in "
                                               : "non-finite value in ";
}

codec::Fp8Kind KindOf(Dtype d) {
  return d == Dtype::kE5M2 ? codec::Fp8Kind::kE5M2 : codec::Fp8Kind::kE4M3;
}

bool IsRawInput(Dtype d) { return d == Dtype::kBF16 || d == Dtype::kF16 || d == Dtype::kF32; }

}  // namespace

struct Writer::Impl {
  std::string path;
  FileSystem* fs = nullptr;
  std::unique_ptr<File> file;
  WriterOptions options;
  FileHeader header;
  ChunkLayout full_layout;   // layout of a chunk of header.chunk_tokens tokens
  // Two staging buffers: tokens gather in staging[current] while the chunk
  // sealed from the other one may still be in flight (File::SubmitWrite).
  internal::PageBuffer staging[2];  // page-aligned, so also kBlockSize-aligned
  int current = 0;
  bool write_in_flight = false;
  bool in_flight_syncs = false;  // the write in flight has a linked fdatasync
  bool data_unsynced = false;    // a completed write may not be durable yet
  uint32_t staged = 0;       // tokens in staging[current]
  uint64_t disk_tokens = 0;  // live tokens in chunks written to the file
  uint64_t end = kDataOffset;
  struct WrittenChunk {
    uint64_t offset, bytes, first_token;
  };
  std::vector<WrittenChunk> chunks;  // every chunk of the sequence, in order
  std::vector<uint32_t> tokens;      // every token id, staged ones included
  // Append ends (spec/RECOVERY.md, "Atomic appends"): tokens before
  // append_end belong to finished appends; those after it to the append
  // still open (AppendBatch::continued), if any. Files with
  // kFlagAppendEnds record it in every chunk head and commit only up to it.
  bool append_ends = false;
  uint64_t append_end = 0;
  bool append_open = false;
  uint64_t disk_append_end = 0;  // the last append end inside a chunk written to the file
  CommitRecord commit;       // the last durable commit record
  // The end of the last record written to a slot, durable or not: after a
  // failed sync the file may hold it, so a failed append cuts nothing below.
  uint64_t written_commit_end = 0;
  Status failure;            // set once an I/O error makes the writer unusable
  bool closed = false;
  RecoveryReport recovery;

  const Geometry& g() const { return header.geometry; }
  uint32_t stream_count() const { return static_cast<uint32_t>(g().streams.size()); }

  Status CheckUsable() const {
    if (closed) return Status::Failed(path + ": writer is closed");
    if (!failure.ok())
      return Status::Failed(path + ": writer stopped after an earlier error (" +
                            failure.message() + "); tokens after the last sync are lost");
    return Status::OK();
  }
  Status Fail(Status st) {
    failure = st;
    return st;
  }

  std::string Where(uint32_t layer, uint32_t stream, uint64_t token, uint64_t row) const {
    return "layer " + std::to_string(layer) + ", stream '" + g().streams[stream].name +
           "', token " + std::to_string(token) + ", row " + std::to_string(row);
  }

  Status ValidateBatch(const AppendBatch& b, bool scan_values) const;
  Status AllocateStaging();
  Status StageTokens(const AppendBatch& b, uint64_t from, uint32_t n);
  Status Init(const std::string& p, const WriterOptions& o, FileHeader h,
              uint64_t max_chunk_bytes = kMaxChunkBytes);
  Status WriteStagedChunk();
  Status WaitInFlight();
  Status CommitDurably(bool force = false);
  Status WriteCommit(CommitRecord next);
  Status CreateFile(const std::string& write_path, uint32_t epoch);
  Status UpgradeFrom(File& v1, const internal::ScanResult& scan);
  Status AppendTokens(const AppendBatch& batch, bool* wrote_chunk = nullptr);
  Status AbandonAppend(Status why);
  void CutBackAfterFailure();
  uint64_t CommitTarget() const;
  Status Recover(const internal::ScanResult& scan);
  Status RewindTo(uint64_t n);
};

// Sets the writer up for the header's geometry: the chunk layout its
// staging buffers will have.
Status Writer::Impl::Init(const std::string& p, const WriterOptions& o, FileHeader h,
                          uint64_t max_chunk_bytes) {
  path = p;
  fs = o.fs ? o.fs : FileSystem::Default();
  options = o;
  header = std::move(h);
  append_ends = (header.required_flags & kFlagAppendEnds) != 0;
  // Chunks say their own token count, so a writer may stage fewer tokens
  // than the header's nominal count (FORMAT.md, "Limits").
  uint32_t chunk_tokens = header.chunk_tokens;
  Status st = ComputeChunkLayout(header.geometry, chunk_tokens, &full_layout);
  // Create() takes the caller's chunk size or refuses it (the message says
  // to use fewer tokens per chunk); Open() lowers the file's hint to fit.
  while (max_chunk_bytes < kMaxChunkBytes && (!st.ok() || full_layout.chunk_bytes > max_chunk_bytes) &&
         chunk_tokens > 1) {
    chunk_tokens = chunk_tokens / 2;
    st = ComputeChunkLayout(header.geometry, chunk_tokens, &full_layout);
  }
  return st.WithContext(path);
}

// The staging buffers are allocated by the first append, not by Create or
// Open: a writer that never appends (an empty import, a repair, a reopen
// that only rewinds) holds no chunk-sized memory, whatever size the header
// asks for. Both at once, before anything is staged, so that a failure
// leaves the append without a trace.
Status Writer::Impl::AllocateStaging() {
  for (internal::PageBuffer& b : staging) {
    if (b.size() == 0 && !b.Resize(AlignUp(full_layout.chunk_bytes, kBlockSize)))
      return Status::IOError(path + ": cannot allocate a staging buffer of " +
                             std::to_string(full_layout.chunk_bytes) + " bytes");
  }
  return Status::OK();
}

Status Writer::Impl::ValidateBatch(const AppendBatch& b, bool scan_values) const {
  size_t expected = static_cast<size_t>(g().layers) * stream_count();
  if (b.blocks.size() != expected)
    return Status::InvalidArgument("append has " + std::to_string(b.blocks.size()) +
                                   " row blocks; the geometry needs layers x streams = " +
                                   std::to_string(expected));
  uint64_t n = b.tokens.size();
  for (uint32_t layer = 0; layer < g().layers; ++layer) {
    for (uint32_t s = 0; s < stream_count(); ++s) {
      const RowBlock& blk = b.blocks[static_cast<size_t>(layer) * stream_count() + s];
      const StreamSpec& spec = g().streams[s];
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
                                 Where(layer, s, disk_tokens + staged + rc.row / spec.rows_per_token,
                                       rc.row % spec.rows_per_token));
    }
  }
  return Status::OK();
}

// Copies tokens [from, from + n) of the batch into the staging buffer after
// the `staged` tokens already there. On a non-finite row nothing is counted
// as staged, so the append leaves no trace.
Status Writer::Impl::StageTokens(const AppendBatch& b, uint64_t from, uint32_t n) {
  uint8_t* base = staging[current].data();
  for (uint32_t layer = 0; layer < g().layers; ++layer) {
    for (uint32_t s = 0; s < stream_count(); ++s) {
      const RowBlock& blk = b.blocks[static_cast<size_t>(layer) * stream_count() + s];
      const StreamSpec& spec = g().streams[s];
      const SectionLayout& sec = full_layout.section(layer, s);
      uint64_t rows_before = uint64_t{staged} * spec.rows_per_token;
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
                                     Where(layer, s, disk_tokens + staged + rc.row / spec.rows_per_token,
                                           rc.row % spec.rows_per_token));
          std::memcpy(dst, src, elems);
          std::memcpy(scales, blk.scales + src_row, rows * 4);
          continue;
        }
        size_t bad_row;
        if (!codec::QuantizeRows(KindOf(spec.dtype), blk.dtype, src, rows, spec.row_width, dst,
                                 scales, &bad_row))
          return Status::NonFinite("non-finite value in " +
                                   Where(layer, s, disk_tokens + staged + bad_row / spec.rows_per_token,
                                         bad_row % spec.rows_per_token));
      } else {
        size_t elems = rows * spec.row_width;
        codec::RowCheck rc = codec::CheckRows(blk.dtype, src, nullptr, rows, spec.row_width);
        if (!rc.ok())
          return Status::NonFinite(RowFaultText(rc.fault) +
                                   Where(layer, s, disk_tokens + staged + rc.row / spec.rows_per_token,
                                         rc.row % spec.rows_per_token));
        codec::ConvertRaw(blk.dtype, src, elems, spec.dtype, dst);
      }
    }
  }
  for (uint32_t i = 0; i < n; ++i)
    StoreU32(base + full_layout.tokens_offset + 4ull * (staged + i), b.tokens[from + i]);
  tokens.insert(tokens.end(), b.tokens.begin() + static_cast<ptrdiff_t>(from),
                b.tokens.begin() + static_cast<ptrdiff_t>(from + n));
  staged += n;
  return Status::OK();
}

// Seals the staged tokens into a chunk and writes it at the end of the file.
Status Writer::Impl::WriteStagedChunk() {
  if (staged == 0) return Status::OK();
  uint8_t* base = staging[current].data();
  ChunkLayout short_layout;
  const ChunkLayout* layout = &full_layout;
  if (staged < full_layout.token_count) {
    // A short chunk has a smaller head and smaller sections: move every
    // section down to its place in the short layout. Destinations never lie
    // above their sources, so ascending order with memmove is safe.
    KVFILE_RETURN_IF_ERROR(ComputeChunkLayout(g(), staged, &short_layout));
    for (size_t i = 0; i < short_layout.sections.size(); ++i) {
      const SectionLayout& from = full_layout.sections[i];
      const SectionLayout& to = short_layout.sections[i];
      std::memmove(base + to.offset, base + from.offset, to.data_bytes);
      if (to.scales_bytes > 0)
        std::memmove(base + to.scales_offset, base + from.scales_offset, to.scales_bytes);
    }
    layout = &short_layout;
  }
  // Zero every padding byte: the staging buffer is reused, and padding is
  // part of what the checksums cover.
  uint64_t tokens_end = layout->tokens_offset + 4ull * staged;
  std::memset(base + tokens_end, 0, layout->head_checksum_offset - tokens_end);
  for (const SectionLayout& sec : layout->sections) {
    uint64_t data_end = sec.offset + sec.data_bytes;
    if (sec.scales_bytes > 0) {
      std::memset(base + data_end, 0, sec.scales_offset - data_end);
      data_end = sec.scales_offset + sec.scales_bytes;
    }
    std::memset(base + data_end, 0, sec.end - data_end);
  }
  ChunkHeader ch;
  ch.token_count = staged;
  ch.salt = header.salt;
  ch.first_token = disk_tokens;
  ch.chunk_offset = end;
  ch.chunk_bytes = layout->chunk_bytes;
  ch.epoch = commit.epoch;
  // append_end <= disk_tokens + staged always: it counts finished appends.
  if (append_ends && append_end > disk_tokens) {
    ch.append_end = static_cast<uint32_t>(append_end - disk_tokens);
    disk_append_end = append_end;
  }
  EncodeChunkHeader(ch, std::span<uint8_t, ch::kHeaderSize>(base, ch::kHeaderSize));
  for (size_t i = 0; i < layout->sections.size(); ++i) {
    const SectionLayout& sec = layout->sections[i];
    StoreU64(base + layout->section_checksums_offset + 8 * i,
             Checksum(base + sec.offset, sec.end - sec.offset));
  }
  StoreU64(base + layout->head_checksum_offset, Checksum(base, layout->head_checksum_offset));
  // The other buffer's write must be complete before this one is queued:
  // that buffer is filled next. One chunk in flight overlaps the write with
  // staging (quantizing) the next chunk.
  KVFILE_RETURN_IF_ERROR(WaitInFlight());
  // In sync mode chunk the chunk's fdatasync is queued linked behind its
  // write (io_uring: IOSQE_IO_LINK), so the commit that follows needs no
  // separate sync of the data.
  bool link_sync = options.sync == SyncMode::kChunk;
  Status st = file->SubmitWrite(end, base, layout->chunk_bytes, link_sync);
  if (!st.ok()) return Fail(st);
  write_in_flight = true;
  in_flight_syncs = link_sync;
  if (!link_sync) data_unsynced = true;
  chunks.push_back({end, layout->chunk_bytes, disk_tokens});
  end += layout->chunk_bytes;
  disk_tokens += staged;
  if (layout != &full_layout) {
    // Restore the full layout's zero padding: compaction moved data into it.
    KVFILE_RETURN_IF_ERROR(WaitInFlight());
    std::memset(base, 0, full_layout.chunk_bytes);
  }
  staged = 0;
  current ^= 1;
  return Status::OK();
}

Status Writer::Impl::WaitInFlight() {
  if (!write_in_flight) return Status::OK();
  write_in_flight = false;
  Status st = file->WaitWrites();
  if (!st.ok()) return Fail(st);
  // A linked fdatasync that completed covers every write before it.
  if (in_flight_syncs) data_unsynced = false;
  return Status::OK();
}

// Data first, then the commit record into the older slot, each made durable
// before the next step: a commit record never vouches for bytes that are not
// on disk, and a torn slot write leaves the other slot intact.
//
// In a file with append ends the record vouches only for finished appends:
// it ends at the last append end that lies in a chunk on disk, which may
// cut the chunk it falls in (FORMAT.md 5.3; later chunks of the same epoch
// go on after that chunk's stored tokens, 5.4).
Status Writer::Impl::CommitDurably(bool force) {
  KVFILE_RETURN_IF_ERROR(WaitInFlight());
  uint64_t target = CommitTarget();
  // The chunks holding tokens [0, target).
  auto past = std::partition_point(chunks.begin(), chunks.end(),
                                   [&](const WrittenChunk& c) { return c.first_token < target; });
  uint64_t n = static_cast<uint64_t>(past - chunks.begin());
  uint64_t target_end = n == 0 ? kDataOffset : chunks[n - 1].offset + chunks[n - 1].bytes;
  if (!force && commit.tokens == target && commit.end == target_end) return Status::OK();
  CommitRecord next = commit;
  next.tokens = target;
  next.end = target_end;
  next.chunks = n;
  return WriteCommit(next);
}

// After an I/O error: cuts the file back to its last commit record (best
// effort), so that whole chunks written since, the failed append's among
// them, cannot be taken for acknowledged data. A record whose write was
// attempted may be on disk although its sync failed: nothing it covers is
// cut (RECOVERY.md, "Errors").
void Writer::Impl::CutBackAfterFailure() {
  if (!file) return;
  (void)file->WaitWrites();
  uint64_t keep = std::max(commit.end, written_commit_end);
  if (keep < end && file->Truncate(keep).ok()) (void)file->Sync();
}

// How many tokens the next commit vouches for.
uint64_t Writer::Impl::CommitTarget() const {
  return append_ends ? disk_append_end : disk_tokens;
}

// A failed Append() fails the whole append it belongs to. After an I/O
// error the writer is unusable: the file is cut back to its last commit
// (best effort; a file with append ends drops the unfinished append at the
// next open anyway). Otherwise the writer goes back to the last append end.
Status Writer::Impl::AbandonAppend(Status why) {
  bool was_open = append_open;
  append_open = false;
  if (!failure.ok()) {
    CutBackAfterFailure();
    return why;
  }
  if (!was_open) return why;  // a single failed call leaves no trace by itself
  uint64_t dropped = tokens.size() - append_end;
  // Staged tokens only, or (part of it in chunks on disk) a durable rewind.
  Status st = RewindTo(append_end);
  if (!st.ok()) return why.WithContext("dropping the unfinished append failed too (" + st.message() + ")");
  return why.WithContext("append dropped whole (" + std::to_string(dropped) + " tokens of its earlier calls)");
}

// Syncs the data, then writes `next` (with the next sequence number) into
// the slot holding the older record and syncs again.
Status Writer::Impl::WriteCommit(CommitRecord next) {
  KVFILE_RETURN_IF_ERROR(WaitInFlight());
  Status st;
  if (data_unsynced) {
    st = file->Sync();
    if (!st.ok()) return Fail(st);
    data_unsynced = false;
  }
  next.sequence = commit.sequence + 1;
  std::vector<uint8_t> slot(kCommitSlotSize);
  EncodeCommitRecord(next, std::span<uint8_t, kCommitSlotSize>(slot.data(), kCommitSlotSize));
  written_commit_end = next.end;
  st = file->WriteAt(kCommitSlotOffset[next.sequence % 2], slot.data(), slot.size());
  if (st.ok()) st = file->Sync();
  if (!st.ok()) return Fail(st);
  commit = next;
  return Status::OK();
}

// Recovery at a writable open (spec/RECOVERY.md, "Opening for append").
Status Writer::Impl::Recover(const internal::ScanResult& scan) {
  // Whatever an earlier writer left past the commit record may still sit
  // in the page cache: the next commit must sync it first.
  data_unsynced = true;
  commit = scan.commit;
  tokens.assign(scan.tokens.begin(), scan.tokens.end());
  disk_tokens = scan.tokens.size();
  for (const auto& c : scan.chunks) chunks.push_back({c.info.offset, c.info.bytes, c.info.first_token});
  end = scan.tail.valid_end;
  append_end = disk_append_end = disk_tokens;
  if (scan.tail.torn_tail_bytes > 0) {
    // Nothing in the tail was acknowledged: the commit record does not
    // cover it (or, cut inside committed data, it is a partial chunk that
    // cannot be read). Cut it off, durably, before anything is appended.
    recovery.truncated_bytes = scan.tail.torn_tail_bytes;
    recovery.torn_reason = scan.tail.torn_reason;
    Status st = file->Truncate(end);
    if (st.ok()) st = file->Sync();
    if (!st.ok()) return Fail(st);
  }
  if (scan.tail.committed_data_missing) {
    // Writer::Open let it through (drop_missing_committed): the record must
    // vouch for the kept prefix only, before anything is appended.
    recovery.dropped_committed_tokens = scan.tail.committed_tokens_missing;
    return CommitDurably(/*force=*/true);
  }
  recovery.recommitted_chunks = chunks.size() - scan.commit.chunks;
  recovery.slot_rewritten = !scan.slot_errors[0].empty() || !scan.slot_errors[1].empty();
  recovery.dropped_after_damage = scan.tail.valid_data_follows;
  // A last chunk cut by the commit record must be followed by chunks of a
  // newer epoch (FORMAT.md 5.3). The library's rewinds always bump the
  // epoch, but a file from elsewhere may cut without: bump it now.
  if (!scan.chunks.empty()) {
    const ChunkInfo& last = scan.chunks.back().info;
    if (last.live_tokens < last.stored_tokens && last.epoch == commit.epoch) {
      if (commit.epoch == UINT32_MAX)
        return Status::Unsupported(path + ": the epoch counter is exhausted; rewrite the file with kvfile convert");
      CommitRecord next = commit;
      next.epoch += 1;
      next.tokens = disk_tokens;
      next.end = end;
      next.chunks = chunks.size();
      return WriteCommit(next);
    }
  }
  if (recovery.recommitted_chunks > 0 || recovery.slot_rewritten) {
    // The next commit goes to the slot that is not active: the damaged one
    // if there is one.
    KVFILE_RETURN_IF_ERROR(CommitDurably(/*force=*/true));
  }
  return Status::OK();
}

// Rewind (spec/RECOVERY.md, "Rewind"): the new commit record, with a new
// epoch, is the single write that switches from the old sequence to the
// rewound one; the truncation after it only reclaims space.
Status Writer::Impl::RewindTo(uint64_t n) {
  if (n > tokens.size())
    return Status::InvalidArgument(path + ": cannot rewind to " + std::to_string(n) +
                                   " tokens; the file has " + std::to_string(tokens.size()));
  // A rewind ends any open append: its n tokens are what the file holds.
  append_open = false;
  append_end = n;
  if (n >= disk_tokens) {
    // Only staged tokens go: nothing on disk changes. Rewound to the end
    // of the chunks on disk, those hold finished appends only now, which
    // no later chunk head could say.
    staged = static_cast<uint32_t>(n - disk_tokens);
    tokens.resize(n);
    if (n == disk_tokens) disk_append_end = n;
    return Status::OK();
  }
  KVFILE_RETURN_IF_ERROR(WaitInFlight());
  // Keep the chunks holding tokens [0, n); the last kept one may be cut.
  size_t keep = 0;
  while (keep < chunks.size() && chunks[keep].first_token < n) ++keep;
  uint64_t new_end = keep == 0 ? kDataOffset : chunks[keep - 1].offset + chunks[keep - 1].bytes;
  // The kept chunks may not be durable yet (sync mode none): WriteCommit
  // syncs them before the record that vouches for them.
  if (commit.epoch == UINT32_MAX)
    return Status::Unsupported(path + ": the epoch counter is exhausted; rewrite the file with kvfile convert");
  CommitRecord next = commit;
  next.epoch += 1;
  next.tokens = n;
  next.end = new_end;
  next.chunks = keep;
  KVFILE_RETURN_IF_ERROR(WriteCommit(next));
  chunks.resize(keep);
  tokens.resize(n);
  disk_tokens = disk_append_end = n;
  end = new_end;
  staged = 0;
  Status st = file->Truncate(new_end);
  if (st.ok()) st = file->Sync();
  if (!st.ok()) return Fail(st);
  return Status::OK();
}

Writer::Writer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Writer::~Writer() {
  if (impl_ && !impl_->closed) (void)Close();
}

// Writes the header and both commit slots (sequence 1 and 2, the same empty
// state at `epoch`) to `write_path`, created exclusively and locked, and
// syncs it. The caller renames it into place (create) or fills it first
// (upgrade).
Status Writer::Impl::CreateFile(const std::string& write_path, uint32_t epoch) {
  std::vector<uint8_t> fixed(kDataOffset);
  EncodeFileHeader(header, std::span<uint8_t, kHeaderSize>(fixed.data(), kHeaderSize));
  CommitRecord c;
  c.salt = header.salt;
  c.epoch = epoch;
  for (uint64_t seq = 1; seq <= 2; ++seq) {
    c.sequence = seq;
    EncodeCommitRecord(c, std::span<uint8_t, kCommitSlotSize>(
                              fixed.data() + kCommitSlotOffset[seq % 2], kCommitSlotSize));
  }
  commit = c;  // sequence 2 is the newest
  Status st = fs->Open(write_path, OpenMode::kCreateExclusive, &file);
  if (!st.ok()) {
    // A leftover of a crashed create or upgrade holds nothing acknowledged:
    // remove it, unless a live writer holds its lock. It is removed while
    // locked, and only if the name still refers to the file locked.
    std::unique_ptr<File> stale;
    if (fs->Open(write_path, OpenMode::kReadWrite, &stale).ok()) {
      KVFILE_RETURN_IF_ERROR(LockWithGrace(*stale));
      FileId locked, named;
      KVFILE_RETURN_IF_ERROR(stale->Id(&locked));
      if (fs->PathId(write_path, &named).ok() && named == locked) KVFILE_RETURN_IF_ERROR(fs->Remove(write_path));
      stale.reset();
      st = fs->Open(write_path, OpenMode::kCreateExclusive, &file);
    }
    if (!st.ok()) return st;
  }
  // Between the exclusive create and the lock, another creator may have
  // taken this name for its own file: then this one gives up.
  st = file->LockExclusive();
  FileId mine, named;
  if (st.ok()) st = file->Id(&mine);
  if (st.ok() && (!fs->PathId(write_path, &named).ok() || !(named == mine)))
    return Status::Busy(write_path + ": another process is creating the same file");
  if (st.ok()) st = file->WriteAt(0, fixed.data(), fixed.size());
  if (st.ok()) st = file->Sync();
  if (!st.ok()) {
    file.reset();
    (void)fs->Remove(write_path);
  }
  return st;
}

namespace {

FileHeader NewHeader(const Geometry& geometry, const ModelIdentity& identity, uint32_t chunk_tokens,
                     uint16_t major) {
  FileHeader h;
  h.major = major;
  h.minor = major == kMajorV2 ? kMinorV2 : 0;
  if (major == kMajorV2) h.required_flags = kFlagAppendEnds;
  h.identity = identity;
  h.geometry = geometry;
  h.chunk_tokens = chunk_tokens;
  return h;
}

}  // namespace

Status Writer::Create(const std::string& path, const Geometry& geometry,
                      const ModelIdentity& identity, const WriterOptions& options,
                      std::unique_ptr<Writer>* out) {
  if (options.format_major != kMajorV1 && options.format_major != kMajorV2)
    return Status::InvalidArgument(path + ": format must be 1 or 2, not " +
                                   std::to_string(options.format_major));
  FileHeader h = NewHeader(geometry, identity, options.chunk_tokens, options.format_major);
  h.salt = options.salt;
  if (h.salt == 0) KVFILE_RETURN_IF_ERROR(RandomSalt(&h.salt));
  Status st = ValidateFileHeader(h);
  if (!st.ok()) return st.WithContext(path);
  auto impl = std::make_unique<Impl>();
  KVFILE_RETURN_IF_ERROR(impl->Init(path, options, h));
  FileSystem* fs = impl->fs;
  // With overwrite, the existing file stays locked until it has been
  // replaced, so no writer can start appending to it in between.
  std::unique_ptr<File> existing;
  if (options.overwrite) {
    st = fs->Open(path, OpenMode::kReadWrite, &existing);
    if (st.ok()) KVFILE_RETURN_IF_ERROR(existing->LockExclusive());
    else if (st.code() != Status::Code::kNotFound) return st;  // not a regular file, say
  } else {
    bool exists = false;
    KVFILE_RETURN_IF_ERROR(fs->Exists(path, &exists));
    if (exists) return Status::InvalidArgument(path + ": file exists");
  }
  // A symlink stays a link: what it leads to is replaced.
  std::string target = path;
  if (options.overwrite) KVFILE_RETURN_IF_ERROR(fs->ResolveSymlinks(path, &target));
  std::string tmp = target + ".kvnew";
  KVFILE_RETURN_IF_ERROR(impl->CreateFile(tmp, /*epoch=*/1));
  st = fs->Rename(tmp, target, options.overwrite);
  if (!st.ok()) {
    impl->file.reset();
    (void)fs->Remove(tmp);
    return st;
  }
  KVFILE_RETURN_IF_ERROR(fs->SyncDir(DirName(target)));
  out->reset(new Writer(std::move(impl)));
  return Status::OK();
}

// The v1 -> v2 upgrade (spec/RECOVERY.md, "Upgrade"): stream every live
// token of the v1 file into a new v2 file at <path>.kvupgrade, checking
// every v1 section checksum on the way; make it durable; rename it over
// the original; sync the directory. Until the rename the original is only
// read; on any failure the temporary file is removed.
Status Writer::Impl::UpgradeFrom(File& v1, const internal::ScanResult& scan) {
  const Geometry& g1 = scan.header.geometry;
  internal::LayoutCache layouts(&scan.header.geometry);
  // Tokens are read in slices of at most 8 MiB of rows, so memory stays
  // bounded whatever the v1 chunk size: the slice buffer plus the two
  // staging buffers of the new file.
  uint64_t bytes_per_token = 0;
  for (const StreamSpec& s : g1.streams) bytes_per_token += s.ElementsPerToken() * ElementSize(s.dtype);
  bytes_per_token *= g1.layers;
  uint64_t slice_tokens = std::max<uint64_t>(1, (8u << 20) / bytes_per_token);
  internal::PageBuffer slice;
  struct StateFree {
    void operator()(XXH3_state_t* st) const { XXH3_freeState(st); }
  };
  std::vector<std::unique_ptr<XXH3_state_t, StateFree>> hashes;
  for (size_t i = 0; i < static_cast<size_t>(g1.layers) * g1.streams.size(); ++i) {
    hashes.emplace_back(XXH3_createState());
    if (!hashes.back()) return Status::IOError(path + ": out of memory for checksum state");
  }
  AppendBatch batch;
  for (size_t ci = 0; ci < scan.chunks.size(); ++ci) {
    const internal::ScannedChunk& c = scan.chunks[ci];
    const ChunkLayout* layout;
    KVFILE_RETURN_IF_ERROR(layouts.Get(c.info.stored_tokens, &layout));
    for (auto& h : hashes) XXH3_64bits_reset(h.get());
    uint32_t stored = c.info.stored_tokens;
    for (uint32_t t0 = 0; t0 < stored; t0 += static_cast<uint32_t>(slice_tokens)) {
      uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(slice_tokens, stored - t0));
      bool last_slice = t0 + n == stored;
      if (!slice.Resize(n * bytes_per_token))
        return Status::IOError(path + ": no memory for an upgrade slice of " + std::to_string(n * bytes_per_token) +
                               " bytes");
      batch.blocks.clear();
      uint8_t* dst = slice.data();
      for (size_t i = 0; i < layout->sections.size(); ++i) {
        const SectionLayout& sec = layout->sections[i];
        const StreamSpec& spec = g1.streams[i % g1.streams.size()];
        uint64_t token_bytes = spec.ElementsPerToken() * ElementSize(spec.dtype);
        uint64_t off = c.info.offset + sec.offset + t0 * token_bytes;
        Status st = v1.ReadAt(off, dst, n * token_bytes);
        if (!st.ok()) return st.WithContext("v1 " + internal::ChunkWhere(ci, c.info.offset));
        XXH3_64bits_update(hashes[i].get(), dst, n * token_bytes);
        if (last_slice) {
          // The section's padding is under its checksum too.
          uint64_t pad_from = sec.offset + sec.data_bytes;
          std::vector<uint8_t> pad(sec.end - pad_from);
          st = v1.ReadAt(c.info.offset + pad_from, pad.data(), pad.size());
          if (!st.ok()) return st.WithContext("v1 " + internal::ChunkWhere(ci, c.info.offset));
          XXH3_64bits_update(hashes[i].get(), pad.data(), pad.size());
        }
        batch.blocks.push_back({spec.dtype, dst, nullptr});
        dst += n * token_bytes;
      }
      // Only live tokens go on; tokens a rewind left dead are dropped.
      uint64_t live_end = c.info.live_tokens;
      if (t0 < live_end) {
        uint64_t take = std::min<uint64_t>(n, live_end - t0);
        batch.tokens = std::span<const uint32_t>(scan.tokens).subspan(c.info.first_token + t0, take);
        KVFILE_RETURN_IF_ERROR(AppendTokens(batch));
      }
    }
    for (size_t i = 0; i < hashes.size(); ++i)
      if (!ChecksumMatches(scan.SectionChecksums(ci)[i], XXH3_64bits_digest(hashes[i].get())))
        return Status::Corruption("v1 " + internal::ChunkWhere(ci, c.info.offset) + ": payload checksum mismatch in layer " +
                                  std::to_string(i / g1.streams.size()) + " stream '" +
                                  g1.streams[i % g1.streams.size()].name + "'; not upgraded");
  }
  KVFILE_RETURN_IF_ERROR(WriteStagedChunk());
  return CommitDurably(/*force=*/true);
}

namespace {

// Self-healing: with the file's lock held no upgrade of it can be running,
// so a <path>.kvupgrade is a crash's leftover; the original is whole.
Status RemoveLeftoverUpgrade(FileSystem& fs, const std::string& path, bool* removed) {
  std::string tmp = path + ".kvupgrade";
  bool exists = false;
  KVFILE_RETURN_IF_ERROR(fs.Exists(tmp, &exists));
  *removed = false;
  if (!exists) return Status::OK();
  KVFILE_RETURN_IF_ERROR(fs.Remove(tmp));
  KVFILE_RETURN_IF_ERROR(fs.SyncDir(DirName(path)));
  *removed = true;
  return Status::OK();
}

}  // namespace

Status RemoveLeftoverUpgradeFile(const std::string& path, FileSystem* fs, bool* removed) {
  if (fs == nullptr) fs = FileSystem::Default();
  std::unique_ptr<File> file;
  KVFILE_RETURN_IF_ERROR(OpenLocked(*fs, path, &file));
  std::string real;
  KVFILE_RETURN_IF_ERROR(fs->ResolveSymlinks(path, &real));
  return RemoveLeftoverUpgrade(*fs, real, removed);
}

Status Writer::Open(const std::string& path, const WriterOptions& options,
                    std::unique_ptr<Writer>* out) {
  FileSystem* fs = options.fs ? options.fs : FileSystem::Default();
  std::unique_ptr<File> file;
  KVFILE_RETURN_IF_ERROR(OpenLocked(*fs, path, &file));
  // An upgrade replaces the file a symlink leads to, not the link: the
  // temporary file lives next to that file.
  std::string real;
  KVFILE_RETURN_IF_ERROR(fs->ResolveSymlinks(path, &real));
  std::string tmp = real + ".kvupgrade";
  bool removed_stale = false;
  KVFILE_RETURN_IF_ERROR(RemoveLeftoverUpgrade(*fs, real, &removed_stale));
  internal::ScanResult scan;
  Status st = internal::ScanFile(*file, &scan);
  if (!st.ok()) return st.WithContext(path);
  // Appending after a cut would make a commit record that no longer counts
  // acknowledged tokens: that takes an explicit decision.
  if (scan.tail.committed_data_missing && !options.drop_missing_committed)
    return Status::Corruption(
        path + ": file truncated: the file is " + std::to_string(scan.tail.file_size) +
        " bytes but the commit record vouches for " + std::to_string(scan.commit.end) + "; " +
        std::to_string(scan.tail.committed_tokens_missing) + " committed tokens are missing (" +
        scan.tail.torn_reason + "); not opened for writing, `kvfile repair --force` cuts it to the " +
        std::to_string(scan.tokens.size()) + " tokens before the cut");
  auto impl = std::make_unique<Impl>();
  if (scan.header.major == kMajorV1) {
    if (!IsFp8(options.upgrade_dtype))
      return Status::InvalidArgument(path + ": the upgrade dtype must be e4m3 or e5m2");
    FileHeader h = NewHeader(scan.header.geometry, scan.header.identity, scan.header.chunk_tokens, kMajorV2);
    for (StreamSpec& s : h.geometry.streams)
      if (std::find(options.keep_raw.begin(), options.keep_raw.end(), s.name) == options.keep_raw.end())
        s.dtype = options.upgrade_dtype;
    for (const std::string& name : options.keep_raw)
      if (!h.geometry.FindStream(name))
        return Status::InvalidArgument(path + ": --keep-raw names stream '" + name + "', which the file does not have");
    KVFILE_RETURN_IF_ERROR(RandomSalt(&h.salt));
    KVFILE_RETURN_IF_ERROR(impl->Init(path, options, h, kOpenMaxChunkBytes));
    if (scan.commit.epoch == UINT32_MAX)
      return Status::Unsupported(path + ": the epoch counter is exhausted; convert the file instead");
    // The upgrade renames a new file over the old one's name: another hard
    // link would go on naming the old v1 data, so that is refused. The new
    // file gets the old one's mode, owner and group.
    PathInfo info;
    FileId locked;
    KVFILE_RETURN_IF_ERROR(fs->Stat(real, &info));
    KVFILE_RETURN_IF_ERROR(file->Id(&locked));
    if (!info.exists || !(info.id == locked))
      return Status::Busy(path + ": the file was replaced while opening it; not upgraded");
    if (info.links > 1)
      return Status::InvalidArgument(
          path + ": a v1 file with " + std::to_string(info.links) +
          " hard links is not upgraded to v2 in place (the other names would keep the old v1 data); "
          "write a v2 copy with `kvfile convert`, or remove the other links first");
    st = impl->CreateFile(tmp, scan.commit.epoch + 1);
    if (!st.ok()) return st.WithContext(path + ": upgrade to v2 failed, the v1 file is unchanged");
    st = impl->UpgradeFrom(*file, scan);
    if (st.ok()) st = fs->CopyAttributes(info, tmp);
    if (st.ok()) st = fs->Rename(tmp, real, /*replace=*/true);
    if (!st.ok()) {
      impl->file.reset();
      (void)fs->Remove(tmp);
      return st.WithContext(path + ": upgrade to v2 failed, the v1 file is unchanged");
    }
    KVFILE_RETURN_IF_ERROR(fs->SyncDir(DirName(real)));
    impl->recovery.upgraded_from_v1 = true;
    impl->recovery.dropped_committed_tokens = scan.tail.committed_tokens_missing;
    impl->recovery.removed_stale_upgrade = removed_stale;
    out->reset(new Writer(std::move(impl)));
    return Status::OK();
  }
  // The header's nominal chunk size is only a hint, and it comes from the
  // file: staging buffers for an existing file are capped.
  KVFILE_RETURN_IF_ERROR(impl->Init(path, options, scan.header, kOpenMaxChunkBytes));
  impl->file = std::move(file);
  KVFILE_RETURN_IF_ERROR(impl->Recover(scan));
  impl->recovery.removed_stale_upgrade = removed_stale;
  out->reset(new Writer(std::move(impl)));
  return Status::OK();
}

// Stages the batch and writes every chunk it completes. Returns whether it
// wrote a chunk.
Status Writer::Impl::AppendTokens(const AppendBatch& batch, bool* wrote_chunk) {
  KVFILE_RETURN_IF_ERROR(CheckUsable());
  uint64_t n = batch.tokens.size();
  if (n == 0) {
    // An empty last batch still ends the append it belongs to.
    if (!batch.continued) append_end = tokens.size();
    return Status::OK();
  }
  KVFILE_RETURN_IF_ERROR(AllocateStaging());
  uint32_t room = full_layout.token_count - staged;
  // An append that fits the staging buffer is checked while it is staged; a
  // longer one is checked whole first, since its first chunks go to disk
  // before its last rows are read.
  KVFILE_RETURN_IF_ERROR(ValidateBatch(batch, /*scan_values=*/n > room));
  uint64_t done = 0;
  while (done < n) {
    uint32_t piece = static_cast<uint32_t>(std::min<uint64_t>(n - done, full_layout.token_count - staged));
    KVFILE_RETURN_IF_ERROR(StageTokens(batch, done, piece));
    done += piece;
    // The append is whole in memory: the chunk written next records its end.
    if (done == n && !batch.continued) append_end = tokens.size();
    if (staged == full_layout.token_count) {
      KVFILE_RETURN_IF_ERROR(WriteStagedChunk());
      if (wrote_chunk) *wrote_chunk = true;
    }
  }
  return Status::OK();
}

Status Writer::Append(const AppendBatch& batch) {
  Impl& w = *impl_;
  bool wrote_chunk = false;
  Status st = w.AppendTokens(batch, &wrote_chunk);
  if (!st.ok()) return w.closed ? st : w.AbandonAppend(st);
  w.append_open = batch.continued;
  // Sync mode chunk: the appends that end in the chunks written so far are
  // durable and committed before the call returns.
  if (wrote_chunk && w.options.sync == SyncMode::kChunk) {
    st = w.CommitDurably();
    if (!st.ok()) return w.AbandonAppend(st);
  }
  return Status::OK();
}

Status Writer::Flush() {
  KVFILE_RETURN_IF_ERROR(impl_->CheckUsable());
  KVFILE_RETURN_IF_ERROR(impl_->WriteStagedChunk());
  return impl_->WaitInFlight();
}

Status Writer::Sync() {
  KVFILE_RETURN_IF_ERROR(Flush());
  return impl_->CommitDurably();
}

Status Writer::Close() {
  Impl& w = *impl_;
  if (w.closed) return Status::OK();
  Status st = w.CheckUsable();
  // An unfinished append is dropped: its staged tokens go, and what of it
  // is in chunks already is removed by a rewind to the last append end
  // (durable; in a 2.0 file too, where no append end would drop it).
  uint64_t dropped = 0;
  if (st.ok() && w.append_open) {
    w.append_open = false;
    dropped = w.tokens.size() - w.append_end;
    st = w.RewindTo(w.append_end);
  }
  if (st.ok()) st = w.WriteStagedChunk();
  if (st.ok()) st = w.WaitInFlight();
  if (st.ok() && w.options.sync != SyncMode::kNone) st = w.CommitDurably();
  if (!st.ok() && !w.failure.ok()) w.CutBackAfterFailure();
  w.closed = true;
  w.file.reset();
  if (st.ok() && dropped > 0)
    return Status::Failed(w.path + ": closed with an unfinished append; its " + std::to_string(dropped) +
                          " tokens were dropped");
  return st;
}

Status Writer::Rewind(uint64_t n) {
  KVFILE_RETURN_IF_ERROR(impl_->CheckUsable());
  return impl_->RewindTo(n);
}

uint64_t Writer::token_count() const { return impl_->tokens.size(); }
uint64_t Writer::durable_tokens() const { return impl_->commit.tokens; }
const Geometry& Writer::geometry() const { return impl_->header.geometry; }
const std::string& Writer::path() const { return impl_->path; }
const Writer::RecoveryReport& Writer::recovery() const { return impl_->recovery; }
std::span<const uint32_t> Writer::tokens() const { return impl_->tokens; }
uint64_t Writer::LongestCommonPrefix(std::span<const uint32_t> prompt) const {
  const auto& t = impl_->tokens;
  auto [a, b] = std::mismatch(t.begin(), t.end(), prompt.begin(), prompt.end());
  return static_cast<uint64_t>(a - t.begin());
}

}  // namespace kvfile
