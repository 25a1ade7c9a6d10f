// SPDX-License-Identifier: Apache-2.0
// The C API (kvfile/c.h) over the C++ Writer, Reader and VerifyFile.
//
// Every entry point runs its body through Guarded(), which catches every
// exception (an allocation failure inside the C++ library or here, or
// anything unexpected) and turns it into a status code with a message: a C
// caller cannot catch a C++ exception, and one unwinding into C code is
// undefined behaviour. Statuses become codes of the same value (the enums
// mirror each other, checked below) and the message goes to the calling
// thread's last-error string.
#include "kvfile/c.h"
#include "kvfile/pack.h"
#include "capi/c_api_internal.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "kvfile/append.h"
#include "kvfile/convert.h"
#include "kvfile/presets.h"
#include "kvfile/reader.h"
#include "kvfile/repair.h"
#include "kvfile/verify.h"
#include "kvfile/prefix_index.h"
#include "index/index_format.h"
#include "kvfile/writer.h"

using kvfile::Dtype;
using kvfile::Geometry;
using kvfile::Status;

struct kvfile_writer {
  std::unique_ptr<kvfile::Writer> impl;
};

struct kvfile_reader {
  std::unique_ptr<kvfile::Reader> impl;
};

struct kvfile_pack {
  std::unique_ptr<kvfile::PackReader> impl;
};

namespace kvfile::capi {

namespace {
thread_local std::string last_error;
}  // namespace

const char* LastError() noexcept { return last_error.c_str(); }

// Records `message` (the two parts joined) as this thread's last error and
// returns `code`. Never throws: if even the message cannot be stored, the
// code still reaches the caller, with an empty message.
kvfile_status Fail(kvfile_status code, std::string_view message, std::string_view detail) noexcept {
  try {
    last_error.assign(message);
    last_error.append(detail);
  } catch (...) {
    last_error.clear();
  }
  return code;
}

kvfile_status Report(const Status& st) noexcept {
  if (st.ok()) return KVFILE_OK;
  return Fail(static_cast<kvfile_status>(st.code()), st.message());
}

// "<function>: <argument> is NULL".
kvfile_status NullArgument(std::string_view function, std::string_view argument) noexcept {
  try {
    return Fail(KVFILE_INVALID_ARGUMENT, std::string(function) + ": " + std::string(argument), " is NULL");
  } catch (...) {
    return Fail(KVFILE_INVALID_ARGUMENT, "an argument is NULL");
  }
}

// The converters never replace a file: KVFILE_INVALID_ARGUMENT
// ("<path>: file exists") where `path` exists.
kvfile_status RefuseExisting(kvfile::FileSystem* fs, const char* path) {
  bool exists = false;
  if (kvfile_status st = Report(fs->Exists(path, &exists)); st != KVFILE_OK) return st;
  if (exists) return Fail(KVFILE_INVALID_ARGUMENT, std::string(path), ": file exists");
  return KVFILE_OK;
}

// KVFILE_BUFFER_TOO_SMALL unless `have` >= `need` (`what` names the buffer).
kvfile_status CheckCapacity(std::string_view what, uint64_t need, uint64_t have) {
  if (have >= need) return KVFILE_OK;
  return Fail(KVFILE_BUFFER_TOO_SMALL, std::string(what) + " holds " + std::to_string(have) + ", the result needs " +
                                           std::to_string(need));
}

}  // namespace kvfile::capi

using namespace kvfile::capi;

