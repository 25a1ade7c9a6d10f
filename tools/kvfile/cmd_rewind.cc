// SPDX-License-Identifier: Apache-2.0
// kvfile rewind: keep the first N tokens of a .kv file and drop the rest,
// durably (spec/RECOVERY.md, "Rewind"). A v1 file is upgraded to v2 first
// (--upgrade-dtype, --keep-raw), and stderr says so.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <thread>

#include "cli_common.h"
#include "damage_advice.h"
#include "pack_member.h"
#include "progress.h"
#include "progress_fs.h"
#include "signals.h"
#include "kvfile/reader.h"
#include "kvfile/verify.h"
#include "kvfile/writer.h"

namespace kvfile::cli {

namespace {

struct RewindArgs {
  std::string path;
  uint64_t to = 0;
  std::optional<std::string> upgrade_dtype;
  std::vector<std::string> keep_raw;
};

std::string TooFar(const std::string& path, uint64_t to, uint64_t have) {
  return path + ": cannot rewind to " + std::to_string(to) + " tokens; the file has " + std::to_string(have);
}

// Corruption naming the first damaged chunk that holds tokens below `to`
// (a VerifyFile finding), with IntactAdvice; else OK.
Status CheckKeptChunks(const std::string& path, const Reader& r, uint64_t to) {
  if (to == 0) return Status::OK();
  VerifyOptions vo;
  vo.threads = std::max(1u, std::thread::hardware_concurrency());
  VerifyReport rep;
  KVFILE_RETURN_IF_ERROR(VerifyFile(path, vo, &rep));
  for (const VerifyFinding& f : rep.findings) {
    if (!f.error || f.chunk < 0 || static_cast<uint64_t>(f.chunk) >= r.chunks().size()) continue;
    if (r.chunks()[static_cast<size_t>(f.chunk)].first_token >= to) continue;
    std::string advice = IntactAdvice(path, path, rep);
    return Status::Corruption(path + ": chunk " + std::to_string(f.chunk) + " at offset " + std::to_string(f.offset) +
                              " is damaged (kvfile verify " + path + " says how); not rewound" +
                              (advice.empty() ? "" : "; " + advice));
  }
  return Status::OK();
}

int RunRewind(const RewindArgs& a) {
  InstallSignalHandlers();
  SetCurrentPath(a.path);
  // A read-only look first: a request past the end is refused before the
  // writable open, which would already repair a torn tail.
  uint64_t have = 0;
  std::string old_format;  // a v1 file: its format and dtypes, for the upgrade line
  if (Status st = RefusePackMemberTarget(a.path); !st.ok()) return ReportError(st);
  {
    std::unique_ptr<Reader> r;
    Status st = Reader::Open(a.path, {}, &r);
    if (!st.ok()) return ReportError(st);
    have = r->token_count();
    st = CheckStreamNames(a.path, r->geometry(), a.keep_raw);
    if (!st.ok()) return ReportError(st);
    if (r->major_version() == 1) old_format = FormatAndDtypes(r->major_version(), r->minor_version(), r->geometry());
    if (a.to > have) return UsageError(TooFar(a.path, a.to, have));
    // The tokens kept must be whole: a damaged chunk below --to is refused
    // (exit 1) with the rewind that keeps what is intact, not kept silently.
    st = CheckKeptChunks(a.path, *r, a.to);
    if (!st.ok()) return ReportError(st);
  }
  WriterOptions opt;
  if (a.upgrade_dtype) {
    if (Status st = ParseDtype(*a.upgrade_dtype, &opt.upgrade_dtype); !st.ok()) return UsageError(st.message());
  }
  opt.keep_raw = a.keep_raw;
  // Declared before the writer, which reads and writes through its fs().
  std::unique_ptr<UpgradeProgress> upgrading;
  std::unique_ptr<Writer> w;
  Status st = CheckInterrupt(a.path);
  if (st.ok() && !old_format.empty()) {
    upgrading = std::make_unique<UpgradeProgress>("rewind " + a.path + ": upgrading", a.path);
    opt.fs = upgrading->fs();
    st = Writer::Open(a.path, opt, &w);
    upgrading->Finish();
  } else if (st.ok()) {
    Activity opening("rewind " + a.path + ": opening");  // recovery
    st = Writer::Open(a.path, opt, &w);
  }
  if (!st.ok() && st.IsDataError()) {
    // A file cut inside its committed data: the short line that says what
    // keeps the prefix (the library's message runs to 300 characters).
    std::string cut = ShortTruncation(a.path);
    if (!cut.empty()) return ReportError(Status::Corruption(cut));
  }
  if (!st.ok()) return ReportError(st);
  const Writer::RecoveryReport& rec = w->recovery();
  // Said once: on stderr when the rewind succeeds, else in its error line.
  std::string upgraded = rec.upgraded_from_v1 ? UpgradeNote(old_format, w->geometry()) : "";
  uint64_t before = w->token_count();
  if (a.to > before) {  // another writer changed the file in between
    (void)w->Close();
    return ReportError(Status::InvalidArgument(TooFar(a.path, a.to, before)), upgraded);
  }
  st = w->Rewind(a.to);
  if (st.ok()) st = w->Close();
  if (!st.ok()) return ReportError(st, upgraded);
  if (!upgraded.empty()) PrintLine("note", a.path + ": " + upgraded);
  if (rec.truncated_bytes > 0)
    std::printf("%s: cut a torn tail of %llu bytes first\n", a.path.c_str(),
                static_cast<unsigned long long>(rec.truncated_bytes));
  std::printf("%s: kept %llu tokens, dropped %llu\n", a.path.c_str(), static_cast<unsigned long long>(a.to),
              static_cast<unsigned long long>(before - a.to));
  return kExitOk;
}

}  // namespace

void RegisterRewind(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<RewindArgs>();
  CLI::App* cmd = app.add_subcommand(
      "rewind",
      "Keep the first N tokens of a .kv file and drop the rest, atomically and durably.\n"
      "N beyond the file's token count is refused (exit 2, file untouched). A v1 file is upgraded to v2\n"
      "first (its streams quantized to --upgrade-dtype, except --keep-raw ones); stderr says so.\n"
      "Example: kvfile rewind session.kv --to 1000");
  cmd->add_option("FILE", args->path, "the .kv file")->required();
  cmd->add_option("--to", args->to, "number of tokens to keep")->required()->check(Count(0, UINT64_MAX));
  cmd->add_option("--upgrade-dtype", args->upgrade_dtype,
                  "a v1 FILE is upgraded to v2 first: the fp8 dtype of its streams (default e4m3)")
      ->check(CLI::IsMember({"e4m3", "e5m2"}));
  cmd->add_option("--keep-raw", args->keep_raw, "streams kept raw by the upgrade of a v1 FILE; comma separated")
      ->delimiter(',');
  cmd->callback([args, exit_code] { *exit_code = RunRewind(*args); });
}

}  // namespace kvfile::cli
