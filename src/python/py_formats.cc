// SPDX-License-Identifier: Apache-2.0
// The seeds' formats for Python: Mooncake FP8 codec records
// (mooncake_encode, mooncake_decode) and colibri .coli_kv sessions
// (coli_import, coli_export), over kvfile/formats/mooncake.h and kvfile/formats/coli_kv.h.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <cstring>
#include <filesystem>
#include <optional>

#include "arrays.h"
#include "bindings.h"
#include "errors.h"
#include "kvfile/formats/coli_kv.h"
#include "kvfile/file.h"
#include "kvfile/formats/mooncake.h"

namespace py = pybind11;

namespace kvfile::python {

namespace {

// float16 arrays are fp16; uint16 arrays hold bf16 bit patterns.
py::bytes MooncakeEncode(const py::array& values, uint32_t group_size) {
  mooncake::RecordDesc d;
  if (!values.dtype().attr("isnative").cast<bool>()) {  // the right kind and size, but swapped bytes
    throw py::type_error("values: a float16 array (fp16) or a uint16 array of bf16 bit patterns in native "
                         "byte order, not " + std::string(py::str(values.dtype())));
  } else if (values.dtype().kind() == 'u' && values.dtype().itemsize() == 2) {
    d.dtype = mooncake::SourceDtype::kBF16;
  } else if (values.dtype().kind() == 'f' && values.dtype().itemsize() == 2) {
    d.dtype = mooncake::SourceDtype::kF16;
  } else {
    throw py::type_error("values: a float16 array (fp16) or a uint16 array of bf16 bit patterns, not " +
                         std::string(py::str(values.dtype())));
  }
  d.group_size = group_size;
  for (py::ssize_t i = 0; i < values.ndim(); ++i) d.shape.push_back(static_cast<uint64_t>(values.shape(i)));
  // The shape and group size (rank 1..8, no zero dimension) before any copy.
  uint64_t elements = 0, record_bytes = 0;
  ThrowIfError(mooncake::RecordSize(d, &elements, &record_bytes));
  py::array c = Contiguous(values, "values");
  std::vector<uint8_t> rec;
  Status st;
  {
    py::gil_scoped_release release;
    st = mooncake::EncodeValues(d, static_cast<const uint16_t*>(c.data()), &rec);
  }
  ThrowIfError(st);
  return py::bytes(reinterpret_cast<const char*>(rec.data()), rec.size());
}

py::dict MooncakeDecode(const py::bytes& record) {
  std::string bytes = record;
  mooncake::RecordView v;
  ThrowIfError(mooncake::ParseRecord({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, &v));
  bool f16 = v.desc.dtype == mooncake::SourceDtype::kF16;
  std::vector<py::ssize_t> shape(v.desc.shape.begin(), v.desc.shape.end());
  py::array out = f16 ? py::array(py::dtype("float16"), shape) : py::array(py::dtype("uint16"), shape);
  mooncake::DecodeValues(v, static_cast<uint16_t*>(out.mutable_data()));
  py::array scales(py::dtype("float32"), std::vector<py::ssize_t>{static_cast<py::ssize_t>(v.groups)});
  for (uint64_t g = 0; g < v.groups; ++g) static_cast<float*>(scales.mutable_data())[g] = v.scale(g);
  py::array codes(py::dtype("uint8"), shape);
  std::memcpy(codes.mutable_data(), v.codes, v.elements);
  return py::dict(py::arg("dtype") = f16 ? "fp16" : "bf16", py::arg("group_size") = v.desc.group_size,
                  py::arg("shape") = py::tuple(py::cast(shape)), py::arg("values") = out,
                  py::arg("codes") = codes, py::arg("scales") = scales);
}

py::dict ColiImport(const std::filesystem::path& in, const std::filesystem::path& out) {
  FileSystem* fs = FileSystem::Default();
  bool exists = false;
  ThrowIfError(fs->Exists(out.string(), &exists));
  if (exists) ThrowIfError(Status::InvalidArgument(out.string() + ": file exists"));
  coli::ImportResult res;
  Status st;
  {
    py::gil_scoped_release release;
    st = coli::Import(in.string(), out.string(), fs, &res);
    if (!st.ok()) (void)fs->Remove(out.string());
  }
  ThrowIfError(st);
  const coli::Header& h = res.header;
  return py::dict(py::arg("version") = h.version, py::arg("tokens") = h.records, py::arg("layers") = h.layers,
                  py::arg("vocab") = h.vocab, py::arg("ignored_bytes") = res.ignored_bytes);
}

uint64_t ColiExport(const std::filesystem::path& in, const std::filesystem::path& out, std::optional<uint32_t> vocab) {
  FileSystem* fs = FileSystem::Default();
  bool exists = false;
  ThrowIfError(fs->Exists(out.string(), &exists));
  if (exists) ThrowIfError(Status::InvalidArgument(out.string() + ": file exists"));
  coli::ExportOptions o;
  o.vocab = vocab;
  uint64_t tokens = 0;
  Status st;
  {
    py::gil_scoped_release release;
    st = coli::Export(in.string(), out.string(), o, &tokens);
    if (!st.ok()) (void)fs->Remove(out.string());
  }
  ThrowIfError(st);
  return tokens;
}

}  // namespace

void BindFormats(py::module_& m) {
  m.def("mooncake_encode", &MooncakeEncode, py::arg("values"), py::kw_only(), py::arg("group_size"),
        "Mooncake's FP8 codec record (version 1) of a tensor: float16 values (fp16) or uint16 bf16 bit "
        "patterns; the record's shape is the array's. Returns the record's bytes.");
  m.def("mooncake_decode", &MooncakeDecode, py::arg("record"),
        "Checks a Mooncake FP8 codec record and decodes it. Returns a dict: dtype ('fp16' or 'bf16'), "
        "group_size, shape, values (float16, or uint16 bf16 bit patterns), codes (uint8), scales (float32).");
  m.def("coli_import", &ColiImport, py::arg("coli_path"), py::arg("kv_path"),
        "Imports a colibri .coli_kv session (COLIKV1 or COLIKV2) as a new .kv file. Returns a dict: version, "
        "tokens, layers, vocab, ignored_bytes (past the record count).");
  m.def("coli_export", &ColiExport, py::arg("kv_path"), py::arg("coli_path"), py::kw_only(),
        py::arg("vocab") = py::none(),
        "Writes a .kv file of colibri's geometry as a new COLIKV2 session; vocab defaults to the one a "
        "'coli_kv:vocab=N' model id gives. Returns the token count.");
}

}  // namespace kvfile::python
