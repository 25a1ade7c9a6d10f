// SPDX-License-Identifier: Apache-2.0
// Numpy arrays at the module's boundary: which dtypes stand for which
// kvfile Dtype, token-id arrays, and the checks that turn a wrong array into
// a TypeError or ValueError that says what was expected.
//
// Row data crosses as float32, float16, or uint16 holding bf16 bit patterns
// (numpy has no bfloat16; "bf16" names it where a dtype is asked for).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvfile/geometry.h"
#include "kvfile/writer.h"

namespace kvfile::python {

// `obj` as a numpy array of row data, as it is (not copied), with its
// kvfile dtype in *dtype. TypeError for any other dtype; `what` names the
// argument in the message. The caller checks the shape, then calls
// Contiguous.
pybind11::array RowArray(pybind11::handle obj, const std::string& what, Dtype* dtype);

// `a` itself when it is C-contiguous, else a C-contiguous copy of it.
// MemoryError, naming `what`, the shape and the bytes, when numpy cannot
// allocate the copy (a large numpy.broadcast_to view, say). Callers check
// the shape and dtype first: a wrong array is refused before any copy.
pybind11::array Contiguous(const pybind11::array& a, const std::string& what);

// The dtype argument of a decoded read: "f32"/"float32"/numpy.float32,
// "f16"/"float16"/numpy.float16, or "bf16"/"bfloat16"/numpy.uint16.
Dtype DecodedDtype(pybind11::handle dtype);
// The numpy dtype holding elements of a raw kvfile dtype.
pybind11::dtype NumpyDtype(Dtype dtype);

// A kvfile Dtype by its name ("e4m3", "bf16", ...); ValueError otherwise.
Dtype DtypeByName(const std::string& name);
// A sync mode by its name ("none", "chunk", "close"); ValueError otherwise.
SyncMode SyncModeByName(const std::string& name);

// Token ids from any 1-D sequence of integers in [0, 2^32): TokenIdArray
// checks them (TypeError, ValueError) without copying a numpy array;
// CopyTokenIds copies what it returned (MemoryError when that fails);
// TokenIds is both.
pybind11::array TokenIdArray(pybind11::handle tokens);
std::vector<uint32_t> CopyTokenIds(const pybind11::array& ids);
std::vector<uint32_t> TokenIds(pybind11::handle tokens);
// A numpy uint32 copy of token ids.
pybind11::array_t<uint32_t> TokenArray(std::span<const uint32_t> tokens);

// kvfile.Codes, the one result type of Reader.codes and codes_all: a
// named tuple (codes, block_scales, scales), block_scales None for an fp8
// stream. RegisterCodesType makes it (module attribute "Codes"); MakeCodes
// builds one.
void RegisterCodesType(pybind11::module_& m);
pybind11::object MakeCodes(pybind11::object codes, pybind11::object block_scales, pybind11::object scales);

// The parts of a stream's codes given as a tuple, in Codes' order
// (codes, block_scales, scales) into *parts: for an fp8 stream (codes,
// scales) or (codes, None, scales) (a Codes among them), block_scales then
// None; for an nvfp4 stream (codes, block_scales, scales). False for
// anything else (the caller says what it wanted).
bool CodesParts(pybind11::handle value, bool nvfp4, std::array<pybind11::object, 3>* parts);

// The shape as "(2, 3, 16)", for messages.
std::string ShapeText(const pybind11::array& a);

}  // namespace kvfile::python
