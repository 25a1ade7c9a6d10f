// SPDX-License-Identifier: Apache-2.0
// Geometries as Python values: a preset name, or a dict
//   {"layers": 2, "streams": [{"name": "k", "rows_per_token": 2,
//                              "row_width": 16, "dtype": "e4m3"}, ...]}
// and back (the dict form is what info()["geometry"] returns, so a file's
// geometry can be handed to create() as it is).
#pragma once

#include <pybind11/pybind11.h>

#include "kvfile/geometry.h"

namespace kvfile::python {

// `spec` is a preset name (its fp8 streams stored as `fp8_dtype`) or a dict
// as above (a stream without "dtype" gets `fp8_dtype`). ValueError or
// TypeError for anything else; limits are left to the library.
Geometry GeometryFrom(pybind11::handle spec, Dtype fp8_dtype);
pybind11::dict GeometryDict(const Geometry& geometry);

// The index of a stream given by name or index; ValueError if there is none.
uint32_t StreamIndex(const Geometry& geometry, pybind11::handle stream);

}  // namespace kvfile::python
