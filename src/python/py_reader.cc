// SPDX-License-Identifier: Apache-2.0
// kvfile.Reader: an open .kv file (v1 or v2) read from Python.
//
// Reads return new numpy arrays. With a layer they are shaped
// [tokens, rows_per_token, row_width] (scales [tokens, rows_per_token]);
// with layer=None every layer is read, shaped [layers, tokens, ...]: the
// shape Writer.append takes, so what was appended reads back as it was given.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "errors.h"
#include "geometry_dict.h"
#include "guarded.h"
#include "kvfile/codec.h"
#include "kvfile/dtype.h"
#include "kvfile/reader.h"
#include "kvfile/formats/safetensors.h"

namespace py = pybind11;

namespace kvfile::python {

namespace {

// What one read() or codes() call covers.
struct Selection {
  uint32_t stream = 0;
  uint32_t first_layer = 0, layer_count = 0;
  std::vector<uint32_t> layers;  // read, in order: the stream's layers (layer sets), or the one asked for
  bool all_layers = false;  // the result gets a leading layer axis
  uint64_t begin = 0, end = 0;

  // The result's shape: [layers,] tokens, then `tail`.
  std::vector<py::ssize_t> Shape(std::initializer_list<py::ssize_t> tail) const {
    return Shape(std::vector<py::ssize_t>(tail));
  }
  std::vector<py::ssize_t> Shape(const std::vector<py::ssize_t>& tail) const {
    std::vector<py::ssize_t> shape;
    if (all_layers) shape.push_back(layer_count);
    shape.push_back(static_cast<py::ssize_t>(end - begin));
    shape.insert(shape.end(), tail.begin(), tail.end());
    return shape;
  }
};

// A caller's writable, C-contiguous buffer (buffer protocol), held while a
// bulk read writes into it. Released with the GIL held (destruction).
class WritableBuffer {
 public:
  // `what` names the buffer in messages; `bytes` and `itemsize` are what
  // the read needs.
  WritableBuffer(py::handle obj, const std::string& what, size_t bytes, size_t itemsize) {
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) {
      PyErr_Clear();
      throw py::type_error(what + ": expected a writable C-contiguous buffer (a numpy array, or a CPU torch "
                                  "tensor's .numpy()), got " +
                           py::str(py::type::of(obj).attr("__name__")).cast<std::string>());
    }
    held_ = true;
    if (static_cast<size_t>(view_.len) != bytes || static_cast<size_t>(view_.itemsize) != itemsize)
      throw py::value_error(what + ": the buffer holds " + std::to_string(view_.len) + " bytes of " +
                            std::to_string(view_.itemsize) + "-byte items; the read needs " + std::to_string(bytes) +
                            " bytes of " + std::to_string(itemsize) + "-byte items");
  }
  WritableBuffer(const WritableBuffer&) = delete;
  WritableBuffer& operator=(const WritableBuffer&) = delete;
  ~WritableBuffer() {
    if (held_) PyBuffer_Release(&view_);
  }
  void* data() const { return view_.buf; }

 private:
  Py_buffer view_{};
  bool held_ = false;
};

// What one read_all() or codes_all() call covers: streams, a layer range, tokens.
struct BulkSelection {
  std::vector<uint32_t> streams;
  uint32_t first_layer = 0, layer_count = 0;
  uint64_t begin = 0, end = 0;
  unsigned threads = 1;
};

class PyReader {
 public:
  explicit PyReader(std::unique_ptr<Reader> reader) : guarded_(std::move(reader), "reader") {}

  void Close() { guarded_.Reset(); }

  // Copies, so that no reference into the reader outlives the mutex.
  Geometry GetGeometry() { return guarded_.Inspect([](Reader& r) { return r.geometry(); }); }
  std::vector<uint32_t> Tokens() {
    return guarded_.Inspect([](Reader& r) { return std::vector<uint32_t>(r.tokens().begin(), r.tokens().end()); });
  }
  uint64_t TokenCount() { return guarded_.Inspect([](Reader& r) { return r.token_count(); }); }
  std::string Path() { return guarded_.Inspect([](Reader& r) { return r.path(); }); }
  uint64_t LongestCommonPrefix(py::handle tokens) {
    const std::vector<uint32_t> prompt = TokenIds(tokens);
    return guarded_.Inspect([&](Reader& r) { return r.LongestCommonPrefix(prompt); });
  }

