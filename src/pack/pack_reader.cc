// SPDX-License-Identifier: Apache-2.0
// PackReader: opens a .kvpack (spec/PACK.md), checks its tables, reads
// members and chunks (checked before they are returned), materialises
// members as .kv files and verifies the whole pack.
#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <tuple>

#include "io/atomic_replace.h"
#include "io/checked_read.h"
#include "codec/dtype_codec.h"
#include "codec/row_check.h"
#include "writer/direct_chunk.h"
#include "format/chunk_layout.h"
#include "format/endian.h"
#include "format/header.h"
#include "io/page_buffer.h"
#include "kvfile/pack.h"
#include "kvfile/writer.h"
#include "pack/pack_format.h"

namespace kvfile {

using format::LoadU16;
using format::LoadU32;
using format::LoadU64;
using format::Checksum;

namespace {
// The alignment rows of a dtype need in memory: a raw element's size; codes
// (fp8, packed nvfp4) are bytes.
size_t RowAlignment(Dtype d) { return IsQuantized(d) ? 1 : ElementSize(d); }
}  // namespace

struct KVFILE_NO_EXPORT PackReader::Impl {
  std::string path;
  FileSystem* fs = nullptr;
  std::unique_ptr<File> file;
  uint64_t file_bytes = 0;
  uint64_t data_end = 0;
  std::vector<PackModel> models;
  std::vector<PackChunk> chunks;
  std::vector<PackMember> members;

  Status Damage(const std::string& what) const { return Status::Corruption(path + ": " + what); }
  // Memory for a region only once its checksum holds (internal::ReadChecked).
  Status ReadRegion(uint64_t offset, uint64_t n, uint64_t want_checksum, const char* what,
                    std::vector<uint8_t>* out) {
    bool match = false;
    KVFILE_RETURN_IF_ERROR(internal::ReadChecked(*file, offset, n, want_checksum, out, &match));
    if (!match) return Damage(std::string(what) + " checksum mismatch (at offset " + std::to_string(offset) + ")");
    return Status::OK();
  }
  // Reads chunk `id`'s payload into `into` (c.bytes) and checks its checksum.
  Status ReadPayload(uint32_t id, uint8_t* into) {
    const PackChunk& c = chunks[id];
    KVFILE_RETURN_IF_ERROR(file->ReadAt(c.offset, into, c.bytes));
    if (!format::ChecksumMatches(c.payload_checksum, Checksum(into, c.bytes)))
      return Damage("chunk " + std::to_string(id) + ": payload checksum mismatch (at offset " +
                    std::to_string(c.offset) + ")");
    return Status::OK();
  }
  // A chunk whose payload checksum holds but whose rows the row check
  // refuses.
  Status RowDamage(uint32_t id, uint32_t layer, const StreamSpec& spec, codec::RowFault fault) const {
    return Damage("chunk " + std::to_string(id) + " layer " + std::to_string(layer) + " stream '" + spec.name +
                  "': " + codec::RowFaultText(fault));
  }
  // Unpack's direct path: where the .kv chunk size is a multiple of the
  // pack's and the pieces it reads are large (UseDirectPath).
  bool UseDirectPath(const PackMember& m, uint32_t ct) const;
  Status MaterializeDirect(PackReader& self, const PackMember& m, std::span<const uint32_t> tokens,
                           std::span<const uint32_t> ids, uint32_t ct, Writer& w);
  Status ParseTables(const uint8_t* h);
  Status CheckTiling() const;
  Status CheckNameSet() const;
};

PackReader::PackReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PackReader::~PackReader() = default;
const std::string& PackReader::path() const { return impl_->path; }
uint64_t PackReader::file_bytes() const { return impl_->file_bytes; }
std::span<const PackModel> PackReader::models() const { return impl_->models; }
std::span<const PackChunk> PackReader::chunks() const { return impl_->chunks; }
std::span<const PackMember> PackReader::members() const { return impl_->members; }

std::optional<size_t> PackReader::Find(std::string_view name) const {
  const auto& m = impl_->members;
  auto it = std::lower_bound(m.begin(), m.end(), name,
                             [](const PackMember& a, std::string_view b) { return a.name < b; });
  if (it == m.end() || it->name != name) return std::nullopt;
  return static_cast<size_t>(it - m.begin());
}

Status PackReader::Open(const std::string& path, FileSystem* fs, std::unique_ptr<PackReader>* out) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->fs = fs ? fs : FileSystem::Default();
  KVFILE_RETURN_IF_ERROR(impl->fs->Open(path, OpenMode::kRead, &impl->file));
  KVFILE_RETURN_IF_ERROR(impl->file->Size(&impl->file_bytes));
  uint8_t h[pack::kHeaderBytes];
  if (impl->file_bytes < sizeof h) {
    uint8_t m[8] = {};
    size_t n = std::min<uint64_t>(impl->file_bytes, 8);
    if (n) KVFILE_RETURN_IF_ERROR(impl->file->ReadAt(0, m, n));
    if (n < 8 || std::memcmp(m, pack::kMagic, 8) != 0) return impl->Damage("not a kvfile pack (bad magic)");
    return impl->Damage("truncated: " + std::to_string(impl->file_bytes) + " bytes, shorter than the 128-byte header");
  }
  KVFILE_RETURN_IF_ERROR(impl->file->ReadAt(0, h, sizeof h));
  KVFILE_RETURN_IF_ERROR(impl->ParseTables(h));
  out->reset(new PackReader(std::move(impl)));
  return Status::OK();
}

