// kvfile rewind: keep the first N tokens of a .kv file and drop the rest,
// durably (spec/RECOVERY.md, "Rewind").
#include <cstdio>

#include "cli_common.h"
#include "kvfile/reader.h"
#include "kvfile/writer.h"

namespace kvfile::cli {

namespace {

struct RewindArgs {
  std::string path;
  uint64_t to = 0;
};

std::string TooFar(const std::string& path, uint64_t to, uint64_t have) {
  return path + ": cannot rewind to " + std::to_string(to) + " tokens; the file has " + std::to_string(have);
}

int RunRewind(const RewindArgs& a) {
  // A read-only look first: a request past the end is refused before the
  // writable open, which would already repair a torn tail.
  uint64_t have = 0;
  {
    std::unique_ptr<Reader> r;
    Status st = Reader::Open(a.path, {}, &r);
    if (!st.ok()) return ReportError(st);
    have = r->token_count();
  }
  if (a.to > have) return UsageError(TooFar(a.path, a.to, have));
  std::unique_ptr<Writer> w;
  Status st = Writer::Open(a.path, {}, &w);
  if (!st.ok()) return ReportError(st);
  const Writer::RecoveryReport& rec = w->recovery();
  uint64_t before = w->token_count();
  if (a.to > before) {  // another writer changed the file in between
    (void)w->Close();
    return UsageError(TooFar(a.path, a.to, before));
  }
  st = w->Rewind(a.to);
  if (st.ok()) st = w->Close();
  if (!st.ok()) return ReportError(st);
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
      "N beyond the file's token count is refused (exit 2, file untouched).\n"
      "Example: kvfile rewind session.kv --to 1000");
  cmd->add_option("FILE", args->path, "the .kv file")->required();
  cmd->add_option("--to", args->to, "number of tokens to keep")->required();
  cmd->callback([args, exit_code] { *exit_code = RunRewind(*args); });
}

}  // namespace kvfile::cli
