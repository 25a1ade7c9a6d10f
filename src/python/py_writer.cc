// SPDX-License-Identifier: Apache-2.0
// kvfile.Writer: creating a .kv file, or appending to one, from Python.
//
// append(tokens, {"k": array, ...}) takes, for every stream, one array shaped
// [layers, tokens, rows_per_token, row_width] (the layout of the safetensors
// convention `kvfile convert` uses) as float32, float16, or uint16 holding
// bf16 bits; or, for a quantized stream, the codes already encoded with the
// stream's own dtype: a tuple (codes uint8 [layers, tokens, rows, width],
// scales float32 [layers, tokens, rows]) for e4m3/e5m2 (or a kvfile.Codes,
// block_scales None, as Reader.codes returns), (codes uint8
// [layers, tokens, rows*width/2], block_scales uint8 [layers, tokens,
// rows*width/16], scales float32 [layers, tokens]) for nvfp4 (what
// kvfile.torch encodes on a GPU). Every array is checked here before the
// library sees it; the library then checks every value (a NaN fails the
// whole append, as does an invalid scale).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "errors.h"
#include "geometry_dict.h"
#include "guarded.h"
#include "kvfile/dtype.h"
#include "kvfile/writer.h"

namespace py = pybind11;

namespace kvfile::python {

namespace {

// The expected shape of a stream's array, as text for messages.
// A stream's leading axis: its layers (all, or its layer set's).
uint32_t LayersOf(const Geometry& g, const StreamSpec& s) {
  return s.layers.empty() ? g.layers : static_cast<uint32_t>(s.layers.size());
}

std::string ExpectedShape(const Geometry& g, const StreamSpec& s, size_t tokens) {
  return "[layers=" + std::to_string(LayersOf(g, s)) + ", tokens=" + std::to_string(tokens) +
         ", rows_per_token=" + std::to_string(s.rows_per_token) + ", row_width=" + std::to_string(s.row_width) +
         "]";
}

// One stream's arrays of an append: raw rows (`data` alone), or codes with
// their scales (and nvfp4 block scales).
struct StreamArrays {
  Dtype dtype = Dtype::kBF16;
  py::array data, scales, block_scales;
};

// `obj` as a numpy array of `dtype` shaped `want`; TypeError or ValueError
// naming `what` otherwise.
py::array EncodedArray(py::handle obj, const std::string& what, const py::dtype& dtype,
                       const std::vector<py::ssize_t>& want) {
  if (!py::isinstance<py::array>(obj))
    throw py::type_error(what + ": expected a numpy array, got " +
                         py::str(py::type::of(obj).attr("__name__")).cast<std::string>());
  auto a = py::reinterpret_borrow<py::array>(obj);
  if (!a.dtype().equal(dtype))
    throw py::type_error(what + ": dtype " + py::str(a.dtype()).cast<std::string>() + ", expected " +
                         py::str(static_cast<py::handle>(dtype)).cast<std::string>());
  if (a.ndim() != static_cast<py::ssize_t>(want.size()) || !std::equal(want.begin(), want.end(), a.shape())) {
    std::string text = "[";
    for (size_t i = 0; i < want.size(); ++i) text += (i ? ", " : "") + std::to_string(want[i]);
    throw py::value_error(what + ": shape " + ShapeText(a) + ", expected " + text + "]");
  }
  return a;
}

// What a codes tuple that CodesParts refused holds, for the message.
std::string Items(py::handle value) {
  const auto t = py::reinterpret_borrow<py::tuple>(value);
  if (t.size() == 3) return t[1].is_none() ? "block_scales None" : "block_scales that are not None";
  return std::to_string(t.size()) + " items";
}

// A stream's encoded tuple checked against its geometry (see the top).
StreamArrays EncodedArrays(const Geometry& g, const StreamSpec& spec, size_t count, py::handle value) {
  const std::string what = "stream '" + spec.name + "'";
  const py::ssize_t layers = LayersOf(g, spec), tokens = static_cast<py::ssize_t>(count);
  const py::ssize_t rows = spec.rows_per_token, width = spec.row_width;
  StreamArrays out;
  out.dtype = spec.dtype;
  if (spec.dtype == Dtype::kE4M3 || spec.dtype == Dtype::kE5M2) {
    std::array<py::object, 3> parts;
    if (!CodesParts(value, false, &parts))
      throw py::value_error(what + ": codes of an fp8 stream are a tuple (codes, scales), got " + Items(value));
    out.data = EncodedArray(parts[0], what + " codes", py::dtype::of<uint8_t>(), {layers, tokens, rows, width});
    out.scales = EncodedArray(parts[2], what + " scales", py::dtype::of<float>(), {layers, tokens, rows});
  } else if (spec.dtype == Dtype::kNvfp4) {
    std::array<py::object, 3> parts;
    if (!CodesParts(value, true, &parts))
      throw py::value_error(what + ": codes of an nvfp4 stream are a tuple (codes, block_scales, scales), got " +
                            Items(value));
    const py::ssize_t n = rows * width;
    out.data = EncodedArray(parts[0], what + " codes", py::dtype::of<uint8_t>(), {layers, tokens, n / 2});
    out.block_scales =
        EncodedArray(parts[1], what + " block_scales", py::dtype::of<uint8_t>(), {layers, tokens, n / 16});
    out.scales = EncodedArray(parts[2], what + " scales", py::dtype::of<float>(), {layers, tokens});
  } else {
    throw py::type_error(what + ": the stream is " + std::string(DtypeName(spec.dtype)) +
                         ", so it takes rows (an array), not codes");
  }
  return out;
}

class PyWriter {
 public:
  explicit PyWriter(std::unique_ptr<Writer> writer) : guarded_(std::move(writer), "writer") {}