Status PackReader::Impl::ParseTables(const uint8_t* h) {
  namespace H = pack::hdr;
  const format::FrameCheck frame = format::ParseFrame(pack::kFrame, {h, pack::kHeaderBytes});
  switch (frame.fault) {
    case format::FrameFault::kNone:
      break;
    case format::FrameFault::kMagic:
      return Damage("not a kvfile pack (bad magic)");
    case format::FrameFault::kMajor:
      return Status::Unsupported(path + ": pack format version " + std::to_string(frame.fields.major) +
                                 " is not supported (this build reads 1)");
    case format::FrameFault::kChecksum:
      return Damage("pack header checksum mismatch");
    case format::FrameFault::kHeaderBytes:
      return Damage("header_bytes is not 128");
    case format::FrameFault::kRequiredFlags:
      return Status::Unsupported(path + ": the pack needs features this build lacks (required flags " +
                                 std::to_string(frame.fields.required_flags) + ")");
    case format::FrameFault::kReserved:
      return Damage("nonzero reserved header bytes");
  }
  const uint64_t required = frame.fields.required_flags;
  data_end = LoadU64(h + H::kDataEnd);
  uint64_t model_count = LoadU64(h + H::kModelCount), chunk_count = LoadU64(h + H::kChunkCount);
  uint64_t member_count = LoadU64(h + H::kMemberCount), names_bytes = LoadU64(h + H::kNamesBytes);
  uint64_t stated = LoadU64(h + H::kFileBytes);
  if (stated != file_bytes)
    return Damage("the file is " + std::to_string(file_bytes) + " bytes, the header says " + std::to_string(stated) +
                  (file_bytes < stated ? " (truncated)" : ""));
  if (model_count >= pack::kMaxEntries || chunk_count >= pack::kMaxEntries || member_count >= pack::kMaxEntries)
    return Damage("table count out of range");
  // Each region must fit in what remains of the file; subtracting keeps it overflow-free.
  uint64_t left = file_bytes;
  auto take = [&left](uint64_t count, uint64_t size, uint64_t* bytes) {
    if (count > left / size) return false;
    *bytes = count * size;
    left -= *bytes;
    return true;
  };
  uint64_t models_b = 0, chunks_b = 0, index_b = 0, names_b = 0;
  if (data_end < pack::kHeaderBytes || data_end > left) return Damage("data_end out of range");
  left -= data_end;
  const bool layer_sets = (required & pack::kFlagLayerSets) != 0;
  const size_t entry_bytes = pack::ModelEntryBytes(layer_sets);
  if (!take(model_count, entry_bytes, &models_b) || !take(chunk_count, pack::kChunkEntryBytes, &chunks_b) ||
      !take(names_bytes, 1, &names_b) || !take(member_count, pack::kIndexEntryBytes, &index_b) || left != 0)
    return Damage("the header's table sizes do not add up to the file's size");
  // Every name is 1..kMaxNameBytes bytes and the region holds exactly the
  // names (spec/PACK.md 5): its size is bounded by the member count.
  if (names_bytes > member_count * pack::kMaxNameBytes)
    return Damage("the names region is " + std::to_string(names_bytes) + " bytes, more than " +
                  std::to_string(member_count) + " names of at most " + std::to_string(pack::kMaxNameBytes) +
                  " bytes hold");
  std::vector<uint8_t> mt, ct, nm, it;
  uint64_t at = data_end;
  KVFILE_RETURN_IF_ERROR(ReadRegion(at, models_b, LoadU64(h + H::kModelsChecksum), "model table", &mt));
  at += models_b;
  KVFILE_RETURN_IF_ERROR(ReadRegion(at, chunks_b, LoadU64(h + H::kChunksChecksum), "chunk table", &ct));
  at += chunks_b;
  KVFILE_RETURN_IF_ERROR(ReadRegion(at, names_b, LoadU64(h + H::kNamesChecksum), "names", &nm));
  at += names_b;
  KVFILE_RETURN_IF_ERROR(ReadRegion(at, index_b, LoadU64(h + H::kIndexChecksum), "member index", &it));

  // Two models may not be the same (every byte but chunk_tokens equal).
  // Sorted by those bytes, then by index, equal entries are neighbours: the
  // first duplicate, in table order, is the later of the neighbouring pair
  // with the smallest later index, O(n log n) where comparing each entry
  // with every earlier one took 15 s for 24,000 models.
  std::vector<uint32_t> order(model_count);
  for (uint64_t i = 0; i < model_count; ++i) order[i] = static_cast<uint32_t>(i);
  auto entry = [&mt, entry_bytes](uint32_t i) { return mt.data() + uint64_t{i} * entry_bytes; };
  auto compare = [&entry, entry_bytes](uint32_t a, uint32_t b) {
    int c = std::memcmp(entry(a), entry(b), pack::me::kChunkTokens);
    if (c == 0) c = std::memcmp(entry(a) + pack::me::kModelIdLength, entry(b) + pack::me::kModelIdLength,
                                entry_bytes - pack::me::kModelIdLength);
    return c;
  };
  std::sort(order.begin(), order.end(), [&compare](uint32_t a, uint32_t b) {
    int c = compare(a, b);
    return c != 0 ? c < 0 : a < b;
  });
  uint64_t duplicate = model_count, original = 0;
  for (uint64_t k = 1; k < model_count; ++k)
    if (order[k] < duplicate && compare(order[k - 1], order[k]) == 0) duplicate = order[k], original = order[k - 1];
  models.resize(model_count);
  bool nvfp4 = false;
  for (uint64_t i = 0; i < model_count; ++i) {
    Status st = pack::DecodeModel(entry(static_cast<uint32_t>(i)), &models[i], required);
    if (!st.ok()) return Damage("model " + std::to_string(i) + ": " + st.message());
    if (i == duplicate)
      return Damage("models " + std::to_string(original) + " and " + std::to_string(i) + " are the same");
    nvfp4 = nvfp4 || pack::HasNvfp4(models[i].geometry);
  }
  if ((required & pack::kFlagNvfp4) && !nvfp4) return Damage("the NVFP4 required flag without an nvfp4 stream");
  chunks.resize(chunk_count);
  for (uint64_t i = 0; i < chunk_count; ++i) {
    const uint8_t* e = ct.data() + i * pack::kChunkEntryBytes;
    PackChunk& c = chunks[i];
    c.offset = LoadU64(e + pack::ce::kOffset);
    c.first_token = LoadU64(e + pack::ce::kFirstToken);
    c.token_count = LoadU32(e + pack::ce::kTokenCount);
    c.model = LoadU32(e + pack::ce::kModel);
    c.chain_hash = LoadU64(e + pack::ce::kChainHash);
    c.payload_checksum = LoadU64(e + pack::ce::kPayloadChecksum);
    std::string where = "chunk " + std::to_string(i) + ": ";
    if (LoadU64(e + pack::ce::kReserved) != 0) return Damage(where + "nonzero reserved bytes");
    if (c.model >= models.size()) return Damage(where + "model " + std::to_string(c.model) + " does not exist");
    const PackModel& m = models[c.model];
    if (c.token_count < 1 || c.token_count > m.chunk_tokens || c.first_token % m.chunk_tokens != 0)
      return Damage(where + "token range does not fit the model's chunk size");
    c.bytes = m.payload_bytes_per_token * c.token_count;
    if (c.offset < pack::kHeaderBytes || c.offset >= data_end || c.bytes > data_end - c.offset)
      return Damage(where + "payload lies outside the data region");
  }
  members.resize(member_count);
  uint64_t name_at = 0;
  for (uint64_t i = 0; i < member_count; ++i) {
    const uint8_t* e = it.data() + i * pack::kIndexEntryBytes;
    PackMember& m = members[i];
    std::string where = "member " + std::to_string(i) + ": ";
    uint64_t name_offset = LoadU64(e + pack::ie::kNameOffset);
    uint32_t name_length = LoadU32(e + pack::ie::kNameLength);
    if (name_offset != name_at || name_length < 1 || name_length > pack::kMaxNameBytes ||
        name_length > names_bytes - name_at)
      return Damage(where + "name out of place");
    m.name.assign(reinterpret_cast<const char*>(nm.data() + name_at), name_length);
    name_at += name_length;
    if (!IsValidPackMemberName(m.name)) return Damage(where + "invalid name");
    if (i > 0 && !(members[i - 1].name < m.name)) return Damage(where + "names are not sorted and unique");
    where = "member '" + m.name + "': ";
    m.model = LoadU32(e + pack::ie::kModel);
    m.token_count = LoadU64(e + pack::ie::kTokenCount);
    m.record_offset = LoadU64(e + pack::ie::kRecordOffset);
    m.record_checksum = LoadU64(e + pack::ie::kRecordChecksum);
    m.source_chunk_tokens = LoadU32(e + pack::ie::kSourceChunkTokens);
    uint32_t version = LoadU32(e + pack::ie::kSourceVersion);
    m.source_major = static_cast<uint16_t>(version >> 16);
    m.source_minor = static_cast<uint16_t>(version & 0xFFFF);
    for (size_t k = 0; k < 16; ++k)
      if (e[pack::ie::kReserved + k] != 0) return Damage(where + "nonzero reserved bytes");
    if (m.model >= models.size()) return Damage(where + "model " + std::to_string(m.model) + " does not exist");
    if (m.source_chunk_tokens < 1 || m.source_chunk_tokens > pack::kMaxChunkTokens)
      return Damage(where + "source chunk tokens out of range");
    if (m.token_count > data_end / 4) return Damage(where + "more token ids than the data region holds");
    uint64_t c = models[m.model].chunk_tokens;
    m.chunk_count = (m.token_count + c - 1) / c;
    uint64_t record = 4 * (m.token_count + m.chunk_count);
    if (m.record_offset < pack::kHeaderBytes || m.record_offset > data_end || record > data_end - m.record_offset)
      return Damage(where + "record lies outside the data region");
  }
  if (name_at != names_bytes) return Damage("names region holds bytes no member uses");
  KVFILE_RETURN_IF_ERROR(CheckNameSet());
  return CheckTiling();
}

