// SPDX-License-Identifier: Apache-2.0
// Repair of a .kv file after a crash, for `kvfile repair`, kvfile_repair
// (C) and kvfile.repair (Python).
//
// Repair finishes what a crash interrupted and refuses what is damage. It
// checks the file whole (VerifyFile), decides on the kinds of its findings
// (VerifyFindingKind), and only then opens it for writing, whose recovery
// (spec/RECOVERY.md) does the work:
//   - a torn tail (kTornTail) is cut;
//   - a damaged commit slot (kCommitSlot) is rewritten from the other one;
//   - whole chunks past the commit record are committed;
//   - damage that valid chunks follow (kDamageBeforeEnd) is cut only with
//     `force` (the valid chunks after it go too);
//   - a file shorter than its commit record (kCommittedDataMissing) is cut
//     to its whole chunks and that prefix recommitted only with `force`
//     (the missing committed tokens are given up);
//   - anything else (kUnreadable, kDamagedChunk, and a kind this version
//     does not know) is refused: the file is left as it is.
// A v1 file is upgraded to v2 by that writable open. A leftover
// "<path>.kvupgrade" of an interrupted upgrade (the original is whole) is
// removed first, even when the repair is then refused.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "kvfile/export.h"
#include "kvfile/file.h"
#include "kvfile/geometry.h"
#include "kvfile/status.h"
#include "kvfile/verify.h"
#include "kvfile/writer.h"

namespace kvfile {

struct RepairReport;

// The points at which RepairOptions::on_stage is called.
enum class RepairStage : uint8_t {
  kChecked = 0,  // the check is done (report->check is filled); nothing changed yet
  kWriting = 1,  // the file is about to be opened for writing (not in a dry run)
};

struct RepairOptions {
  bool force = false;    // also cut kDamageBeforeEnd and kCommittedDataMissing
  bool dry_run = false;  // decide and report, change nothing (the leftover included)
  FileSystem* fs = nullptr;  // every read and write; nullptr: FileSystem::Default()
  unsigned threads = 1;      // workers of the check (VerifyOptions::threads)
  // Called at each stage with the report so far. A non-OK status ends the
  // repair there with that status; the steps after it are not taken (a
  // caller stops at a signal this way, or switches its progress display).
  std::function<Status(RepairStage stage, const RepairReport& report)> on_stage;
};

struct KVFILE_EXPORT RepairReport {
  VerifyReport check;  // the file as it was found

  // "<path>.kvupgrade" when an interrupted upgrade left one, else "";
  // removed says whether it was removed (never in a dry run).
  std::string leftover;
  bool leftover_removed = false;

  // The finding that refused the repair (an index into check.findings), or
  // -1. Repair returned Status::Corruption naming it.
  int64_t refused = -1;

  // Nothing to repair: check.findings is empty.
  bool healthy = false;

  // The plan (what a dry run reports, and what the repair does):
  // the finding whose bytes the repair cuts (kTornTail, kDamageBeforeEnd
  // or kCommittedDataMissing; an index into check.findings), or -1. Every
  // other finding of a repair that goes ahead is a damaged commit slot,
  // rewritten.
  int64_t cut = -1;
  // A v1 file: the writable open upgrades it; its geometry before, and
  // after (the streams' dtype WriterOptions().upgrade_dtype).
  bool upgrade = false;
  Geometry geometry_before, geometry_after;
  // Committed tokens a forced cut of a kCommittedDataMissing file gives up.
  uint64_t committed_tokens_lost = 0;

  // Done (not in a dry run, and not refused):
  bool repaired = false;
  Writer::RecoveryReport recovery;  // what the writable open did
  uint64_t tokens = 0;              // the file's tokens after the repair

  const VerifyFinding* cut_finding() const;
  const VerifyFinding* refused_finding() const;
};

// Repairs `path` as the comment at the top says. Returns OK when the file
// is healthy, repaired, or (dry run) would be repaired; Corruption (the
// file untouched, report->refused set) when the repair is refused; any
// other error as the check, the leftover's removal or the writer gave it
// (the writer's own transaction leaves the file as valid as it was).
KVFILE_EXPORT Status Repair(const std::string& path, const RepairOptions& options, RepairReport* report);

}  // namespace kvfile
