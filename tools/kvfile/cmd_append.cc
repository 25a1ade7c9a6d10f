// SPDX-License-Identifier: Apache-2.0
// kvfile append: append the tokens of a safetensors file (the kvfile
// convention of kvfile/formats/safetensors.h, docs/formats.md) to a .kv file, creating it with the
// input's geometry if it does not exist.
//
// Everything is checked before the first byte is appended: the input's
// structure and token ids, its model and geometry against the existing
// file, and every value (finite; codes and scales valid). A refusal leaves
// FILE exactly as it was (or absent). A v1 FILE is upgraded to v2 first
// (--upgrade-dtype, --keep-raw), and stderr says so.
#include <algorithm>
#include <cstdio>
#include <optional>

#include "kvfile/formats/safetensors.h"
#include "kvfile/formats/safetensors_append.h"
#include "kvfile/replace.h"
#include "cli_common.h"
#include "pack_member.h"
#include "progress.h"
#include "progress_fs.h"
#include "signals.h"
#include "kvfile/reader.h"
#include "kvfile/writer.h"

namespace kvfile::cli {

namespace {

using safetensors::KvStream;
using safetensors::KvTensors;
using safetensors::SafetensorsFile;

struct AppendArgs {
  std::string path;
  std::string input;
  std::string sync = "close";
  std::optional<std::string> model;
  std::optional<std::string> dtype;
  std::optional<std::string> upgrade_dtype;
  std::vector<std::string> keep_raw;
  std::optional<uint32_t> chunk_tokens;  // default: BoundedChunkTokens(256)
};

SyncMode ParseSync(const std::string& s) {
  if (s == "none") return SyncMode::kNone;
  if (s == "chunk") return SyncMode::kChunk;
  return SyncMode::kClose;
}

// An append that failed or was interrupted is dropped whole by the
// library: AppendAll's batches are one append (AppendBatch::continued), a
// failed batch drops it, and Close() drops one left unfinished (an
// interrupt between batches), committing nothing of it (its kFailed says
// so; the error reported is the first one). After an I/O error the writer
// has cut the file back to its last commit itself.
int UndoAppend(std::unique_ptr<Writer> w, const Status& st, const std::string& upgraded) {
  (void)w->Close();
  return ReportError(st, upgraded);
}

int RunAppend(const AppendArgs& a) {
  InstallSignalHandlers();
  SetCurrentPath(a.path);
  safetensors::AppendPlanOptions plan_options;
  Status st;
  if (a.dtype) {
    plan_options.dtype.emplace();
    if (st = ParseDtype(*a.dtype, &*plan_options.dtype); !st.ok()) return UsageError(st.message());
  }
  if (a.upgrade_dtype) {
    plan_options.upgrade_dtype.emplace();
    if (st = ParseDtype(*a.upgrade_dtype, &*plan_options.upgrade_dtype); !st.ok()) return UsageError(st.message());
  }
  plan_options.keep_raw = a.keep_raw;
  st = RefusePackMemberTarget(a.path);
  if (!st.ok()) return ReportError(st);
  std::unique_ptr<SafetensorsFile> in;
  st = SafetensorsFile::Open(a.input, nullptr, &in);
  if (!st.ok()) return ReportError(st);
  KvTensors kv;
  st = safetensors::DescribeKv(in->header(), &kv);
  if (!st.ok()) return ReportError(st.WithContext(a.input));
  std::vector<uint32_t> ids;
  st = safetensors::ReadTokenIds(*in, kv, &ids);
  if (!st.ok()) return ReportError(st);

  bool exists = false;
  st = FileSystem::Default()->Exists(a.path, &exists);
  if (!st.ok()) return ReportError(st);
  safetensors::AppendPlan plan;  // the geometries, and the input stream of each of the file's
  std::string old_format;  // a v1 FILE: its format and dtypes, for the upgrade line
  std::string unidentified;  // the note for an input without a model identity
  ModelIdentity id;
  if (exists) {
    std::unique_ptr<Reader> r;
    st = Reader::Open(a.path, {}, &r);
    if (!st.ok()) return ReportError(st);
    st = CheckStreamNames(a.path, r->geometry(), a.keep_raw);
    if (!st.ok()) return ReportError(st);
    if (r->major_version() == 1) old_format = FormatAndDtypes(r->major_version(), r->minor_version(), r->geometry());
    st = safetensors::PlanAppend(kv, &r->geometry(), r->major_version(), plan_options, a.path, a.input, &plan);
    if (!st.ok()) return ReportError(st);
    id = r->identity();
    // An input that names no model matches any file of its geometry: said
    // on stderr once the append succeeds.
    if (!a.model && !kv.model_id && !kv.fingerprint)
      unidentified = a.path + ": " + a.input + " names no model (no kvfile.model or kvfile.fingerprint metadata, no "
                     "--model): appended to model '" + id.model_id + "' on its geometry alone";
    ModelIdentity want_id{a.model ? *a.model : kv.model_id.value_or(id.model_id), kv.fingerprint.value_or(id.fingerprint)};
    st = CheckExpected(id, plan.file, want_id, plan.want);
    if (!st.ok()) return ReportError(Status::Mismatch(a.path + ": " + st.message() + " (from " + a.input + ")"));
  } else {
    Geometry names;
    for (const KvStream& s : kv.streams) names.streams.push_back({s.name, 1, 1, Dtype::kBF16});
    st = CheckStreamNames(a.input, names, a.keep_raw);
    if (!st.ok()) return ReportError(st);
    id = {a.model ? *a.model : kv.model_id.value_or(""), kv.fingerprint.value_or(0)};
    st = safetensors::PlanAppend(kv, nullptr, 0, plan_options, a.path, a.input, &plan);
    if (!st.ok()) return ReportError(st);
  }
  const Geometry& file_geometry = plan.file;
  const std::vector<size_t>& stream_of = plan.stream_of;
  st = safetensors::CheckValues(*in, kv);
  if (!st.ok()) return ReportError(st);

  WriterOptions opt;
  opt.threads = 0;  // quantize on every core (the bytes do not depend on it)
  opt.sync = ParseSync(a.sync);
  if (!exists) opt.chunk_tokens = a.chunk_tokens ? *a.chunk_tokens : BoundedChunkTokens(file_geometry, 256, a.input);
  opt.upgrade_dtype = plan.upgrade_dtype;
  opt.keep_raw = a.keep_raw;
  // A new FILE is written under a temporary name and renamed into place
  // when complete and durable (sync mode close at least): a failure leaves
  // no FILE.
  std::unique_ptr<PendingReplace> create;
  // Declared before the writer, which reads and writes through its fs().
  std::unique_ptr<UpgradeProgress> upgrading;
  std::unique_ptr<Writer> w;
  st = CheckInterrupt(a.path);
  if (st.ok() && exists && !old_format.empty()) {
    // The open upgrades a v1 file: a bar of the v1 bytes read.
    upgrading = std::make_unique<UpgradeProgress>("append " + a.path + ": upgrading", a.path);
    opt.fs = upgrading->fs();
    st = Writer::Open(a.path, opt, &w);
    upgrading->Finish();
  } else if (st.ok() && exists) {
    // The open recovers the file: it can take a while.
    Activity opening("append " + a.path + ": opening");
    st = Writer::Open(a.path, opt, &w);
  } else if (st.ok()) {
    if (opt.sync == SyncMode::kNone) opt.sync = SyncMode::kClose;
    st = PendingReplace::Begin(a.path, nullptr, &create);
    if (st.ok() && create->original().exists)
      st = Status::Busy(a.path + ": created by another process while appending was being prepared");
    if (st.ok()) st = Writer::Create(create->temp_path(), file_geometry, id, opt, &w).WithContext(a.path);
  }
  if (!st.ok()) return ReportError(st);
  // Said once: on stderr when the append succeeds, else in its error line.
  std::string upgraded = w->recovery().upgraded_from_v1 ? UpgradeNote(old_format, w->geometry()) : "";
  if (w->geometry() != file_geometry) {  // replaced between the check and the open
    (void)w->Close();
    return ReportError(Status::Mismatch(a.path + ": the file changed while appending was being prepared"), upgraded);
  }
  uint64_t before = w->token_count();
  uint64_t per_token = 0;
  for (const StreamSpec& s : file_geometry.streams) per_token += s.ElementsPerToken() * 12;  // input + f32 + codes
  per_token *= file_geometry.layers;
  const uint64_t block = safetensors::BlockTokens(per_token, uint64_t{256} << 20);
  Progress progress("append " + a.path, kv.tokens);
  st = safetensors::AppendAll(*in, kv, ids, stream_of, *w, block, [&a, &progress, block] {
    progress.Add(block);
    return CheckInterrupt(a.path);
  });
  progress.Finish();
  if (!st.ok()) return UndoAppend(std::move(w), create ? st.WithContext(a.path) : st, upgraded);
  {
    Activity closing("append " + a.path + ": syncing");
    st = w->Close();
  }
  if (!st.ok() && create) st = st.WithContext(a.path);  // the writer names the temporary file
  if (st.ok() && create) st = create->Commit();
  if (!st.ok()) return ReportError(st, upgraded);
  if (!upgraded.empty()) PrintLine("note", a.path + ": " + upgraded);
  if (!unidentified.empty()) PrintLine("note", unidentified);
  std::printf("%s: %sappended %llu tokens from %s (%llu in total)\n", a.path.c_str(), exists ? "" : "created; ",
              static_cast<unsigned long long>(kv.tokens), a.input.c_str(),
              static_cast<unsigned long long>(before + kv.tokens));
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