// spec/PACK.md section 5: every member can be unpacked under one directory.
Status PackReader::Impl::CheckNameSet() const {
  std::vector<std::string_view> names;
  names.reserve(members.size());
  for (const PackMember& m : members) names.push_back(m.name);
  std::string conflict = pack::NameSetConflict(std::move(names));
  return conflict.empty() ? Status::OK() : Damage(conflict);
}

// Payloads and records must tile [128, data_end) exactly (spec/PACK.md 6).
Status PackReader::Impl::CheckTiling() const {
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  spans.reserve(chunks.size() + members.size());
  for (const PackChunk& c : chunks) spans.emplace_back(c.offset, c.bytes);
  for (const PackMember& m : members)
    if (m.token_count) spans.emplace_back(m.record_offset, 4 * (m.token_count + m.chunk_count));
  std::sort(spans.begin(), spans.end());
  uint64_t at = pack::kHeaderBytes;
  for (const auto& [off, len] : spans) {
    if (off != at)
      return Damage(off < at ? "chunks or records overlap at offset " + std::to_string(off)
                             : "bytes [" + std::to_string(at) + ", " + std::to_string(off) + ") belong to no chunk or record");
    at += len;
  }
  if (at != data_end)
    return Damage("bytes [" + std::to_string(at) + ", " + std::to_string(data_end) + ") belong to no chunk or record");
  return Status::OK();
}

