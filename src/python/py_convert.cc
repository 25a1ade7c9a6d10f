// SPDX-License-Identifier: Apache-2.0
// kvfile.convert for Python: kvfile::Convert (kvfile/convert.h) with its
// options as keywords; the report as a dict. _convert.py wraps it.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "errors.h"
#include "kvfile/convert.h"

namespace py = pybind11;

namespace kvfile::python {

namespace {

py::dict ConvertFile(const std::string& in, const std::string& out, const std::optional<std::string>& to,
                     uint16_t kv_major, const std::optional<std::string>& dtype, bool every_stream,
                     const std::vector<std::string>& keep_raw, bool codes, std::optional<uint32_t> chunk_tokens,
                     bool salvage, bool force, std::optional<uint32_t> head_size, std::optional<std::string> model,
                     std::optional<bool> rotated, bool unrotate, std::optional<uint32_t> group_size,
                     std::optional<uint32_t> vocab, bool session, std::optional<std::string> cache_type,
                     std::optional<bool> v_trans, std::optional<std::string> arch, std::optional<uint32_t> n_stream,
                     bool coli_v1, std::optional<std::string> indexer_layers) {
  ConvertOptions o;
  if (to) {
    Format f;
    ThrowIfError(ParseFormat(*to, &f));
    o.to = f;
  }
  o.kv_major = kv_major;
  if (dtype) o.dtype = DtypeByName(*dtype);
  o.every_stream = every_stream;
  o.keep_raw = std::set<std::string>(keep_raw.begin(), keep_raw.end());
  o.codes = codes;
  o.chunk_tokens = chunk_tokens;
  o.salvage = salvage;
  o.force = force;
  o.llama.head_size = head_size;
  o.llama.model = std::move(model);
  o.llama.rotated = rotated;
  o.llama.unrotate = unrotate;
  o.mooncake.group_size = group_size;
  o.llama.session = session;
  o.llama.type = std::move(cache_type);
  if (v_trans) o.llama.v_trans = *v_trans ? 1 : 0;
  o.llama.arch = std::move(arch);
  o.llama.n_stream = n_stream;
  o.coli.vocab = vocab;
  o.coli.v1 = coli_v1;
  o.coli.indexer_layers = std::move(indexer_layers);
  // Ctrl-C stops the conversion at its next batch (OUT stays as it was).
  o.interrupted = [] {
    py::gil_scoped_acquire gil;
    return PyErr_CheckSignals() != 0;
  };
  ConvertReport r;
  Status st;
  {
    py::gil_scoped_release release;
    st = Convert(in, out, o, &r);
  }
  if (PyErr_Occurred()) throw py::error_already_set();  // the KeyboardInterrupt that stopped it
  ThrowIfError(st);
  py::dict d;
  d["from"] = FormatName(r.from);
  d["to"] = FormatName(r.to);
  d["tokens"] = r.tokens;
  d["summary"] = r.summary;
  d["warnings"] = r.warnings;
  d["notes"] = r.notes;
  return d;
}

}  // namespace

void BindConvert(py::module_& m) {
  m.def("convert_file", &ConvertFile, py::arg("src"), py::arg("dst"), py::kw_only(), py::arg("to") = py::none(),
        py::arg("kv_major") = 2, py::arg("dtype") = py::none(), py::arg("every_stream") = false,
        py::arg("keep_raw") = std::vector<std::string>{}, py::arg("codes") = false,
        py::arg("chunk_tokens") = py::none(), py::arg("salvage") = false, py::arg("force") = false,
        py::arg("head_size") = py::none(), py::arg("model") = py::none(), py::arg("rotated") = py::none(),
        py::arg("unrotate") = false, py::arg("group_size") = py::none(), py::arg("vocab") = py::none(),
        py::arg("session") = false, py::arg("cache_type") = py::none(), py::arg("v_trans") = py::none(),
        py::arg("arch") = py::none(), py::arg("n_stream") = py::none(), py::arg("coli_v1") = false,
        py::arg("indexer_layers") = py::none(),
        "kvfile::Convert: src -> dst in any of the formats (kvfile.convert wraps it). Returns a dict: from, to, "
        "tokens, summary, warnings, notes.");
}

}  // namespace kvfile::python
