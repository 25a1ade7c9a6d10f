// SPDX-License-Identifier: Apache-2.0
// Reader: open = scan (file_scan.h); reads check whole sections before they
// decode anything into the caller's buffer.
#include "kvfile/reader.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "reader/file_scan.h"
#include "reader/parallel_chunks.h"
#include "reader/reader_access.h"
#include "codec/dtype_codec.h"
#include "kvfile/codec.h"
#include "format/endian.h"

namespace kvfile {

using namespace kvfile::format;
using internal::ScanResult;

// More workers than this cannot help: a chunk is the unit of work and the
// disk is one.
constexpr size_t kMaxReadThreads = 16;

struct KVFILE_NO_EXPORT Reader::Impl {
  std::string path;
  FileSystem* fs = nullptr;
  std::unique_ptr<File> file;
  // What the open found: the committed state, taken once. Shared with the
  // readers made from this one by ReaderAccess::Share.
  std::shared_ptr<const ScanResult> scan;
  internal::PageVector<ChunkInfo> chunk_infos;
  CommitInfo commit;  // scan->commit, as the public type
  std::unique_ptr<internal::LayoutCache> layouts;
  internal::PageBuffer scratch;  // reused across reads: no allocation per call once warm
  // ReadMany's and ReadManyCodes' workers, kept for the next call: the
  // pool's threads, and for each worker its section buffer and layouts and,
  // after the first (which reads through `file`), a File of its own.
  std::vector<internal::PageBuffer> worker_buffers;
  std::vector<internal::LayoutCache> worker_layouts;
  std::vector<std::unique_ptr<File>> worker_files;
  pid_t worker_files_pid = 0;  // the process that opened worker_files
  internal::ChunkWorkers workers;  // last: its threads stop before the rest goes

  const Geometry& g() const { return scan->header.geometry; }