Status PackReader::ReadMember(size_t index, std::vector<uint32_t>* tokens, std::vector<uint32_t>* chunk_ids) {
  Impl& r = *impl_;
  if (index >= r.members.size()) return Status::InvalidArgument(r.path + ": no member " + std::to_string(index));
  const PackMember& m = r.members[index];
  std::vector<uint8_t> rec;
  std::string what = "member '" + m.name + "': record";
  KVFILE_RETURN_IF_ERROR(r.ReadRegion(m.record_offset, 4 * (m.token_count + m.chunk_count), m.record_checksum,
                                      what.c_str(), &rec));
  tokens->resize(m.token_count);
  chunk_ids->resize(m.chunk_count);
  for (uint64_t i = 0; i < m.token_count; ++i) (*tokens)[i] = LoadU32(rec.data() + 4 * i);
  for (uint64_t j = 0; j < m.chunk_count; ++j) (*chunk_ids)[j] = LoadU32(rec.data() + 4 * (m.token_count + j));
  const uint64_t c = r.models[m.model].chunk_tokens;
  uint64_t chain = 0;
  for (uint64_t j = 0; j < m.chunk_count; ++j) {
    uint64_t first = j * c;
    uint64_t t = std::min(c, m.token_count - first);
    chain = pack::ChainHash(chain, std::span<const uint32_t>(*tokens).subspan(first, t));
    uint32_t id = (*chunk_ids)[j];
    std::string where = "member '" + m.name + "': chunk " + std::to_string(j) + " (id " + std::to_string(id) + ")";
    if (id >= r.chunks.size()) return r.Damage(where + " does not exist");
    const PackChunk& ck = r.chunks[id];
    if (ck.model != m.model || ck.first_token != first || ck.token_count != t)
      return r.Damage(where + " holds another model or token range");
    if (ck.chain_hash != chain) return r.Damage(where + ": chain hash does not match the member's tokens");
  }
  return Status::OK();
}

