// SPDX-License-Identifier: Apache-2.0
// PackWriter: builds a .kvpack (spec/PACK.md) under a temporary name, storing
// each distinct chunk once, and renames it into place when finished.
#include <algorithm>
#include <bit>
#include <cstring>
#include <map>
#include <thread>
#include <tuple>

#include "io/atomic_replace.h"
#include "reader/reader_access.h"
#include "writer/write_behind.h"
#include "format/endian.h"
#include "format/chunk_layout.h"
#include "format/kv_format.h"
#include "kvfile/codec.h"
#include "kvfile/pack.h"
#include "pack/pack_format.h"

namespace kvfile {

using format::StoreU32;
using format::StoreU64;
using format::Checksum;

namespace {
// The (offset, bytes) fields of one part of a payload section.
std::pair<uint64_t*, uint64_t*> PayloadPart(PayloadSection& p, DtypePart part) {
  switch (part) {
    case DtypePart::kCodes: return {&p.data_offset, &p.data_bytes};
    case DtypePart::kBlockScales: return {&p.block_scales_offset, &p.block_scales_bytes};
    case DtypePart::kRowScales: return {&p.scales_offset, &p.scales_bytes};
  }
  return {&p.data_offset, &p.data_bytes};
}
}  // namespace

std::vector<PayloadSection> PackPayloadLayout(const Geometry& g, uint32_t tokens) {
  std::vector<PayloadSection> out;
  out.reserve(g.SectionCount());
  uint64_t at = 0;
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t si = 0; si < g.streams.size(); ++si) {
      if (!g.InLayer(l, si)) continue;
      const StreamSpec& s = g.streams[si];
      PayloadSection p;
      p.layer = l;
      p.stream = si;
      // The section's parts in the order of a .kv section (spec/PACK.md 4),
      // unpadded: those of the dtype's table, each at its offset, those it
      // does not store with 0 bytes where they would be.
      const CodecRows cr = format::CodecRowsOf(s);
      const uint64_t rows = uint64_t{tokens} * cr.per_token;
      for (DtypePart part : {DtypePart::kCodes, DtypePart::kBlockScales, DtypePart::kRowScales}) {
        const uint64_t bytes = PartBytes(s.dtype, part, rows, cr.width);
        auto [offset, size] = PayloadPart(p, part);
        *offset = at;
        *size = bytes;
        at += bytes;
      }
      out.push_back(p);
    }
  return out;
}

bool IsValidPackMemberName(std::string_view name) {
  if (name.empty() || name.size() > pack::kMaxNameBytes || name.front() == '/') return false;
  if (name.find('\0') != std::string_view::npos) return false;
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == std::string_view::npos) end = name.size();
    std::string_view comp = name.substr(start, end - start);
    if (comp.empty() || comp == "." || comp == ".." || comp.size() > pack::kMaxNameComponentBytes) return false;
    start = end + 1;
  }
  return true;
}

struct KVFILE_NO_EXPORT PackWriter::Impl {
  FileSystem* fs = nullptr;
  PackWriterOptions options;
  std::unique_ptr<internal::PendingReplace> replace;
  std::unique_ptr<File> file;
  uint64_t offset = pack::kHeaderBytes;
  bool failed = false;
  bool finished = false;
  std::vector<PackModel> models;
  std::vector<PackChunk> chunks;
  std::vector<PackMember> members;
  // (model, first_token, token_count, chain, payload checksum) -> chunk id
  std::map<std::tuple<uint32_t, uint64_t, uint32_t, uint64_t, uint64_t>, uint32_t> index;
  PackWriteStats stats;
  std::vector<uint8_t> payload;
  // Per reading thread: aligned staging for one section read, and rows
  // decoded for requantizing.
  struct Buffers {
    std::vector<uint64_t> scratch;
    std::vector<float> f32;
  };
  std::vector<Buffers> buffers{1};
  // AddFile with options.threads > 1: more readers of the same open file,
  // one per further thread (a Reader is used by one thread at a time), all
  // with the committed state the first one took (ReaderAccess::Share).
  std::vector<std::unique_ptr<Reader>> more_readers;