  // Copies, so that no reference into the writer outlives the mutex.
  Geometry GetGeometry() { return guarded_.Inspect([](Writer& w) { return w.geometry(); }); }
  std::vector<uint32_t> Tokens() {
    return guarded_.Inspect([](Writer& w) { return std::vector<uint32_t>(w.tokens().begin(), w.tokens().end()); });
  }
  uint64_t TokenCount() { return guarded_.Inspect([](Writer& w) { return w.token_count(); }); }
  uint64_t DurableTokens() { return guarded_.Inspect([](Writer& w) { return w.durable_tokens(); }); }
  std::string Path() { return guarded_.Inspect([](Writer& w) { return w.path(); }); }
  uint64_t LongestCommonPrefix(py::handle tokens) {
    const std::vector<uint32_t> prompt = TokenIds(tokens);
    return guarded_.Inspect([&](Writer& w) { return w.LongestCommonPrefix(prompt); });
  }

  void Append(py::handle tokens, const py::dict& streams) {
    const py::array token_array = TokenIdArray(tokens);
    const auto count = static_cast<size_t>(token_array.size());
    const Geometry g = GetGeometry();
    for (auto item : streams) {
      if (!py::isinstance<py::str>(item.first)) throw py::type_error("append: stream keys must be names");
      StreamIndex(g, item.first);  // InvalidArgumentError, naming the file's streams, for one it lacks
    }
    // Every array's dtype and shape first; copies (of token ids, and of
    // arrays that are not contiguous) only once all are right. The arrays
    // stay referenced (and their buffers alive) until the call returns.
    std::vector<StreamArrays> arrays(g.streams.size());
    for (size_t s = 0; s < g.streams.size(); ++s) {
      const StreamSpec& spec = g.streams[s];
      if (!streams.contains(spec.name))
        throw py::value_error("append: no array for stream '" + spec.name + "'");
      const py::handle value = streams[spec.name.c_str()];
      if (py::isinstance<py::tuple>(value)) {
        arrays[s] = EncodedArrays(g, spec, count, value);
        continue;
      }
      py::array a = RowArray(value, "stream '" + spec.name + "'", &arrays[s].dtype);
      const std::vector<py::ssize_t> want = {LayersOf(g, spec), static_cast<py::ssize_t>(count), spec.rows_per_token,
                                             spec.row_width};
      if (a.ndim() != 4 || !std::equal(want.begin(), want.end(), a.shape()))
        throw py::value_error("stream '" + spec.name + "': shape " + ShapeText(a) + ", expected " +
                              ExpectedShape(g, spec, count));
      arrays[s].data = std::move(a);
    }
    const std::vector<uint32_t> ids = CopyTokenIds(token_array);
    AppendBatch batch;
    batch.tokens = ids;
    batch.blocks.resize(size_t{g.layers} * g.streams.size());
    for (size_t s = 0; s < g.streams.size(); ++s) {
      const StreamSpec& spec = g.streams[s];
      StreamArrays& a = arrays[s];
      const std::string what = "stream '" + spec.name + "'";
      a.data = Contiguous(a.data, what);
      const auto* base = static_cast<const char*>(a.data.data());
      const float* scales = nullptr;
      if (a.scales) {
        a.scales = Contiguous(a.scales, what);
        scales = static_cast<const float*>(a.scales.data());
      }
      const uint8_t* blocks = nullptr;
      if (a.block_scales) {
        a.block_scales = Contiguous(a.block_scales, what);
        blocks = static_cast<const uint8_t*>(a.block_scales.data());
      }
      // Bytes, scales and block scales of one of the stream's layers; the
      // array's i-th layer is the stream's i-th, absent layers keep an empty block.
      const uint32_t layers = std::max<uint32_t>(LayersOf(g, spec), 1);
      const size_t layer_bytes = static_cast<size_t>(a.data.nbytes()) / layers;
      const size_t layer_scales = a.scales ? static_cast<size_t>(a.scales.size()) / layers : 0;
      const size_t layer_blocks = a.block_scales ? static_cast<size_t>(a.block_scales.size()) / layers : 0;
      size_t i = 0;
      for (uint32_t layer = 0; layer < g.layers; ++layer) {
        if (!g.InLayer(layer, static_cast<uint32_t>(s))) continue;
        batch.blocks[layer * g.streams.size() + s] = {a.dtype, base + i * layer_bytes,
                                                      scales ? scales + i * layer_scales : nullptr,
                                                      blocks ? blocks + i * layer_blocks : nullptr};
        ++i;
      }
    }
    guarded_.Run([&](Writer& w) { return w.Append(batch); });
  }