Status PackReader::ReadChunk(uint32_t id, std::vector<uint8_t>* payload) {
  Impl& r = *impl_;
  if (id >= r.chunks.size()) return Status::InvalidArgument(r.path + ": no chunk " + std::to_string(id));
  const PackChunk& c = r.chunks[id];
  payload->resize(c.bytes);
  KVFILE_RETURN_IF_ERROR(r.ReadPayload(id, payload->data()));
  const Geometry& g = r.models[c.model].geometry;
  std::vector<PayloadSection> layout = PackPayloadLayout(g, c.token_count);
  // Copies give the check host-order scales, and aligned raw rows where the
  // payload holds them unaligned.
  std::vector<uint64_t> rows_copy;
  std::vector<float> scales;
  for (const PayloadSection& p : layout) {
    const uint32_t l = p.layer, s = p.stream;
    const StreamSpec& spec = g.streams[s];
    const format::CodecRows cr = format::CodecRowsOf(spec);
    const size_t rows = size_t{c.token_count} * cr.per_token;
    const void* rows_at = payload->data() + p.data_offset;
    if (reinterpret_cast<uintptr_t>(rows_at) % RowAlignment(spec.dtype) != 0) {
      rows_copy.resize((p.data_bytes + 7) / 8);
      std::memcpy(rows_copy.data(), rows_at, p.data_bytes);
      rows_at = rows_copy.data();
    }
    scales.resize(p.scales_bytes / 4);
    for (size_t i = 0; i < scales.size(); ++i) {
      uint32_t bits = LoadU32(payload->data() + p.scales_offset + 4 * i);
      std::memcpy(&scales[i], &bits, 4);
    }
    codec::RowCheck rc = codec::CheckRows(spec.dtype, rows_at, scales.data(), rows, cr.width,
                                          payload->data() + p.block_scales_offset);
    if (!rc.ok()) return r.RowDamage(id, l, spec, rc.fault);
  }
  return Status::OK();
}

// The direct path reads one piece per (pack chunk, section) and scales
// part: it is taken where every .kv chunk holds whole pack chunks and the
// pieces average at least 64 KiB, so the reads stay few and large (a
// geometry of many tiny sections, or tiny pack chunks, is staged instead).
bool PackReader::Impl::UseDirectPath(const PackMember& m, uint32_t ct) const {
  const PackModel& model = models[m.model];
  const uint64_t sections = model.geometry.SectionCount();
  return ct % model.chunk_tokens == 0 &&
         model.chunk_tokens * model.payload_bytes_per_token / sections >= (uint64_t{64} << 10);
}