  Status Write(const void* data, size_t n) {
    if (n == 0) return Status::OK();  // an empty member's record: nothing to write (data may be null)
    Status st = file->WriteAt(offset, data, n);
    if (!st.ok()) {
      failed = true;
      return st;
    }
    offset += n;
    // Every 8 MiB written, the kernel starts writing them to the disk while
    // the next chunks are read (write_behind.h); the sync at Finish stays.
    hinted = std::min(hinted, offset - n);  // a refused member's bytes are written over
    if (offset - hinted >= (uint64_t{8} << 20)) {
      write_behind.Start(*file, replace->temp_path(), hinted, offset - hinted);
      hinted = offset;
    }
    return Status::OK();
  }
  uint64_t hinted = pack::kHeaderBytes;  // bytes before this have had their writeback hint
  internal::WriteBehind write_behind;
  Status ModelFor(const Reader& r, uint32_t* model);
  Geometry StoredGeometry(const Reader& r) const;
  Status FillPayload(Reader& r, const PackModel& m, uint64_t begin, uint32_t tokens);
  Status FillSections(Reader& r, const PackModel& m, const std::vector<PayloadSection>& layout, uint64_t begin,
                      uint64_t end, size_t first, size_t step, Buffers& b);
};

PackWriter::PackWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PackWriter::~PackWriter() {
  if (impl_->file) impl_->file.reset();
  // The PendingReplace removes the temporary file unless committed.
}

const PackWriteStats& PackWriter::stats() const { return impl_->stats; }

Status PackWriter::Begin(const std::string& dest, const PackWriterOptions& options,
                         std::unique_ptr<PackWriter>* out) {
  if (options.chunk_tokens < 1 || options.chunk_tokens > pack::kMaxChunkTokens)
    return Status::InvalidArgument(dest + ": pack chunk tokens must be in 1..65536");
  auto impl = std::make_unique<Impl>();
  impl->fs = options.fs ? options.fs : FileSystem::Default();
  impl->options = options;
  KVFILE_RETURN_IF_ERROR(internal::PendingReplace::Begin(dest, impl->fs, &impl->replace));
  KVFILE_RETURN_IF_ERROR(impl->fs->Open(impl->replace->temp_path(), OpenMode::kCreateExclusive, &impl->file));
  out->reset(new PackWriter(std::move(impl)));
  return Status::OK();
}

// The geometry a member is stored with: the source's, with options.dtype
// applied as `kvfile convert --dtype` applies it.
Geometry PackWriter::Impl::StoredGeometry(const Reader& r) const {
  Geometry g = r.geometry();
  if (!options.dtype) return g;
  const Dtype to = *options.dtype;
  for (StreamSpec& s : g.streams)
    if (!IsQuantized(to) || IsQuantized(s.dtype) || r.major_version() == 1) s.dtype = to;
  return g;
}

Status PackWriter::Impl::ModelFor(const Reader& r, uint32_t* model) {
  for (size_t i = 0; i < models.size(); ++i)
    if (models[i].identity == r.identity() && models[i].geometry == StoredGeometry(r)) {
      *model = static_cast<uint32_t>(i);
      return Status::OK();
    }
  if (models.size() >= pack::kMaxEntries) return Status::InvalidArgument("too many models in one pack");
  PackModel m;
  m.identity = r.identity();
  m.geometry = StoredGeometry(r);
  // A requantized geometry can break a rule the source's kept (nvfp4 needs
  // rows x width a multiple of 16), as it does for convert --dtype.
  if (options.dtype) KVFILE_RETURN_IF_ERROR(m.geometry.Validate().WithContext(r.path()));
  m.payload_bytes_per_token = pack::PayloadBytesPerToken(m.geometry);
  if (m.payload_bytes_per_token > pack::kMaxChunkPayload)
    return Status::Unsupported(r.path() + ": one token's rows exceed the 1 GiB limit of a pack chunk");
  m.chunk_tokens = static_cast<uint32_t>(
      std::min<uint64_t>(options.chunk_tokens, pack::kMaxChunkPayload / m.payload_bytes_per_token));
  *model = static_cast<uint32_t>(models.size());
  models.push_back(std::move(m));
  return Status::OK();
}

// Reads tokens [begin, begin + tokens) of every (layer, stream) into
// `payload`, laid out as spec/PACK.md section 4 says. With more readers,
// thread t fills sections t, t + T, t + 2T, ... (T threads): the payload,
// and so the pack, is the same bytes for any T.
Status PackWriter::Impl::FillPayload(Reader& r, const PackModel& m, uint64_t begin, uint32_t tokens) {
  payload.resize(m.payload_bytes_per_token * tokens);
  std::vector<PayloadSection> layout = PackPayloadLayout(m.geometry, tokens);
  const size_t threads = 1 + more_readers.size();
  buffers.resize(threads);
  if (threads == 1) return FillSections(r, m, layout, begin, begin + tokens, 0, 1, buffers[0]);
  std::vector<Status> status(threads);
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t)
    pool.emplace_back([&, t] {
      status[t] = FillSections(*more_readers[t - 1], m, layout, begin, begin + tokens, t, threads, buffers[t]);
    });
  status[0] = FillSections(r, m, layout, begin, begin + tokens, 0, threads, buffers[0]);
  for (std::thread& t : pool) t.join();
  for (const Status& st : status) KVFILE_RETURN_IF_ERROR(st);
  return Status::OK();
}

