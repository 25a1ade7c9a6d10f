// SPDX-License-Identifier: Apache-2.0
// kvfile._kvfile._Replace(dest): a whole-file replacement (kvfile/replace.h,
// PendingReplace), for the package's functions that write a file another
// way than through the Writer's own path (kvfile.convert): they write the
// new file at temp_path and commit(); a local destination is renamed over,
// an s3:// one uploaded by multipart, and nothing is at dest until then.
#include <pybind11/pybind11.h>
#include <pybind11/stl/filesystem.h>

#include <filesystem>
#include <memory>
#include <string>

#include "bindings.h"
#include "errors.h"
#include "kvfile/replace.h"

namespace py = pybind11;

namespace kvfile::python {

namespace {

class PyReplace {
 public:
  explicit PyReplace(const std::filesystem::path& dest) {
    Status st;
    {
      py::gil_scoped_release release;
      st = PendingReplace::Begin(dest.string(), nullptr, &replace_);
    }
    ThrowIfError(st);
  }
  const std::string& TempPath() const { return Live().temp_path(); }
  bool Existed() const { return Live().original().exists; }
  void Commit() {
    Live();
    Status st;
    {
      py::gil_scoped_release release;
      st = replace_->Commit();
    }
    ThrowIfError(st);
  }
  // Removes the temporary file (what the destructor does), now.
  void Discard() { replace_.reset(); }

 private:
  // The pending replacement; ValueError once discard() has ended it.
  PendingReplace& Live() const {
    if (!replace_) throw py::value_error("this replacement was discarded");
    return *replace_;
  }

  std::unique_ptr<PendingReplace> replace_;
};

}  // namespace

void BindReplace(py::module_& m) {
  py::class_<PyReplace>(m, "_Replace", "A pending whole-file replacement of dest (kvfile/replace.h).")
      .def(py::init<const std::filesystem::path&>(), py::arg("dest"))
      .def_property_readonly("temp_path", &PyReplace::TempPath, "Where the new file is written.")
      .def_property_readonly("existed", &PyReplace::Existed, "Whether dest existed when this began.")
      .def("commit", &PyReplace::Commit, "Puts the file at temp_path in dest's place (an s3:// dest: uploads it).")
      .def("discard", &PyReplace::Discard, "Removes the temporary file; dest stays as it was.");
}

}  // namespace kvfile::python
