// SPDX-License-Identifier: Apache-2.0
// Writer: staging buffer -> whole chunks -> commit slots (see writer.h and
// spec/RECOVERY.md for the order of writes that makes this crash safe).
//
// This file: the append path (stage, seal, write, commit) and the public
// API. The parts are described in writer_impl.h.
#include "kvfile/writer.h"

#include <sys/random.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "format/chunk_layout.h"
#include "format/header.h"
#include "io/atomic_replace.h"
#include "writer/writer_impl.h"
#include "writer/writer_lock.h"

namespace kvfile {

using namespace kvfile::format;
using internal::NewHeader;
using internal::RandomSalt;

namespace {

// Staging buffers of a writer that opens an existing file hold at most this
// much each, whatever nominal chunk size the file's header names; so do the
// chunks of the CLI's default size for an input smaller than this.
constexpr uint64_t kDefaultMaxChunkBytes = uint64_t{64} << 20;

}  // namespace

uint32_t FitChunkTokens(const Geometry& g, uint32_t wanted, uint64_t input_bytes) {
  const uint64_t cap = std::max(kDefaultMaxChunkBytes, input_bytes);
  ChunkLayout layout;
  while (wanted > 1 && (!ComputeChunkLayout(g, wanted, &layout).ok() || layout.chunk_bytes > cap)) wanted /= 2;
  return wanted;
}

namespace internal {

Status RandomSalt(uint64_t* salt) {
  do {
    if (getrandom(salt, sizeof *salt, 0) != sizeof *salt) return ErrnoStatus("getrandom", errno);
  } while (*salt == 0);
  return Status::OK();
}

FileHeader NewHeader(const Geometry& geometry, const ModelIdentity& identity, uint32_t chunk_tokens,
                     uint16_t major) {
  FileHeader h;
  h.major = major;
  h.minor = major == kMajorV2 ? kMinorV2 : 0;
  if (major == kMajorV2) h.required_flags = kFlagAppendEnds;
  // A file with an nvfp4 stream is 2.2 (spec/FORMAT.md 9); others stay 2.1.
  for (const StreamSpec& s : geometry.streams)
    if (major == kMajorV2 && IsNvfp4(s.dtype)) {
      h.minor = kMinorNvfp4;
      h.required_flags |= kFlagNvfp4;
    }
  // A stream absent from some layer makes it 2.3 (the layer sets).
  if (major == kMajorV2 && geometry.HasLayerSets()) {
    h.minor = kMinorLayerSets;
    h.required_flags |= kFlagLayerSets;
  }
  h.identity = identity;
  h.geometry = geometry;
  h.chunk_tokens = chunk_tokens;
  return h;
}

}  // namespace internal

// Sets the writer up for the header's geometry: the chunk layout its
// staging buffers will have.
Status Writer::Impl::Init(const std::string& p, const WriterOptions& o, FileHeader h, bool cap_chunk_size) {
  path = p;
  fs = o.fs ? o.fs : FileSystem::Default();
  options = o;
  header = std::move(h);
  append_ends = (header.required_flags & kFlagAppendEnds) != 0;
  // Chunks say their own token count, so a writer may stage fewer tokens
  // than the header's nominal count (FORMAT.md, "Limits"). Create() takes
  // the caller's chunk size or refuses it (the message says to use fewer
  // tokens per chunk); Open() lowers the file's hint to fit.
  uint32_t chunk_tokens = header.chunk_tokens;
  if (cap_chunk_size) chunk_tokens = FitChunkTokens(header.geometry, chunk_tokens, 0);
  return builder.Init(&header.geometry, chunk_tokens, options.threads).WithContext(path);
}

// Writes the header and both commit slots (sequence 1 and 2, the same empty
// state at `epoch`) to `write_path`, created exclusively and locked, and
// syncs it. The caller renames it into place (create) or fills it first
// (upgrade).
Status Writer::Impl::CreateFile(const std::string& write_path, uint32_t epoch) {
  std::vector<uint8_t> fixed(kDataOffset);
  EncodeFileHeader(header, std::span<uint8_t, kHeaderSize>(fixed.data(), kHeaderSize));
  log.Reset(internal::EncodeInitialSlots(header.salt, epoch, fixed));
  Status st = internal::CreateLocked(*fs, write_path, &file);
  if (!st.ok() && !file) return st;
  if (st.ok()) st = file->WriteAt(0, fixed.data(), fixed.size());
  if (st.ok()) st = file->Sync();
  if (!st.ok()) {
    file.reset();
    (void)fs->Remove(write_path);
  }
  return st;
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
  // The staging buffers are allocated by the first append, not by Create or
  // Open: a writer that never appends (an empty import, a repair, a reopen
  // that only rewinds) holds no chunk-sized memory, whatever size the header
  // asks for. Both at once, before anything is staged, so that a failure
  // leaves the append without a trace.
  if (!builder.Allocate())
    return Status::IOError(path + ": cannot allocate a staging buffer of " + std::to_string(builder.buffer_bytes()) +
                           " bytes");
  // An append that fits the staging buffer is checked while it is staged; a
  // longer one is checked whole first, since its first chunks go to disk
  // before its last rows are read.
  KVFILE_RETURN_IF_ERROR(builder.Validate(batch, /*scan_values=*/n > builder.room(), disk_tokens));
  uint64_t done = 0;
  while (done < n) {
    uint32_t piece = static_cast<uint32_t>(std::min<uint64_t>(n - done, builder.room()));
    KVFILE_RETURN_IF_ERROR(builder.Stage(batch, done, piece, disk_tokens));
    tokens.insert(tokens.end(), batch.tokens.begin() + static_cast<ptrdiff_t>(done),
                  batch.tokens.begin() + static_cast<ptrdiff_t>(done + piece));
    done += piece;
    // The append is whole in memory: the chunk written next records its end.
    if (done == n && !batch.continued) append_end = tokens.size();
    if (builder.room() == 0) {
      KVFILE_RETURN_IF_ERROR(WriteStagedChunk());
      if (wrote_chunk) *wrote_chunk = true;
    }
  }
  return Status::OK();
}

Status Writer::Impl::WriteStagedChunk() {
  const uint32_t staged = builder.staged();
  if (staged == 0) return Status::OK();
  ChunkHeader ch;
  ch.salt = header.salt;
  ch.first_token = disk_tokens;
  ch.chunk_offset = end;
  ch.epoch = log.durable().epoch;
  // append_end <= disk_tokens + staged always: it counts finished appends.
  if (append_ends && append_end > disk_tokens) {
    ch.append_end = static_cast<uint32_t>(append_end - disk_tokens);
    disk_append_end = append_end;
  }
  std::span<const uint8_t> chunk;
  KVFILE_RETURN_IF_ERROR(builder.Seal(ch, &chunk));
  // The other buffer's write must be complete before this one is queued:
  // that buffer is filled next. One chunk in flight overlaps the write with
  // staging (quantizing) the next chunk.
  KVFILE_RETURN_IF_ERROR(WaitInFlight());
  // In sync mode chunk the chunk's fdatasync is queued linked behind its
  // write (io_uring: IOSQE_IO_LINK), so the commit that follows needs no
  // separate sync of the data.
  bool link_sync = options.sync == SyncMode::kChunk;
  Status st = file->SubmitWrite(end, chunk.data(), chunk.size(), link_sync);
  if (!st.ok()) return Fail(st);
  in_flight = {.pending = true, .syncs = link_sync};
  if (!link_sync) log.DataWritten();
  chunks.push_back({end, chunk.size(), disk_tokens});
  end += chunk.size();
  disk_tokens += staged;
  builder.Advance();
  return Status::OK();
}

Status Writer::Impl::WaitInFlight() {
  if (!in_flight.pending) return Status::OK();
  in_flight.pending = false;
  Status st = file->WaitWrites();
  if (!st.ok()) return Fail(st);
  // A linked fdatasync that completed covers every write before it;
  // otherwise the disk may start on the chunk now (write_behind.h), so the
  // sync at the commit finds less to do.
  if (in_flight.syncs)
    log.DataSynced();
  else if (!chunks.empty())
    write_behind.Start(*file, path, chunks.back().offset, chunks.back().bytes);
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
  if (!force && log.durable().tokens == target && log.durable().end == target_end) return Status::OK();
  CommitRecord next = log.durable();
  next.tokens = target;
  next.end = target_end;
  next.chunks = n;
  return WriteCommit(next);
}

// Writes `next` through the commit log, after the write in flight; any
// failure makes the writer unusable.
Status Writer::Impl::WriteCommit(CommitRecord next) {
  KVFILE_RETURN_IF_ERROR(WaitInFlight());
  Status st = log.Write(*file, next);
  if (!st.ok()) return Fail(st);
  return Status::OK();
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

Writer::Writer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Writer::~Writer() {
  if (impl_ && !impl_->closed) (void)Close();
}

Status Writer::Create(const std::string& path, const Geometry& geometry,
                      const ModelIdentity& identity, const WriterOptions& options,
                      std::unique_ptr<Writer>* out) {
  return internal::WriterAccess::Create(path, geometry, identity, options, /*salt=*/0, out);
}

Status internal::WriterAccess::Create(const std::string& path, const Geometry& geometry,
                                      const ModelIdentity& identity, const WriterOptions& options, uint64_t salt,
                                      std::unique_ptr<Writer>* out) {
  if (options.format_major != kMajorV1 && options.format_major != kMajorV2)
    return Status::InvalidArgument(path + ": format must be 1 or 2, not " +
                                   std::to_string(options.format_major));
  FileHeader h = NewHeader(geometry, identity, options.chunk_tokens, options.format_major);
  h.salt = salt;
  if (h.salt == 0) KVFILE_RETURN_IF_ERROR(RandomSalt(&h.salt));
  Status st = ValidateFileHeader(h);
  if (!st.ok()) return st.WithContext(path);
  auto impl = std::make_unique<Writer::Impl>();
  KVFILE_RETURN_IF_ERROR(impl->Init(path, options, h, /*cap_chunk_size=*/false));
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
  std::string tmp = TempPathFor(target, ".kvnew");
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

Status RemoveLeftoverUpgradeFile(const std::string& path, FileSystem* fs, bool* removed) {
  if (fs == nullptr) fs = FileSystem::Default();
  std::unique_ptr<File> file;
  KVFILE_RETURN_IF_ERROR(internal::OpenLocked(*fs, path, &file));
  std::string real;
  KVFILE_RETURN_IF_ERROR(fs->ResolveSymlinks(path, &real));
  return internal::RemoveLeftoverUpgrade(*fs, real, removed);
}

Status Writer::Open(const std::string& path, const WriterOptions& options,
                    std::unique_ptr<Writer>* out) {
  FileSystem* fs = options.fs ? options.fs : FileSystem::Default();
  std::unique_ptr<File> file;
  KVFILE_RETURN_IF_ERROR(internal::OpenLocked(*fs, path, &file));
  // An upgrade replaces the file a symlink leads to, not the link: the
  // temporary file lives next to that file.
  std::string real;
  KVFILE_RETURN_IF_ERROR(fs->ResolveSymlinks(path, &real));
  bool removed_stale = false;
  KVFILE_RETURN_IF_ERROR(internal::RemoveLeftoverUpgrade(*fs, real, &removed_stale));
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
  std::unique_ptr<Impl> impl;
  if (scan.header.major == kMajorV1) {
    KVFILE_RETURN_IF_ERROR(Impl::OpenUpgrading(path, real, options, *file, scan, &impl));
  } else {
    // The header's nominal chunk size is only a hint, and it comes from the
    // file: staging buffers for an existing file are capped.
    impl = std::make_unique<Impl>();
    KVFILE_RETURN_IF_ERROR(impl->Init(path, options, scan.header, /*cap_chunk_size=*/true));
    impl->file = std::move(file);
    KVFILE_RETURN_IF_ERROR(impl->Recover(scan));
  }
  impl->recovery.removed_stale_upgrade = removed_stale;
  out->reset(new Writer(std::move(impl)));
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
  w.write_behind.Release();
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
uint64_t Writer::durable_tokens() const { return impl_->log.durable().tokens; }
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