  // Token ranges and layers out of bounds are left to the library, which
  // names them in an InvalidArgumentError.
  Selection Select(const Geometry& g, py::handle stream, std::optional<uint32_t> layer, uint64_t start,
                   std::optional<uint64_t> stop) {
    Selection sel;
    sel.stream = StreamIndex(g, stream);
    sel.all_layers = !layer.has_value();
    sel.first_layer = layer.value_or(0);
    // Every layer the stream is in (FORMAT.md 3.2: maybe not all of them).
    if (layer) sel.layers = {*layer};
    for (uint32_t l = 0; !layer && l < g.layers; ++l)
      if (g.InLayer(l, sel.stream)) sel.layers.push_back(l);
    sel.layer_count = static_cast<uint32_t>(sel.layers.size());
    sel.begin = start;
    sel.end = stop ? *stop : TokenCount();
    if (sel.end < sel.begin)
      throw py::value_error("stop (" + std::to_string(sel.end) + ") is before start (" +
                            std::to_string(sel.begin) + ")");
    return sel;
  }

  py::array Read(py::handle stream, std::optional<uint32_t> layer, uint64_t start,
                 std::optional<uint64_t> stop, py::handle dtype) {
    const Dtype out_dtype = DecodedDtype(dtype);
    const Geometry g = GetGeometry();
    const Selection sel = Select(g, stream, layer, start, stop);
    const StreamSpec& spec = g.streams[sel.stream];
    py::array result(NumpyDtype(out_dtype), sel.Shape({spec.rows_per_token, spec.row_width}));
    auto* dst = static_cast<char*>(result.mutable_data());
    const size_t layer_bytes = (sel.end - sel.begin) * spec.ElementsPerToken() * ElementSize(out_dtype);
    guarded_.Run([&](Reader& r) -> Status {
      for (uint32_t i = 0; i < sel.layer_count; ++i)
        KVFILE_RETURN_IF_ERROR(r.ReadRows(sel.layers[i], sel.stream, sel.begin, sel.end, out_dtype,
                                          dst + i * layer_bytes));
      return Status::OK();
    });
    return result;
  }

  py::object Codes(py::handle stream, std::optional<uint32_t> layer, uint64_t start,
                  std::optional<uint64_t> stop, const std::string& v1_as) {
    const Dtype v1_quantize_as = DtypeByName(v1_as);
    const Geometry g = GetGeometry();
    const Selection sel = Select(g, stream, layer, start, stop);
    const StreamSpec& spec = g.streams[sel.stream];
    // The codes' dtype: the stream's, or a v1 file's raw rows quantized as
    // v1_as. One array per part of it (kvfile/dtype.h), per token: fp8 codes
    // [rows, width] and scales [rows]; nvfp4 codes [n/2], block scales
    // [n/16] and one scale (n = rows*width), uint8 but the f32 scales.
    const Dtype d = kvfile::IsQuantized(spec.dtype) ? spec.dtype : v1_quantize_as;
    const kvfile::DtypeInfo& info = *kvfile::FindDtype(d);
    const kvfile::CodecRows cr = kvfile::CodecRowsOf(d, spec.rows_per_token, spec.row_width);
    std::vector<py::ssize_t> rows_shape;
    if (info.quantization != kvfile::Quantization::kPerToken) rows_shape.push_back(spec.rows_per_token);
    const uint64_t tokens = sel.end - sel.begin;
    py::tuple result(info.part_count);
    std::array<uint8_t*, 3> base{};  // by DtypePart
    for (size_t k = 0; k < info.part_count; ++k) {
      const kvfile::DtypePart part = info.parts[k];
      std::vector<py::ssize_t> shape = rows_shape;
      if (part == kvfile::DtypePart::kRowScales) {
        py::array_t<float> a(sel.Shape(shape));
        base[static_cast<size_t>(part)] = reinterpret_cast<uint8_t*>(a.mutable_data());
        result[k] = a;
      } else {
        shape.push_back(static_cast<py::ssize_t>(kvfile::PartBytes(d, part, 1, cr.width)));
        py::array_t<uint8_t> a(sel.Shape(shape));
        base[static_cast<size_t>(part)] = a.mutable_data();
        result[k] = a;
      }
    }
    // Layer i's part starts i reads' worth of that part further on.
    auto at = [&](kvfile::DtypePart part, uint32_t i) -> uint8_t* {
      uint8_t* b = base[static_cast<size_t>(part)];
      return b ? b + i * kvfile::PartBytes(d, part, tokens * cr.per_token, cr.width) : nullptr;
    };
    guarded_.Run([&](Reader& r) -> Status {
      for (uint32_t i = 0; i < sel.layer_count; ++i) {
        uint8_t* codes = at(kvfile::DtypePart::kCodes, i);
        float* scales = reinterpret_cast<float*>(at(kvfile::DtypePart::kRowScales, i));
        KVFILE_RETURN_IF_ERROR(info.quantization == kvfile::Quantization::kPerToken
                                   ? r.ReadCodes(sel.layers[i], sel.stream, sel.begin, sel.end, codes,
                                                 at(kvfile::DtypePart::kBlockScales, i), scales)
                                   : r.ReadCodes(sel.layers[i], sel.stream, sel.begin, sel.end, codes, scales,
                                                 v1_quantize_as));
      }
      return Status::OK();
    });
    return ToCodes(info, result);
  }

