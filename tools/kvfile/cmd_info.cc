// SPDX-License-Identifier: Apache-2.0
// kvfile info: what a .kv file holds, as text or one JSON document.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>

#include "cli_common.h"
#include "damage_advice.h"
#include "json_output.h"
#include "kvfile/reader.h"
#include "pack_member.h"
#include "stdin_copy.h"

namespace kvfile::cli {

namespace {

struct InfoArgs {
  std::vector<std::string> paths;
  bool json = false;
};

// Bytes the same tokens would take stored raw as bf16 (no scales, no
// headers): what an engine writes without kvfile.
uint64_t Bf16Bytes(const Geometry& g, uint64_t tokens) {
  uint64_t per_token = 0;  // over the layers each stream is in
  for (uint32_t s = 0; s < g.streams.size(); ++s) per_token += g.streams[s].ElementsPerToken() * 2 * g.StreamLayers(s);
  return per_token * tokens;
}

// One file: its text block on stdout, or its JSON object in *out. `shown`
// is the name printed ("-" for standard input), `path` the file opened. A
// failure is returned, not printed.
Status InfoOne(const std::string& shown, const std::string& path, bool json, nlohmann::ordered_json* out) {
  SetCurrentPath(shown);
  std::unique_ptr<Reader> r;
  Status st = Reader::Open(path, {}, &r);
  if (!st.ok()) {
    // The library names the temporary copy (standard input, a pack member).
    if (path != shown) st = RenamePath(st, path, shown);
    return st;
  }
  const Geometry& g = r->geometry();
  uint64_t bytes = r->tail().file_size;
  uint64_t tokens = r->token_count();
  double per_token = tokens ? static_cast<double>(bytes) / static_cast<double>(tokens) : 0.0;
  uint64_t bf16 = Bf16Bytes(g, tokens);
  std::string version = std::to_string(r->major_version()) + "." + std::to_string(r->minor_version());
  if (json) {
    nlohmann::ordered_json j;
    j["path"] = shown;
    j["version"] = version;
    j["model"] = r->identity().model_id;
    j["fingerprint"] = Hex16(r->identity().fingerprint);
    j["layers"] = g.layers;
    j["streams"] = nlohmann::json::array();
    for (const StreamSpec& s : g.streams) {
      nlohmann::ordered_json js = {{"name", s.name},
                                   {"rows_per_token", s.rows_per_token},
                                   {"row_width", s.row_width},
                                   {"dtype", DtypeName(s.dtype)}};
      if (!s.layers.empty()) js["layers"] = s.layers;  // a stream in some layers only
      j["streams"].push_back(std::move(js));
    }
    j["tokens"] = tokens;
    j["chunks"] = r->chunks().size();
    j["bytes"] = bytes;
    j["bytes_per_token"] = per_token;
    j["bf16_bytes"] = bf16;
    j["torn_tail_bytes"] = r->tail().torn_tail_bytes;
    j["damage_before_end"] = r->tail().valid_data_follows;
    j["committed_data_missing"] = r->tail().committed_data_missing;
    j["committed_tokens_missing"] = r->tail().committed_tokens_missing;
    j["committed_bytes_missing"] = r->tail().committed_bytes_missing;
    j["io_backend"] = r->io_backend();
    *out = std::move(j);
    return Status::OK();
  }
  std::printf("file:            %s\n", shown.c_str());
  std::printf("format:          v%s\n", version.c_str());
  std::printf("model:           %s (fingerprint %s)\n", r->identity().model_id.c_str(),
              Hex16(r->identity().fingerprint).c_str());
  std::printf("layers:          %u\n", g.layers);
  std::printf("streams:\n");
  for (const StreamSpec& s : g.streams)
    std::printf("  %-14s %4u rows x %5u  %s%s\n", s.name.c_str(), s.rows_per_token, s.row_width, DtypeName(s.dtype),
                s.layers.empty() ? "" : ("  in layers " + FormatLayerList(s.layers)).c_str());
  std::printf("tokens:          %llu\n", static_cast<unsigned long long>(tokens));
  std::printf("chunks:          %zu (nominal %u tokens each)\n", r->chunks().size(), r->nominal_chunk_tokens());
  std::printf("bytes:           %llu (%.1f per token)\n", static_cast<unsigned long long>(bytes), per_token);
  if (bf16 > 0)
    std::printf("as raw bf16:     %llu bytes; this file is %.3fx that size\n",
                static_cast<unsigned long long>(bf16), static_cast<double>(bytes) / static_cast<double>(bf16));
  std::printf("torn tail:       %llu bytes%s%s\n", static_cast<unsigned long long>(r->tail().torn_tail_bytes),
              r->tail().torn_reason.empty() ? "" : " - ", r->tail().torn_reason.c_str());
  if (r->tail().valid_data_follows)
    std::printf("damage:          a valid chunk follows the tail at offset %llu: damage before the end "
                "(run kvfile verify)\n",
                static_cast<unsigned long long>(r->tail().valid_data_offset));
  if (r->tail().committed_data_missing)
    std::printf("missing data:    %s\n", MissingCommittedData(r->tail()).c_str());
  std::printf("io backend:      %s\n", r->io_backend());
  return Status::OK();
}

// Several FILEs: every one is shown (a failed one as an error entry); the
// first failure is the one stderr line, and the exit status is the worst.
int RunInfo(const InfoArgs& a) {
  StdinCopy stdin_copy;
  PackMemberInputs members;
  nlohmann::ordered_json all = nlohmann::json::array();
  int code = kExitOk;
  bool reported = false;
  for (size_t i = 0; i < a.paths.size(); ++i) {
    const std::string& shown = a.paths[i];
    std::string path = shown;
    if (!a.json && i > 0) std::printf("\n");
    nlohmann::ordered_json j;
    Status st = shown == "-" ? stdin_copy.Copy(&path) : members.Resolve(shown, &path);
    if (st.ok()) st = InfoOne(shown, path, a.json, &j);
    // A file cut inside its committed data: its readable prefix is shown,
    // and the cut is the failure (exit 1).
    Status cut = st.ok() ? CutInsideCommittedData(path, shown) : Status::OK();
    if (!cut.ok()) {
      std::fflush(stdout);
      code = std::max(code, reported ? kExitData : ReportError(cut));
      reported = true;
    }
    if (!st.ok()) {
      if (a.json) j = {{"path", shown}, {"ok", false}, {"error", st.message()}};
      else if (a.paths.size() > 1) std::printf("file:            %s\nerror:           %s\n", shown.c_str(),
                                               EscapeLine(st.message()).c_str());
      std::fflush(stdout);
      int c = st.IsDataError() ? kExitData : kExitUsage;
      if (!reported) c = ReportError(st);
      reported = true;
      code = std::max(code, c);
    }
    if (a.json) all.push_back(j);
  }
  if (a.json) PrintJson(a.paths.size() == 1 ? all[0] : all);
  return code;
}

}  // namespace

void RegisterInfo(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<InfoArgs>();
  CLI::App* cmd = app.add_subcommand(
      "info",
      "Show a .kv file's version, model, geometry and size. With several FILEs, one block each\n"
      "(with --json, an array of their documents).\n"
      "Example: kvfile info session.kv --json\n"
      "         kvfile info corpus.kvpack:docs/a.kv\n"
      "         cat session.kv | kvfile info -");
  cmd->add_option("FILE", args->paths,
                  "the .kv files (- reads one from standard input; PACK:MEMBER a member of a .kvpack)")
      ->required();
  cmd->add_flag("--json", args->json, "print one JSON document");
  cmd->callback([args, exit_code] { *exit_code = RunInfo(*args); });
}

}  // namespace kvfile::cli