// Unpack's direct path (UseDirectPath says where): each section of a .kv
// chunk is read from the pack straight into its place in one of two
// section-sized buffers (each pack chunk's rows, then its scales; one
// buffer is filled while the other is written), checked, sealed and written
// (DirectChunk); no chunk-sized buffer, no staging copy. The pack chunks'
// checksums are computed as their bytes pass, in payload order, and
// compared before the .kv chunk's head is written. On any fault the pack
// chunks of that .kv chunk are checked again in order by ReadChunk, so the
// error is the one the staged path gives; the unpack fails and the
// temporary file goes. The file is the bytes the staged path writes: one
// append per pack chunk, so each .kv chunk ends an append.
Status PackReader::Impl::MaterializeDirect(PackReader& self, const PackMember& m, std::span<const uint32_t> tokens,
                                           std::span<const uint32_t> ids, uint32_t ct, Writer& w) {
  const Geometry& g = models[m.model].geometry;
  const uint64_t c_tokens = models[m.model].chunk_tokens;
  // The payload layout of a whole pack chunk, and of the member's last one.
  const std::vector<PayloadSection> full = PackPayloadLayout(g, static_cast<uint32_t>(c_tokens));
  std::vector<PayloadSection> tail;
  internal::PageBuffer buffers[2];
  std::vector<std::unique_ptr<format::ChecksumStream>> sums;
  std::vector<float> host_scales;  // big-endian hosts only
  for (uint64_t first = 0; first < m.token_count; first += ct) {
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(ct, m.token_count - first));
    // The pack chunks [p0, p1) of the member hold exactly these tokens
    // (ReadMember checked their token ranges).
    const size_t p0 = first / c_tokens, p1 = (first + n + c_tokens - 1) / c_tokens;
    while (sums.size() < p1 - p0) sums.push_back(std::make_unique<format::ChecksumStream>());
    for (size_t p = p0; p < p1; ++p) sums[p - p0]->Reset();
    bool fault = false;
    {
      internal::DirectChunk dc;  // destroyed before the buffers its writes read
      KVFILE_RETURN_IF_ERROR(dc.Begin(w, n));
      const format::ChunkLayout& cl = dc.layout();
      uint64_t largest = 0;
      for (const format::SectionLayout& sec : cl.sections) largest = std::max(largest, sec.end - sec.offset);
      for (internal::PageBuffer& b : buffers)
        if (!b.Resize(largest))
          return Status::IOError(path + ": cannot allocate a buffer of " + std::to_string(largest) + " bytes");
      for (size_t k = 0; k < cl.sections.size(); ++k) {
        const format::SectionLayout& sec = cl.sections[k];
        const StreamSpec& spec = g.streams[sec.stream];
        // The write of section k - 2 from this buffer is complete: the
        // previous section waited for it.
        uint8_t* base = buffers[k % 2].data();
        // Per token, as the chunk layout sizes the section's arrays.
        const uint64_t data_per_token = sec.data_bytes / n, scales_per_token = sec.scales_bytes / n;
        const uint64_t block_scales_per_token = sec.block_scales_bytes / n;
        for (size_t p = p0; p < p1; ++p) {
          const PackChunk& c = chunks[ids[p]];
          if (c.token_count != c_tokens && tail.empty()) tail = PackPayloadLayout(g, c.token_count);
          const PayloadSection& ps = (c.token_count == c_tokens ? full : tail)[k];
          if (ps.data_bytes != c.token_count * data_per_token || ps.scales_bytes != c.token_count * scales_per_token ||
              ps.block_scales_bytes != c.token_count * block_scales_per_token)
            return Status::Unsupported(path + ": stream '" + spec.name + "' is laid out differently in a pack and a .kv chunk");
          const uint64_t at = c.first_token - first;  // the pack chunk's first token in this .kv chunk
          uint8_t* rows = base + at * data_per_token;
          KVFILE_RETURN_IF_ERROR(file->ReadAt(c.offset + ps.data_offset, rows, ps.data_bytes));
          sums[p - p0]->Update(rows, ps.data_bytes);
          if (ps.block_scales_bytes) {
            uint8_t* block_scales = base + (sec.block_scales_offset - sec.offset) + at * block_scales_per_token;
            KVFILE_RETURN_IF_ERROR(file->ReadAt(c.offset + ps.block_scales_offset, block_scales, ps.block_scales_bytes));
            sums[p - p0]->Update(block_scales, ps.block_scales_bytes);
          }
          if (!ps.scales_bytes) continue;
          uint8_t* scales = base + (sec.scales_offset - sec.offset) + at * scales_per_token;
          KVFILE_RETURN_IF_ERROR(file->ReadAt(c.offset + ps.scales_offset, scales, ps.scales_bytes));
          sums[p - p0]->Update(scales, ps.scales_bytes);
        }
        if (!fault) {
          const float* scales = nullptr;
          if (sec.scales_bytes) {
            scales = reinterpret_cast<const float*>(base + (sec.scales_offset - sec.offset));
            if constexpr (std::endian::native != std::endian::little) {
              host_scales.resize(sec.scales_bytes / 4);
              for (size_t i = 0; i < host_scales.size(); ++i) {
                uint32_t bits = LoadU32(base + (sec.scales_offset - sec.offset) + 4 * i);
                std::memcpy(&host_scales[i], &bits, 4);
              }
              scales = host_scales.data();
            }
          }
          const format::CodecRows cr = format::CodecRowsOf(spec);
          fault = !codec::CheckRows(spec.dtype, base, scales, size_t{n} * cr.per_token, cr.width,
                                    base + (sec.block_scales_offset - sec.offset))
                       .ok();
        }
        KVFILE_RETURN_IF_ERROR(dc.Wait());
        KVFILE_RETURN_IF_ERROR(dc.WriteSection(k, base));
      }
      for (size_t p = p0; p < p1; ++p)
        fault |= !format::ChecksumMatches(chunks[ids[p]].payload_checksum, sums[p - p0]->Digest());
      if (!fault) {
        KVFILE_RETURN_IF_ERROR(dc.Finish(tokens.subspan(first, n)));
        continue;
      }
    }
    std::vector<uint8_t> check;
    for (size_t p = p0; p < p1; ++p) KVFILE_RETURN_IF_ERROR(self.ReadChunk(ids[p], &check));
    return Damage("chunks " + std::to_string(ids[p0]) + ".." + std::to_string(ids[p1 - 1]) +
                  " changed while they were read");
  }
  return Status::OK();
}