  // A piece of a read: which chunk, which of its tokens, where its section
  // landed in scratch.
  struct Piece {
    size_t chunk;
    uint32_t first;  // first token within the chunk
    uint32_t count;
    SectionLayout section;  // a copy: the layout cache may drop layouts
    size_t scratch_offset;
  };
  Status CheckRange(uint32_t layer, uint32_t stream, uint64_t begin, uint64_t end) const;
  Status CheckTokenRange(uint64_t begin, uint64_t end) const;
  Status LoadSections(uint32_t layer, uint32_t stream, uint64_t begin, uint64_t end,
                      std::vector<Piece>* pieces);
  Status ReadCodes(uint32_t layer, uint32_t stream, uint64_t begin, uint64_t end, uint8_t* codes,
                   uint8_t* block_scales, float* scales, Dtype v1_quantize_as);
  size_t FirstChunkFor(uint64_t begin) const;
  // The tokens of chunk ci that a read of [begin, end) covers.
  struct ChunkWindow {
    uint64_t from;   // first token, in the file's numbering
    uint32_t first;  // first token within the chunk
    uint32_t count;
  };
  // ReadMany's and ReadManyCodes' shared step on one chunk: each target's
  // (layer, stream) section read into *buf on its own (a buffer that stays in
  // the core's cache while it is checked and used; consecutive targets read
  // consecutive bytes) and checked (CheckSection), then handed to
  // use(target, spec, section, window), which takes what it needs from *buf.
  template <typename Target, typename Use>
  Status ForEachCheckedSection(File& f, internal::LayoutCache& chunk_layouts, size_t ci,
                               std::span<const Target> targets, uint64_t begin, uint64_t end,
                               internal::PageBuffer* buf, Use&& use) const;
  Status ReadChunkTargets(File& f, internal::LayoutCache& chunk_layouts, size_t ci,
                          std::span<const RowsTarget> targets, uint64_t begin, uint64_t end,
                          Dtype out_dtype, internal::PageBuffer* buf) const;
  Status ReadChunkCodes(File& f, internal::LayoutCache& chunk_layouts, size_t ci,
                        std::span<const CodesTarget> targets, uint64_t begin, uint64_t end,
                        Dtype v1_quantize_as, internal::PageBuffer* buf) const;
  // Runs per_chunk(File&, LayoutCache&, chunk index, PageBuffer*) for every
  // chunk overlapping [begin, end) (not empty) on up to `threads` workers;
  // returns the error of the first failing chunk in file order.
  template <typename PerChunk>
  Status ForEachChunk(uint64_t begin, uint64_t end, unsigned threads, PerChunk&& per_chunk);
};

Status Reader::Impl::CheckRange(uint32_t layer, uint32_t stream, uint64_t begin,
                                uint64_t end) const {
  if (layer >= g().layers)
    return Status::InvalidArgument(path + ": layer " + std::to_string(layer) + " out of range (" +
                                   std::to_string(g().layers) + " layers)");
  if (stream >= g().streams.size())
    return Status::InvalidArgument(path + ": stream " + std::to_string(stream) + " out of range");
  if (!g().InLayer(layer, stream))
    return Status::InvalidArgument(path + ": stream '" + g().streams[stream].name + "' is not in layer " +
                                   std::to_string(layer) + " (it is in layers " +
                                   FormatLayerList(g().streams[stream].layers) + ")");
  return CheckTokenRange(begin, end);
}

Status Reader::Impl::CheckTokenRange(uint64_t begin, uint64_t end) const {
  if (begin > end || end > scan->tokens.size())
    return Status::InvalidArgument(path + ": token range [" + std::to_string(begin) + ", " +
                                   std::to_string(end) + ") outside [0, " +
                                   std::to_string(scan->tokens.size()) + ")");
  return Status::OK();
}

namespace {

// Checks one (layer, stream) section held in memory: its checksum, then the
// values of the rows a read uses (tokens [first, first + count) of the
// chunk): fp8 codes and scales, or that raw values are finite (the writer
// never stores a non-finite one, so one in a file is damage). The caller
// adds where the section is, only on failure: building that string for
// every section read was a fifth of a small read's time.
Status CheckSection(const StreamSpec& spec, const SectionLayout& sec, const uint8_t* bytes,
                    uint64_t expected_checksum, uint64_t section_file_offset,
                    uint64_t chunk_first_token, uint32_t first, uint32_t count) {
  if (!ChecksumMatches(expected_checksum, Checksum(bytes, sec.end - sec.offset)))
    return Status::Corruption("payload checksum mismatch (section at offset " +
                              std::to_string(section_file_offset) + ")");
  Status st = internal::CheckSectionPadding(sec, bytes, section_file_offset - sec.offset);
  if (st.ok()) st = internal::CheckSectionValues(spec, sec, bytes, chunk_first_token, first, count);
  return st;
}

// Decodes tokens [first, first + count) of a checked section into `out` as
// `out_dtype`; returns the end of what it wrote.
uint8_t* DecodeSection(const StreamSpec& spec, const SectionLayout& sec, const uint8_t* bytes,
                       uint32_t first, uint32_t count, Dtype out_dtype, uint8_t* out) {
  const CodecRows cr = CodecRowsOf(spec);
  const uint64_t rows = uint64_t{count} * cr.per_token;
  const codec::PartsIn in = codec::AtRow(spec.dtype, SectionParts(sec, bytes), uint64_t{first} * cr.per_token, cr.width);
  codec::CodecOf(spec.dtype)->decode(spec.dtype, in, rows, cr.width, out_dtype, out);
  return out + CodeBytes(out_dtype, rows * cr.width);
}

// Copies the stored parts (codes and scales, and for nvfp4 the block
// scales) of tokens [first, first + count) of a checked fp8 or nvfp4
// section to the destinations of token `out_token` (counted from the
// read's first token).
void CopyCodes(const StreamSpec& spec, const SectionLayout& sec, const uint8_t* bytes, uint32_t first,
               uint32_t count, uint64_t out_token, uint8_t* codes, uint8_t* block_scales, float* scales) {
  const CodecRows cr = CodecRowsOf(spec);
  const codec::PartsIn from = codec::AtRow(spec.dtype, SectionParts(sec, bytes), uint64_t{first} * cr.per_token, cr.width);
  const codec::PartsOut to =
      codec::AtRow(spec.dtype, codec::PartsOut{codes, block_scales, scales}, out_token * cr.per_token, cr.width);
  codec::CopyParts(spec.dtype, from, uint64_t{count} * cr.per_token, cr.width, to);
}

// The refusal of a codes read of a stream it cannot read, or OK.
Status CodesReadable(const std::string& path, const StreamSpec& spec, bool v1, bool nvfp4_read,
                     const char* rows_call) {
  if (!v1 && !IsQuantized(spec.dtype))
    return Status::InvalidArgument(path + ": stream '" + spec.name + "' is stored raw (" + DtypeName(spec.dtype) +
                                   "); read it with " + rows_call);
  if (IsNvfp4(spec.dtype) && !nvfp4_read)
    return Status::InvalidArgument(path + ": stream '" + spec.name +
                                   "' is nvfp4; its codes come with block scales (ReadCodes with block_scales)");
  if (!IsNvfp4(spec.dtype) && nvfp4_read)
    return Status::InvalidArgument(path + ": stream '" + spec.name + "' is " + DtypeName(spec.dtype) +
                                   ", not nvfp4; it has no block scales");
  return Status::OK();
}

std::string SectionWhere(const std::string& path, size_t chunk, uint64_t offset, uint32_t layer,
                         const StreamSpec& spec) {
  return path + ": " + internal::ChunkWhere(chunk, offset) + ", layer " + std::to_string(layer) +
         " stream '" + spec.name + "'";
}

}  // namespace

// Index of the first chunk whose live range ends after `begin`.
size_t Reader::Impl::FirstChunkFor(uint64_t begin) const {
  auto it = std::upper_bound(chunk_infos.begin(), chunk_infos.end(), begin,
                             [](uint64_t t, const ChunkInfo& c) { return t < c.first_token + c.live_tokens; });
  return static_cast<size_t>(it - chunk_infos.begin());
}

// Reads the (layer, stream) section of every chunk overlapping [begin, end)
// into scratch and checks it: checksum, and for fp8 the codes and scales of
// the rows the read uses. Nothing is decoded until all of them pass.
Status Reader::Impl::LoadSections(uint32_t layer, uint32_t stream, uint64_t begin, uint64_t end,
                                  std::vector<Piece>* pieces) {
  const StreamSpec& spec = g().streams[stream];
  size_t total = 0;
  size_t idx = 0;
  for (size_t ci = FirstChunkFor(begin); ci < chunk_infos.size(); ++ci) {
    const ChunkInfo& c = chunk_infos[ci];
    if (c.first_token >= end) break;
    const ChunkLayout* layout;
    KVFILE_RETURN_IF_ERROR(layouts->Get(c.stored_tokens, &layout));
    idx = layout->index(layer, stream);  // the same in every chunk
    SectionLayout sec = layout->sections[idx];
    uint64_t from = std::max(begin, c.first_token);
    uint64_t to = std::min(end, c.first_token + c.live_tokens);
    pieces->push_back({ci, static_cast<uint32_t>(from - c.first_token),
                       static_cast<uint32_t>(to - from), sec, total});
    total += sec.end - sec.offset;
  }
  if (scratch.size() < total && !scratch.Resize(total))
    return Status::IOError(path + ": no memory for a read of " + std::to_string(total) + " bytes");
  for (const Piece& p : *pieces) {
    const ChunkInfo& c = chunk_infos[p.chunk];
    const SectionLayout& sec = p.section;
    uint8_t* buf = scratch.data() + p.scratch_offset;
    Status st = file->ReadAt(c.offset + sec.offset, buf, sec.end - sec.offset);
    if (st.ok())
      st = CheckSection(spec, sec, buf, scan->SectionChecksums(p.chunk)[idx], c.offset + sec.offset, c.first_token,
                        p.first, p.count);
    if (!st.ok())
      return internal::ExplainReadFailure(*file, *scan, c.offset + sec.end, path,
                                          st.WithContext(SectionWhere(path, p.chunk, c.offset, layer, spec)));
  }
  return Status::OK();
}

template <typename Target, typename Use>
Status Reader::Impl::ForEachCheckedSection(File& f, internal::LayoutCache& chunk_layouts, size_t ci,
                                           std::span<const Target> targets, uint64_t begin, uint64_t end,
                                           internal::PageBuffer* buf, Use&& use) const {
  const ChunkInfo& c = chunk_infos[ci];
  const ChunkLayout* layout;
  KVFILE_RETURN_IF_ERROR(chunk_layouts.Get(c.stored_tokens, &layout));
  uint64_t from = std::max(begin, c.first_token);
  uint64_t to = std::min(end, c.first_token + c.live_tokens);
  const ChunkWindow w{from, static_cast<uint32_t>(from - c.first_token), static_cast<uint32_t>(to - from)};
  for (const Target& t : targets) {
    const StreamSpec& spec = g().streams[t.stream];
    const SectionLayout& sec = layout->section(t.layer, t.stream);
    uint64_t bytes = sec.end - sec.offset;
    if (buf->size() < bytes && !buf->Resize(bytes))
      return Status::IOError(path + ": no memory for a section of " + std::to_string(bytes) + " bytes");
    size_t idx = layout->index(t.layer, t.stream);
    Status st = f.ReadAt(c.offset + sec.offset, buf->data(), bytes);
    if (st.ok())
      st = CheckSection(spec, sec, buf->data(), scan->SectionChecksums(ci)[idx], c.offset + sec.offset,
                        c.first_token, w.first, w.count);
    if (!st.ok())
      return internal::ExplainReadFailure(f, *scan, c.offset + sec.end, path,
                                          st.WithContext(SectionWhere(path, ci, c.offset, t.layer, spec)));
    KVFILE_RETURN_IF_ERROR(use(t, spec, sec, w));
  }
  return Status::OK();
}

// ReadMany's work on one chunk: each target's checked section decoded into
// its destination.
Status Reader::Impl::ReadChunkTargets(File& f, internal::LayoutCache& chunk_layouts, size_t ci,
                                      std::span<const RowsTarget> targets, uint64_t begin, uint64_t end,
                                      Dtype out_dtype, internal::PageBuffer* buf) const {
  size_t out_elem = ElementSize(out_dtype);
  return ForEachCheckedSection(
      f, chunk_layouts, ci, targets, begin, end, buf,
      [&](const RowsTarget& t, const StreamSpec& spec, const SectionLayout& sec, const ChunkWindow& w) {
        auto* out = static_cast<uint8_t*>(t.dst) + (w.from - begin) * spec.ElementsPerToken() * out_elem;
        DecodeSection(spec, sec, buf->data(), w.first, w.count, out_dtype, out);
        return Status::OK();
      });
}

// ReadManyCodes' work on one chunk: each target's checked codes and scales
// (nvfp4: and block scales) copied out (or, in a v1 file, the raw rows
// quantized).
Status Reader::Impl::ReadChunkCodes(File& f, internal::LayoutCache& chunk_layouts, size_t ci,
                                    std::span<const CodesTarget> targets, uint64_t begin, uint64_t end,
                                    Dtype v1_quantize_as, internal::PageBuffer* buf) const {
  const bool quantize = scan->header.major == kMajorV1;
  return ForEachCheckedSection(
      f, chunk_layouts, ci, targets, begin, end, buf,
      [&](const CodesTarget& t, const StreamSpec& spec, const SectionLayout& sec, const ChunkWindow& w) {
        if (!quantize) {
          CopyCodes(spec, sec, buf->data(), w.first, w.count, w.from - begin, t.codes, t.block_scales, t.scales);
          return Status::OK();
        }
        uint64_t row0 = uint64_t{w.first} * spec.rows_per_token;
        uint64_t rows = uint64_t{w.count} * spec.rows_per_token;
        uint64_t out_row0 = (w.from - begin) * spec.rows_per_token;
        uint8_t* codes = t.codes + out_row0 * spec.row_width;
        float* scales = t.scales + out_row0;
        // v1 rows were checked finite (CheckSection).
        size_t bad_row;
        if (!codec::QuantizeRows(v1_quantize_as, spec.dtype,
                                 buf->data() + row0 * spec.row_width * ElementSize(spec.dtype), rows,
                                 spec.row_width, codes, scales, &bad_row)) {
          const ChunkInfo& c = chunk_infos[ci];
          return Status::Corruption(SectionWhere(path, ci, c.offset, t.layer, spec) +
                                    ": non-finite value at token " +
                                    std::to_string(c.first_token + w.first + bad_row / spec.rows_per_token));
        }
        return Status::OK();
      });
}

Reader::Reader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Reader::~Reader() = default;

Status Reader::Open(const std::string& path, const ReaderOptions& options,
                    std::unique_ptr<Reader>* out) {
  FileSystem* fs = options.fs ? options.fs : FileSystem::Default();
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->fs = fs;
  KVFILE_RETURN_IF_ERROR(fs->Open(path, OpenMode::kRead, &impl->file));
  auto scan = std::make_shared<ScanResult>();
  Status st = internal::ScanSettledFile(*impl->file, scan.get());
  if (!st.ok()) return st.WithContext(path);
  impl->scan = std::move(scan);
  const FileHeader& h = impl->scan->header;
  if (options.expect_identity || options.expect_geometry) {
    ModelIdentity want_id = options.expect_identity.value_or(h.identity);
    Geometry want_g = options.expect_geometry.value_or(h.geometry);
    st = CheckExpected(h.identity, h.geometry, want_id, want_g);
    if (!st.ok()) return st.WithContext(path);
  }
  impl->layouts = std::make_unique<internal::LayoutCache>(&impl->scan->header.geometry);
  impl->chunk_infos.reserve(impl->scan->chunks.size());
  for (const auto& c : impl->scan->chunks) impl->chunk_infos.push_back(c.info);
  const CommitRecord& cr = impl->scan->commit;
  impl->commit = CommitInfo{cr.sequence, cr.epoch, cr.tokens, cr.end, cr.chunks};
  out->reset(new Reader(std::move(impl)));
  return Status::OK();
}

Status internal::ReaderAccess::Share(const Reader& r, std::unique_ptr<Reader>* out) {
  const Reader::Impl& from = *r.impl_;
  auto impl = std::make_unique<Reader::Impl>();
  impl->path = from.path;
  impl->fs = from.fs;
  std::vector<std::unique_ptr<File>> files;
  KVFILE_RETURN_IF_ERROR(internal::OpenWorkerFiles(*from.fs, from.path, *from.file, 1, "since it was opened", &files));
  impl->file = std::move(files[0]);
  impl->scan = from.scan;
  impl->layouts = std::make_unique<internal::LayoutCache>(&impl->scan->header.geometry);
  impl->chunk_infos = from.chunk_infos;
  impl->commit = from.commit;
  out->reset(new Reader(std::move(impl)));
  return Status::OK();
}

uint64_t internal::ReaderAccess::WorkerThreadsStarted(const Reader& r) { return r.impl_->workers.threads_started(); }

uint16_t Reader::major_version() const { return impl_->scan->header.major; }
uint16_t Reader::minor_version() const { return impl_->scan->header.minor; }
const Geometry& Reader::geometry() const { return impl_->g(); }
const ModelIdentity& Reader::identity() const { return impl_->scan->header.identity; }
uint64_t Reader::salt() const { return impl_->scan->header.salt; }
uint32_t Reader::nominal_chunk_tokens() const { return impl_->scan->header.chunk_tokens; }
uint32_t Reader::epoch() const { return impl_->scan->commit.epoch; }
uint64_t Reader::token_count() const { return impl_->scan->tokens.size(); }
std::span<const uint32_t> Reader::tokens() const { return impl_->scan->tokens; }
std::span<const ChunkInfo> Reader::chunks() const { return impl_->chunk_infos; }
const TailInfo& Reader::tail() const { return impl_->scan->tail; }
uint64_t Reader::required_flags() const { return impl_->scan->header.required_flags; }
uint64_t Reader::optional_flags() const { return impl_->scan->header.optional_flags; }
const CommitInfo& Reader::commit() const { return impl_->commit; }
int Reader::active_commit_slot() const { return impl_->scan->active_slot; }
const std::array<CommitSlotState, 2>& Reader::commit_slots() const { return impl_->scan->slots; }
const char* Reader::io_backend() const { return impl_->file->backend(); }
const std::string& Reader::path() const { return impl_->path; }

uint64_t Reader::LongestCommonPrefix(std::span<const uint32_t> prompt) const {
  const auto& t = impl_->scan->tokens;
  auto [a, b] = std::mismatch(t.begin(), t.end(), prompt.begin(), prompt.end());
  return static_cast<uint64_t>(a - t.begin());
}

Status Reader::ReadRows(uint32_t layer, uint32_t stream, uint64_t begin, uint64_t end,
                        Dtype out_dtype, void* dst) {
  Impl& r = *impl_;
  KVFILE_RETURN_IF_ERROR(r.CheckRange(layer, stream, begin, end));
  if (begin == end) return Status::OK();
  if (IsQuantized(out_dtype))
    return Status::InvalidArgument(r.path + ": decoded reads produce bf16, f16 or f32; use ReadCodes for codes");
  std::vector<Impl::Piece> pieces;
  KVFILE_RETURN_IF_ERROR(r.LoadSections(layer, stream, begin, end, &pieces));
  const StreamSpec& spec = r.g().streams[stream];
  auto* out = static_cast<uint8_t*>(dst);
  for (const Impl::Piece& p : pieces)
    out = DecodeSection(spec, p.section, r.scratch.data() + p.scratch_offset, p.first, p.count, out_dtype, out);
  return Status::OK();
}

template <typename PerChunk>
Status Reader::Impl::ForEachChunk(uint64_t begin, uint64_t end, unsigned threads, PerChunk&& per_chunk) {
  size_t first_chunk = FirstChunkFor(begin);
  size_t last_chunk = first_chunk;
  while (last_chunk < chunk_infos.size() && chunk_infos[last_chunk].first_token < end) ++last_chunk;
  threads = internal::WorkerCount(threads, last_chunk - first_chunk, kMaxReadThreads);

  // Each further worker reads through its own File, which must be the file
  // this reader opened; one opened by the process this one forked from
  // would share its io_uring ring.
  if (worker_files_pid != getpid()) {
    worker_files.clear();
    worker_files_pid = getpid();
  }
  if (worker_files.size() + 1 < threads) {
    const auto more = threads - 1 - static_cast<unsigned>(worker_files.size());
    KVFILE_RETURN_IF_ERROR(internal::OpenWorkerFiles(*fs, path, *file, more, "since it was opened", &worker_files));
  }
  if (worker_buffers.size() < threads) worker_buffers.resize(threads);
  while (worker_layouts.size() < threads) worker_layouts.emplace_back(&g());
  return workers.Run(first_chunk, last_chunk, threads, [&](unsigned w, size_t ci) {
    File& f = w == 0 ? *file : *worker_files[w - 1];
    return per_chunk(f, worker_layouts[w], ci, &worker_buffers[w]);
  });
}

Status Reader::ReadMany(std::span<const RowsTarget> targets, uint64_t begin, uint64_t end,
                        Dtype out_dtype, unsigned threads) {
  Impl& r = *impl_;
  // The range and dtype are checked even with no target: a bad argument is
  // a caller's bug whatever else the call asks for.
  KVFILE_RETURN_IF_ERROR(r.CheckTokenRange(begin, end));
  if (IsQuantized(out_dtype))
    return Status::InvalidArgument(r.path + ": decoded reads produce bf16, f16 or f32; use ReadCodes for codes");
  for (const RowsTarget& t : targets) {
    KVFILE_RETURN_IF_ERROR(r.CheckRange(t.layer, t.stream, begin, end));
    if (t.dst == nullptr) return Status::InvalidArgument(r.path + ": ReadMany target without a destination");
  }
  if (begin == end || targets.empty()) return Status::OK();
  Status st = r.ForEachChunk(begin, end, threads,
                             [&](File& f, internal::LayoutCache& layouts, size_t ci, internal::PageBuffer* buf) {
                               return r.ReadChunkTargets(f, layouts, ci, targets, begin, end, out_dtype, buf);
                             });
  if (!st.ok())
    for (const RowsTarget& t : targets)
      std::memset(t.dst, 0, (end - begin) * r.g().streams[t.stream].ElementsPerToken() * ElementSize(out_dtype));
  return st;
}

Status Reader::ReadManyCodes(std::span<const CodesTarget> targets, uint64_t begin, uint64_t end,
                             unsigned threads, Dtype v1_quantize_as) {
  Impl& r = *impl_;
  KVFILE_RETURN_IF_ERROR(r.CheckTokenRange(begin, end));
  const bool quantize = r.scan->header.major == kMajorV1;
  if (quantize && !IsFp8(v1_quantize_as))
    return Status::InvalidArgument(r.path + ": codes are e4m3 or e5m2, not " + DtypeName(v1_quantize_as));
  for (const CodesTarget& t : targets) {
    KVFILE_RETURN_IF_ERROR(r.CheckRange(t.layer, t.stream, begin, end));
    const StreamSpec& spec = r.g().streams[t.stream];
    if (!quantize && !IsQuantized(spec.dtype))
      return Status::InvalidArgument(r.path + ": stream '" + spec.name + "' is stored raw (" +
                                     DtypeName(spec.dtype) + "); read it with ReadMany");
    const Dtype codes_dtype = quantize ? v1_quantize_as : spec.dtype;
    if (!codec::HasEveryPart(codes_dtype, codec::PartsOut{t.codes, t.block_scales, t.scales}))
      return Status::InvalidArgument(r.path + ": ReadManyCodes target without a destination" +
                                     (IsNvfp4(spec.dtype) ? " (nvfp4 needs block_scales too)" : ""));
  }
  if (begin == end || targets.empty()) return Status::OK();
  Status st = r.ForEachChunk(begin, end, threads,
                             [&](File& f, internal::LayoutCache& layouts, size_t ci, internal::PageBuffer* buf) {
                               return r.ReadChunkCodes(f, layouts, ci, targets, begin, end, v1_quantize_as, buf);
                             });
  if (!st.ok())
    for (const CodesTarget& t : targets) {
      // The parts of the codes' dtype (a version 1 file's: v1_quantize_as).
      const StreamSpec& spec = r.g().streams[t.stream];
      const Dtype codes_dtype = quantize ? v1_quantize_as : spec.dtype;
      const CodecRows cr = CodecRowsOf(codes_dtype, spec.rows_per_token, spec.row_width);
      codec::ZeroParts(codes_dtype, (end - begin) * cr.per_token, cr.width, codec::PartsOut{t.codes, t.block_scales, t.scales});
    }
  return st;
}

Status Reader::ReadCodes(uint32_t layer, uint32_t stream, uint64_t begin, uint64_t end,
                         uint8_t* codes, float* scales, Dtype v1_quantize_as) {
  return impl_->ReadCodes(layer, stream, begin, end, codes, nullptr, scales, v1_quantize_as);
}

Status Reader::ReadCodes(uint32_t layer, uint32_t stream, uint64_t begin, uint64_t end, uint8_t* codes,
                         uint8_t* block_scales, float* row_scales) {
  return impl_->ReadCodes(layer, stream, begin, end, codes, block_scales, row_scales, Dtype::kNvfp4);
}

Status Reader::ReadParts(uint32_t layer, uint32_t stream, uint64_t begin, uint64_t end, const Parts& out) {
  const Geometry& g = impl_->g();
  const DtypeInfo* info = stream < g.streams.size() ? FindDtype(g.streams[stream].dtype) : nullptr;
  const bool blocks = info != nullptr && info->block_elements != 0 && major_version() > 1;
  return impl_->ReadCodes(layer, stream, begin, end, out.codes, blocks ? out.block_scales : nullptr, out.scales,
                          blocks ? Dtype::kNvfp4 : Dtype::kE4M3);
}

// Both ReadCodes and ReadParts: block_scales non-null (with v1_quantize_as
// kNvfp4) for a dtype with block scales.
Status Reader::Impl::ReadCodes(uint32_t layer, uint32_t stream, uint64_t begin, uint64_t end, uint8_t* codes,
                               uint8_t* block_scales, float* scales, Dtype v1_quantize_as) {
  Impl& r = *this;
  KVFILE_RETURN_IF_ERROR(r.CheckRange(layer, stream, begin, end));
  const StreamSpec& spec = r.g().streams[stream];
  bool quantize = r.scan->header.major == kMajorV1;
  const bool nvfp4_read = v1_quantize_as == Dtype::kNvfp4;
  if (quantize && !IsFp8(v1_quantize_as))
    return Status::InvalidArgument(r.path + ": codes are e4m3 or e5m2, not " + DtypeName(v1_quantize_as));
  KVFILE_RETURN_IF_ERROR(CodesReadable(r.path, spec, quantize, nvfp4_read, "ReadRows"));
  if (nvfp4_read && begin < end && (codes == nullptr || block_scales == nullptr || scales == nullptr))
    return Status::InvalidArgument(r.path + ": ReadCodes without a destination");
  std::vector<Impl::Piece> pieces;
  KVFILE_RETURN_IF_ERROR(r.LoadSections(layer, stream, begin, end, &pieces));
  uint64_t out_token = 0;
  for (const Impl::Piece& p : pieces) {
    const uint8_t* buf = r.scratch.data() + p.scratch_offset;
    if (quantize) {
      uint64_t row0 = uint64_t{p.first} * spec.rows_per_token;
      uint64_t rows = uint64_t{p.count} * spec.rows_per_token;
      uint64_t out_row0 = out_token * spec.rows_per_token;
      // v1 rows were finite when written (the writer refuses non-finite
      // rows), but a file is input: a non-finite row is reported.
      size_t bad_row;
      if (!codec::QuantizeRows(v1_quantize_as, spec.dtype, buf + row0 * spec.row_width * ElementSize(spec.dtype),
                               rows, spec.row_width, codes + out_row0 * spec.row_width, scales + out_row0, &bad_row))
        return Status::Corruption(r.path + ": layer " + std::to_string(layer) + " stream '" + spec.name +
                                  "': non-finite value at token " +
                                  std::to_string(r.chunk_infos[p.chunk].first_token + p.first +
                                                 bad_row / spec.rows_per_token));
    } else {
      CopyCodes(spec, p.section, buf, p.first, p.count, out_token, codes, block_scales, scales);
    }
    out_token += p.count;
  }
  return Status::OK();
}

Status Reader::VerifyChunk(size_t index) {
  Impl& r = *impl_;
  if (index >= r.scan->chunks.size())
    return Status::InvalidArgument(r.path + ": chunk " + std::to_string(index) + " out of range");
  const auto& c = r.scan->chunks[index];
  std::string where = r.path + ": " + internal::ChunkWhere(index, c.info.offset);
  Status st = internal::ReadAndCheckChunk(*r.file, r.g(), *r.layouts, c, r.scan->SectionChecksums(index), &r.scratch);
  if (st.ok()) return st;
  return internal::ExplainReadFailure(*r.file, *r.scan, c.info.offset + c.info.bytes, r.path, st.WithContext(where));
}

}  // namespace kvfile