  // The parts of one dtype (in the table's order) as a kvfile.Codes, whose
  // fields are the parts in DtypePart order (codes, block_scales, scales),
  // None for a part the dtype has not.
  static py::object ToCodes(const kvfile::DtypeInfo& info, const py::tuple& parts) {
    std::array<py::object, 3> fields = {py::none(), py::none(), py::none()};
    for (size_t k = 0; k < info.part_count; ++k) fields[static_cast<size_t>(info.parts[k])] = parts[k];
    return MakeCodes(fields[0], fields[1], fields[2]);
  }

  BulkSelection SelectBulk(const Geometry& g, py::handle streams, py::handle layers, uint64_t start,
                           std::optional<uint64_t> stop, unsigned threads, bool quantized_only) {
    BulkSelection sel;
    const bool v1 = guarded_.Inspect([](Reader& r) { return r.major_version() == 1; });
    if (streams.is_none()) {
      for (uint32_t i = 0; i < g.streams.size(); ++i)
        if (!quantized_only || v1 || kvfile::IsQuantized(g.streams[i].dtype)) sel.streams.push_back(i);
    } else {
      for (py::handle s : streams) sel.streams.push_back(StreamIndex(g, s));
    }
    sel.layer_count = g.layers;
    if (!layers.is_none()) {
      auto range = layers.cast<std::pair<uint32_t, uint32_t>>();
      if (range.second < range.first || range.second > g.layers)
        throw py::value_error("layers: (" + std::to_string(range.first) + ", " + std::to_string(range.second) +
                              ") is not a range inside [0, " + std::to_string(g.layers) + "]");
      sel.first_layer = range.first;
      sel.layer_count = range.second - range.first;
    }
    sel.begin = start;
    sel.end = stop ? *stop : TokenCount();
    if (sel.end < sel.begin)
      throw py::value_error("stop (" + std::to_string(sel.end) + ") is before start (" + std::to_string(sel.begin) +
                            ")");
    sel.threads = threads != 0 ? threads : std::max(1u, std::thread::hardware_concurrency());
    return sel;
  }

  // out[name], or None when out is None.
  static py::object OutEntry(py::handle out, const std::string& name) {
    if (out.is_none()) return py::none();
    if (!out.contains(py::str(name))) throw py::value_error("out has no entry for stream '" + name + "'");
    return out[py::str(name)];
  }

