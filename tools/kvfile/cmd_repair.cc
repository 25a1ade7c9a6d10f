// SPDX-License-Identifier: Apache-2.0
// kvfile repair: finish what a crash interrupted (cut a torn tail, commit
// whole chunks past the commit record, rewrite a damaged commit slot), and
// refuse anything that is damage rather than a crash's leftovers.
#include <algorithm>
#include <cstdio>
#include <thread>
#include <filesystem>

#include "cli_common.h"
#include "damage_advice.h"
#include "pack_member.h"
#include "progress.h"
#include "progress_fs.h"
#include "signals.h"
#include "kvfile/reader.h"
#include "kvfile/replace.h"
#include "kvfile/verify.h"
#include "kvfile/writer.h"

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
  VerifyReport rep;
  // The check reads the whole file: its bar counts the bytes read.
  std::error_code size_ec;
  uint64_t size = std::filesystem::file_size(a.path, size_ec);
  Progress checking("repair " + a.path + ": checking", size_ec ? 0 : size);
  ReadProgressFileSystem counted(FileSystem::Default(), &checking);
  VerifyOptions vo;
  vo.fs = &counted;
  vo.threads = std::max(1u, std::thread::hardware_concurrency());
  Status st = VerifyFile(a.path, vo, &rep);
  checking.Finish();
  if (st.ok()) st = CheckInterrupt(a.path);
  if (!st.ok()) return ReportError(st);
  // A leftover of an interrupted v1 -> v2 upgrade: the original is whole.
  std::error_code ec;
  const std::string leftover = TempPathFor(a.path, ".kvupgrade");
  if (std::filesystem::exists(leftover, ec)) {
    if (a.dry_run) {
      std::printf("%s: would remove %s, left by an interrupted upgrade\n", a.path.c_str(), leftover.c_str());
    } else {
      bool removed = false;
      st = RemoveLeftoverUpgradeFile(a.path, nullptr, &removed);
      if (!st.ok()) return ReportError(st);
      if (removed)
        std::printf("%s: removed %s, left by an interrupted upgrade\n", a.path.c_str(), leftover.c_str());
    }
  }
  // Damage inside the committed data cannot be repaired without losing
  // acknowledged tokens: refuse, and leave the file as it is.
  const VerifyFinding* tail = nullptr;
  for (const VerifyFinding& f : rep.findings) {
    bool is_tail = f.offset >= 0 && static_cast<uint64_t>(f.offset) == rep.valid_end && rep.torn_tail_bytes > 0;
    bool is_slot = f.chunk < 0 && (f.offset == 4096 || f.offset == 8192) && rep.opened;
    bool is_cut = rep.committed_data_missing && f.offset >= 0 && static_cast<uint64_t>(f.offset) == rep.bytes;
    if (is_cut) {
      // Acknowledged tokens are gone already; cutting the partial chunk and
      // recommitting the prefix makes that official, so it takes --force.
      tail = &f;
      if (!a.force) {
        // One short line: the cut and the --force that keeps the prefix.
        std::string cut = ShortTruncation(a.path);
        if (!cut.empty()) return ReportError(Status::Corruption(cut));
        return ReportError(Status::Corruption(
            a.path + ": " + f.message + "; not repaired (the commit record would no longer count the missing "
            "tokens; use --force to cut the file at offset " + std::to_string(rep.valid_end) +
            " and commit the " + std::to_string(rep.tokens) + " tokens before it)"));
      }
      continue;
    }
    if (is_tail) {
      tail = &f;
      if (f.error && !a.force)
        return ReportError(Status::Corruption(
            a.path + ": " + f.message + "; not repaired (cutting the file at offset " +
            std::to_string(rep.valid_end) + " drops the valid chunks after it; use --force to do it)"));
      continue;
    }
    if (is_slot) continue;
    std::string advice = IntactAdvice(a.path, a.path, rep);
    return ReportError(Status::Corruption(a.path + ": " + f.message + "; not repaired (damage, not a crash's leftovers)" +
                                          (advice.empty() ? "" : "; " + advice)));
  }
  if (rep.findings.empty()) {
    std::printf("%s: healthy, nothing to repair (%llu tokens)\n", a.path.c_str(),
                static_cast<unsigned long long>(rep.tokens));
    return kExitOk;
  }
  // A v1 file is upgraded by the writable open: its format and dtypes
  // before, for the line that says so (and for --dry-run's).
  std::string old_format;
  Geometry v2_geometry;         // a v1 file's geometry after the upgrade
  uint64_t missing_tokens = 0;  // committed tokens a --force cut gives up
  {
    std::unique_ptr<Reader> reader;
    if (Reader::Open(a.path, {}, &reader).ok()) {
      if (rep.major == 1) {
        old_format = FormatAndDtypes(reader->major_version(), reader->minor_version(), reader->geometry());
        v2_geometry = reader->geometry();
        for (StreamSpec& s : v2_geometry.streams) s.dtype = WriterOptions().upgrade_dtype;
      }
      missing_tokens = reader->tail().committed_tokens_missing;
    }
  }
  if (a.dry_run) {
    // Every step the repair takes, in its order: the upgrade (the writable
    // open), the cut, the recommit of the prefix, the rewrites.
    if (!old_format.empty())
      std::printf("%s: would be %s\n", a.path.c_str(), UpgradeNote(old_format, v2_geometry).c_str());
    if (tail)
      std::printf("%s: would cut %llu bytes at offset %llu (%s)\n", a.path.c_str(),
                  static_cast<unsigned long long>(rep.torn_tail_bytes),
                  static_cast<unsigned long long>(rep.valid_end), tail->message.c_str());
    for (const VerifyFinding& f : rep.findings)
      if (&f != tail) std::printf("%s: would rewrite: %s\n", a.path.c_str(), f.message.c_str());
    if (rep.committed_data_missing)
      std::printf("%s: would commit the %llu tokens before the cut; %llu committed tokens would be lost\n",
                  a.path.c_str(), static_cast<unsigned long long>(rep.tokens),
                  static_cast<unsigned long long>(missing_tokens));
    return kExitOk;
  }
  // Declared before the writer, which reads and writes through its fs().
  std::unique_ptr<UpgradeProgress> upgrading;
  std::unique_ptr<Writer> w;
  WriterOptions options;
  options.drop_missing_committed = a.force && rep.committed_data_missing;
  st = CheckInterrupt(a.path);
  if (st.ok() && rep.major == 1) {
    upgrading = std::make_unique<UpgradeProgress>("repair " + a.path + ": upgrading", a.path);
    options.fs = upgrading->fs();
    st = Writer::Open(a.path, options, &w);
    upgrading->Finish();
  } else if (st.ok()) {
    Activity repairing("repair " + a.path + ": repairing");
    st = Writer::Open(a.path, options, &w);
  }
  if (!st.ok()) return ReportError(st);
  const Writer::RecoveryReport& r = w->recovery();
  // Said once: on stderr when the repair succeeds, else in its error line.
  std::string upgraded = r.upgraded_from_v1 ? UpgradeNote(old_format, w->geometry()) : "";
  st = w->Close();
  if (!st.ok()) return ReportError(st, upgraded);
  if (!upgraded.empty()) PrintLine("note", a.path + ": " + upgraded);
  if (r.truncated_bytes > 0)
    std::printf("%s: cut a torn tail of %llu bytes at offset %llu\n", a.path.c_str(),
                static_cast<unsigned long long>(r.truncated_bytes), static_cast<unsigned long long>(rep.valid_end));
  if (rep.committed_data_missing)
    std::printf("%s: committed the %llu tokens before the cut; %llu committed tokens were lost\n", a.path.c_str(),
                static_cast<unsigned long long>(w->token_count()),
                static_cast<unsigned long long>(r.dropped_committed_tokens));
  if (r.slot_rewritten) std::printf("%s: rewrote the damaged commit slot\n", a.path.c_str());
  if (r.recommitted_chunks > 0)
    std::printf("%s: committed %llu whole chunks found past the commit record\n", a.path.c_str(),
                static_cast<unsigned long long>(r.recommitted_chunks));
  std::printf("%s: repaired, %llu tokens\n", a.path.c_str(), static_cast<unsigned long long>(w->token_count()));
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
