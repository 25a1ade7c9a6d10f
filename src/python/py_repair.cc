// SPDX-License-Identifier: Apache-2.0
// kvfile.repair(path): the library's Repair (kvfile/repair.h), its report
// as a dict; a refusal raises CorruptionError carrying that dict.
#include <pybind11/pybind11.h>
#include <pybind11/stl/filesystem.h>

#include <filesystem>

#include "bindings.h"
#include "errors.h"
#include "kvfile/repair.h"

namespace py = pybind11;

namespace kvfile::python {

namespace {

py::object Kind(const VerifyFinding* f) { return f ? py::object(py::str(VerifyFindingKindName(f->kind))) : py::none(); }

py::dict ReportDict(const std::string& path, const RepairReport& rep, bool dry_run) {
  py::list findings;
  for (const VerifyFinding& f : rep.check.findings)
    findings.append(py::dict(py::arg("kind") = VerifyFindingKindName(f.kind), py::arg("error") = f.error,
                             py::arg("message") = f.message));
  const VerifyFinding* cut = rep.cut_finding();
  return py::dict(
      py::arg("path") = path, py::arg("dry_run") = dry_run, py::arg("healthy") = rep.healthy,
      py::arg("repaired") = rep.repaired, py::arg("refused") = Kind(rep.refused_finding()),
      py::arg("findings") = findings, py::arg("cut") = Kind(cut),
      py::arg("cut_offset") = cut ? py::object(py::int_(rep.check.valid_end)) : py::none(),
      py::arg("cut_bytes") = rep.repaired ? rep.recovery.truncated_bytes : cut ? rep.check.torn_tail_bytes : 0,
      py::arg("upgrade") = rep.upgrade || rep.recovery.upgraded_from_v1,
      py::arg("slot_rewritten") = rep.recovery.slot_rewritten,
      py::arg("recommitted_chunks") = rep.recovery.recommitted_chunks,
      py::arg("committed_tokens_lost") =
          rep.repaired ? rep.recovery.dropped_committed_tokens : rep.committed_tokens_lost,
      py::arg("leftover_removed") = rep.leftover_removed,
      py::arg("tokens") = rep.repaired || rep.healthy ? rep.tokens : rep.check.tokens);
}

py::dict RepairFile(const std::filesystem::path& path, bool force, bool dry_run) {
  RepairOptions options;
  options.force = force;
  options.dry_run = dry_run;
  RepairReport report;
  Status st;
  {
    py::gil_scoped_release release;
    st = Repair(path.string(), options, &report);
  }
  py::dict result = ReportDict(path.string(), report, dry_run);
  try {
    ThrowIfError(st);
  } catch (py::error_already_set& e) {
    // The refusal's exception carries the report: which finding refused.
    if (report.refused >= 0) e.value().attr("report") = result;
    throw;
  }
  return result;
}

}  // namespace

void BindRepair(py::module_& m) {
  m.def("repair", &RepairFile, py::arg("path"), py::kw_only(), py::arg("force") = false,
        py::arg("dry_run") = false,
        "Finishes what a crash interrupted, as `kvfile repair` does: cuts a torn tail, rewrites a damaged "
        "commit slot, commits whole chunks past the commit record; with force=True also cuts damage that "
        "valid chunks follow and a file shorter than its commit record. Returns a dict: healthy, repaired, "
        "findings (the check before, each {kind, error, message}), cut (the kind of the finding cut, or None), "
        "cut_offset, cut_bytes, upgrade (a v1 file, upgraded), slot_rewritten, recommitted_chunks, "
        "committed_tokens_lost, leftover_removed, tokens. dry_run=True decides and reports, changing nothing. "
        "Damage that is not a crash's leftovers raises CorruptionError, the file untouched; the exception's "
        "`report` is the dict, its `refused` the finding's kind.");
}

}  // namespace kvfile::python
