// SPDX-License-Identifier: Apache-2.0
// The _kvfile extension module: kvfile's Reader, Writer and verify for
// Python. The package kvfile/__init__.py re-exports it; see docs/api.md,
// section "Python", for the conventions (array shapes, dtypes, errors).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "errors.h"
#include "kvfile/presets.h"

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
  m.def("presets", [] { return pybind11::cast(kvfile::PresetNames()); },
        "The names of the preset geometries create() accepts.");
}
