// SPDX-License-Identifier: Apache-2.0
// kvfile convert for colibri .coli_kv sessions (kvfile/coli_kv.h), and the
// dispatch of convert_seeds.h: which conversions belong to the seeds'
// formats.
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>

#include "kvfile/replace.h"
#include "cli_common.h"
#include "convert_seeds.h"
#include "kvfile/coli_kv.h"
#include "kvfile/verify.h"
#include "signals.h"

namespace kvfile::cli {

namespace fs = std::filesystem;

namespace {

bool EndsWith(const std::string& s, const char* suffix) { return fs::path(s).extension() == suffix; }

// Runs `body` writing the new file at a temporary path, then renames it over
// OUT (atomic_replace.h); prints `line` on success.
int ReplaceFile(const std::string& out, bool force,
                const std::function<Status(const std::string& tmp, std::string* line, std::string* note)>& body) {
  std::unique_ptr<PendingReplace> replace;
  Status st = PendingReplace::Begin(out, nullptr, &replace);
  if (!st.ok()) return ReportError(st);
  if (replace->original().exists && !force)
    return ReportError(Status::InvalidArgument(out + ": file exists; use --force to replace it"));
  std::string line, note;
  st = body(replace->temp_path(), &line, &note);
  if (PendingSignal()) st = CheckInterrupt(out);  // a signal: OUT stays as it was
  if (st.ok()) st = replace->Commit();
  if (!st.ok()) return ReportError(st);
  std::printf("%s\n", line.c_str());
  if (!note.empty()) {
    std::fflush(stdout);
    PrintLine("note", note);
  }
  return kExitOk;
}

}  // namespace

Status VerifyBeforeConvert(const std::string& in) {
  VerifyReport rep;
  VerifyOptions vo;
  vo.threads = 4;
  KVFILE_RETURN_IF_ERROR(VerifyFile(in, vo, &rep));
  for (const VerifyFinding& f : rep.findings)
    if (f.error) return Status::Corruption(in + ": " + f.message + "; not converted (kvfile verify fails on it)");
  return Status::OK();
}

bool ConvertSeedFormat(const SeedConvertArgs& given, int* exit_code) {
  // A .coli_kv OUT says the format itself, unless --format names another.
  SeedConvertArgs a = given;
  if (a.format == "v2" && EndsWith(a.out, ".coli_kv")) a.format = "coli-v2";
  std::error_code ec;
  bool in_dir = fs::is_directory(a.in, ec);
  bool mooncake_out = a.format == "mooncake";
  bool coli_out = a.format == "coli-v2" || a.format == "coli-v1";
  // A manifest.json that is not a regular file (a FIFO): refused by the
  // import with one line, rather than taken for a tree of .kv files.
  bool odd_manifest = in_dir && fs::exists(fs::symlink_status(fs::path(a.in) / "manifest.json", ec)) &&
                      !fs::is_regular_file(fs::path(a.in) / "manifest.json", ec);
  bool mooncake_in = in_dir && (IsMooncakeDir(a.in) || odd_manifest);
  bool coli_in = !in_dir && EndsWith(a.in, ".coli_kv");
  if (!mooncake_out && !coli_out && !mooncake_in && !coli_in) {
    if (a.group_size) *exit_code = UsageError("--group-size applies to --format mooncake");
    else if (a.vocab) *exit_code = UsageError("--vocab applies to --format coli-v2 or coli-v1");
    else if (a.indexer_layers) *exit_code = UsageError("--indexer-layers applies to a .coli_kv IN");
    else if (EndsWith(a.out, ".coli_kv"))
      *exit_code =
          UsageError(a.out + ": a .coli_kv OUT is written by --format coli-v2 or coli-v1, not --format " + a.format);
    else return false;
    return true;
  }
  SetCurrentPath(a.out);
  if (a.other_flags) {
    *exit_code = UsageError("--dtype, --keep-raw, --codes, --chunk-tokens, --salvage and --jobs do not apply to "
                            "Mooncake or .coli_kv conversions");
    return true;
  }
  if (a.group_size && !mooncake_out) {
    *exit_code = UsageError("--group-size applies to --format mooncake");
    return true;
  }
  if (a.indexer_layers && !coli_in) {
    *exit_code = UsageError("--indexer-layers applies to a .coli_kv IN");
    return true;
  }
  if (a.vocab && !coli_out) {
    *exit_code = UsageError("--vocab applies to --format coli-v2 or coli-v1");
    return true;
  }
  if ((mooncake_out || coli_out) && (mooncake_in || coli_in || in_dir || !EndsWith(a.in, ".kv"))) {
    *exit_code = UsageError(a.in + ": --format " + a.format + " converts a .kv file");
    return true;
  }
  if ((mooncake_in || coli_in) && !EndsWith(a.out, ".kv")) {
    *exit_code = UsageError(a.out + ": a " + std::string(mooncake_in ? "Mooncake directory" : ".coli_kv file") +
                            " is converted to a .kv file (OUT must end in .kv)");
    return true;
  }
  if (mooncake_out) *exit_code = ExportMooncake(a);
  else if (coli_out) *exit_code = ExportColi(a);
  else if (mooncake_in) *exit_code = ImportMooncake(a);
  else *exit_code = ImportColi(a);
  return true;
}

int ImportColi(const SeedConvertArgs& a) {
  coli::ImportOptions o;
  if (a.indexer_layers) {
    std::vector<uint32_t> layers;
    Status st = ParseLayerList(*a.indexer_layers, &layers);
    if (!st.ok()) return UsageError("--indexer-layers: " + st.message());
    o.indexer_layers = std::move(layers);
  }
  return ReplaceFile(a.out, a.force, [&a, &o](const std::string& tmp, std::string* line, std::string* note) {
    coli::ImportResult res;
    KVFILE_RETURN_IF_ERROR(coli::Import(a.in, tmp, o, &res));
    const coli::Header& h = res.header;
    *line = a.in + " -> " + a.out + ": COLIKV" + std::to_string(h.version) + ", " + std::to_string(h.records) +
            " tokens, " + std::to_string(h.layers) + " layers (latent " + std::to_string(h.kv_lora) + ", rope " +
            std::to_string(h.qk_rope) + (h.indexer_layers ? ", indexer " + std::to_string(h.index_hd) : "") +
            (h.indexer_layer_list.empty() ? "" : " in layers " + FormatLayerList(h.indexer_layer_list)) +
            "), vocab " + std::to_string(h.vocab);
    std::string parts;
    if (h.version == 1) parts = "COLIKV1 f32 latent and rope rows quantized to e4m3 (kvfile's row rule)";
    if (res.ignored_bytes > 0)
      parts += (parts.empty() ? "" : "; ") + std::to_string(res.ignored_bytes) +
               " bytes past the record count ignored (an uncommitted append, as colibri ignores it)";
    if (!parts.empty()) *note = a.in + ": " + parts;
    return Status::OK();
  });
}

int ExportColi(const SeedConvertArgs& a) {
  Status st = VerifyBeforeConvert(a.in);
  if (!st.ok()) return ReportError(st);
  return ReplaceFile(a.out, a.force, [&a](const std::string& tmp, std::string* line, std::string*) {
    coli::ExportOptions o;
    o.vocab = a.vocab;
    o.version = a.format == "coli-v1" ? 1 : 2;
    uint64_t tokens = 0;
    KVFILE_RETURN_IF_ERROR(coli::Export(a.in, tmp, o, &tokens));
    *line = a.in + " -> " + a.out + ": COLIKV" + std::to_string(o.version) + ", " + std::to_string(tokens) + " tokens";
    return Status::OK();
  });
}

}  // namespace kvfile::cli
