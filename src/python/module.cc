// SPDX-License-Identifier: Apache-2.0
// The _kvfile extension module: kvfile's Reader, Writer and verify for
// Python. The package kvfile/__init__.py re-exports it; see docs/api.md,
// section "Python", for the conventions (array shapes, dtypes, errors).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "errors.h"
#include "kvfile/dtype.h"
#include "kvfile/presets.h"
#include "kvfile/formats/safetensors.h"

namespace {

const char* QuantizationName(kvfile::Quantization q) {
  switch (q) {
    case kvfile::Quantization::kNone: return "none";
    case kvfile::Quantization::kPerRow: return "row";
    case kvfile::Quantization::kPerToken: return "token";
  }
  return "none";
}

// The dtype table (kvfile/dtype.h) as Python dicts; a part's name is its
// safetensors suffix without the dot.
pybind11::list DtypeTable() {
  pybind11::list out;
  for (const kvfile::DtypeInfo& d : kvfile::kDtypeTable) {
    pybind11::list parts;
    for (size_t k = 0; k < d.part_count; ++k) parts.append(kvfile::safetensors::PartSuffix(d.parts[k]) + 1);
    out.append(pybind11::dict(pybind11::arg("name") = d.name, pybind11::arg("value") = static_cast<int>(d.dtype),
                              pybind11::arg("quantization") = QuantizationName(d.quantization),
                              pybind11::arg("element_bits") = d.element_bits,
                              pybind11::arg("block_elements") = d.block_elements,
                              pybind11::arg("parts") = pybind11::tuple(parts)));
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(_kvfile, m) {
  m.doc() = "kvfile: LLM KV caches on disk (the C++ library's Python binding)";
  m.attr("__version__") = KVFILE_VERSION_STRING;
  kvfile::python::RegisterExceptions(m);
  kvfile::python::BindReader(m);
  kvfile::python::BindWriter(m);
  kvfile::python::BindVerify(m);
  kvfile::python::BindFormats(m);
  kvfile::python::BindConvert(m);
  kvfile::python::BindPack(m);
  kvfile::python::BindFind(m);
  kvfile::python::BindReplace(m);
  kvfile::python::BindRepair(m);
  kvfile::python::BindAppend(m);
  m.def("presets", [] { return pybind11::cast(kvfile::PresetNames()); },
        "The names of the preset geometries create() accepts.");
  m.def("dtype_table", &DtypeTable,
        "The stored dtypes (spec/FORMAT.md 2.1), in value order: dicts of name, value, quantization ('none', "
        "'row' or 'token'), element_bits, block_elements and parts (the arrays a stream of it stores, in "
        "order: of 'codes', 'block_scales', 'scales').");
}