  // A destination: `given` (a caller's buffer) or, when None, a new array.
  static py::object Destination(py::handle given, const std::string& what, py::dtype dtype,
                                const std::vector<py::ssize_t>& shape,
                                std::vector<std::unique_ptr<WritableBuffer>>* held, void** data) {
    size_t elements = 1;
    for (py::ssize_t d : shape) elements *= static_cast<size_t>(d);
    py::object obj = given.is_none() ? py::object(py::array(dtype, shape)) : py::reinterpret_borrow<py::object>(given);
    held->push_back(std::make_unique<WritableBuffer>(obj, what, elements * dtype.itemsize(), dtype.itemsize()));
    *data = held->back()->data();
    return obj;
  }

  // The layers of the selection stream s is in (all of them but for a
  // layer set): a bulk read's leading axis for that stream.
  static std::vector<uint32_t> LayersIn(const Geometry& g, uint32_t s, const BulkSelection& sel) {
    std::vector<uint32_t> ls;
    for (uint32_t l = sel.first_layer; l < sel.first_layer + sel.layer_count; ++l)
      if (g.InLayer(l, s)) ls.push_back(l);
    return ls;
  }

  py::dict ReadAll(py::handle dtype, uint64_t start, std::optional<uint64_t> stop, unsigned threads, py::handle out,
                   py::handle streams, py::handle layers) {
    const Dtype out_dtype = DecodedDtype(dtype);
    const Geometry g = GetGeometry();
    const BulkSelection sel = SelectBulk(g, streams, layers, start, stop, threads, false);
    if (!out.is_none() && !py::isinstance<py::dict>(out)) throw py::type_error("out must be a dict {stream: buffer}");
    py::dict result;
    std::vector<std::unique_ptr<WritableBuffer>> held;
    std::vector<RowsTarget> targets;
    const auto tokens = static_cast<py::ssize_t>(sel.end - sel.begin);
    for (uint32_t s : sel.streams) {
      const StreamSpec& spec = g.streams[s];
      const std::vector<uint32_t> ls = LayersIn(g, s, sel);
      void* data = nullptr;
      result[py::str(spec.name)] =
          Destination(OutEntry(out, spec.name), "out['" + spec.name + "']", NumpyDtype(out_dtype),
                      {static_cast<py::ssize_t>(ls.size()), tokens, spec.rows_per_token, spec.row_width}, &held, &data);
      const size_t layer_bytes = (sel.end - sel.begin) * spec.ElementsPerToken() * kvfile::ElementSize(out_dtype);
      for (size_t i = 0; i < ls.size(); ++i) targets.push_back({ls[i], s, static_cast<char*>(data) + i * layer_bytes});
    }
    guarded_.Run([&](Reader& r) { return r.ReadMany(targets, sel.begin, sel.end, out_dtype, sel.threads); });
    return result;
  }

  py::dict CodesAll(uint64_t start, std::optional<uint64_t> stop, unsigned threads, py::handle out,
                    py::handle streams, py::handle layers, const std::string& v1_as) {
    const Dtype v1_quantize_as = DtypeByName(v1_as);
    const Geometry g = GetGeometry();
    const BulkSelection sel = SelectBulk(g, streams, layers, start, stop, threads, true);
    if (!out.is_none() && !py::isinstance<py::dict>(out))
      throw py::type_error("out must be a dict {stream: (codes, scales)}, (codes, block_scales, scales) for nvfp4, "
                           "or kvfile.Codes");
    py::dict result;
    std::vector<std::unique_ptr<WritableBuffer>> held;
    std::vector<CodesTarget> targets;
    for (uint32_t s : sel.streams) {
      const StreamSpec& spec = g.streams[s];
      // The codes' dtype: the stream's, or a v1 file's raw rows quantized as v1_as.
      const Dtype codes_dtype = kvfile::IsQuantized(spec.dtype) ? spec.dtype : v1_quantize_as;
      result[py::str(spec.name)] =
          PartTargets(g, s, codes_dtype, sel, OutEntry(out, spec.name), &held, &targets);
    }
    guarded_.Run([&](Reader& r) { return r.ReadManyCodes(targets, sel.begin, sel.end, sel.threads, v1_quantize_as); });
    return result;
  }

