// SPDX-License-Identifier: Apache-2.0
// kvfile.verify(path): the library's whole-file check, as a dict.
#include <pybind11/pybind11.h>
#include <pybind11/stl/filesystem.h>

#include <filesystem>

#include "bindings.h"
#include "errors.h"
#include "kvfile/verify.h"

namespace py = pybind11;

namespace kvfile::python {

namespace {

// -1 (no chunk, no offset) becomes None.
py::object OrNone(int64_t v) { return v < 0 ? py::none() : py::object(py::int_(v)); }

py::dict Verify(const std::filesystem::path& path, bool quick) {
  VerifyOptions options;
  options.quick = quick;
  VerifyReport report;
  Status st;
  {
    py::gil_scoped_release release;
    st = VerifyFile(path.string(), options, &report);
  }
  ThrowIfError(st);
  py::list findings;
  for (const VerifyFinding& f : report.findings)
    findings.append(py::dict(py::arg("kind") = VerifyFindingKindName(f.kind), py::arg("error") = f.error,
                             py::arg("chunk") = OrNone(f.chunk),
                             py::arg("offset") = OrNone(f.offset), py::arg("message") = f.message));
  return py::dict(py::arg("path") = path.string(), py::arg("ok") = !report.HasErrors(),
                  py::arg("opened") = report.opened,
                  py::arg("version") = std::to_string(report.major) + "." + std::to_string(report.minor),
                  py::arg("tokens") = report.tokens, py::arg("chunks") = report.chunks,
                  py::arg("bytes") = report.bytes, py::arg("torn_tail_bytes") = report.torn_tail_bytes,
                  py::arg("findings") = findings);
}

}  // namespace

void BindVerify(py::module_& m) {
  m.def("verify", &Verify, py::arg("path"), py::kw_only(), py::arg("quick") = false,
        "Checks a whole file without modifying it. Returns a dict: ok (no errors), version, tokens, "
        "chunks, bytes, torn_tail_bytes, and findings: a list of {kind (\"torn tail\", \"commit slot\", "
        "\"damaged chunk\", \"damage before the end\", \"committed data missing\", \"unreadable\"), error "
        "(False: a warning, such as a torn tail), chunk, offset, message}. Raises only when the file cannot be examined (missing, "
        "permission, I/O error); damage is reported in the findings.");
}

}  // namespace kvfile::python
