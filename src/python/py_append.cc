// SPDX-License-Identifier: Apache-2.0
// kvfile.append_safetensors for Python: kvfile::AppendSafetensors
// (kvfile/append.h), what `kvfile append` does, with its options as
// keywords; the report as a dict.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "errors.h"
#include "kvfile/append.h"

namespace py = pybind11;

namespace kvfile::python {

namespace {

py::dict AppendFile(const std::filesystem::path& file, const std::filesystem::path& input,
                    const std::optional<std::string>& model, const std::optional<std::string>& dtype,
                    const std::optional<std::string>& upgrade_dtype, const std::vector<std::string>& keep_raw,
                    std::optional<uint32_t> chunk_tokens, const std::string& sync) {
  AppendOptions o;
  o.model = model;
  if (dtype) o.dtype = DtypeByName(*dtype);
  if (upgrade_dtype) o.upgrade_dtype = DtypeByName(*upgrade_dtype);
  o.keep_raw = keep_raw;
  o.chunk_tokens = chunk_tokens;
  o.sync = SyncModeByName(sync);
  // Ctrl-C stops the append at its next block (FILE keeps what it had).
  o.on_progress = [](uint64_t) {
    py::gil_scoped_acquire gil;
    return PyErr_CheckSignals() != 0 ? Status::Failed("interrupted") : Status::OK();
  };
  AppendReport r;
  Status st;
  {
    py::gil_scoped_release release;
    st = AppendSafetensors(file.string(), input.string(), o, &r);
  }
  if (PyErr_Occurred()) throw py::error_already_set();  // the KeyboardInterrupt that stopped it
  ThrowIfError(st);
  py::dict d;
  d["created"] = r.created;
  d["upgraded"] = r.upgraded_from_v1;
  d["tokens_before"] = r.tokens_before;
  d["tokens_appended"] = r.input_tokens;
  d["tokens"] = r.tokens_before + r.input_tokens;
  d["notes"] = r.notes;
  return d;
}

}  // namespace

void BindAppend(py::module_& m) {
  m.def("append_safetensors", &AppendFile, py::arg("file"), py::arg("input"), py::kw_only(),
        py::arg("model") = py::none(), py::arg("dtype") = py::none(), py::arg("upgrade_dtype") = py::none(),
        py::arg("keep_raw") = std::vector<std::string>{}, py::arg("chunk_tokens") = py::none(),
        py::arg("sync") = "close",
        "Appends the tokens of a safetensors file in the kvfile convention to a .kv file, creating it with the "
        "input's geometry if it does not exist, as `kvfile append` does (kvfile::AppendSafetensors): one "
        "transaction, everything checked before the first byte is written, a v1 file upgraded first "
        "(upgrade_dtype, keep_raw). model: the id a new file gets and an existing one must have (default: the "
        "input's kvfile.model); dtype: e4m3, e5m2 or nvfp4 for the quantized streams; chunk_tokens: a new "
        "file's chunk size (default 256, fitted to the input's size). Returns a dict: created, upgraded, "
        "tokens_before, tokens_appended, tokens, notes.");
}

}  // namespace kvfile::python
