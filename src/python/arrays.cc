// SPDX-License-Identifier: Apache-2.0
// Conversions between numpy arrays and the library's row and token buffers.
#include "arrays.h"

#include <limits>

#include "kvfile/dtype.h"

namespace py = pybind11;

namespace kvfile::python {

namespace {

// The raw dtype a numpy dtype carries, or false.
bool RawDtypeOf(const py::dtype& dt, Dtype* out) {
  // A byte-swapped array has the right kind and size but the wrong bytes.
  if (!dt.attr("isnative").cast<bool>()) return false;
  const char kind = dt.kind();
  const py::ssize_t size = dt.itemsize();
  if (kind == 'f' && size == 4) *out = Dtype::kF32;
  else if (kind == 'f' && size == 2) *out = Dtype::kF16;
  else if (kind == 'u' && size == 2) *out = Dtype::kBF16;
  else return false;
  return true;
}

// py::array::ensure returns a null handle and clears numpy's exception
// when it cannot convert. For an array numpy already holds (so that its
// size fits) and a numeric dtype, the one failure left is the allocation
// of the copy: a MemoryError that says which argument and how much.
[[noreturn]] void ThrowCopyFailed(const std::string& what, const py::array& a, uint64_t bytes) {
  PyErr_SetString(PyExc_MemoryError, (what + ": cannot allocate " + std::to_string(bytes) +
                                      " bytes for a contiguous copy of the array of shape " + ShapeText(a))
                                         .c_str());
  throw py::error_already_set();
}

}  // namespace

py::array RowArray(py::handle obj, const std::string& what, Dtype* dtype) {
  if (!py::isinstance<py::array>(obj))
    throw py::type_error(what + ": expected a numpy array, got " +
                         py::str(py::type::of(obj).attr("__name__")).cast<std::string>());
  auto a = py::reinterpret_borrow<py::array>(obj);
  if (!RawDtypeOf(a.dtype(), dtype))
    throw py::type_error(what + ": dtype " + py::str(a.dtype()).cast<std::string>() +
                         " is not one kvfile takes: float32, float16, or uint16 holding bf16 bits");
  return a;
}

py::array Contiguous(const py::array& a, const std::string& what) {
  if ((a.flags() & py::array::c_style) != 0) return a;
  py::array c = py::array::ensure(a, py::array::c_style);
  if (!c) ThrowCopyFailed(what, a, static_cast<uint64_t>(a.nbytes()));
  return c;
}

Dtype DecodedDtype(py::handle dtype) {
  if (py::isinstance<py::str>(dtype)) {
    const auto name = dtype.cast<std::string>();
    if (name == "bf16" || name == "bfloat16") return Dtype::kBF16;
    if (name == "f16") return Dtype::kF16;
    if (name == "f32") return Dtype::kF32;
  }
  // Everything numpy understands as a dtype: numpy.float32, "float16", ...
  Dtype out;
  py::dtype dt;
  try {
    dt = py::dtype::from_args(py::reinterpret_borrow<py::object>(dtype));
  } catch (const py::error_already_set&) {
    dt = py::dtype();
  }
  if (dt && RawDtypeOf(dt, &out)) return out;
  throw py::type_error("dtype must be numpy.float32, numpy.float16, or \"bf16\" (uint16 bits), not " +
                       py::repr(dtype).cast<std::string>());
}

py::dtype NumpyDtype(Dtype dtype) {
  switch (dtype) {
    case Dtype::kF32: return py::dtype::of<float>();
    case Dtype::kF16: return py::dtype("float16");
    case Dtype::kBF16: return py::dtype::of<uint16_t>();
    default: break;
  }
  throw py::type_error(std::string("no numpy dtype for ") + DtypeName(dtype));
}

Dtype DtypeByName(const std::string& name) {
  Dtype d{};
  if (Status st = ParseDtype(name, &d); !st.ok()) throw py::value_error(st.message());
  return d;
}

SyncMode SyncModeByName(const std::string& name) {
  if (name == "none") return SyncMode::kNone;
  if (name == "chunk") return SyncMode::kChunk;
  if (name == "close") return SyncMode::kClose;
  throw py::value_error("sync must be \"none\", \"chunk\" or \"close\", not \"" + name + "\"");
}

py::array TokenIdArray(py::handle tokens) {
  py::module_ np = py::module_::import("numpy");
  py::array a = np.attr("asarray")(tokens);
  if (a.ndim() != 1)
    throw py::value_error("tokens: expected a 1-D sequence of token ids, got shape " + ShapeText(a));
  if (a.size() == 0) return a;
  const char kind = a.dtype().kind();
  if (kind != 'i' && kind != 'u')
    throw py::type_error("tokens: expected integers, got dtype " + py::str(a.dtype()).cast<std::string>());
  // Compared as Python ints, so no numpy dtype can wrap around.
  const auto lowest = a.attr("min")().attr("item")().cast<py::int_>();
  const auto highest = a.attr("max")().attr("item")().cast<py::int_>();
  if (lowest < py::int_(0) || highest > py::int_(std::numeric_limits<uint32_t>::max()))
    throw py::value_error("tokens: ids must lie in [0, 2**32); got values from " +
                          py::repr(lowest).cast<std::string>() + " to " + py::repr(highest).cast<std::string>());
  return a;
}

std::vector<uint32_t> TokenIds(py::handle tokens) { return CopyTokenIds(TokenIdArray(tokens)); }

std::vector<uint32_t> CopyTokenIds(const py::array& a) {
  if (a.size() == 0) return {};
  auto ids = py::array_t<uint32_t, py::array::c_style | py::array::forcecast>::ensure(a);
  if (!ids) ThrowCopyFailed("tokens", a, static_cast<uint64_t>(a.size()) * sizeof(uint32_t));
  return std::vector<uint32_t>(ids.data(), ids.data() + ids.size());
}

py::array_t<uint32_t> TokenArray(std::span<const uint32_t> tokens) {
  py::array_t<uint32_t> out(static_cast<py::ssize_t>(tokens.size()));
  std::copy(tokens.begin(), tokens.end(), out.mutable_data());
  return out;
}

namespace {
// kvfile.Codes, made once by RegisterCodesType and kept for the life of
// the process (a type object the module also holds).
PyObject* g_codes_type = nullptr;
}  // namespace

void RegisterCodesType(py::module_& m) {
  py::object type = py::module_::import("collections")
                        .attr("namedtuple")("Codes", py::make_tuple("codes", "block_scales", "scales"),
                                            py::arg("module") = "kvfile");
  type.attr("__doc__") =
      "The codes of a quantized stream, as Reader.codes and codes_all return them: codes (uint8), "
      "block_scales (uint8 E4M3 block scale codes of an nvfp4 stream; None for fp8) and scales (float32). "
      "Writer.append takes one back for a stream of the same dtype.";
  m.attr("Codes") = type;
  g_codes_type = type.release().ptr();
}

py::object MakeCodes(py::object codes, py::object block_scales, py::object scales) {
  return py::reinterpret_borrow<py::object>(g_codes_type)(std::move(codes), std::move(block_scales),
                                                           std::move(scales));
}

bool CodesParts(py::handle value, bool nvfp4, std::array<py::object, 3>* parts) {
  if (!py::isinstance<py::tuple>(value)) return false;
  const auto t = py::reinterpret_borrow<py::tuple>(value);
  if (nvfp4 && t.size() == 3 && !t[1].is_none()) *parts = {t[0], t[1], t[2]};
  else if (!nvfp4 && t.size() == 2) *parts = {t[0], py::none(), t[1]};
  else if (!nvfp4 && t.size() == 3 && t[1].is_none()) *parts = {t[0], py::none(), t[2]};
  else return false;
  return true;
}

std::string ShapeText(const py::array& a) {
  std::string text = "(";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(a.shape(i));
  }
  return text + (a.ndim() == 1 ? ",)" : ")");
}

}  // namespace kvfile::python
