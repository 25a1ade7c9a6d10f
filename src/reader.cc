// Reader: open = scan (file_scan.h); reads check whole sections before they
// decode anything into the caller's buffer.
#include "kvfile/reader.h"

#include <algorithm>
#include <cstring>

#include "file_scan.h"
#include "kvfile/codec.h"
#include "kvfile/format/endian.h"

namespace kvfile {

using namespace kvfile::format;
using internal::ScanResult;

struct Reader::Impl {
  std::string path;
  std::unique_ptr<File> file;
  ScanResult scan;
  std::vector<ChunkInfo> chunk_infos;
  std::unique_ptr<internal::LayoutCache> layouts;
  std::vector<uint8_t> scratch;  // reused across reads: no allocation per call once warm

  const Geometry& g() const { return scan.header.geometry; }

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
  Status LoadSections(uint32_t layer, uint32_t stream, uint64_t begin, uint64_t end,
                      std::vector<Piece>* pieces);
};

Status Reader::Impl::CheckRange(uint32_t layer, uint32_t stream, uint64_t begin,
                                uint64_t end) const {
  if (layer >= g().layers)
    return Status::InvalidArgument(path + ": layer " + std::to_string(layer) + " out of range (" +
                                   std::to_string(g().layers) + " layers)");
  if (stream >= g().streams.size())
    return Status::InvalidArgument(path + ": stream " + std::to_string(stream) + " out of range");
  if (begin > end || end > scan.tokens.size())
    return Status::InvalidArgument(path + ": token range [" + std::to_string(begin) + ", " +
                                   std::to_string(end) + ") outside [0, " +
                                   std::to_string(scan.tokens.size()) + ")");
  return Status::OK();
}

// Reads the (layer, stream) section of every chunk overlapping [begin, end)
// into scratch and checks it: checksum, and for fp8 the codes and scales of
// the rows the read uses. Nothing is decoded until all of them pass.
Status Reader::Impl::LoadSections(uint32_t layer, uint32_t stream, uint64_t begin, uint64_t end,
                                  std::vector<Piece>* pieces) {
  const StreamSpec& spec = g().streams[stream];
  size_t idx = static_cast<size_t>(layer) * g().streams.size() + stream;
  // First chunk whose live range ends after `begin`.
  auto it = std::upper_bound(chunk_infos.begin(), chunk_infos.end(), begin,
                             [](uint64_t t, const ChunkInfo& c) { return t < c.first_token + c.live_tokens; });
  size_t total = 0;
  for (size_t ci = static_cast<size_t>(it - chunk_infos.begin()); ci < chunk_infos.size(); ++ci) {
    const ChunkInfo& c = chunk_infos[ci];
    if (c.first_token >= end) break;
    const ChunkLayout* layout;
    KVFILE_RETURN_IF_ERROR(layouts->Get(c.stored_tokens, &layout));
    SectionLayout sec = layout->sections[idx];
    uint64_t from = std::max(begin, c.first_token);
    uint64_t to = std::min(end, c.first_token + c.live_tokens);
    pieces->push_back({ci, static_cast<uint32_t>(from - c.first_token),
                       static_cast<uint32_t>(to - from), sec, total});
    total += sec.end - sec.offset;
  }
  if (scratch.size() < total) scratch.resize(total);
  for (const Piece& p : *pieces) {
    const ChunkInfo& c = chunk_infos[p.chunk];
    const SectionLayout& sec = p.section;
    uint8_t* buf = scratch.data() + p.scratch_offset;
    // Built only for an error: this runs for every chunk of every read.
    auto where = [&] {
      return path + ": " + internal::ChunkWhere(p.chunk, c.offset) + ", layer " + std::to_string(layer) +
             " stream '" + spec.name + "'";
    };
    Status st = file->ReadAt(c.offset + sec.offset, buf, sec.end - sec.offset);
    if (!st.ok()) return st.WithContext(where());
    if (!ChecksumMatches(scan.chunks[p.chunk].section_checksums[idx], Checksum(buf, sec.end - sec.offset)))
      return Status::Corruption(where() + ": payload checksum mismatch (section at offset " +
                                std::to_string(c.offset + sec.offset) + ")");
    if (!IsFp8(spec.dtype)) {
      // The writer never stores a non-finite raw value; one in a file is damage.
      uint64_t elems = uint64_t{p.count} * spec.ElementsPerToken();
      const uint8_t* rows = buf + uint64_t{p.first} * spec.ElementsPerToken() * ElementSize(spec.dtype);
      size_t bad = codec::FindNonFinite(spec.dtype, rows, elems);
      if (bad < elems)
        return Status::Corruption(where() + ": non-finite value at token " +
                                  std::to_string(c.first_token + p.first + bad / spec.ElementsPerToken()));
    }
    if (IsFp8(spec.dtype)) {
      codec::Fp8Kind kind = spec.dtype == Dtype::kE5M2 ? codec::Fp8Kind::kE5M2 : codec::Fp8Kind::kE4M3;
      uint64_t row0 = uint64_t{p.first} * spec.rows_per_token;
      uint64_t rows = uint64_t{p.count} * spec.rows_per_token;
      const uint8_t* codes = buf + row0 * spec.row_width;
      const float* scales = reinterpret_cast<const float*>(buf + (sec.scales_offset - sec.offset)) + row0;
      size_t bad = codec::FindInvalidCode(kind, codes, rows * spec.row_width);
      if (bad < rows * spec.row_width)
        return Status::Corruption(where() + ": non-finite code at token " +
                                  std::to_string(c.first_token + p.first + bad / spec.ElementsPerToken()));
      size_t bad_scale = codec::FindInvalidScale(scales, rows);
      if (bad_scale < rows)
        return Status::Corruption(where() + ": invalid scale at token " +
                                  std::to_string(c.first_token + p.first + bad_scale / spec.rows_per_token));
    }
  }
  return Status::OK();
}

Reader::Reader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Reader::~Reader() = default;

Status Reader::Open(const std::string& path, const ReaderOptions& options,
                    std::unique_ptr<Reader>* out) {
  FileSystem* fs = options.fs ? options.fs : FileSystem::Default();
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  KVFILE_RETURN_IF_ERROR(fs->Open(path, OpenMode::kRead, &impl->file));
  Status st = internal::ScanFile(*impl->file, &impl->scan);
  if (!st.ok()) return st.WithContext(path);
  const FileHeader& h = impl->scan.header;
  if (options.expect_identity || options.expect_geometry) {
    ModelIdentity want_id = options.expect_identity.value_or(h.identity);
    Geometry want_g = options.expect_geometry.value_or(h.geometry);
    st = CheckExpected(h.identity, h.geometry, want_id, want_g);
    if (!st.ok()) return st.WithContext(path);
  }
  impl->layouts = std::make_unique<internal::LayoutCache>(&impl->scan.header.geometry);
  for (const auto& c : impl->scan.chunks) impl->chunk_infos.push_back(c.info);
  out->reset(new Reader(std::move(impl)));
  return Status::OK();
}

uint16_t Reader::major_version() const { return impl_->scan.header.major; }
uint16_t Reader::minor_version() const { return impl_->scan.header.minor; }
const Geometry& Reader::geometry() const { return impl_->g(); }
const ModelIdentity& Reader::identity() const { return impl_->scan.header.identity; }
uint64_t Reader::salt() const { return impl_->scan.header.salt; }
uint32_t Reader::nominal_chunk_tokens() const { return impl_->scan.header.chunk_tokens; }
uint32_t Reader::epoch() const { return impl_->scan.commit.epoch; }
uint64_t Reader::token_count() const { return impl_->scan.tokens.size(); }
std::span<const uint32_t> Reader::tokens() const { return impl_->scan.tokens; }
const std::vector<ChunkInfo>& Reader::chunks() const { return impl_->chunk_infos; }
const TailInfo& Reader::tail() const { return impl_->scan.tail; }
const char* Reader::io_backend() const { return impl_->file->backend(); }
const std::string& Reader::path() const { return impl_->path; }

uint64_t Reader::LongestCommonPrefix(std::span<const uint32_t> prompt) const {
  const auto& t = impl_->scan.tokens;
  auto [a, b] = std::mismatch(t.begin(), t.end(), prompt.begin(), prompt.end());
  return static_cast<uint64_t>(a - t.begin());
}

Status Reader::ReadRows(uint32_t layer, uint32_t stream, uint64_t begin, uint64_t end,
                        Dtype out_dtype, void* dst) {
  Impl& r = *impl_;
  KVFILE_RETURN_IF_ERROR(r.CheckRange(layer, stream, begin, end));
  if (begin == end) return Status::OK();
  if (IsFp8(out_dtype))
    return Status::InvalidArgument(r.path + ": decoded reads produce bf16, f16 or f32; use ReadCodes for codes");
  std::vector<Impl::Piece> pieces;
  KVFILE_RETURN_IF_ERROR(r.LoadSections(layer, stream, begin, end, &pieces));
  const StreamSpec& spec = r.g().streams[stream];
  auto* out = static_cast<uint8_t*>(dst);
  size_t out_elem = ElementSize(out_dtype);
  for (const Impl::Piece& p : pieces) {
    const uint8_t* buf = r.scratch.data() + p.scratch_offset;
    uint64_t row0 = uint64_t{p.first} * spec.rows_per_token;
    uint64_t rows = uint64_t{p.count} * spec.rows_per_token;
    if (IsFp8(spec.dtype)) {
      const float* scales = reinterpret_cast<const float*>(buf + (p.section.scales_offset - p.section.offset)) + row0;
      codec::DequantizeRows(spec.dtype == Dtype::kE5M2 ? codec::Fp8Kind::kE5M2 : codec::Fp8Kind::kE4M3,
                            buf + row0 * spec.row_width, scales, rows, spec.row_width, out_dtype, out);
    } else {
      codec::ConvertRaw(spec.dtype, buf + row0 * spec.row_width * ElementSize(spec.dtype),
                        rows * spec.row_width, out_dtype, out);
    }
    out += rows * spec.row_width * out_elem;
  }
  return Status::OK();
}

Status Reader::ReadCodes(uint32_t layer, uint32_t stream, uint64_t begin, uint64_t end,
                         uint8_t* codes, float* scales, Dtype v1_quantize_as) {
  Impl& r = *impl_;
  KVFILE_RETURN_IF_ERROR(r.CheckRange(layer, stream, begin, end));
  const StreamSpec& spec = r.g().streams[stream];
  bool quantize = r.scan.header.major == kMajorV1;
  if (quantize && !IsFp8(v1_quantize_as))
    return Status::InvalidArgument(r.path + ": codes are e4m3 or e5m2, not " + DtypeName(v1_quantize_as));
  if (!quantize && !IsFp8(spec.dtype))
    return Status::InvalidArgument(r.path + ": stream '" + spec.name + "' is stored raw (" +
                                   DtypeName(spec.dtype) + "); read it with ReadRows");
  std::vector<Impl::Piece> pieces;
  KVFILE_RETURN_IF_ERROR(r.LoadSections(layer, stream, begin, end, &pieces));
  for (const Impl::Piece& p : pieces) {
    const uint8_t* buf = r.scratch.data() + p.scratch_offset;
    uint64_t row0 = uint64_t{p.first} * spec.rows_per_token;
    uint64_t rows = uint64_t{p.count} * spec.rows_per_token;
    if (quantize) {
      // v1 rows were finite when written (the writer refuses non-finite
      // rows), but a file is input: a non-finite row is reported.
      size_t bad_row;
      auto kind = v1_quantize_as == Dtype::kE5M2 ? codec::Fp8Kind::kE5M2 : codec::Fp8Kind::kE4M3;
      if (!codec::QuantizeRows(kind, spec.dtype, buf + row0 * spec.row_width * ElementSize(spec.dtype),
                               rows, spec.row_width, codes, scales, &bad_row))
        return Status::Corruption(r.path + ": layer " + std::to_string(layer) + " stream '" + spec.name +
                                  "': non-finite value at token " +
                                  std::to_string(r.chunk_infos[p.chunk].first_token + p.first +
                                                 bad_row / spec.rows_per_token));
    } else {
      std::memcpy(codes, buf + row0 * spec.row_width, rows * spec.row_width);
      std::memcpy(scales, buf + (p.section.scales_offset - p.section.offset) + row0 * 4, rows * 4);
    }
    codes += rows * spec.row_width;
    scales += rows;
  }
  return Status::OK();
}

Status Reader::VerifyChunk(size_t index) {
  Impl& r = *impl_;
  if (index >= r.scan.chunks.size())
    return Status::InvalidArgument(r.path + ": chunk " + std::to_string(index) + " out of range");
  const auto& c = r.scan.chunks[index];
  std::string where = r.path + ": " + internal::ChunkWhere(index, c.info.offset);
  Status st = internal::ReadAndCheckChunk(*r.file, r.g(), *r.layouts, c, &r.scratch);
  const ChunkLayout* layout = nullptr;
  if (st.ok()) st = r.layouts->Get(c.info.stored_tokens, &layout);
  if (st.ok()) st = internal::CheckChunkValues(r.g(), *layout, c.info, r.scratch.data());
  return st.WithContext(where);
}

}  // namespace kvfile