  // codes_all's destinations of stream s: one array per part of the codes'
  // dtype `d` (kvfile/dtype.h), over the layers the stream is in: fp8 codes
  // [layers, tokens, rows, width] and scales [layers, tokens, rows]; nvfp4
  // codes [layers, tokens, n/2], block_scales [layers, tokens, n/16] and
  // scales [layers, tokens] (n = rows*width). From `given` (a sequence of
  // as many buffers) or new arrays.
  static py::object PartTargets(const Geometry& g, uint32_t s, Dtype d, const BulkSelection& sel, py::handle given,
                               std::vector<std::unique_ptr<WritableBuffer>>* held,
                               std::vector<CodesTarget>* targets) {
    const StreamSpec& spec = g.streams[s];
    const kvfile::DtypeInfo& info = *kvfile::FindDtype(d);
    const std::string what = "out['" + spec.name + "']";
    std::vector<py::object> outs(info.part_count, py::none());
    if (!given.is_none()) {
      // A kvfile.Codes, or a tuple of the parts (CodesParts).
      std::array<py::object, 3> fields;
      const bool blocks = info.quantization == kvfile::Quantization::kPerToken;
      if (!CodesParts(given, blocks, &fields)) {
        std::string names;
        for (size_t k = 0; k < info.part_count; ++k)
          names += std::string(k ? ", " : "") + (kvfile::safetensors::PartSuffix(info.parts[k]) + 1);
        throw py::type_error(what + " must be (" + names + ")" + (blocks ? "" : " or kvfile.Codes") +
                             ": the stream is " + DtypeName(spec.dtype));
      }
      for (size_t k = 0; k < info.part_count; ++k) outs[k] = fields[static_cast<size_t>(info.parts[k])];
    }
    const std::vector<uint32_t> ls = LayersIn(g, s, sel);
    const auto tokens = static_cast<py::ssize_t>(sel.end - sel.begin);
    const kvfile::CodecRows cr = kvfile::CodecRowsOf(d, spec.rows_per_token, spec.row_width);
    // [layers, tokens], then rows for a per-row dtype.
    std::vector<py::ssize_t> rows_shape = {static_cast<py::ssize_t>(ls.size()), tokens};
    if (info.quantization != kvfile::Quantization::kPerToken) rows_shape.push_back(spec.rows_per_token);
    py::tuple result(info.part_count);
    std::array<uint8_t*, 3> base{};  // by DtypePart
    for (size_t k = 0; k < info.part_count; ++k) {
      const kvfile::DtypePart part = info.parts[k];
      const bool scales = part == kvfile::DtypePart::kRowScales;
      std::vector<py::ssize_t> shape = rows_shape;
      if (!scales) shape.push_back(static_cast<py::ssize_t>(kvfile::PartBytes(d, part, 1, cr.width)));
      void* data = nullptr;
      result[k] = Destination(outs[k], what + "[" + std::to_string(k) + "]",
                              scales ? py::dtype::of<float>() : py::dtype::of<uint8_t>(), shape, held, &data);
      base[static_cast<size_t>(part)] = static_cast<uint8_t*>(data);
    }
    // Layer i's part starts i tokens' worth of that part further on.
    auto at = [&](kvfile::DtypePart part, size_t i) -> uint8_t* {
      uint8_t* b = base[static_cast<size_t>(part)];
      return b ? b + i * kvfile::PartBytes(d, part, uint64_t(tokens) * cr.per_token, cr.width) : nullptr;
    };
    for (size_t i = 0; i < ls.size(); ++i) {
      CodesTarget t{ls[i], s, at(kvfile::DtypePart::kCodes, i),
                    reinterpret_cast<float*>(at(kvfile::DtypePart::kRowScales, i))};
      t.block_scales = at(kvfile::DtypePart::kBlockScales, i);
      targets->push_back(t);
    }
    return ToCodes(info, result);
  }

