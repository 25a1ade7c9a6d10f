// SPDX-License-Identifier: Apache-2.0
// kvfile append: the library's AppendSafetensors (kvfile/append.h: append
// the tokens of a safetensors file in the kvfile convention to a .kv file,
// creating it with the input's geometry if it does not exist, as one
// transaction), with the CLI's flags, progress, signal checks and words.
//
// A refusal leaves FILE exactly as it was (or absent). A v1 FILE is
// upgraded to v2 first (--upgrade-dtype, --keep-raw), and stderr says so.
#include <algorithm>
#include <cstdio>
#include <optional>

#include "kvfile/append.h"
#include "cli_common.h"
#include "pack_member.h"
#include "progress.h"
#include "progress_fs.h"
#include "signals.h"

namespace kvfile::cli {

namespace {

struct AppendArgs {
  std::string path;
  std::string input;
  std::string sync = "close";
  std::optional<std::string> model;
  std::optional<std::string> dtype;
  std::optional<std::string> upgrade_dtype;
  std::vector<std::string> keep_raw;
  std::optional<uint32_t> chunk_tokens;  // default: the library's (256, fitted to INPUT's size)
};

SyncMode ParseSync(const std::string& s) {
  if (s == "none") return SyncMode::kNone;
  if (s == "chunk") return SyncMode::kChunk;
  return SyncMode::kClose;
}

int RunAppend(const AppendArgs& a) {
  InstallSignalHandlers();
  SetCurrentPath(a.path);
  AppendOptions o;
  Status st;
  if (a.dtype) {
    o.dtype.emplace();
    if (st = ParseDtype(*a.dtype, &*o.dtype); !st.ok()) return UsageError(st.message());
  }
  if (a.upgrade_dtype) {
    o.upgrade_dtype.emplace();
    if (st = ParseDtype(*a.upgrade_dtype, &*o.upgrade_dtype); !st.ok()) return UsageError(st.message());
  }
  if (st = RefusePackMemberTarget(a.path); !st.ok()) return ReportError(st);
  o.model = a.model;
  o.keep_raw = a.keep_raw;
  o.chunk_tokens = a.chunk_tokens;
  o.sync = ParseSync(a.sync);
  o.threads = 0;  // quantize on every core (the bytes do not depend on it)
  // The displays of the stages: a v1 FILE's upgrade has a bar of the bytes
  // it reads, an existing FILE's open (its recovery) and the final sync a
  // spinner, the append a bar of the tokens.
  ReadProgressFileSystem counted(FileSystem::Default(), nullptr);
  o.fs = &counted;
  std::optional<UpgradeProgress> upgrading;
  std::optional<Activity> opening, closing;
  std::optional<Progress> progress;
  uint64_t shown = 0;  // tokens the bar shows
  o.on_stage = [&](AppendStage stage, const AppendReport& r) {
    switch (stage) {
      case AppendStage::kOpening:
        if (r.major_before == 1) {
          upgrading.emplace("append " + a.path + ": upgrading", a.path);
          counted.set_progress(upgrading->progress());
        } else if (!r.created) {
          opening.emplace("append " + a.path + ": opening");
        }
        return CheckInterrupt(a.path);
      case AppendStage::kAppending:
        if (upgrading) upgrading->Finish();
        if (opening) opening->Finish();
        counted.set_progress(nullptr);
        progress.emplace("append " + a.path, r.input_tokens);
        return Status::OK();
      case AppendStage::kSyncing:
        if (progress) {
          progress->Add(r.input_tokens - std::min(r.input_tokens, shown));  // all appended: the full bar
          progress->Finish();
        }
        closing.emplace("append " + a.path + ": syncing");
        return Status::OK();
    }
    return Status::OK();
  };
  o.on_progress = [&](uint64_t done) {
    if (progress) progress->Add(done - std::min(done, shown));
    shown = std::max(shown, done);
    return CheckInterrupt(a.path);
  };
  AppendReport r;
  st = AppendSafetensors(a.path, a.input, o, &r);
  for (auto* display : {&opening, &closing})
    if (*display) (*display)->Finish();
  if (upgrading) upgrading->Finish();
  if (progress) progress->Finish();
  // Said once: on stderr when the append succeeds, else in its error line.
  const std::string upgraded =
      r.upgraded_from_v1 ? UpgradeNote(FormatAndDtypes(r.major_before, r.minor_before, r.geometry_before), r.geometry)
                         : "";
  if (!st.ok()) return ReportError(st, upgraded);
  if (!upgraded.empty()) PrintLine("note", a.path + ": " + upgraded);
  for (const std::string& n : r.notes) PrintLine("note", n);
  std::printf("%s: %sappended %llu tokens from %s (%llu in total)\n", a.path.c_str(), r.created ? "created; " : "",
              static_cast<unsigned long long>(r.input_tokens), a.input.c_str(),
              static_cast<unsigned long long>(r.tokens_before + r.input_tokens));
  return kExitOk;
}

}  // namespace

void RegisterAppend(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<AppendArgs>();
  CLI::App* cmd = app.add_subcommand(
      "append",
      "Append the tokens of a safetensors file to a .kv file, creating FILE with the input's geometry\n"
      "if it does not exist. Input: one tensor per stream [layers, tokens, rows, width] (BF16, F16, F32),\n"
      "or <stream>.codes + <stream>.scales (nvfp4: + <stream>.block_scales); a 'tokens' tensor; __metadata__ kvfile.model and\n"
      "kvfile.fingerprint. Streams are matched by name. A model or geometry mismatch, or a non-finite\n"
      "value, is refused before anything is written (exit 1, FILE untouched). A v1 FILE is upgraded to\n"
      "v2 first (its streams quantized to --upgrade-dtype, except --keep-raw ones); stderr says so.\n"
      "Example: kvfile append session.kv turn2.safetensors --sync chunk");
  cmd->add_option("FILE", args->path, "the .kv file to append to (created if missing)")->required();
  cmd->add_option("INPUT", args->input, "the .safetensors file with the new tokens")->required();
  cmd->add_option("--sync", args->sync, "sync mode: none, chunk or close")
      ->check(CLI::IsMember({"none", "chunk", "close"}))
      ->capture_default_str();
  cmd->add_option("--model", args->model, "model id (default: the input's kvfile.model)");
  cmd->add_option("--dtype", args->dtype,
                  "quantized dtype of a new FILE's streams (default e4m3; nvfp4: the 4-bit tier; codes keep "
                  "theirs); for an existing FILE it must match")
      ->check(CLI::IsMember({"e4m3", "e5m2", "nvfp4"}));
  cmd->add_option("--upgrade-dtype", args->upgrade_dtype,
                  "a v1 FILE is upgraded to v2 first: the fp8 dtype of its streams (default: --dtype if fp8, else e4m3)")
      ->check(CLI::IsMember({"e4m3", "e5m2"}));
  cmd->add_option("--keep-raw", args->keep_raw,
                  "streams kept raw by the upgrade of a v1 FILE, or stored raw (bf16) in a new FILE; comma separated")
      ->delimiter(',');
  cmd->add_option("--chunk-tokens", args->chunk_tokens,
                  "tokens per chunk of a new FILE (default 256, halved while a chunk exceeds "
                  "max(64 MiB, INPUT's size))")
      ->check(Count(1, 65536));
  cmd->callback([args, exit_code] { *exit_code = RunAppend(*args); });
}

}  // namespace kvfile::cli