// Sections first, first + step, ... of the payload (index layer * streams + stream).
Status PackWriter::Impl::FillSections(Reader& r, const PackModel& m, const std::vector<PayloadSection>& layout,
                                      uint64_t begin, uint64_t end, size_t first, size_t step, Buffers& b) {
  const Geometry& g = m.geometry;
  std::vector<uint64_t>& scratch = b.scratch;
  std::vector<float>& f32 = b.f32;
  for (size_t k = first; k < layout.size(); k += step) {
      const PayloadSection& p = layout[k];
      const uint32_t l = p.layer, s = p.stream;
      const StreamSpec& spec = g.streams[s];
      const Dtype from = r.geometry().streams[s].dtype;
      if (IsQuantized(spec.dtype)) {
        scratch.resize((p.scales_bytes + 7) / 8);
        float* scales = reinterpret_cast<float*>(scratch.data());
        uint8_t* codes = payload.data() + p.data_offset;
        uint8_t* block_scales = payload.data() + p.block_scales_offset;  // nvfp4: one byte each, any alignment
        if (from == spec.dtype) {
          KVFILE_RETURN_IF_ERROR(r.ReadParts(l, s, begin, end, {codes, block_scales, scales}));
        } else {
          // Requantized: decoded to f32, then quantized as a writer quantizes
          // f32 rows (nvfp4: one row of rows x width per token).
          const uint64_t rows = p.scales_bytes / 4, width = format::CodecRowsOf(spec).width;
          f32.resize(rows * width);
          KVFILE_RETURN_IF_ERROR(r.ReadRows(l, s, begin, end, Dtype::kF32, f32.data()));
          size_t bad = 0;
          if (!codec::CodecOf(spec.dtype)->encode(spec.dtype, Dtype::kF32, f32.data(), rows, width,
                                                  codec::PartsOut{codes, block_scales, scales}, &bad))
            return Status::NonFinite(r.path() + ": layer " + std::to_string(l) + " stream '" + spec.name +
                                     "': a non-finite value in row " + std::to_string(bad));
        }
        std::memcpy(payload.data() + p.scales_offset, scales, p.scales_bytes);
        if constexpr (std::endian::native == std::endian::big)
          for (uint64_t i = 0; i < p.scales_bytes; i += 4)
            std::reverse(payload.data() + p.scales_offset + i, payload.data() + p.scales_offset + i + 4);
      } else {
        scratch.resize((p.data_bytes + 7) / 8);
        KVFILE_RETURN_IF_ERROR(r.ReadRows(l, s, begin, end, spec.dtype, scratch.data()));
        std::memcpy(payload.data() + p.data_offset, scratch.data(), p.data_bytes);
      }
    }
  return Status::OK();
}

Status PackWriter::AddFile(const std::string& name, const std::string& kv_path) {
  ReaderOptions ro;
  ro.fs = impl_->fs;
  std::unique_ptr<Reader> r;
  KVFILE_RETURN_IF_ERROR(Reader::Open(kv_path, ro, &r));
  // Every further thread reads the state this open took: no second scan,
  // so a file appended to meanwhile gives the same member for any number
  // of threads, and one renamed over the path is refused.
  struct Release {
    std::vector<std::unique_ptr<Reader>>& readers;
    ~Release() { readers.clear(); }
  } release{impl_->more_readers};
  impl_->more_readers.clear();
  for (unsigned t = 1; t < impl_->options.threads; ++t) {
    std::unique_ptr<Reader> more;
    KVFILE_RETURN_IF_ERROR(internal::ReaderAccess::Share(*r, &more));
    impl_->more_readers.push_back(std::move(more));
  }
  return Add(name, *r);
}

Status PackWriter::Add(const std::string& name, Reader& r) {
  Impl& w = *impl_;
  const uint64_t offset = w.offset;
  const size_t chunks = w.chunks.size(), models = w.models.size();
  const PackWriteStats stats = w.stats;
  Status st = AddMember(name, r);
  if (!st.ok() && !w.failed) {
    // A refused member leaves no trace: its new chunks are dropped and
    // their bytes are overwritten or cut off by Finish.
    for (size_t i = chunks; i < w.chunks.size(); ++i) {
      const PackChunk& c = w.chunks[i];
      w.index.erase(std::make_tuple(c.model, c.first_token, c.token_count, c.chain_hash, c.payload_checksum));
    }
    w.chunks.resize(chunks);
    w.models.resize(models);
    w.offset = offset;
    w.stats = stats;
  }
  return st;
}