namespace {

// The C codes that mirror Status::Code must keep the same values.
constexpr bool Mirrors(kvfile_status c, Status::Code cc) { return static_cast<int>(c) == static_cast<int>(cc); }
static_assert(Mirrors(KVFILE_OK, Status::Code::kOk));
static_assert(Mirrors(KVFILE_CORRUPTION, Status::Code::kCorruption));
static_assert(Mirrors(KVFILE_MISMATCH, Status::Code::kMismatch));
static_assert(Mirrors(KVFILE_NON_FINITE, Status::Code::kNonFinite));
static_assert(Mirrors(KVFILE_INVALID_ARGUMENT, Status::Code::kInvalidArgument));
static_assert(Mirrors(KVFILE_NOT_FOUND, Status::Code::kNotFound));
static_assert(Mirrors(KVFILE_IO_ERROR, Status::Code::kIOError));
static_assert(Mirrors(KVFILE_UNSUPPORTED, Status::Code::kUnsupported));
static_assert(Mirrors(KVFILE_BUSY, Status::Code::kBusy));
static_assert(Mirrors(KVFILE_FAILED, Status::Code::kFailed));
// And the dtypes the values written to disk.
static_assert(KVFILE_E4M3 == static_cast<int>(Dtype::kE4M3) && KVFILE_E5M2 == static_cast<int>(Dtype::kE5M2) &&
              KVFILE_BF16 == static_cast<int>(Dtype::kBF16) && KVFILE_F16 == static_cast<int>(Dtype::kF16) &&
              KVFILE_F32 == static_cast<int>(Dtype::kF32) && KVFILE_NVFP4 == static_cast<int>(Dtype::kNvfp4));

// Copies s into dst[0, capacity) with a terminating NUL, cut to fit.
void CopyString(std::string_view s, char* dst, size_t capacity) {
  size_t n = std::min(s.size(), capacity - 1);
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

bool IsDtype(kvfile_dtype d) { return static_cast<int>(d) >= KVFILE_E4M3 && static_cast<int>(d) <= KVFILE_NVFP4; }

kvfile_status ToGeometry(const kvfile_geometry& in, Geometry* out) {
  if (in.stream_count > KVFILE_MAX_STREAMS)
    return Fail(KVFILE_INVALID_ARGUMENT, "geometry: stream_count " + std::to_string(in.stream_count) +
                                             " is above the limit of " + std::to_string(KVFILE_MAX_STREAMS));
  out->layers = in.layers;
  out->streams.clear();
  for (uint32_t i = 0; i < in.stream_count; ++i) {
    const kvfile_stream& s = in.streams[i];
    const void* nul = std::memchr(s.name, '\0', sizeof s.name);
    if (nul == nullptr)
      return Fail(KVFILE_INVALID_ARGUMENT, "geometry: the name of stream " + std::to_string(i) +
                                               " is not NUL-terminated within its 32 bytes");
    if (!IsDtype(s.dtype))
      return Fail(KVFILE_INVALID_ARGUMENT, "geometry: stream " + std::to_string(i) + " has an invalid dtype " +
                                               std::to_string(static_cast<int>(s.dtype)));
    out->streams.push_back({std::string(s.name), s.rows_per_token, s.row_width, static_cast<Dtype>(s.dtype)});
  }
  return KVFILE_OK;
}

void FromGeometry(const Geometry& in, kvfile_geometry* out) {
  *out = kvfile_geometry{};
  out->layers = in.layers;
  out->stream_count = static_cast<uint32_t>(std::min<size_t>(in.streams.size(), KVFILE_MAX_STREAMS));
  for (uint32_t i = 0; i < out->stream_count; ++i) {
    const kvfile::StreamSpec& s = in.streams[i];
    CopyString(s.name, out->streams[i].name, sizeof out->streams[i].name);
    out->streams[i].rows_per_token = s.rows_per_token;
    out->streams[i].row_width = s.row_width;
    out->streams[i].dtype = static_cast<kvfile_dtype>(s.dtype);
  }
}

kvfile::WriterOptions ToWriterOptions(const kvfile_writer_options* in) {
  kvfile::WriterOptions o;
  if (in == nullptr) return o;
  if (in->chunk_tokens != 0) o.chunk_tokens = in->chunk_tokens;
  switch (in->sync) {
    case KVFILE_SYNC_CHUNK: o.sync = kvfile::SyncMode::kChunk; break;
    case KVFILE_SYNC_NONE: o.sync = kvfile::SyncMode::kNone; break;
    default: o.sync = kvfile::SyncMode::kClose; break;  // KVFILE_SYNC_CLOSE (checked by IsSyncMode)
  }
  o.overwrite = in->overwrite != 0;
  return o;
}

bool IsSyncMode(const kvfile_writer_options* o) {
  return o == nullptr || o->sync == KVFILE_SYNC_CLOSE || o->sync == KVFILE_SYNC_CHUNK ||
         o->sync == KVFILE_SYNC_NONE;
}

kvfile_status InvalidSyncMode() { return Fail(KVFILE_INVALID_ARGUMENT, "writer options: invalid sync mode"); }

// Elements per token of (stream) for a read of tokens [begin, end), or 0
// when the request is out of range (the C++ reader then reports it with
// its own message).
uint64_t RowsInRead(const kvfile::Reader& r, uint32_t layer, uint32_t stream, uint64_t begin, uint64_t end) {
  const Geometry& g = r.geometry();
  if (layer >= g.layers || stream >= g.streams.size() || begin > end || end > r.token_count()) return 0;
  return (end - begin) * g.streams[stream].rows_per_token;
}

// kvfile_writer_common_prefix and kvfile_reader_common_prefix: `handle`
// is either kind (both keep the C++ object in `impl`).
template <typename Handle>
kvfile_status CommonPrefix(std::string_view function, std::string_view handle_name, const Handle* handle,
                           const uint32_t* prompt, size_t prompt_count, uint64_t* out) {
  return Guarded([&] {
    if (handle == nullptr) return NullArgument(function, handle_name);
    if (out == nullptr) return NullArgument(function, "out");
    if (prompt == nullptr && prompt_count > 0) return NullArgument(function, "prompt");
    *out = handle->impl->LongestCommonPrefix(std::span<const uint32_t>(prompt, prompt_count));
    return KVFILE_OK;
  });
}

// A bulk read's worker count: 0 means one per core.
unsigned ReadThreads(unsigned threads) {
  if (threads != 0) return threads;
  return std::max(1u, std::thread::hardware_concurrency());
}

// kvfile_rows2 begins with kvfile_rows' fields, at the same offsets.
static_assert(offsetof(kvfile_rows2, dtype) == offsetof(kvfile_rows, dtype) &&
              offsetof(kvfile_rows2, data) == offsetof(kvfile_rows, data) &&
              offsetof(kvfile_rows2, scales) == offsetof(kvfile_rows, scales) &&
              offsetof(kvfile_rows2, block_scales) == sizeof(kvfile_rows));
// kvfile_parts: the dtype, then each part's pointer and size in the order
// of the dtype table's parts (codes, row scales, block scales here).
static_assert(offsetof(kvfile_parts, dtype) == 0 && offsetof(kvfile_parts, data) == sizeof(void*) &&
              offsetof(kvfile_parts, data_bytes) == 2 * sizeof(void*) &&
              offsetof(kvfile_parts, scales) == 3 * sizeof(void*) &&
              offsetof(kvfile_parts, scale_count) == 4 * sizeof(void*) &&
              offsetof(kvfile_parts, block_scales) == 5 * sizeof(void*) &&
              offsetof(kvfile_parts, block_scales_bytes) == 6 * sizeof(void*) &&
              sizeof(kvfile_parts) == 7 * sizeof(void*));

// The deprecated append structs as kvfile_parts (sizes unknown: unbounded).
constexpr size_t kUnknownSize = SIZE_MAX;
kvfile_parts PartsOf(const kvfile_rows& b) {
  return {b.dtype, const_cast<void*>(b.data), kUnknownSize, const_cast<float*>(b.scales), kUnknownSize, nullptr,
          kUnknownSize};
}
kvfile_parts PartsOf(const kvfile_rows2& b) {
  return {b.dtype,      const_cast<void*>(b.data), kUnknownSize, const_cast<float*>(b.scales), kUnknownSize,
          const_cast<uint8_t*>(b.block_scales), kUnknownSize};
}
const kvfile_parts& PartsOf(const kvfile_parts& b) { return b; }

// One part of a kvfile_parts: its pointer, its size (in elements of the
// part: bytes, or f32 scales) and the names a message gives them.
struct CPart {
  void* data;
  size_t size;
  uint64_t element_bytes;
  const char* size_name;
  const char* name;
};
// The names each entry point gives the parts (codes, block scales, row scales).
struct PartNames {
  const char* data_size;
  const char* block_scales_size;
  const char* scales_size;
  const char* data;
  const char* block_scales;
  const char* scales;
};
constexpr PartNames kPartsNames{"data_bytes", "block_scales_bytes", "scale_count", "data", "block_scales", "scales"};
CPart PartOf(const kvfile_parts& p, kvfile::DtypePart part, const PartNames& n) {
  switch (part) {
    case kvfile::DtypePart::kCodes: return {p.data, p.data_bytes, 1, n.data_size, n.data};
    case kvfile::DtypePart::kBlockScales: return {p.block_scales, p.block_scales_bytes, 1, n.block_scales_size, n.block_scales};
    case kvfile::DtypePart::kRowScales: return {p.scales, p.scale_count, sizeof(float), n.scales_size, n.scales};
  }
  return {p.data, p.data_bytes, 1, n.data_size, n.data};
}

// Checks the sizes, then (with `pointers`) the pointers, of the parts of
// `dtype` for `tokens` tokens of `spec` (none when `tokens` is 0). `what`
// prefixes the names.
kvfile_status CheckParts(const std::string& function, const std::string& what, const kvfile_parts& p, Dtype dtype,
                         const kvfile::StreamSpec& spec, uint64_t tokens, const PartNames& names, bool pointers) {
  if (tokens == 0) return KVFILE_OK;
  const kvfile::DtypeInfo& info = *kvfile::FindDtype(dtype);
  const kvfile::CodecRows cr = kvfile::CodecRowsOf(dtype, spec.rows_per_token, spec.row_width);
  for (size_t k = 0; k < info.part_count; ++k) {
    const CPart c = PartOf(p, info.parts[k], names);
    const uint64_t need = kvfile::PartBytes(dtype, info.parts[k], tokens * cr.per_token, cr.width) / c.element_bytes;
    if (kvfile_status st = CheckCapacity(function + ": " + what + c.size_name, need, c.size); st != KVFILE_OK)
      return st;
  }
  for (size_t k = 0; pointers && k < info.part_count; ++k) {
    const CPart c = PartOf(p, info.parts[k], names);
    if (c.data == nullptr) return NullArgument(function, what + c.name);
  }
  return KVFILE_OK;
}

// kvfile_writer_append_parts and the deprecated kvfile_writer_append and
// kvfile_writer_append2 (`function` names it).
template <typename Rows>
kvfile_status Append(const char* function, kvfile_writer* writer, const uint32_t* tokens, size_t token_count,
                     const Rows* blocks, size_t block_count) {
  if (writer == nullptr) return NullArgument(function, "writer");
  if (tokens == nullptr && token_count > 0) return NullArgument(function, "tokens");
  if (blocks == nullptr && block_count > 0) return NullArgument(function, "blocks");
  const Geometry& g = writer->impl->geometry();
  kvfile::AppendBatch batch;
  batch.tokens = std::span<const uint32_t>(tokens, token_count);
  batch.blocks.reserve(block_count);
  for (size_t i = 0; i < block_count; ++i) {
    auto refuse = [&](const std::string& what) {
      return Fail(KVFILE_INVALID_ARGUMENT, std::string(function) + ": block " + std::to_string(i) + what);
    };
    const kvfile_parts& b = PartsOf(blocks[i]);
    if (!IsDtype(b.dtype)) return refuse(" has an invalid dtype " + std::to_string(static_cast<int>(b.dtype)));
    const Dtype dtype = static_cast<Dtype>(b.dtype);
    if (b.block_scales != nullptr && !kvfile::FindDtype(dtype)->block_elements)
      return refuse(" has block_scales but is not KVFILE_NVFP4 codes");
    // The sizes of the parts given; the writer refuses a missing part or
    // block with its own message (no rows, codes without scales, rows for
    // a layer the stream is not in).
    const size_t S = g.streams.size();
    if (b.data != nullptr && i < g.layers * S &&
        g.InLayer(static_cast<uint32_t>(i / S), static_cast<uint32_t>(i % S)))
      if (kvfile_status st =
              CheckParts(function, "block " + std::to_string(i) + " ", b, dtype, g.streams[i % S], token_count,
                         kPartsNames, false);
          st != KVFILE_OK)
        return st;
    batch.blocks.push_back({dtype, b.data, b.scales, b.block_scales});
  }
  return Report(writer->impl->Append(batch));
}

// kvfile_reader_read_parts and the deprecated kvfile_reader_read_codes and
// kvfile_reader_read_nvfp4_codes (`function` names it, `names` its arguments).
kvfile_status ReadParts(const char* function, kvfile_reader* reader, uint32_t layer, uint32_t stream, uint64_t begin,
                        uint64_t end, const kvfile_parts& p, const PartNames& names) {
  if (reader == nullptr) return NullArgument(function, "reader");
  if (!IsDtype(p.dtype))
    return Fail(KVFILE_INVALID_ARGUMENT,
                std::string(function) + ": invalid dtype " + std::to_string(static_cast<int>(p.dtype)));
  const Dtype dtype = static_cast<Dtype>(p.dtype);
  kvfile::Reader& r = *reader->impl;
  if (RowsInRead(r, layer, stream, begin, end) > 0) {
    const kvfile::StreamSpec& spec = r.geometry().streams[stream];
    if (kvfile_status st = CheckParts(function, "", p, dtype, spec, end - begin, names, true); st != KVFILE_OK)
      return st;
    if (r.major_version() > 1 && kvfile::IsFp8(dtype) && kvfile::IsFp8(spec.dtype) && dtype != spec.dtype)
      return Fail(KVFILE_INVALID_ARGUMENT, std::string(function) + ": stream '" + spec.name + "' is " +
                                               kvfile::DtypeName(spec.dtype) + ", not " + kvfile::DtypeName(dtype));
  }
  switch (kvfile::FindDtype(dtype)->quantization) {
    case kvfile::Quantization::kNone:
      return Report(r.ReadRows(layer, stream, begin, end, dtype, p.data));
    case kvfile::Quantization::kPerRow:
      return Report(r.ReadCodes(layer, stream, begin, end, static_cast<uint8_t*>(p.data), p.scales, dtype));
    case kvfile::Quantization::kPerToken:
      return Report(r.ReadCodes(layer, stream, begin, end, static_cast<uint8_t*>(p.data), p.block_scales, p.scales));
  }
  return Fail(KVFILE_INVALID_ARGUMENT, std::string(function) + ": invalid dtype");
}

// Copies the layers stream `stream` of `g` is in to out[0, capacity).
kvfile_status CopyStreamLayers(const char* function, const Geometry& g, uint32_t stream, uint32_t* out,
                               size_t capacity, size_t* count) {
  if (stream >= g.streams.size())
    return Fail(KVFILE_INVALID_ARGUMENT, std::string(function) + ": stream " + std::to_string(stream) +
                                             " out of range (" + std::to_string(g.streams.size()) + " streams)");
  std::vector<uint32_t> layers = g.streams[stream].layers;
  if (layers.empty())
    for (uint32_t l = 0; l < g.layers; ++l) layers.push_back(l);
  if (count != nullptr) *count = layers.size();
  if (kvfile_status st = CheckCapacity(std::string(function) + ": the buffer", layers.size(), capacity);
      st != KVFILE_OK)
    return st;
  if (out == nullptr) return NullArgument(function, "out");
  std::copy(layers.begin(), layers.end(), out);
  return KVFILE_OK;
}

}  // namespace

extern "C" {

const char* kvfile_last_error(void) { return LastError(); }

const char* kvfile_status_name(kvfile_status status) {
  switch (status) {
    case KVFILE_OK: return "ok";
    case KVFILE_CORRUPTION: return "corruption";
    case KVFILE_MISMATCH: return "mismatch";
    case KVFILE_NON_FINITE: return "non-finite input";
    case KVFILE_INVALID_ARGUMENT: return "invalid argument";
    case KVFILE_NOT_FOUND: return "not found";
    case KVFILE_IO_ERROR: return "I/O error";
    case KVFILE_UNSUPPORTED: return "unsupported";
    case KVFILE_BUSY: return "busy";
    case KVFILE_FAILED: return "failed";
    case KVFILE_BUFFER_TOO_SMALL: return "buffer too small";
    case KVFILE_OUT_OF_MEMORY: return "out of memory";
    case KVFILE_INTERNAL: return "internal error";
    default: return "unknown";  // the range markers, or a value outside the enum
  }
}

size_t kvfile_dtype_size(kvfile_dtype dtype) {
  if (!IsDtype(dtype)) return 0;
  return kvfile::ElementSize(static_cast<Dtype>(dtype));  // 0 for KVFILE_NVFP4
}

kvfile_status kvfile_preset(const char* name, kvfile_dtype fp8_dtype, kvfile_geometry* out) {
  return Guarded([&] {
    if (name == nullptr) return NullArgument("kvfile_preset", "name");
    if (out == nullptr) return NullArgument("kvfile_preset", "out");
    if (!IsDtype(fp8_dtype)) return Fail(KVFILE_INVALID_ARGUMENT, "kvfile_preset: invalid dtype");
    Geometry g;
    kvfile_status st = Report(kvfile::GetPreset(name, static_cast<Dtype>(fp8_dtype), &g));
    if (st == KVFILE_OK) FromGeometry(g, out);
    return st;
  });
}

kvfile_status kvfile_preset_stream_layers(const char* name, uint32_t stream, uint32_t* out, size_t capacity,
                                          size_t* count) {
  return Guarded([&] {
    if (name == nullptr) return NullArgument("kvfile_preset_stream_layers", "name");
    Geometry g;
    kvfile_status st = Report(kvfile::GetPreset(name, kvfile::Dtype::kE4M3, &g));
    if (st != KVFILE_OK) return st;
    return CopyStreamLayers("kvfile_preset_stream_layers", g, stream, out, capacity, count);
  });
}

// ---- Writing ----

kvfile_status kvfile_writer_create(const char* path, const kvfile_geometry* geometry, const char* model_id,
                                   uint64_t fingerprint, const kvfile_writer_options* options,
                                   kvfile_writer** out) {
  return Guarded([&] {
    if (out == nullptr) return NullArgument("kvfile_writer_create", "out");
    *out = nullptr;
    if (path == nullptr) return NullArgument("kvfile_writer_create", "path");
    if (geometry == nullptr) return NullArgument("kvfile_writer_create", "geometry");
    if (!IsSyncMode(options)) return InvalidSyncMode();
    Geometry g;
    if (kvfile_status st = ToGeometry(*geometry, &g); st != KVFILE_OK) return st;
    kvfile::ModelIdentity identity{model_id ? model_id : "", fingerprint};
    auto w = std::make_unique<kvfile_writer>();
    kvfile_status st = Report(kvfile::Writer::Create(path, g, identity, ToWriterOptions(options), &w->impl));
    if (st == KVFILE_OK) *out = w.release();
    return st;
  });
}

kvfile_status kvfile_writer_create_layers(const char* path, const kvfile_geometry* geometry,
                                          const uint32_t* const* stream_layers, const uint32_t* stream_layer_counts,
                                          const char* model_id, uint64_t fingerprint,
                                          const kvfile_writer_options* options, kvfile_writer** out) {
  return Guarded([&] {
    if (out == nullptr) return NullArgument("kvfile_writer_create_layers", "out");
    *out = nullptr;
    if (path == nullptr) return NullArgument("kvfile_writer_create_layers", "path");
    if (geometry == nullptr) return NullArgument("kvfile_writer_create_layers", "geometry");
    if (stream_layer_counts == nullptr) return NullArgument("kvfile_writer_create_layers", "stream_layer_counts");
    if (!IsSyncMode(options)) return InvalidSyncMode();
    Geometry g;
    if (kvfile_status st = ToGeometry(*geometry, &g); st != KVFILE_OK) return st;
    for (uint32_t s = 0; s < g.streams.size(); ++s) {
      if (stream_layer_counts[s] == 0) continue;
      if (stream_layers == nullptr || stream_layers[s] == nullptr)
        return NullArgument("kvfile_writer_create_layers", "stream_layers[" + std::to_string(s) + "]");
      g.streams[s].layers.assign(stream_layers[s], stream_layers[s] + stream_layer_counts[s]);
      // Exactly every layer is written as "every layer"; any other list, a
      // repeated or unordered one too, goes to the writer's check as given.
      const std::vector<uint32_t>& l = g.streams[s].layers;
      bool every = l.size() == g.layers;
      for (uint32_t i = 0; every && i < l.size(); ++i) every = l[i] == i;
      if (every) g.streams[s].layers.clear();
    }
    kvfile::ModelIdentity identity{model_id ? model_id : "", fingerprint};
    auto w = std::make_unique<kvfile_writer>();
    kvfile_status st = Report(kvfile::Writer::Create(path, g, identity, ToWriterOptions(options), &w->impl));
    if (st == KVFILE_OK) *out = w.release();
    return st;
  });
}

kvfile_status kvfile_writer_open(const char* path, const kvfile_writer_options* options, kvfile_writer** out) {
  return Guarded([&] {
    if (out == nullptr) return NullArgument("kvfile_writer_open", "out");
    *out = nullptr;
    if (path == nullptr) return NullArgument("kvfile_writer_open", "path");
    if (!IsSyncMode(options)) return InvalidSyncMode();
    auto w = std::make_unique<kvfile_writer>();
    kvfile_status st = Report(kvfile::Writer::Open(path, ToWriterOptions(options), &w->impl));
    if (st == KVFILE_OK) *out = w.release();
    return st;
  });
}

kvfile_status kvfile_writer_append_parts(kvfile_writer* writer, const uint32_t* tokens, size_t token_count,
                                         const kvfile_parts* blocks, size_t block_count) {
  return Guarded(
      [&] { return Append("kvfile_writer_append_parts", writer, tokens, token_count, blocks, block_count); });
}

kvfile_status kvfile_writer_append(kvfile_writer* writer, const uint32_t* tokens, size_t token_count,
                                   const kvfile_rows* blocks, size_t block_count) {
  return Guarded([&] { return Append("kvfile_writer_append", writer, tokens, token_count, blocks, block_count); });
}

kvfile_status kvfile_writer_append2(kvfile_writer* writer, const uint32_t* tokens, size_t token_count,
                                    const kvfile_rows2* blocks, size_t block_count) {
  return Guarded([&] { return Append("kvfile_writer_append2", writer, tokens, token_count, blocks, block_count); });
}

kvfile_status kvfile_writer_sync(kvfile_writer* writer) {
  return Guarded([&] {
    if (writer == nullptr) return NullArgument("kvfile_writer_sync", "writer");
    return Report(writer->impl->Sync());
  });
}

kvfile_status kvfile_writer_rewind(kvfile_writer* writer, uint64_t n) {
  return Guarded([&] {
    if (writer == nullptr) return NullArgument("kvfile_writer_rewind", "writer");
    return Report(writer->impl->Rewind(n));
  });
}

kvfile_status kvfile_writer_common_prefix(const kvfile_writer* writer, const uint32_t* prompt, size_t prompt_count,
                                          uint64_t* out) {
  return CommonPrefix("kvfile_writer_common_prefix", "writer", writer, prompt, prompt_count, out);
}

kvfile_status kvfile_writer_token_count(const kvfile_writer* writer, uint64_t* out) {
  return Guarded([&] {
    if (writer == nullptr) return NullArgument("kvfile_writer_token_count", "writer");
    if (out == nullptr) return NullArgument("kvfile_writer_token_count", "out");
    *out = writer->impl->token_count();
    return KVFILE_OK;
  });
}

kvfile_status kvfile_writer_close(kvfile_writer* writer) {
  return Guarded([&] {
    if (writer == nullptr) return KVFILE_OK;
    std::unique_ptr<kvfile_writer> owned(writer);
    return Report(owned->impl->Close());
  });
}

// ---- Reading ----

kvfile_status kvfile_reader_open(const char* path, kvfile_reader** out) {
  return Guarded([&] {
    if (out == nullptr) return NullArgument("kvfile_reader_open", "out");
    *out = nullptr;
    if (path == nullptr) return NullArgument("kvfile_reader_open", "path");
    auto r = std::make_unique<kvfile_reader>();
    kvfile_status st = Report(kvfile::Reader::Open(path, kvfile::ReaderOptions{}, &r->impl));
    if (st == KVFILE_OK) *out = r.release();
    return st;
  });
}

void kvfile_reader_close(kvfile_reader* reader) { delete reader; }

kvfile_status kvfile_reader_token_count(const kvfile_reader* reader, uint64_t* out) {
  return Guarded([&] {
    if (reader == nullptr) return NullArgument("kvfile_reader_token_count", "reader");
    if (out == nullptr) return NullArgument("kvfile_reader_token_count", "out");
    *out = reader->impl->token_count();
    return KVFILE_OK;
  });
}

kvfile_status kvfile_reader_stream_layers(const kvfile_reader* reader, uint32_t stream, uint32_t* out,
                                          size_t capacity, size_t* count) {
  return Guarded([&] {
    if (reader == nullptr) return NullArgument("kvfile_reader_stream_layers", "reader");
    return CopyStreamLayers("kvfile_reader_stream_layers", reader->impl->geometry(), stream, out, capacity, count);
  });
}

kvfile_status kvfile_reader_tokens(const kvfile_reader* reader, uint32_t* out, size_t capacity, size_t* count) {
  return Guarded([&] {
    if (reader == nullptr) return NullArgument("kvfile_reader_tokens", "reader");
    std::span<const uint32_t> tokens = reader->impl->tokens();
    if (count != nullptr) *count = tokens.size();
    if (kvfile_status st = CheckCapacity("kvfile_reader_tokens: the buffer", tokens.size(), capacity);
        st != KVFILE_OK)
      return st;
    if (out == nullptr && !tokens.empty()) return NullArgument("kvfile_reader_tokens", "out");
    std::copy(tokens.begin(), tokens.end(), out);
    return KVFILE_OK;
  });
}

kvfile_status kvfile_reader_common_prefix(const kvfile_reader* reader, const uint32_t* prompt, size_t prompt_count,
                                          uint64_t* out) {
  return CommonPrefix("kvfile_reader_common_prefix", "reader", reader, prompt, prompt_count, out);
}

kvfile_status kvfile_reader_read_rows(kvfile_reader* reader, uint32_t layer, uint32_t stream, uint64_t begin,
                                      uint64_t end, kvfile_dtype out_dtype, void* dst, size_t dst_bytes) {
  return Guarded([&] {
    if (reader == nullptr) return NullArgument("kvfile_reader_read_rows", "reader");
    if (out_dtype != KVFILE_BF16 && out_dtype != KVFILE_F16 && out_dtype != KVFILE_F32)
      return Fail(KVFILE_INVALID_ARGUMENT, "kvfile_reader_read_rows: decoded reads produce bf16, f16 or f32");
    const kvfile::Reader& r = *reader->impl;
    uint64_t rows = RowsInRead(r, layer, stream, begin, end);
    if (rows > 0) {
      uint64_t need = rows * r.geometry().streams[stream].row_width * kvfile_dtype_size(out_dtype);
      if (kvfile_status st = CheckCapacity("kvfile_reader_read_rows: dst_bytes", need, dst_bytes); st != KVFILE_OK)
        return st;
      if (dst == nullptr) return NullArgument("kvfile_reader_read_rows", "dst");
    }
    return Report(reader->impl->ReadRows(layer, stream, begin, end, static_cast<Dtype>(out_dtype), dst));
  });
}

kvfile_status kvfile_reader_read_parts(kvfile_reader* reader, uint32_t layer, uint32_t stream, uint64_t begin,
                                       uint64_t end, const kvfile_parts* parts) {
  return Guarded([&] {
    if (parts == nullptr) return NullArgument("kvfile_reader_read_parts", "parts");
    return ReadParts("kvfile_reader_read_parts", reader, layer, stream, begin, end, *parts, kPartsNames);
  });
}

kvfile_status kvfile_reader_read_nvfp4_codes(kvfile_reader* reader, uint32_t layer, uint32_t stream, uint64_t begin,
                                             uint64_t end, uint8_t* codes, size_t codes_bytes, uint8_t* block_scales,
                                             size_t block_scales_bytes, float* scales, size_t scale_count) {
  return Guarded([&] {
    const kvfile_parts p{KVFILE_NVFP4, codes, codes_bytes, scales, scale_count, block_scales, block_scales_bytes};
    return ReadParts("kvfile_reader_read_nvfp4_codes", reader, layer, stream, begin, end, p,
                     {"codes_bytes", "block_scales_bytes", "scale_count", "codes", "block_scales", "scales"});
  });
}

// The codes of the stream's own fp8 dtype, or of a v1 file's rows as e4m3.
kvfile_status kvfile_reader_read_codes(kvfile_reader* reader, uint32_t layer, uint32_t stream, uint64_t begin,
                                       uint64_t end, uint8_t* codes, size_t codes_bytes, float* scales,
                                       size_t scale_count) {
  return Guarded([&] {
    kvfile_parts p{KVFILE_E4M3, codes, codes_bytes, scales, scale_count, nullptr, 0};
    if (reader != nullptr && stream < reader->impl->geometry().streams.size() &&
        kvfile::IsFp8(reader->impl->geometry().streams[stream].dtype))
      p.dtype = static_cast<kvfile_dtype>(reader->impl->geometry().streams[stream].dtype);
    return ReadParts("kvfile_reader_read_codes", reader, layer, stream, begin, end, p,
                     {"codes_bytes", "", "scale_count", "codes", "", "scales"});
  });
}

kvfile_status kvfile_reader_read_many(kvfile_reader* reader, uint64_t begin, uint64_t end, kvfile_dtype out_dtype,
                                      const kvfile_rows_target* targets, size_t target_count, unsigned threads) {
  return Guarded([&] {
    if (reader == nullptr) return NullArgument("kvfile_reader_read_many", "reader");
    if (targets == nullptr && target_count > 0) return NullArgument("kvfile_reader_read_many", "targets");
    if (out_dtype != KVFILE_BF16 && out_dtype != KVFILE_F16 && out_dtype != KVFILE_F32)
      return Fail(KVFILE_INVALID_ARGUMENT, "kvfile_reader_read_many: decoded reads produce bf16, f16 or f32");
    const kvfile::Reader& r = *reader->impl;
    std::vector<kvfile::RowsTarget> many;
    many.reserve(target_count);
    for (size_t i = 0; i < target_count; ++i) {
      const kvfile_rows_target& t = targets[i];
      uint64_t rows = RowsInRead(r, t.layer, t.stream, begin, end);
      if (rows > 0) {
        uint64_t need = rows * r.geometry().streams[t.stream].row_width * kvfile_dtype_size(out_dtype);
        std::string what = "kvfile_reader_read_many: targets[" + std::to_string(i) + "].dst_bytes";
        if (kvfile_status st = CheckCapacity(what, need, t.dst_bytes); st != KVFILE_OK) return st;
        if (t.dst == nullptr) return NullArgument("kvfile_reader_read_many", "targets[" + std::to_string(i) + "].dst");
      }
      many.push_back({t.layer, t.stream, t.dst});
    }
    return Report(reader->impl->ReadMany(many, begin, end, static_cast<Dtype>(out_dtype), ReadThreads(threads)));
  });
}

kvfile_status kvfile_reader_read_codes_many(kvfile_reader* reader, uint64_t begin, uint64_t end,
                                            const kvfile_codes_target* targets, size_t target_count,
                                            unsigned threads) {
  return Guarded([&] {
    if (reader == nullptr) return NullArgument("kvfile_reader_read_codes_many", "reader");
    if (targets == nullptr && target_count > 0) return NullArgument("kvfile_reader_read_codes_many", "targets");
    const kvfile::Reader& r = *reader->impl;
    std::vector<kvfile::CodesTarget> many;
    many.reserve(target_count);
    for (size_t i = 0; i < target_count; ++i) {
      const kvfile_codes_target& t = targets[i];
      uint64_t rows = RowsInRead(r, t.layer, t.stream, begin, end);
      if (rows > 0) {
        std::string target = "targets[" + std::to_string(i) + "]";
        std::string where = "kvfile_reader_read_codes_many: " + target;
        uint64_t need_codes = rows * r.geometry().streams[t.stream].row_width;
        if (kvfile_status st = CheckCapacity(where + ".codes_bytes", need_codes, t.codes_bytes); st != KVFILE_OK)
          return st;
        if (kvfile_status st = CheckCapacity(where + ".scale_count", rows, t.scale_count); st != KVFILE_OK)
          return st;
        if (t.codes == nullptr) return NullArgument("kvfile_reader_read_codes_many", target + ".codes");
        if (t.scales == nullptr) return NullArgument("kvfile_reader_read_codes_many", target + ".scales");
      }
      many.push_back({t.layer, t.stream, t.codes, t.scales});
    }
    return Report(reader->impl->ReadManyCodes(many, begin, end, ReadThreads(threads)));
  });
}

kvfile_status kvfile_reader_read_parts_many(kvfile_reader* reader, uint64_t begin, uint64_t end,
                                            const kvfile_parts_target* targets, size_t target_count,
                                            unsigned threads) {
  return Guarded([&] {
    constexpr const char* kFunction = "kvfile_reader_read_parts_many";
    if (reader == nullptr) return NullArgument(kFunction, "reader");
    if (targets == nullptr && target_count > 0) return NullArgument(kFunction, "targets");
    kvfile::Reader& r = *reader->impl;
    // Checked whole first: dtypes, ranges, sizes and pointers.
    for (size_t i = 0; i < target_count; ++i) {
      const kvfile_parts_target& t = targets[i];
      const std::string what = "targets[" + std::to_string(i) + "].parts.";
      if (!IsDtype(t.parts.dtype))
        return Fail(KVFILE_INVALID_ARGUMENT, std::string(kFunction) + ": " + what + "dtype " +
                                                 std::to_string(static_cast<int>(t.parts.dtype)) + " is invalid");
      const Dtype dtype = static_cast<Dtype>(t.parts.dtype);
      const Geometry& g = r.geometry();
      const std::string where = std::string(kFunction) + ": targets[" + std::to_string(i) + "]: ";
      if (t.layer >= g.layers)
        return Fail(KVFILE_INVALID_ARGUMENT, where + "layer " + std::to_string(t.layer) + " out of range (" +
                                                 std::to_string(g.layers) + " layers)");
      if (t.stream >= g.streams.size())
        return Fail(KVFILE_INVALID_ARGUMENT, where + "stream " + std::to_string(t.stream) + " out of range (" +
                                                 std::to_string(g.streams.size()) + " streams)");
      if (!g.InLayer(t.layer, t.stream))
        return Fail(KVFILE_INVALID_ARGUMENT, where + "stream '" + g.streams[t.stream].name + "' is not in layer " +
                                                 std::to_string(t.layer));
      if (RowsInRead(r, t.layer, t.stream, begin, end) == 0) continue;  // an empty or invalid range: the reader's
      const kvfile::StreamSpec& spec = g.streams[t.stream];
      if (kvfile::IsQuantized(dtype) && (r.major_version() > 1 ? dtype != spec.dtype : !kvfile::IsFp8(dtype)))
        return Fail(KVFILE_INVALID_ARGUMENT,
                    std::string(kFunction) + ": " + what + "dtype: stream '" + spec.name + "' is " +
                        (r.major_version() > 1 ? kvfile::DtypeName(spec.dtype)
                                               : "raw rows in a format 1 file, quantized as e4m3 or e5m2 only") +
                        ", not " + kvfile::DtypeName(dtype));
      if (kvfile_status st = CheckParts(kFunction, what, t.parts, dtype, spec, end - begin, kPartsNames, true);
          st != KVFILE_OK)
        return st;
    }
    // One pass per dtype (a v1 file's rows are quantized as the targets' fp8
    // dtype; a raw dtype decodes to itself).
    kvfile::Status st;
    for (uint8_t v = 1; v <= kvfile::kDtypeCount && st.ok(); ++v) {
      const Dtype dtype = static_cast<Dtype>(v);
      std::vector<kvfile::RowsTarget> rows;
      std::vector<kvfile::CodesTarget> codes;
      for (size_t i = 0; i < target_count; ++i) {
        const kvfile_parts_target& t = targets[i];
        if (static_cast<Dtype>(t.parts.dtype) != dtype) continue;
        if (kvfile::IsQuantized(dtype))
          codes.push_back({t.layer, t.stream, static_cast<uint8_t*>(t.parts.data), t.parts.scales, t.parts.block_scales});
        else
          rows.push_back({t.layer, t.stream, t.parts.data});
      }
      if (!rows.empty()) st = r.ReadMany(rows, begin, end, dtype, ReadThreads(threads));
      if (!codes.empty() && st.ok()) st = r.ReadManyCodes(codes, begin, end, ReadThreads(threads), dtype);
    }
    if (!st.ok()) {  // the contract: no target keeps data of a pass that succeeded
      for (size_t i = 0; i < target_count; ++i) {
        const kvfile_parts_target& t = targets[i];
        if (RowsInRead(r, t.layer, t.stream, begin, end) == 0) continue;
        const Dtype dtype = static_cast<Dtype>(t.parts.dtype);
        const kvfile::DtypeInfo& info = *kvfile::FindDtype(dtype);
        const kvfile::StreamSpec& spec = r.geometry().streams[t.stream];
        const kvfile::CodecRows cr = kvfile::CodecRowsOf(dtype, spec.rows_per_token, spec.row_width);
        for (size_t k = 0; k < info.part_count; ++k) {
          const CPart c = PartOf(t.parts, info.parts[k], kPartsNames);
          std::memset(c.data, 0, kvfile::PartBytes(dtype, info.parts[k], (end - begin) * cr.per_token, cr.width));
        }
      }
    }
    return Report(st);
  });
}

kvfile_status kvfile_reader_info(const kvfile_reader* reader, kvfile_info* out) {
  return Guarded([&] {
    if (reader == nullptr) return NullArgument("kvfile_reader_info", "reader");
    if (out == nullptr) return NullArgument("kvfile_reader_info", "out");
    const kvfile::Reader& r = *reader->impl;
    *out = kvfile_info{};
    out->major_version = r.major_version();
    out->minor_version = r.minor_version();
    CopyString(r.identity().model_id, out->model_id, sizeof out->model_id);
    out->fingerprint = r.identity().fingerprint;
    FromGeometry(r.geometry(), &out->geometry);
    out->tokens = r.token_count();
    out->chunks = r.chunks().size();
    out->nominal_chunk_tokens = r.nominal_chunk_tokens();
    out->bytes = r.tail().file_size;
    out->torn_tail_bytes = r.tail().torn_tail_bytes;
    out->damage_before_end = r.tail().valid_data_follows ? 1 : 0;
    out->committed_data_missing = r.tail().committed_data_missing ? 1 : 0;
    out->committed_tokens_missing = r.tail().committed_tokens_missing;
    out->committed_bytes_missing = r.tail().committed_bytes_missing;
    return KVFILE_OK;
  });
}

// ---- Verifying ----

kvfile_status kvfile_verify(const char* path, int quick, kvfile_verify_result* out) {
  return Guarded([&] {
    if (path == nullptr) return NullArgument("kvfile_verify", "path");
    if (out == nullptr) return NullArgument("kvfile_verify", "out");
    *out = kvfile_verify_result{};
    kvfile::VerifyOptions options;
    options.quick = quick != 0;
    kvfile::VerifyReport report;
    if (kvfile_status st = Report(kvfile::VerifyFile(path, options, &report)); st != KVFILE_OK) return st;
    for (const kvfile::VerifyFinding& f : report.findings) ++(f.error ? out->errors : out->warnings);
    out->ok = out->errors == 0 ? 1 : 0;
    out->major_version = report.major;
    out->minor_version = report.minor;
    out->tokens = report.tokens;
    out->chunks = report.chunks;
    out->bytes = report.bytes;
    out->torn_tail_bytes = report.torn_tail_bytes;
    if (!report.findings.empty())
      CopyString(report.findings.front().message, out->first_message, sizeof out->first_message);
    return KVFILE_OK;
  });
}

// ---- Repair ----

static_assert(KVFILE_FINDING_UNREADABLE == static_cast<int>(kvfile::VerifyFindingKind::kUnreadable) &&
              KVFILE_FINDING_COMMIT_SLOT == static_cast<int>(kvfile::VerifyFindingKind::kCommitSlot) &&
              KVFILE_FINDING_DAMAGED_CHUNK == static_cast<int>(kvfile::VerifyFindingKind::kDamagedChunk) &&
              KVFILE_FINDING_TORN_TAIL == static_cast<int>(kvfile::VerifyFindingKind::kTornTail) &&
              KVFILE_FINDING_DAMAGE_BEFORE_END == static_cast<int>(kvfile::VerifyFindingKind::kDamageBeforeEnd) &&
              KVFILE_FINDING_COMMITTED_DATA_MISSING ==
                  static_cast<int>(kvfile::VerifyFindingKind::kCommittedDataMissing));

static kvfile_finding_kind FindingKind(const kvfile::VerifyFinding* f) {
  return f ? static_cast<kvfile_finding_kind>(f->kind) : KVFILE_FINDING_NONE;
}

kvfile_status kvfile_repair(const char* path, unsigned flags, kvfile_repair_result* out) {
  return Guarded([&] {
    if (path == nullptr) return NullArgument("kvfile_repair", "path");
    if (out == nullptr) return NullArgument("kvfile_repair", "out");
    *out = kvfile_repair_result{};
    out->refused_kind = out->cut_kind = KVFILE_FINDING_NONE;
    if ((flags & ~(KVFILE_REPAIR_FORCE | KVFILE_REPAIR_DRY_RUN)) != 0)
      return Fail(KVFILE_INVALID_ARGUMENT, "kvfile_repair: unknown flags " + std::to_string(flags));
    kvfile::RepairOptions options;
    options.force = (flags & KVFILE_REPAIR_FORCE) != 0;
    options.dry_run = (flags & KVFILE_REPAIR_DRY_RUN) != 0;
    kvfile::RepairReport rep;
    Status st = kvfile::Repair(path, options, &rep);
    out->healthy = rep.healthy;
    out->repaired = rep.repaired;
    out->upgrade = rep.upgrade || rep.recovery.upgraded_from_v1;
    out->slot_rewritten = rep.recovery.slot_rewritten;
    out->leftover_removed = rep.leftover_removed;
    out->refused_kind = FindingKind(rep.refused_finding());
    out->cut_kind = FindingKind(rep.cut_finding());
    out->findings = rep.check.findings.size();
    if (rep.cut >= 0) {
      out->cut_offset = rep.check.valid_end;
      out->cut_bytes = rep.repaired ? rep.recovery.truncated_bytes : rep.check.torn_tail_bytes;
    }
    out->recommitted_chunks = rep.recovery.recommitted_chunks;
    out->committed_tokens_lost = rep.repaired ? rep.recovery.dropped_committed_tokens : rep.committed_tokens_lost;
    out->tokens = rep.repaired || rep.healthy ? rep.tokens : rep.check.tokens;
    if (!st.ok())
      CopyString(st.message(), out->message, sizeof out->message);
    else if (!rep.check.findings.empty())
      CopyString(rep.check.findings.front().message, out->message, sizeof out->message);
    return Report(st);
  });
}

// ---- Prefix lookup ----

static_assert(KVFILE_PATH_CAPACITY == kvfile::index::kMaxPathBytes + 1);
static_assert(KVFILE_MODEL_ID_CAPACITY == kvfile::index::kMaxModelIdBytes + 1);

kvfile_status kvfile_find_prefix(const char* path, const uint32_t* tokens, size_t token_count,
                                 const uint64_t* model_fingerprint, kvfile_prefix_match* out) {
  return Guarded([&] {
    if (path == nullptr) return NullArgument("kvfile_find_prefix", "path");
    if (tokens == nullptr && token_count > 0) return NullArgument("kvfile_find_prefix", "tokens");
    if (out == nullptr) return NullArgument("kvfile_find_prefix", "out");
    *out = kvfile_prefix_match{};
    kvfile::PrefixFindOptions options;
    if (model_fingerprint) options.fingerprint = *model_fingerprint;
    std::optional<kvfile::PrefixMatch> m;
    if (kvfile_status st = Report(kvfile::FindPrefix(path, std::span<const uint32_t>(tokens, token_count), options, &m));
        st != KVFILE_OK)
      return st;
    if (!m) return KVFILE_OK;
    if (m->path.size() >= sizeof out->path)
      return Fail(KVFILE_BUFFER_TOO_SMALL, path, ": member name longer than KVFILE_PATH_CAPACITY - 1");
    out->found = 1;
    CopyString(m->path, out->path, sizeof out->path);
    CopyString(m->model_id, out->model_id, sizeof out->model_id);
    out->fingerprint = m->fingerprint;
    out->tokens = m->tokens;
    out->matched = m->matched;
    return KVFILE_OK;
  });
}

kvfile_status kvfile_index_directory(const char* dir) {
  return Guarded([&] {
    if (dir == nullptr) return NullArgument("kvfile_index_directory", "dir");
    return Report(kvfile::IndexDirectory(dir, nullptr, nullptr));
  });
}

}  // extern "C"

// ---- Packs ----------------------------------------------------------------------

kvfile_status kvfile_pack_files(const char* dest, const char* const* paths, const char* const* names, size_t count,
                                uint32_t chunk_tokens) {
  return Guarded([&] {
    if (dest == nullptr) return NullArgument("kvfile_pack_files", "dest");
    if (count > 0 && paths == nullptr) return NullArgument("kvfile_pack_files", "paths");
    if (count > 0 && names == nullptr) return NullArgument("kvfile_pack_files", "names");
    for (size_t i = 0; i < count; ++i)
      if (paths[i] == nullptr || names[i] == nullptr)
        return Fail(KVFILE_INVALID_ARGUMENT, "kvfile_pack_files: path or name " + std::to_string(i) + " is NULL");
    if (kvfile_status st = RefuseExisting(kvfile::FileSystem::Default(), dest); st != KVFILE_OK) return st;
    kvfile::PackWriterOptions options;
    if (chunk_tokens) options.chunk_tokens = chunk_tokens;
    std::unique_ptr<kvfile::PackWriter> w;
    if (kvfile_status st = Report(kvfile::PackWriter::Begin(dest, options, &w)); st != KVFILE_OK) return st;
    for (size_t i = 0; i < count; ++i)
      if (kvfile_status st = Report(w->AddFile(names[i], paths[i])); st != KVFILE_OK) return st;
    return Report(w->Finish());
  });
}

kvfile_status kvfile_pack_open(const char* path, kvfile_pack** out) {
  return Guarded([&] {
    if (out == nullptr) return NullArgument("kvfile_pack_open", "out");
    *out = nullptr;
    if (path == nullptr) return NullArgument("kvfile_pack_open", "path");
    auto p = std::make_unique<kvfile_pack>();
    kvfile_status st = Report(kvfile::PackReader::Open(path, nullptr, &p->impl));
    if (st == KVFILE_OK) *out = p.release();
    return st;
  });
}

void kvfile_pack_close(kvfile_pack* pack) { delete pack; }

namespace {
// The member at `index`, or a failure naming the function.
kvfile_status PackMember(const kvfile_pack* pack, size_t index, const char* fn, const kvfile::PackMember** out) {
  if (pack == nullptr) return NullArgument(fn, "pack");
  if (index >= pack->impl->members().size())
    return Fail(KVFILE_INVALID_ARGUMENT, std::string(fn) + ": member " + std::to_string(index) + " of " +
                                             std::to_string(pack->impl->members().size()));
  *out = &pack->impl->members()[index];
  return KVFILE_OK;
}
}  // namespace

kvfile_status kvfile_pack_member_count(const kvfile_pack* pack, size_t* out) {
  return Guarded([&] {
    if (pack == nullptr) return NullArgument("kvfile_pack_member_count", "pack");
    if (out == nullptr) return NullArgument("kvfile_pack_member_count", "out");
    *out = pack->impl->members().size();
    return KVFILE_OK;
  });
}

kvfile_status kvfile_pack_member_name(const kvfile_pack* pack, size_t index, char* out, size_t capacity,
                                      size_t* length) {
  return Guarded([&] {
    const kvfile::PackMember* m = nullptr;
    if (kvfile_status st = PackMember(pack, index, "kvfile_pack_member_name", &m); st != KVFILE_OK) return st;
    if (length != nullptr) *length = m->name.size();
    if (kvfile_status st = CheckCapacity("kvfile_pack_member_name: capacity", m->name.size() + 1, capacity);
        st != KVFILE_OK)
      return st;
    if (out == nullptr) return NullArgument("kvfile_pack_member_name", "out");
    CopyString(m->name, out, capacity);
    return KVFILE_OK;
  });
}

kvfile_status kvfile_pack_member_tokens(const kvfile_pack* pack, size_t index, uint64_t* out) {
  return Guarded([&] {
    const kvfile::PackMember* m = nullptr;
    if (kvfile_status st = PackMember(pack, index, "kvfile_pack_member_tokens", &m); st != KVFILE_OK) return st;
    if (out == nullptr) return NullArgument("kvfile_pack_member_tokens", "out");
    *out = m->token_count;
    return KVFILE_OK;
  });
}

kvfile_status kvfile_pack_find(const kvfile_pack* pack, const char* name, size_t* index) {
  return Guarded([&] {
    if (pack == nullptr) return NullArgument("kvfile_pack_find", "pack");
    if (name == nullptr) return NullArgument("kvfile_pack_find", "name");
    if (index == nullptr) return NullArgument("kvfile_pack_find", "index");
    std::optional<size_t> i = pack->impl->Find(name);
    if (!i) return Fail(KVFILE_NOT_FOUND, pack->impl->path() + ": no member '" + name + "'");
    *index = *i;
    return KVFILE_OK;
  });
}

kvfile_status kvfile_pack_materialize(kvfile_pack* pack, size_t index, const char* dest) {
  return Guarded([&] {
    const kvfile::PackMember* m = nullptr;
    if (kvfile_status st = PackMember(pack, index, "kvfile_pack_materialize", &m); st != KVFILE_OK) return st;
    if (dest == nullptr) return NullArgument("kvfile_pack_materialize", "dest");
    return Report(pack->impl->Materialize(index, dest));
  });
}

kvfile_status kvfile_pack_verify(kvfile_pack* pack) {
  return Guarded([&] {
    if (pack == nullptr) return NullArgument("kvfile_pack_verify", "pack");
    return Report(pack->impl->Verify(nullptr));
  });
}

// ---- Converting between formats ----

namespace {

static_assert(KVFILE_FORMAT_KV == static_cast<int>(kvfile::Format::kKv) + 1 &&
              KVFILE_FORMAT_COLI == static_cast<int>(kvfile::Format::kColi) + 1 &&
              KVFILE_FORMAT_COLI == kvfile::kFormatCount);

// The names of a comma-separated list (NULL or "": none; empty names skipped).
std::vector<std::string> CommaList(const char* list) {
  std::vector<std::string> names;
  for (std::string_view rest = list ? list : ""; !rest.empty();) {
    size_t comma = rest.find(',');
    std::string_view name = rest.substr(0, comma);
    if (!name.empty()) names.emplace_back(name);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  return names;
}

bool IsFormat(kvfile_format f) { return f >= KVFILE_FORMAT_KV && f <= KVFILE_FORMAT_COLI; }

kvfile_status ToChoice(int c, const char* field, std::optional<bool>* out) {
  if (c == KVFILE_CHOICE_DEFAULT) {
    out->reset();
  } else if (c == KVFILE_CHOICE_YES || c == KVFILE_CHOICE_NO) {
    *out = c == KVFILE_CHOICE_YES;
  } else {
    return Fail(KVFILE_INVALID_ARGUMENT,
                std::string("kvfile_convert: options->") + field + " " + std::to_string(c) + " is no kvfile_choice");
  }
  return KVFILE_OK;
}

kvfile_status ToConvertOptions(const kvfile_convert_options& c, kvfile::ConvertOptions* o) {
  if (c.to != KVFILE_FORMAT_AUTO) {
    if (!IsFormat(c.to))
      return Fail(KVFILE_INVALID_ARGUMENT, "kvfile_convert: options->to " + std::to_string(static_cast<int>(c.to)) +
                                               " is no kvfile_format");
    o->to = static_cast<kvfile::Format>(c.to - 1);
  }
  if (c.kv_major != 0) o->kv_major = c.kv_major;
  if (static_cast<int>(c.dtype) != 0) {
    if (!IsDtype(c.dtype))
      return Fail(KVFILE_INVALID_ARGUMENT, "kvfile_convert: options->dtype " +
                                               std::to_string(static_cast<int>(c.dtype)) + " is no kvfile_dtype");
    o->dtype = static_cast<Dtype>(c.dtype);
  }
  o->every_stream = c.every_stream != 0;
  for (std::string& name : CommaList(c.keep_raw)) o->keep_raw.insert(std::move(name));
  o->codes = c.codes != 0;
  if (c.chunk_tokens != 0) o->chunk_tokens = c.chunk_tokens;
  o->salvage = c.salvage != 0;
  o->force = c.force != 0;
  if (c.llama_head_size != 0) o->llama.head_size = c.llama_head_size;
  if (c.mooncake_group_size != 0) o->mooncake.group_size = c.mooncake_group_size;
  if (c.coli_vocab != 0) o->coli.vocab = c.coli_vocab;
  o->coli.v1 = c.coli_v1 != 0;
  if (c.coli_indexer_layers != nullptr) o->coli.indexer_layers = c.coli_indexer_layers;
  std::optional<bool> rotated, v_trans;
  if (kvfile_status st = ToChoice(c.llama_rotated, "llama_rotated", &rotated); st != KVFILE_OK) return st;
  if (kvfile_status st = ToChoice(c.llama_v_trans, "llama_v_trans", &v_trans); st != KVFILE_OK) return st;
  if (c.llama_model != nullptr) o->llama.model = c.llama_model;
  o->llama.rotated = rotated;
  o->llama.unrotate = c.llama_unrotate != 0;
  o->llama.session = c.llama_session != 0;
  if (c.llama_type != nullptr) o->llama.type = c.llama_type;
  if (v_trans) o->llama.v_trans = *v_trans ? 1 : 0;
  if (c.llama_arch != nullptr) o->llama.arch = c.llama_arch;
  if (c.llama_n_stream != 0) o->llama.n_stream = c.llama_n_stream;
  return KVFILE_OK;
}

}  // namespace

extern "C" {

kvfile_status kvfile_convert(const char* in, const char* out, const kvfile_convert_options* options,
                             kvfile_convert_result* result) {
  return Guarded([&] {
    if (in == nullptr) return NullArgument("kvfile_convert", "in");
    if (out == nullptr) return NullArgument("kvfile_convert", "out");
    kvfile::ConvertOptions o;
    if (options != nullptr)
      if (kvfile_status st = ToConvertOptions(*options, &o); st != KVFILE_OK) return st;
    kvfile::ConvertReport report;
    kvfile_status st = Report(kvfile::Convert(in, out, o, &report));
    if (st != KVFILE_OK || result == nullptr) return st;
    *result = {};
    result->from = static_cast<kvfile_format>(static_cast<int>(report.from) + 1);
    result->to = static_cast<kvfile_format>(static_cast<int>(report.to) + 1);
    result->tokens = report.tokens;
    result->warnings = static_cast<uint32_t>(report.warnings.size());
    std::string joined;
    for (const std::string& w : report.warnings) joined += (joined.empty() ? "" : "; ") + w;
    CopyString(report.summary, result->summary, sizeof result->summary);
    CopyString(joined, result->warning, sizeof result->warning);
    return KVFILE_OK;
  });
}

}  // extern "C"

// ---- Appending a safetensors file ----

namespace {

static_assert(KVFILE_SYNC_CLOSE == 0, "an all-zero kvfile_append_options syncs at close, the default");

kvfile_status ToAppendOptions(const kvfile_append_options& c, kvfile::AppendOptions* o) {
  auto dtype = [](int d, const char* field, std::optional<Dtype>* out) {
    if (d == 0) return KVFILE_OK;
    if (!IsDtype(static_cast<kvfile_dtype>(d)))
      return Fail(KVFILE_INVALID_ARGUMENT, std::string("kvfile_append_safetensors: options->") + field + " " +
                                               std::to_string(d) + " is no kvfile_dtype");
    *out = static_cast<Dtype>(d);
    return KVFILE_OK;
  };
  if (c.model != nullptr) o->model = c.model;
  if (kvfile_status st = dtype(c.dtype, "dtype", &o->dtype); st != KVFILE_OK) return st;
  if (kvfile_status st = dtype(c.upgrade_dtype, "upgrade_dtype", &o->upgrade_dtype); st != KVFILE_OK) return st;
  o->keep_raw = CommaList(c.keep_raw);
  if (c.chunk_tokens != 0) o->chunk_tokens = c.chunk_tokens;
  switch (c.sync) {
    case KVFILE_SYNC_CLOSE: o->sync = kvfile::SyncMode::kClose; break;
    case KVFILE_SYNC_CHUNK: o->sync = kvfile::SyncMode::kChunk; break;
    case KVFILE_SYNC_NONE: o->sync = kvfile::SyncMode::kNone; break;
    default:
      return Fail(KVFILE_INVALID_ARGUMENT,
                  "kvfile_append_safetensors: options->sync " + std::to_string(c.sync) + " is no kvfile_sync_mode");
  }
  return KVFILE_OK;
}

}  // namespace

extern "C" {

kvfile_status kvfile_append_safetensors(const char* file, const char* input, const kvfile_append_options* options,
                                        kvfile_append_result* result) {
  return Guarded([&] {
    if (file == nullptr) return NullArgument("kvfile_append_safetensors", "file");
    if (input == nullptr) return NullArgument("kvfile_append_safetensors", "input");
    if (result != nullptr) *result = {};
    kvfile::AppendOptions o;
    if (options != nullptr)
      if (kvfile_status st = ToAppendOptions(*options, &o); st != KVFILE_OK) return st;
    kvfile::AppendReport report;
    kvfile_status st = Report(kvfile::AppendSafetensors(file, input, o, &report));
    if (st != KVFILE_OK || result == nullptr) return st;
    result->created = report.created;
    result->upgraded = report.upgraded_from_v1;
    result->tokens_before = report.tokens_before;
    result->tokens_appended = report.input_tokens;
    if (!report.notes.empty()) CopyString(report.notes.front(), result->note, sizeof result->note);
    return KVFILE_OK;
  });
}

}  // extern "C"