// One pass. Where the .kv chunks hold whole pack chunks, the direct path
// above. Otherwise each chunk is read once into one reused buffer, its
// checksum checked, and its rows handed to the writer in place (the writer
// checks codes and values as it stages them, once). The pieces end at the
// writer's chunk boundaries, so no piece is checked before it is staged;
// each pack chunk stays one append, as it always was (the same append ends,
// the same bytes).
Status PackReader::Materialize(size_t index, const std::string& dest) {
  Impl& r = *impl_;
  if (index >= r.members.size()) return Status::InvalidArgument(r.path + ": no member " + std::to_string(index));
  const PackMember& m = r.members[index];
  const PackModel& model = r.models[m.model];
  const Geometry& g = model.geometry;
  std::vector<uint32_t> tokens, ids;
  KVFILE_RETURN_IF_ERROR(ReadMember(index, &tokens, &ids));
  // The source's chunk size, halved until a staging buffer stays <= 64 MiB.
  uint32_t ct = m.source_chunk_tokens;
  format::ChunkLayout cl;
  while (ct > 1 && (!format::ComputeChunkLayout(g, ct, &cl).ok() || cl.chunk_bytes > (uint64_t{64} << 20))) ct /= 2;
  std::unique_ptr<internal::PendingReplace> replace;
  KVFILE_RETURN_IF_ERROR(internal::PendingReplace::Begin(dest, r.fs, &replace));
  WriterOptions wo;
  wo.fs = r.fs;
  wo.chunk_tokens = ct;
  wo.sync = SyncMode::kClose;
  std::unique_ptr<Writer> w;
  KVFILE_RETURN_IF_ERROR(Writer::Create(replace->temp_path(), g, model.identity, wo, &w));
  if (r.UseDirectPath(m, ct)) {
    KVFILE_RETURN_IF_ERROR(r.MaterializeDirect(*this, m, tokens, ids, ct, *w));
    KVFILE_RETURN_IF_ERROR(w->Close());
    w.reset();
    return replace->Commit();
  }
  internal::PageBuffer payload;
  // Aligned, host-order copies, only for sections the payload holds
  // unaligned (or scales on a big-endian host).
  std::vector<std::vector<uint64_t>> copies(g.layers * g.streams.size() * 2);
  uint64_t written = 0;
  for (size_t j = 0; j < ids.size(); ++j) {
    const PackChunk& c = r.chunks[ids[j]];
    if (!payload.Resize(c.bytes))
      return Status::IOError(r.path + ": cannot allocate a buffer of " + std::to_string(c.bytes) + " bytes");
    KVFILE_RETURN_IF_ERROR(r.ReadPayload(ids[j], payload.data()));
    std::vector<PayloadSection> layout = PackPayloadLayout(g, c.token_count);
    AppendBatch batch;
    // Every (layer, stream) has a block; an absent one none (no data).
    batch.blocks.resize(static_cast<size_t>(g.layers) * g.streams.size());
    for (size_t k = 0; k < layout.size(); ++k) {
      const PayloadSection& p = layout[k];
      const StreamSpec& spec = g.streams[p.stream];
      RowBlock& b = batch.blocks[static_cast<size_t>(p.layer) * g.streams.size() + p.stream];
      b.dtype = spec.dtype;
      b.data = payload.data() + p.data_offset;
      if (p.block_scales_bytes) b.block_scales = payload.data() + p.block_scales_offset;
      if (p.data_offset % RowAlignment(spec.dtype) != 0) {
        copies[2 * k].resize((p.data_bytes + 7) / 8);
        std::memcpy(copies[2 * k].data(), payload.data() + p.data_offset, p.data_bytes);
        b.data = copies[2 * k].data();
      }
      if (!p.scales_bytes) continue;
      b.scales = reinterpret_cast<const float*>(payload.data() + p.scales_offset);
      if (std::endian::native != std::endian::little || p.scales_offset % 4 != 0) {
        copies[2 * k + 1].resize((p.scales_bytes + 7) / 8);
        float* f = reinterpret_cast<float*>(copies[2 * k + 1].data());
        for (uint64_t i = 0; i < p.scales_bytes / 4; ++i) {
          uint32_t bits = LoadU32(payload.data() + p.scales_offset + 4 * i);
          std::memcpy(f + i, &bits, 4);
        }
        b.scales = f;
      }
    }
    for (uint32_t done = 0; done < c.token_count;) {
      uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(ct - written % ct, c.token_count - done));
      AppendBatch piece;
      piece.tokens = std::span<const uint32_t>(tokens).subspan(c.first_token + done, n);
      piece.continued = done + n < c.token_count;
      piece.blocks = batch.blocks;
      for (const PayloadSection& p : layout) {
        const size_t k = static_cast<size_t>(p.layer) * g.streams.size() + p.stream;
        const StreamSpec& spec = g.streams[p.stream];
        const format::CodecRows cr = format::CodecRowsOf(spec);
        const uint64_t rows = uint64_t{done} * cr.per_token;
        const RowBlock& from = batch.blocks[k];
        const codec::PartsIn at =
            codec::AtRow(spec.dtype, codec::PartsIn{from.data, from.block_scales, from.scales}, rows, cr.width);
        piece.blocks[k].data = at.codes;
        piece.blocks[k].block_scales = at.block_scales;
        piece.blocks[k].scales = at.row_scales;
      }
      Status st = w->Append(piece);
      if (!st.ok()) {
        // A bad code or value is the pack's damage: ReadChunk names it.
        if (st.code() == Status::Code::kNonFinite) {
          std::vector<uint8_t> check;
          Status damage = ReadChunk(ids[j], &check);
          if (!damage.ok()) return damage;
        }
        return st;
      }
      done += n;
      written += n;
    }
  }
  KVFILE_RETURN_IF_ERROR(w->Close());
  w.reset();
  return replace->Commit();
}

