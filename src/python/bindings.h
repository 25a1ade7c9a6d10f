// SPDX-License-Identifier: Apache-2.0
// The parts of the _kvfile extension, each adding its classes and functions
// to the module (called in this order by module.cc).
#pragma once

#include <pybind11/pybind11.h>

namespace kvfile::python {

void BindReader(pybind11::module_& m);   // Reader, open_reader()
void BindWriter(pybind11::module_& m);   // Writer, create(), open_writer()
void BindVerify(pybind11::module_& m);   // verify()
void BindFormats(pybind11::module_& m);  // mooncake_encode/decode, coli_import/export
void BindConvert(pybind11::module_& m);  // convert_file (kvfile::Convert)
void BindPack(pybind11::module_& m);     // Pack
void BindFind(pybind11::module_& m);     // find(), index_directory(), walk()
void BindReplace(pybind11::module_& m);  // _Replace (kvfile.convert's output)
void BindRepair(pybind11::module_& m);   // repair()
void BindAppend(pybind11::module_& m);   // append_safetensors() (kvfile::AppendSafetensors)

}  // namespace kvfile::python
