// SPDX-License-Identifier: Apache-2.0
// kvfile repair: the library's Repair (kvfile/repair.h: finish what a crash
// interrupted, refuse what is damage), with the CLI's progress, signal
// checks and words.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>

#include "cli_common.h"
#include "damage_advice.h"
#include "pack_member.h"
#include "progress.h"
#include "progress_fs.h"
#include "signals.h"
#include "kvfile/repair.h"

namespace kvfile::cli {

namespace {

struct RepairArgs {
  std::string path;
  bool dry_run = false;
  bool force = false;
};

int RunRepair(const RepairArgs& a) {
  InstallSignalHandlers();
  SetCurrentPath(a.path);
  if (Status st = RefusePackMemberTarget(a.path); !st.ok()) return ReportError(st);
  // The check reads the whole file: its bar counts the bytes read; a v1
  // file's upgrade then has a bar of its own, any other repair a spinner.
  std::error_code size_ec;
  uint64_t size = std::filesystem::file_size(a.path, size_ec);
  Progress checking("repair " + a.path + ": checking", size_ec ? 0 : size);
  ReadProgressFileSystem counted(FileSystem::Default(), &checking);
  std::optional<Progress> upgrading;
  std::optional<Activity> repairing;
  RepairOptions options;
  options.force = a.force;
  options.dry_run = a.dry_run;
  options.fs = &counted;
  options.threads = std::max(1u, std::thread::hardware_concurrency());
  options.on_stage = [&](RepairStage stage, const RepairReport& report) {
    if (stage == RepairStage::kChecked) {
      checking.Finish();
    } else if (report.check.major == 1) {
      upgrading.emplace("repair " + a.path + ": upgrading", size_ec ? 0 : size);
      counted.set_progress(&*upgrading);
    } else {
      counted.set_progress(nullptr);
      repairing.emplace("repair " + a.path + ": repairing");
    }
    return CheckInterrupt(a.path);
  };
  RepairReport rep;
  Status st = Repair(a.path, options, &rep);
  if (upgrading) upgrading->Finish();
  if (repairing) repairing->Finish();
  const VerifyReport& check = rep.check;
  if (a.dry_run && !rep.leftover.empty())
    std::printf("%s: would remove %s, left by an interrupted upgrade\n", a.path.c_str(), rep.leftover.c_str());
  if (rep.leftover_removed)
    std::printf("%s: removed %s, left by an interrupted upgrade\n", a.path.c_str(), rep.leftover.c_str());
  if (const VerifyFinding* refused = rep.refused_finding()) {
    // The refusal in the CLI's words: the short line of a cut file, or the
    // command that keeps the intact tokens before damage.
    if (refused->kind == VerifyFindingKind::kCommittedDataMissing) {
      std::string cut = ShortTruncation(a.path);
      if (!cut.empty()) return ReportError(Status::Corruption(cut));
    } else if (refused->kind != VerifyFindingKind::kDamageBeforeEnd) {
      std::string advice = IntactAdvice(a.path, a.path, check);
      if (!advice.empty()) return ReportError(Status::Corruption(st.message() + "; " + advice));
    }
    return ReportError(st);
  }
  // Said once: on stderr when the repair succeeds, else in its error line.
  std::string old_format = rep.upgrade ? FormatAndDtypes(check.major, check.minor, rep.geometry_before) : "";
  std::string upgraded = rep.recovery.upgraded_from_v1 ? UpgradeNote(old_format, rep.geometry_after) : "";
  if (!st.ok()) return ReportError(st, upgraded);
  if (rep.healthy) {
    std::printf("%s: healthy, nothing to repair (%llu tokens)\n", a.path.c_str(),
                static_cast<unsigned long long>(rep.tokens));
    return kExitOk;
  }
  const VerifyFinding* tail = rep.cut_finding();
  if (a.dry_run) {
    // Every step the repair takes, in its order: the upgrade (the writable
    // open), the cut, the recommit of the prefix, the rewrites.
    if (rep.upgrade)
      std::printf("%s: would be %s\n", a.path.c_str(), UpgradeNote(old_format, rep.geometry_after).c_str());
    if (tail)
      std::printf("%s: would cut %llu bytes at offset %llu (%s)\n", a.path.c_str(),
                  static_cast<unsigned long long>(check.torn_tail_bytes),
                  static_cast<unsigned long long>(check.valid_end), tail->message.c_str());
    for (const VerifyFinding& f : check.findings)
      if (&f != tail) std::printf("%s: would rewrite: %s\n", a.path.c_str(), f.message.c_str());
    if (check.committed_data_missing)
      std::printf("%s: would commit the %llu tokens before the cut; %llu committed tokens would be lost\n",
                  a.path.c_str(), static_cast<unsigned long long>(check.tokens),
                  static_cast<unsigned long long>(rep.committed_tokens_lost));
    return kExitOk;
  }
  const Writer::RecoveryReport& r = rep.recovery;
  if (!upgraded.empty()) PrintLine("note", a.path + ": " + upgraded);
  if (r.truncated_bytes > 0)
    std::printf("%s: cut a torn tail of %llu bytes at offset %llu\n", a.path.c_str(),
                static_cast<unsigned long long>(r.truncated_bytes), static_cast<unsigned long long>(check.valid_end));
  if (check.committed_data_missing)
    std::printf("%s: committed the %llu tokens before the cut; %llu committed tokens were lost\n", a.path.c_str(),
                static_cast<unsigned long long>(rep.tokens),
                static_cast<unsigned long long>(r.dropped_committed_tokens));
  if (r.slot_rewritten) std::printf("%s: rewrote the damaged commit slot\n", a.path.c_str());
  if (r.recommitted_chunks > 0)
    std::printf("%s: committed %llu whole chunks found past the commit record\n", a.path.c_str(),
                static_cast<unsigned long long>(r.recommitted_chunks));
  std::printf("%s: repaired, %llu tokens\n", a.path.c_str(), static_cast<unsigned long long>(rep.tokens));
  return kExitOk;
}

}  // namespace

void RegisterRepair(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<RepairArgs>();
  CLI::App* cmd = app.add_subcommand(
      "repair",
      "Finish recovery after a crash: cut a torn tail, rewrite a damaged commit slot.\n"
      "Refuses (exit 1, file untouched) where the damage is not a crash's leftovers.\n"
      "Example: kvfile repair session.kv --dry-run");
  cmd->add_option("FILE", args->path, "the .kv file")->required();
  cmd->add_flag("--dry-run", args->dry_run, "report what would be done, change nothing");
  cmd->add_flag("--force", args->force,
                "also cut damage that valid (uncommitted) chunks follow, and cut a file shorter than its\n"
                "commit record to its valid prefix (the missing committed tokens are given up)");
  cmd->callback([args, exit_code] { *exit_code = RunRepair(*args); });
}

}  // namespace kvfile::cli