  py::list Chunks() {
    py::list out;
    for (const ChunkInfo& c : guarded_.Inspect([](Reader& r) { return r.chunks(); }))
      out.append(py::dict(py::arg("offset") = c.offset, py::arg("bytes") = c.bytes,
                          py::arg("first_token") = c.first_token, py::arg("stored_tokens") = c.stored_tokens,
                          py::arg("live_tokens") = c.live_tokens, py::arg("committed") = c.committed));
    return out;
  }

  py::dict Info() {
    struct Facts {
      std::string path, model, io_backend;
      uint16_t major = 0, minor = 0;
      uint64_t fingerprint = 0, tokens = 0, chunks = 0, bytes = 0, torn_tail_bytes = 0;
      uint32_t chunk_tokens = 0;
      Geometry geometry;
      TailInfo tail;
    };
    const Facts f = guarded_.Inspect([](Reader& r) {
      return Facts{r.path(), r.identity().model_id, r.io_backend(), r.major_version(), r.minor_version(),
                   r.identity().fingerprint, r.token_count(), r.chunks().size(), r.tail().file_size,
                   r.tail().torn_tail_bytes, r.nominal_chunk_tokens(), r.geometry(), r.tail()};
    });
    char fingerprint_hex[17];
    std::snprintf(fingerprint_hex, sizeof fingerprint_hex, "%016llx", static_cast<unsigned long long>(f.fingerprint));
    return py::dict(py::arg("path") = f.path,
                    py::arg("version") = std::to_string(f.major) + "." + std::to_string(f.minor),
                    py::arg("major_version") = f.major, py::arg("minor_version") = f.minor,
                    py::arg("model") = f.model, py::arg("fingerprint") = f.fingerprint,
                    py::arg("fingerprint_hex") = std::string(fingerprint_hex),
                    py::arg("geometry") = GeometryDict(f.geometry), py::arg("tokens") = f.tokens,
                    py::arg("chunks") = f.chunks, py::arg("chunk_tokens") = f.chunk_tokens,
                    py::arg("bytes") = f.bytes, py::arg("torn_tail_bytes") = f.torn_tail_bytes,
                    py::arg("damage_before_end") = f.tail.valid_data_follows,
                    py::arg("committed_data_missing") = f.tail.committed_data_missing,
                    py::arg("committed_tokens_missing") = f.tail.committed_tokens_missing,
                    py::arg("committed_bytes_missing") = f.tail.committed_bytes_missing,
                    py::arg("io_backend") = f.io_backend);
  }

 private:
  Guarded<Reader> guarded_;
};

std::unique_ptr<PyReader> OpenReader(const std::filesystem::path& path) {
  std::unique_ptr<Reader> reader;
  Status st;
  {
    py::gil_scoped_release release;
    st = Reader::Open(path.string(), ReaderOptions{}, &reader);
  }
  ThrowIfError(st);
  return std::make_unique<PyReader>(std::move(reader));
}

}  // namespace