  py::dict Recovery() {
    const Writer::RecoveryReport r = guarded_.Inspect([](Writer& w) { return w.recovery(); });
    return py::dict(py::arg("truncated_bytes") = r.truncated_bytes, py::arg("torn_reason") = r.torn_reason,
                    py::arg("recommitted_chunks") = r.recommitted_chunks,
                    py::arg("slot_rewritten") = r.slot_rewritten,
                    py::arg("dropped_after_damage") = r.dropped_after_damage,
                    py::arg("upgraded_from_v1") = r.upgraded_from_v1,
                    py::arg("removed_stale_upgrade") = r.removed_stale_upgrade);
  }

  void Flush() { guarded_.Run([](Writer& w) { return w.Flush(); }); }
  void Sync() { guarded_.Run([](Writer& w) { return w.Sync(); }); }
  void Close() { guarded_.Run([](Writer& w) { return w.Close(); }); }
  void Rewind(uint64_t n) { guarded_.Run([n](Writer& w) { return w.Rewind(n); }); }

  // A `with` block closes the writer; when the block raised, that exception
  // is the one that matters and a failing close does not replace it.
  void Exit(const py::handle& exc_type) {
    if (exc_type.is_none()) {
      Close();
      return;
    }
    try {
      Close();
    } catch (const py::error_already_set&) {
    }
  }

