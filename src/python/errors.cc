// SPDX-License-Identifier: Apache-2.0
// The exception classes behind kvfile.Error and the Status -> exception map.
#include "errors.h"

#include <array>
#include <cstddef>

namespace py = pybind11;

namespace kvfile::python {

namespace {

struct ErrorKind {
  Status::Code code;
  const char* class_name;  // attribute of the module
  const char* code_name;   // the exception's `code` attribute
  PyObject* builtin;       // a second base class, or nullptr
  const char* doc;
};

constexpr size_t kCodeCount = static_cast<size_t>(Status::Code::kFailed) + 1;

// The class for each code, indexed by the code's value; filled once by
// RegisterExceptions and kept for the life of the process (extension
// modules are never unloaded).
std::array<PyObject*, kCodeCount> g_class_for_code{};
PyObject* g_base_error = nullptr;

PyObject* NewClass(const std::string& qualified_name, const char* doc, PyObject* bases) {
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified_name.c_str(), doc, bases, nullptr);
  if (cls == nullptr) throw py::error_already_set();
  return cls;
}

}  // namespace

void RegisterExceptions(py::module_& m) {
  g_base_error = NewClass("kvfile.Error", "A kvfile library call failed; str(e) is the library's message.",
                          PyExc_Exception);
  m.add_object("Error", py::handle(g_base_error));

  const ErrorKind kinds[] = {
      {Status::Code::kCorruption, "CorruptionError", "corruption", nullptr,
       "The file's bytes are damaged or not a kvfile."},
      {Status::Code::kMismatch, "MismatchError", "mismatch", nullptr,
       "A valid file, but not the model or geometry the caller expected."},
      {Status::Code::kNonFinite, "NonFiniteError", "non_finite", PyExc_ValueError,
       "Input rows hold NaN or infinity; nothing of the append was written."},
      {Status::Code::kInvalidArgument, "InvalidArgumentError", "invalid_argument", PyExc_ValueError,
       "The library was asked for something impossible."},
      {Status::Code::kNotFound, "NotFoundError", "not_found", PyExc_FileNotFoundError,
       "A path does not exist."},
      {Status::Code::kIOError, "IoError", "io_error", PyExc_OSError,
       "The operating system refused (EIO, ENOSPC, EACCES, ...)."},
      {Status::Code::kUnsupported, "UnsupportedError", "unsupported", nullptr,
       "A valid file of a version or feature this build cannot handle."},
      {Status::Code::kBusy, "BusyError", "busy", nullptr, "Another writer holds the file."},
      {Status::Code::kFailed, "FailedError", "failed", nullptr,
       "The object is unusable: closed, or stopped by an earlier fatal error."},
  };
  for (const ErrorKind& kind : kinds) {
    py::object bases = kind.builtin == nullptr
                           ? py::reinterpret_borrow<py::object>(g_base_error)
                           : py::make_tuple(py::handle(g_base_error), py::handle(kind.builtin));
    PyObject* cls = NewClass(std::string("kvfile.") + kind.class_name, kind.doc, bases.ptr());
    py::setattr(cls, "code", py::str(kind.code_name));
    m.add_object(kind.class_name, py::handle(cls));
    g_class_for_code[static_cast<size_t>(kind.code)] = cls;
  }
}

void ThrowIfError(const Status& st) {
  if (st.ok()) return;
  PyObject* cls = g_class_for_code[static_cast<size_t>(st.code())];
  if (cls == nullptr) cls = g_base_error;  // kOk never gets here; a new code would
  py::object error = py::handle(cls)(st.message());
  PyErr_SetObject(cls, error.ptr());
  throw py::error_already_set();
}

}  // namespace kvfile::python
