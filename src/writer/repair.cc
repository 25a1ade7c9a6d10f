// SPDX-License-Identifier: Apache-2.0
// Repair: the check, the decision on the kinds of its findings, then the
// writable open whose recovery does the work (kvfile/repair.h).
#include "kvfile/repair.h"

#include <memory>

#include "kvfile/reader.h"
#include "kvfile/replace.h"

namespace kvfile {

namespace {

const VerifyFinding* At(const VerifyReport& check, int64_t i) {
  return i < 0 ? nullptr : &check.findings[static_cast<size_t>(i)];
}

Status Stage(const RepairOptions& options, RepairStage stage, const RepairReport& report) {
  return options.on_stage ? options.on_stage(stage, report) : Status::OK();
}

// Decides on the findings: sets report->cut, or report->refused and the
// refusal's status.
Status Decide(const std::string& path, bool force, RepairReport* report) {
  const VerifyReport& check = report->check;
  for (size_t i = 0; i < check.findings.size(); ++i) {
    const VerifyFinding& f = check.findings[i];
    const int64_t at = static_cast<int64_t>(i);
    switch (f.kind) {
      case VerifyFindingKind::kCommitSlot:
        continue;  // the writable open rewrites it from the other slot
      case VerifyFindingKind::kTornTail:
        report->cut = at;
        continue;
      case VerifyFindingKind::kDamageBeforeEnd:
        report->cut = at;
        if (force) continue;
        report->refused = at;
        return Status::Corruption(path + ": " + f.message + "; not repaired (cutting the file at offset " +
                                  std::to_string(check.valid_end) +
                                  " drops the valid chunks after it; use --force to do it)");
      case VerifyFindingKind::kCommittedDataMissing:
        // Acknowledged tokens are gone already; cutting the partial chunk
        // and recommitting the prefix makes that official.
        report->cut = at;
        if (force) continue;
        report->refused = at;
        return Status::Corruption(path + ": " + f.message +
                                  "; not repaired (the commit record would no longer count the missing tokens; "
                                  "use --force to cut the file at offset " + std::to_string(check.valid_end) +
                                  " and commit the " + std::to_string(check.tokens) + " tokens before it)");
      default:
        // Damage inside the committed data, or a kind this version does
        // not know: not a crash's leftovers.
        report->refused = at;
        return Status::Corruption(path + ": " + f.message + "; not repaired (damage, not a crash's leftovers)");
    }
  }
  return Status::OK();
}

}  // namespace

const VerifyFinding* RepairReport::cut_finding() const { return At(check, cut); }
const VerifyFinding* RepairReport::refused_finding() const { return At(check, refused); }

Status Repair(const std::string& path, const RepairOptions& options, RepairReport* report) {
  *report = RepairReport{};
  FileSystem* fs = options.fs ? options.fs : FileSystem::Default();
  VerifyOptions vo;
  vo.fs = fs;
  vo.threads = options.threads;
  KVFILE_RETURN_IF_ERROR(VerifyFile(path, vo, &report->check));
  KVFILE_RETURN_IF_ERROR(Stage(options, RepairStage::kChecked, *report));
  // A leftover of an interrupted v1 -> v2 upgrade: the original is whole.
  const std::string leftover = TempPathFor(path, ".kvupgrade");
  bool exists = false;
  if (fs->Exists(leftover, &exists).ok() && exists) {
    report->leftover = leftover;
    if (!options.dry_run) KVFILE_RETURN_IF_ERROR(RemoveLeftoverUpgradeFile(path, fs, &report->leftover_removed));
  }
  KVFILE_RETURN_IF_ERROR(Decide(path, options.force, report));
  if (report->check.findings.empty()) {
    report->healthy = true;
    report->tokens = report->check.tokens;
    return Status::OK();
  }
  {
    // A v1 file is upgraded by the writable open: its geometry before and
    // after; and the committed tokens a forced cut gives up.
    ReaderOptions ro;
    ro.fs = fs;
    std::unique_ptr<Reader> reader;
    if (Reader::Open(path, ro, &reader).ok()) {
      if (reader->major_version() == 1) {
        report->upgrade = true;
        report->geometry_before = reader->geometry();
        report->geometry_after = reader->geometry();
        for (StreamSpec& s : report->geometry_after.streams) s.dtype = WriterOptions().upgrade_dtype;
      }
      if (report->check.committed_data_missing)
        report->committed_tokens_lost = reader->tail().committed_tokens_missing;
    }
  }
  if (options.dry_run) return Status::OK();
  KVFILE_RETURN_IF_ERROR(Stage(options, RepairStage::kWriting, *report));
  WriterOptions wo;
  wo.fs = fs;
  wo.drop_missing_committed = options.force && report->check.committed_data_missing;
  std::unique_ptr<Writer> w;
  KVFILE_RETURN_IF_ERROR(Writer::Open(path, wo, &w));
  report->recovery = w->recovery();
  report->tokens = w->token_count();
  if (report->recovery.upgraded_from_v1) report->geometry_after = w->geometry();
  KVFILE_RETURN_IF_ERROR(w->Close());
  report->repaired = true;
  return Status::OK();
}

}  // namespace kvfile