 private:
  Guarded<Writer> guarded_;
};

std::unique_ptr<PyWriter> Wrap(const Status& opened, std::unique_ptr<Writer> writer) {
  ThrowIfError(opened);
  return std::make_unique<PyWriter>(std::move(writer));
}

std::unique_ptr<PyWriter> Create(const std::filesystem::path& path, py::handle geometry, const std::string& model,
                                 uint64_t fingerprint, const std::string& dtype, uint32_t chunk_tokens,
                                 const std::string& sync, bool overwrite, uint16_t format_major) {
  const Geometry g = GeometryFrom(geometry, DtypeByName(dtype));
  WriterOptions options;
  options.chunk_tokens = chunk_tokens;
  options.sync = SyncModeByName(sync);
  options.overwrite = overwrite;
  options.format_major = format_major;
  const ModelIdentity identity{model, fingerprint};
  std::unique_ptr<Writer> writer;
  Status st;
  {
    py::gil_scoped_release release;
    st = Writer::Create(path.string(), g, identity, options, &writer);
  }
  // The library's "PATH: file exists", with the keyword that replaces it
  // (as the CLI's line names --force).
  if (!overwrite && st.code() == Status::Code::kInvalidArgument && st.message() == path.string() + ": file exists")
    st = Status::InvalidArgument(st.message() + "; pass overwrite=True to replace it");
  return Wrap(st, std::move(writer));
}

std::unique_ptr<PyWriter> OpenWriter(const std::filesystem::path& path, const std::string& sync,
                                     const std::string& upgrade_dtype, const std::vector<std::string>& keep_raw) {
  WriterOptions options;
  options.sync = SyncModeByName(sync);
  options.upgrade_dtype = DtypeByName(upgrade_dtype);
  options.keep_raw = keep_raw;
  std::unique_ptr<Writer> writer;
  Status st;
  {
    py::gil_scoped_release release;
    st = Writer::Open(path.string(), options, &writer);
  }
  return Wrap(st, std::move(writer));
}

}  // namespace

void BindWriter(py::module_& m) {
  py::class_<PyWriter>(m, "Writer",
                       "A .kv file open for appending. Made by kvfile.create() or kvfile.open(path, \"a\"); "
                       "a context manager that closes it.")
      .def("append", &PyWriter::Append, py::arg("tokens"), py::arg("streams"),
           "Appends token ids and their rows: streams maps every stream name to an array shaped "
           "[layers, tokens, rows_per_token, row_width] of float32, float16, or uint16 (bf16 bits), or, for "
           "a quantized stream, its codes already encoded: (codes uint8 [layers, tokens, rows, width], scales "
           "float32 [layers, tokens, rows]) for e4m3/e5m2, (codes uint8 [layers, tokens, rows*width/2], "
           "block_scales uint8 [layers, tokens, rows*width/16], scales float32 [layers, tokens]) for nvfp4. "
           "Nothing is written if any check fails.")
      .def("flush", &PyWriter::Flush, "Writes the staged tokens as a chunk; no fsync.")
      .def("sync", &PyWriter::Sync, "Makes every appended token durable and committed.")
      .def("close", &PyWriter::Close, "Flushes, and syncs unless sync=\"none\". Idempotent.")
      .def("rewind", &PyWriter::Rewind, py::arg("n"), "Keeps the first n tokens, durably.")
      .def("longest_common_prefix", &PyWriter::LongestCommonPrefix, py::arg("tokens"), "How many leading tokens the file shares with `tokens`.")
      .def_property_readonly("tokens", [](PyWriter& self) { return TokenArray(self.Tokens()); },
                             "Every appended token id, a numpy uint32 array.")
      .def("__len__", &PyWriter::TokenCount)
      .def_property_readonly("durable_tokens", &PyWriter::DurableTokens)
      .def_property_readonly("geometry", [](PyWriter& self) { return GeometryDict(self.GetGeometry()); })
      .def_property_readonly("path", &PyWriter::Path)
      .def_property_readonly("recovery", &PyWriter::Recovery, "What opening the file found and repaired.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyWriter& self, py::handle exc_type, py::handle, py::handle) { self.Exit(exc_type); });

  m.def("create", &Create, py::arg("path"), py::arg("geometry"), py::kw_only(), py::arg("model") = "",
        py::arg("fingerprint") = 0, py::arg("dtype") = "e4m3", py::arg("chunk_tokens") = 256,
        py::arg("sync") = "close", py::arg("overwrite") = false, py::arg("format") = 2,
        "Creates a .kv file. geometry: a preset name (kvfile.presets()) or a dict {\"layers\": n, "
        "\"streams\": [{\"name\", \"rows_per_token\", \"row_width\", \"dtype\"[, \"layers\"]}]} (\"layers\": a stream in those layers only); dtype is the fp8 "
        "dtype of preset streams and of dict streams without one. sync: \"none\", \"chunk\" or "
        "\"close\". format=1 writes the older raw layout.");
  m.def("open_writer", &OpenWriter, py::arg("path"), py::kw_only(), py::arg("sync") = "close",
        py::arg("upgrade_dtype") = "e4m3", py::arg("keep_raw") = std::vector<std::string>{},
        "Opens a .kv file to append to it (kvfile.open(path, \"a\")), after crash recovery; a v1 "
        "file is upgraded to v2 first (its streams become upgrade_dtype, except keep_raw).");
}

}  // namespace kvfile::python
