// SPDX-License-Identifier: Apache-2.0
// kvfile.Writer: creating a .kv file, or appending to one, from Python.
//
// append(tokens, {"k": array, ...}) takes, for every stream, one array shaped
// [layers, tokens, rows_per_token, row_width] (the layout of the safetensors
// convention `kvfile convert` uses) as float32, float16, or uint16 holding
// bf16 bits. Every array is checked here before the library sees it; the
// library then checks every value (a NaN fails the whole append).
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

SyncMode SyncModeByName(const std::string& name) {
  if (name == "none") return SyncMode::kNone;
  if (name == "chunk") return SyncMode::kChunk;
  if (name == "close") return SyncMode::kClose;
  throw py::value_error("sync must be \"none\", \"chunk\" or \"close\", not \"" + name + "\"");
}

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
    std::vector<py::array> arrays(g.streams.size());
    std::vector<Dtype> dtypes(g.streams.size());
    for (size_t s = 0; s < g.streams.size(); ++s) {
      const StreamSpec& spec = g.streams[s];
      if (!streams.contains(spec.name))
        throw py::value_error("append: no array for stream '" + spec.name + "'");
      py::array a = RowArray(streams[spec.name.c_str()], "stream '" + spec.name + "'", &dtypes[s]);
      const std::vector<py::ssize_t> want = {LayersOf(g, spec), static_cast<py::ssize_t>(count), spec.rows_per_token,
                                             spec.row_width};
      if (a.ndim() != 4 || !std::equal(want.begin(), want.end(), a.shape()))
        throw py::value_error("stream '" + spec.name + "': shape " + ShapeText(a) + ", expected " +
                              ExpectedShape(g, spec, count));
      arrays[s] = std::move(a);
    }
    const std::vector<uint32_t> ids = CopyTokenIds(token_array);
    AppendBatch batch;
    batch.tokens = ids;
    batch.blocks.resize(size_t{g.layers} * g.streams.size());
    for (size_t s = 0; s < g.streams.size(); ++s) {
      const StreamSpec& spec = g.streams[s];
      arrays[s] = Contiguous(arrays[s], "stream '" + spec.name + "'");
      const auto* base = static_cast<const char*>(arrays[s].data());
      const size_t layer_bytes = count * spec.ElementsPerToken() * ElementSize(dtypes[s]);
      // The array's i-th layer is the stream's i-th; absent layers keep an empty block.
      size_t i = 0;
      for (uint32_t layer = 0; layer < g.layers; ++layer)
        if (g.InLayer(layer, static_cast<uint32_t>(s)))
          batch.blocks[layer * g.streams.size() + s] = {dtypes[s], base + i++ * layer_bytes, nullptr};
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
           "[layers, tokens, rows_per_token, row_width] of float32, float16, or uint16 (bf16 bits). "
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