Status PackWriter::AddMember(const std::string& name, Reader& r) {
  Impl& w = *impl_;
  if (w.failed || w.finished) return Status::Failed(w.replace->target() + ": the pack writer failed or finished earlier");
  if (!IsValidPackMemberName(name))
    return Status::InvalidArgument(r.path() + ": member name '" + name +
                                   "' is not a relative path (1..4096 bytes, no empty, '.' or '..' component, "
                                   "none over 255 bytes)");
  if (r.tail().committed_data_missing)
    return Status::Corruption(r.path() + ": the file ends inside its committed data; repair it before packing");
  if (w.members.size() >= pack::kMaxEntries - 1) return Status::InvalidArgument("too many members in one pack");
  uint32_t model = 0;
  KVFILE_RETURN_IF_ERROR(w.ModelFor(r, &model));
  const PackModel& m = w.models[model];
  std::span<const uint32_t> tokens = r.tokens();
  const uint64_t n = tokens.size();
  const uint64_t c = m.chunk_tokens;
  std::vector<uint32_t> ids;
  ids.reserve((n + c - 1) / c);
  uint64_t chain = 0;
  for (uint64_t begin = 0; begin < n; begin += c) {
    uint32_t t = static_cast<uint32_t>(std::min(c, n - begin));
    chain = pack::ChainHash(chain, tokens.subspan(begin, t));
    KVFILE_RETURN_IF_ERROR(w.FillPayload(r, m, begin, t));
    uint64_t sum = Checksum(w.payload.data(), w.payload.size());
    auto key = std::make_tuple(model, begin, t, chain, sum);
    auto it = w.index.find(key);
    uint32_t id;
    if (it != w.index.end()) {
      id = it->second;
    } else {
      if (w.chunks.size() >= pack::kMaxEntries - 1) return Status::InvalidArgument("too many chunks in one pack");
      id = static_cast<uint32_t>(w.chunks.size());
      PackChunk ck{w.offset, w.payload.size(), begin, t, model, chain, sum};
      KVFILE_RETURN_IF_ERROR(w.Write(w.payload.data(), w.payload.size()));
      w.chunks.push_back(ck);
      w.index.emplace(key, id);
      w.stats.chunks_stored++;
      w.stats.payload_bytes_stored += w.payload.size();
    }
    ids.push_back(id);
    w.stats.chunks_referenced++;
    w.stats.payload_bytes_referenced += w.payload.size();
  }
  // The member record: token ids, then chunk ids.
  std::vector<uint8_t> record(4 * (n + ids.size()));
  for (uint64_t i = 0; i < n; ++i) StoreU32(record.data() + 4 * i, tokens[i]);
  for (size_t j = 0; j < ids.size(); ++j) StoreU32(record.data() + 4 * (n + j), ids[j]);
  PackMember mem;
  mem.name = name;
  mem.model = model;
  mem.token_count = n;
  mem.record_offset = w.offset;
  mem.record_checksum = Checksum(record.data(), record.size());
  mem.source_chunk_tokens = std::clamp<uint32_t>(r.nominal_chunk_tokens(), 1, pack::kMaxChunkTokens);
  mem.source_major = r.major_version();
  mem.source_minor = r.minor_version();
  mem.chunk_count = ids.size();
  KVFILE_RETURN_IF_ERROR(w.Write(record.data(), record.size()));
  w.members.push_back(std::move(mem));
  w.stats.members++;
  w.stats.tokens += n;
  return Status::OK();
}