void BindReader(py::module_& m) {
  RegisterCodesType(m);
  py::class_<PyReader>(m, "Reader",
                       "An open .kv file (format v1 or v2). Made by kvfile.open(path); a context "
                       "manager that closes it.")
      .def("read", &PyReader::Read, py::arg("stream"), py::arg("layer") = py::none(),
           py::arg("start") = 0, py::arg("stop") = py::none(),
           py::arg("dtype") = py::module_::import("numpy").attr("float32"),
           "Rows of tokens [start, stop) of one stream (name or index), decoded to dtype "
           "(numpy.float32, numpy.float16, or \"bf16\": uint16 bit patterns). Shaped [tokens, "
           "rows_per_token, row_width] for one layer, [layers, tokens, rows_per_token, row_width] "
           "for layer=None (every layer).")
      .def("codes", &PyReader::Codes, py::arg("stream"), py::arg("layer") = py::none(),
           py::arg("start") = 0, py::arg("stop") = py::none(), py::arg("v1_as") = "e4m3",
           "kvfile.Codes(codes, block_scales, scales) of a quantized stream. fp8: uint8 codes shaped like "
           "read()'s rows, block_scales None, float32 scales [..., tokens, rows_per_token]; in a v1 file "
           "the rows are quantized on the fly as v1_as (\"e4m3\" or \"e5m2\"), the codes an upgrade would "
           "store. nvfp4: uint8 packed codes [..., tokens, rows*width/2] (low nibble first), uint8 E4M3 "
           "block scale codes [..., tokens, rows*width/16], float32 scales [..., tokens].")
      .def("read_all", &PyReader::ReadAll, py::arg("dtype") = py::module_::import("numpy").attr("float32"),
           py::arg("start") = 0, py::arg("stop") = py::none(), py::arg("threads") = 0, py::arg("out") = py::none(),
           py::arg("streams") = py::none(), py::arg("layers") = py::none(),
           "Bulk read: {stream name: rows [layers, tokens, rows_per_token, row_width]} of tokens "
           "[start, stop), decoded to dtype (as read()), every layer and stream in one call on `threads` "
           "worker threads (0: one per core) with the GIL released. streams: names or indices (default "
           "all); layers: (first, stop) (default all). out: a dict {stream: writable C-contiguous buffer} "
           "of exactly the result's bytes (a numpy array; a CPU torch tensor's .numpy()) to read into; "
           "the dict returned then holds those objects. On failure every destination is zero-filled.")
      .def("codes_all", &PyReader::CodesAll, py::arg("start") = 0, py::arg("stop") = py::none(),
           py::arg("threads") = 0, py::arg("out") = py::none(), py::arg("streams") = py::none(),
           py::arg("layers") = py::none(), py::arg("v1_as") = "e4m3",
           "Bulk codes: {stream name: kvfile.Codes(uint8 codes [layers, tokens, rows, width], None, float32 "
           "scales [layers, tokens, rows])}, as read_all reads rows; an nvfp4 stream's entry is "
           "Codes(uint8 codes [layers, tokens, rows*width/2], uint8 block_scales [layers, tokens, "
           "rows*width/16], float32 scales [layers, tokens]) as codes() gives it; streams defaults to every "
           "fp8 and nvfp4 stream (every stream of a v1 file, quantized as v1_as). out: {stream: (codes "
           "buffer, scales buffer)}, (codes, block_scales, scales) buffers for nvfp4, or a Codes of buffers.")
      .def_property_readonly("tokens", [](PyReader& self) { return TokenArray(self.Tokens()); },
                             "The token ids, a numpy uint32 array.")
      .def("__len__", &PyReader::TokenCount)
      .def_property_readonly("geometry", [](PyReader& self) { return GeometryDict(self.GetGeometry()); })
      .def_property_readonly("path", &PyReader::Path)
      .def("info", &PyReader::Info,
           "A dict: path, version, model, fingerprint, geometry (dtype per stream), tokens, "
           "chunks, chunk_tokens, bytes, torn_tail_bytes, damage_before_end, committed_data_missing, "
           "committed_tokens_missing, committed_bytes_missing, io_backend.")
      .def("chunks", &PyReader::Chunks,
           "The chunk table: a list of {offset, bytes, first_token, stored_tokens, live_tokens, "
           "committed}, in file order.")
      .def("longest_common_prefix", &PyReader::LongestCommonPrefix, py::arg("tokens"), "How many leading tokens the file shares with `tokens`.")
      .def("close", &PyReader::Close)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyReader& self, py::args) { self.Close(); });

  m.def(
      "fp8_decode_table",
      [](const std::string& kind) {
        const Dtype d = DtypeByName(kind);
        if (!kvfile::IsFp8(d)) throw py::value_error("fp8_decode_table: kind must be 'e4m3' or 'e5m2'");
        py::array_t<float> table(256);
        for (int c = 0; c < 256; ++c) table.mutable_data()[c] = codec::DecodeElement(static_cast<uint8_t>(c), d);
        return table;
      },
      py::arg("kind"),
      "The float32 value of each of the 256 codes of 'e4m3' or 'e5m2' (NaN for the codes a file never "
      "holds): a decoded element is table[code] * scale in float32, rounded to the output dtype.");
  m.def("open_reader", &OpenReader, py::arg("path"), "Opens a .kv file for reading (kvfile.open(path)).");
}

}  // namespace kvfile::python