Status PackReader::Verify(PackVerifyReport* report) {
  Impl& r = *impl_;
  PackVerifyReport rep;
  std::vector<bool> used(r.chunks.size(), false);
  std::vector<uint32_t> tokens, ids;
  for (size_t i = 0; i < r.members.size(); ++i) {
    KVFILE_RETURN_IF_ERROR(ReadMember(i, &tokens, &ids));
    for (uint32_t id : ids) used[id] = true;
    rep.members++;
  }
  std::set<std::tuple<uint32_t, uint64_t, uint32_t, uint64_t, uint64_t>> seen;
  std::vector<uint8_t> payload;
  for (uint32_t id = 0; id < r.chunks.size(); ++id) {
    const PackChunk& c = r.chunks[id];
    if (!used[id]) return r.Damage("chunk " + std::to_string(id) + " is used by no member");
    if (!seen.emplace(c.model, c.first_token, c.token_count, c.chain_hash, c.payload_checksum).second)
      return r.Damage("chunk " + std::to_string(id) + " is stored twice");
    KVFILE_RETURN_IF_ERROR(ReadChunk(id, &payload));
    rep.chunks++;
    rep.payload_bytes += c.bytes;
  }
  if (report) *report = rep;
  return Status::OK();
}

}  // namespace kvfile