Status PackWriter::Finish() {
  Impl& w = *impl_;
  const std::string& dest = w.replace->target();
  if (w.failed || w.finished) return Status::Failed(dest + ": the pack writer failed or finished earlier");
  std::sort(w.members.begin(), w.members.end(),
            [](const PackMember& a, const PackMember& b) { return a.name < b.name; });
  std::vector<std::string_view> member_names;
  member_names.reserve(w.members.size());
  for (const PackMember& m : w.members) member_names.push_back(m.name);
  std::string conflict = pack::NameSetConflict(std::move(member_names));
  if (!conflict.empty()) return Status::InvalidArgument(dest + ": " + conflict + "; not written");
  const uint64_t data_end = w.offset;
  // Layer sets (pack 1.1) only where a model has a stream absent from a layer.
  // nvfp4 streams (pack 1.2) only where a model has one.
  bool layer_sets = false, nvfp4 = false;
  for (const PackModel& m : w.models) {
    layer_sets = layer_sets || m.geometry.HasLayerSets();
    nvfp4 = nvfp4 || pack::HasNvfp4(m.geometry);
  }
  const size_t entry_bytes = pack::ModelEntryBytes(layer_sets);
  std::vector<uint8_t> models(w.models.size() * entry_bytes);
  for (size_t i = 0; i < w.models.size(); ++i) pack::EncodeModel(w.models[i], models.data() + i * entry_bytes, layer_sets);
  std::vector<uint8_t> chunks(w.chunks.size() * pack::kChunkEntryBytes, 0);
  for (size_t i = 0; i < w.chunks.size(); ++i) {
    uint8_t* e = chunks.data() + i * pack::kChunkEntryBytes;
    const PackChunk& c = w.chunks[i];
    StoreU64(e + pack::ce::kOffset, c.offset);
    StoreU64(e + pack::ce::kFirstToken, c.first_token);
    StoreU32(e + pack::ce::kTokenCount, c.token_count);
    StoreU32(e + pack::ce::kModel, c.model);
    StoreU64(e + pack::ce::kChainHash, c.chain_hash);
    StoreU64(e + pack::ce::kPayloadChecksum, c.payload_checksum);
  }
  std::string names;
  std::vector<uint8_t> index(w.members.size() * pack::kIndexEntryBytes, 0);
  for (size_t i = 0; i < w.members.size(); ++i) {
    uint8_t* e = index.data() + i * pack::kIndexEntryBytes;
    const PackMember& m = w.members[i];
    StoreU64(e + pack::ie::kNameOffset, names.size());
    StoreU32(e + pack::ie::kNameLength, static_cast<uint32_t>(m.name.size()));
    StoreU32(e + pack::ie::kModel, m.model);
    StoreU64(e + pack::ie::kTokenCount, m.token_count);
    StoreU64(e + pack::ie::kRecordOffset, m.record_offset);
    StoreU64(e + pack::ie::kRecordChecksum, m.record_checksum);
    StoreU32(e + pack::ie::kSourceChunkTokens, m.source_chunk_tokens);
    StoreU32(e + pack::ie::kSourceVersion, uint32_t{m.source_major} << 16 | m.source_minor);
    names += m.name;
  }
  auto bytes = [](const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); };
  KVFILE_RETURN_IF_ERROR(w.Write(models.data(), models.size()));
  KVFILE_RETURN_IF_ERROR(w.Write(chunks.data(), chunks.size()));
  KVFILE_RETURN_IF_ERROR(w.Write(names.data(), names.size()));
  KVFILE_RETURN_IF_ERROR(w.Write(index.data(), index.size()));
  uint8_t h[pack::kHeaderBytes];
  format::EncodeFrame(pack::kFrame,
                      {pack::kMajor, nvfp4 ? pack::kMinorNvfp4 : layer_sets ? pack::kMinorLayerSets : pack::kMinor,
                       (layer_sets ? pack::kFlagLayerSets : 0) | (nvfp4 ? pack::kFlagNvfp4 : 0), 0},
                      h);
  StoreU64(h + pack::hdr::kDataEnd, data_end);
  StoreU64(h + pack::hdr::kModelCount, w.models.size());
  StoreU64(h + pack::hdr::kChunkCount, w.chunks.size());
  StoreU64(h + pack::hdr::kMemberCount, w.members.size());
  StoreU64(h + pack::hdr::kNamesBytes, names.size());
  StoreU64(h + pack::hdr::kModelsChecksum, Checksum(models.data(), models.size()));
  StoreU64(h + pack::hdr::kChunksChecksum, Checksum(chunks.data(), chunks.size()));
  StoreU64(h + pack::hdr::kNamesChecksum, Checksum(bytes(names), names.size()));
  StoreU64(h + pack::hdr::kIndexChecksum, Checksum(index.data(), index.size()));
  StoreU64(h + pack::hdr::kFileBytes, w.offset);
  format::SealRecord(h);
  Status st = w.file->WriteAt(0, h, sizeof h);
  if (st.ok()) st = w.file->Truncate(w.offset);  // bytes of a refused member past the end
  if (st.ok()) st = w.file->Sync();
  if (!st.ok()) {
    w.failed = true;
    return st;
  }
  w.file.reset();
  st = w.replace->Commit();
  if (!st.ok()) {
    w.failed = true;
    return st;
  }
  w.finished = true;
  w.stats.file_bytes = w.offset;
  return Status::OK();
}

}  // namespace kvfile
