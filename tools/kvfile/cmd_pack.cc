// SPDX-License-Identifier: Apache-2.0
// kvfile pack / unpack / ls, and verify of a pack: .kvpack archives
// (spec/PACK.md, src/include/kvfile/pack.h).
#include "cmd_pack.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "cli_common.h"
#include "input_file.h"
#include "json_output.h"
#include "kvfile/pack.h"
#include "progress.h"
#include "progress_fs.h"
#include "signals.h"

namespace kvfile::cli {

namespace {

namespace fs = std::filesystem;

struct PackArgs {
  std::vector<std::string> inputs;
  std::string out;
  uint32_t chunk_tokens = 256;
  std::optional<std::string> dtype;
  unsigned jobs = 1;
  bool force = false;
};

// Inputs to (member name, path): a directory gives its *.kv files under
// their paths relative to it, a file its own file name.
Status ListInputs(const std::vector<std::string>& inputs, std::vector<std::pair<std::string, std::string>>* out) {
  for (const std::string& p : inputs) {
    std::error_code ec;
    const bool prefix = IsObjectPrefix(p);  // s3://BUCKET/PREFIX/: its .kv objects
    if (prefix || fs::is_directory(p, ec)) {
      std::vector<std::pair<std::string, std::string>> found;
      std::vector<WalkEntry> walked;
      KVFILE_RETURN_IF_ERROR(WalkDirectory(p, {".kv"}, &walked));
      for (const WalkEntry& w : walked) {
        // An unreadable subdirectory is refused as an unreadable file is.
        if (!w.error.ok()) return w.error;
        found.emplace_back(w.path.substr(p.back() == '/' ? p.size() : p.size() + 1), w.path);  // relative to p
      }
      std::sort(found.begin(), found.end());
      out->insert(out->end(), found.begin(), found.end());
    } else if (p.starts_with("s3://") || fs::exists(p, ec)) {  // an object: the store says whether it exists
      out->emplace_back(fs::path(p).filename().string(), p);
    } else {
      return Status::NotFound(p + ": No such file or directory");
    }
  }
  std::map<std::string, std::string> seen;
  for (const auto& [name, path] : *out) {
    auto [it, fresh] = seen.emplace(name, path);
    if (!fresh)
      return Status::InvalidArgument(path + ": member name '" + name + "' is also the name of " + it->second);
  }
  return Status::OK();
}

int RunPack(const PackArgs& a) {
  InstallSignalHandlers();
  SetCurrentPath(a.out);
  std::vector<std::pair<std::string, std::string>> files;
  Status st = ListInputs(a.inputs, &files);
  if (!st.ok()) return ReportError(st);
  std::error_code ec;
  if (!a.force) {
    bool exists = false;
    st = OutputExists(a.out, &exists);
    if (!st.ok()) return ReportError(st);
    if (exists) return ReportError(Status::InvalidArgument(a.out + ": file exists; use --force to replace it"));
  }
  uint64_t total = 0;
  for (const auto& f : files) total += fs::file_size(f.second, ec), ec.clear();
  // A signal stops the pack at its next read or write (the temp goes).
  ReadProgressFileSystem stop_fs(FileSystem::Default(), nullptr, ReadProgressFileSystem::Signals::kStop);
  PackWriterOptions po;
  po.fs = &stop_fs;
  po.chunk_tokens = a.chunk_tokens;
  po.threads = a.jobs;
  if (a.dtype) {
    po.dtype.emplace();
    if (st = ParseDtype(*a.dtype, &*po.dtype); !st.ok()) return UsageError(st.message());
  }
  std::unique_ptr<PackWriter> w;
  st = PackWriter::Begin(a.out, po, &w);
  if (!st.ok()) return ReportError(st);
  Progress progress("pack", total);
  for (const auto& [name, path] : files) {
    if (PendingSignal()) return ReportError(CheckInterrupt(a.out));
    SetCurrentPath(path);
    st = w->AddFile(name, path);
    if (!st.ok()) return ReportError(PendingSignal() ? CheckInterrupt(a.out) : st);
    progress.Add(fs::file_size(path, ec));
  }
  if (PendingSignal()) return ReportError(CheckInterrupt(a.out));
  st = w->Finish();
  progress.Finish();
  if (!st.ok()) return ReportError(PendingSignal() ? CheckInterrupt(a.out) : st);
  const PackWriteStats& s = w->stats();
  std::printf("%s: %llu members, %llu tokens, %llu chunks stored of %llu used, %llu bytes\n", a.out.c_str(),
              static_cast<unsigned long long>(s.members), static_cast<unsigned long long>(s.tokens),
              static_cast<unsigned long long>(s.chunks_stored), static_cast<unsigned long long>(s.chunks_referenced),
              static_cast<unsigned long long>(s.file_bytes));
  return kExitOk;
}

// The directories unpack creates, removed again (when still empty) if it
// fails: a failed unpack leaves the output tree as it found it.
class CreatedDirs {
 public:
  Status Create(const fs::path& dir) {
    std::vector<fs::path> missing;
    std::error_code ec;
    for (fs::path p = dir; !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
      missing.push_back(p);
      if (p == p.parent_path()) break;
    }
    for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
      if (!fs::create_directory(*it, ec) && ec) return Status::IOError(it->string() + ": " + ec.message());
      made_.push_back(*it);
    }
    return Status::OK();
  }
  int Undo(int exit_code) {
    std::error_code ec;
    for (auto it = made_.rbegin(); it != made_.rend(); ++it) fs::remove(*it, ec);  // only if empty
    return exit_code;
  }

 private:
  std::vector<fs::path> made_;
};

struct UnpackArgs {
  std::string pack;
  std::string out;
  std::vector<std::string> members;
  bool force = false;
};

int RunUnpack(const UnpackArgs& a) {
  InstallSignalHandlers();
  SetCurrentPath(a.pack);
  if (a.out.starts_with("s3://"))
    return UsageError(a.out + ": unpack writes local files; upload a member with: kvfile convert PACK:MEMBER s3://BUCKET/KEY.kv");
  // A signal stops the unpack at its next read or write: the member being
  // written is left as it was.
  ReadProgressFileSystem stop_fs(FileSystem::Default(), nullptr, ReadProgressFileSystem::Signals::kStop);
  std::unique_ptr<PackReader> r;
  Status st = PackReader::Open(a.pack, &stop_fs, &r);
  if (!st.ok()) return ReportError(st);
  std::vector<size_t> chosen;
  if (a.members.empty()) {
    for (size_t i = 0; i < r->members().size(); ++i) chosen.push_back(i);
  } else {
    for (const std::string& m : a.members) {
      std::optional<size_t> i = r->Find(m);
      if (!i) return ReportError(Status::NotFound(a.pack + ": no member '" + m + "'"));
      chosen.push_back(*i);
    }
  }
  std::error_code ec;
  if (fs::exists(a.out, ec) && !fs::is_directory(a.out, ec))
    return ReportError(Status::InvalidArgument(a.out + ": exists and is not a directory"));
  std::vector<std::string> outs;
  for (size_t i : chosen) {
    outs.push_back((fs::path(a.out) / r->members()[i].name).string());
    if (!a.force && fs::exists(outs.back(), ec))
      return ReportError(Status::InvalidArgument(outs.back() + ": file exists; use --force to replace it"));
  }
  // Several members: every record and chunk they use is checked before any
  // file is written, so damage writes nothing. One member: Materialize
  // checks each chunk before its bytes are written and replaces the file
  // only when all of it is written, so one pass does.
  std::set<uint32_t> checked;
  std::vector<uint32_t> tokens, ids;
  std::vector<uint8_t> payload;
  uint64_t total = 0;
  for (size_t i : chosen) {
    if (PendingSignal()) return ReportError(CheckInterrupt(a.pack));
    total += r->members()[i].token_count;
    if (chosen.size() == 1) break;
    st = r->ReadMember(i, &tokens, &ids);
    if (!st.ok()) return ReportError(st);
    for (uint32_t id : ids)
      if (checked.insert(id).second) {
        st = r->ReadChunk(id, &payload);
        if (!st.ok()) return ReportError(st);
      }
  }
  Progress progress("unpack", total);
  CreatedDirs made;
  for (size_t k = 0; k < chosen.size(); ++k) {
    if (PendingSignal()) return made.Undo(ReportError(CheckInterrupt(outs[k])));
    SetCurrentPath(outs[k]);
    st = made.Create(fs::path(outs[k]).parent_path());
    if (!st.ok()) return made.Undo(ReportError(st));
    st = r->Materialize(chosen[k], outs[k]);
    if (!st.ok()) return made.Undo(ReportError(PendingSignal() ? CheckInterrupt(outs[k]) : st));
    progress.Add(r->members()[chosen[k]].token_count);
  }
  progress.Finish();
  std::printf("%s: %zu member(s) written to %s\n", a.pack.c_str(), chosen.size(), a.out.c_str());
  return kExitOk;
}

struct LsArgs {
  std::string pack;
  bool json = false;
};

int RunLs(const LsArgs& a) {
  SetCurrentPath(a.pack);
  std::unique_ptr<PackReader> r;
  Status st = PackReader::Open(a.pack, nullptr, &r);
  if (!st.ok()) return a.json ? ReportErrorAsJson(a.pack, st) : ReportError(st);
  // How many members use each chunk; reads every member record (checked).
  std::vector<uint32_t> uses(r->chunks().size(), 0);
  std::vector<std::vector<uint32_t>> member_ids(r->members().size());
  std::vector<uint32_t> tokens;
  for (size_t i = 0; i < r->members().size(); ++i) {
    st = r->ReadMember(i, &tokens, &member_ids[i]);
    if (!st.ok()) return a.json ? ReportErrorAsJson(a.pack, st) : ReportError(st);
    for (uint32_t id : member_ids[i]) uses[id]++;
  }
  nlohmann::ordered_json j;
  j["path"] = a.pack;
  j["file_bytes"] = r->file_bytes();
  j["chunks"] = r->chunks().size();
  j["members"] = nlohmann::json::array();
  if (!a.json) std::printf("%-40s %10s %14s %14s  %s\n", "MEMBER", "TOKENS", "BYTES", "SHARED", "MODEL");
  for (size_t i = 0; i < r->members().size(); ++i) {
    const PackMember& m = r->members()[i];
    const PackModel& model = r->models()[m.model];
    uint64_t bytes = 4 * (m.token_count + m.chunk_count), shared = 0;
    for (uint32_t id : member_ids[i]) {
      bytes += r->chunks()[id].bytes;
      if (uses[id] > 1) shared += r->chunks()[id].bytes;
    }
    if (a.json) {
      nlohmann::ordered_json e;
      e["name"] = m.name;
      e["tokens"] = m.token_count;
      e["bytes"] = bytes;
      e["shared_bytes"] = shared;
      e["model"] = model.identity.model_id;
      e["fingerprint"] = Hex16(model.identity.fingerprint);  // as info, dump and find give it
      j["members"].push_back(e);
    } else {
      std::printf("%-40s %10llu %14llu %14llu  %s\n", EscapeLine(m.name).c_str(),
                  static_cast<unsigned long long>(m.token_count), static_cast<unsigned long long>(bytes),
                  static_cast<unsigned long long>(shared), EscapeLine(model.identity.model_id).c_str());
    }
  }
  if (a.json) PrintJson(j);
  else
    std::printf("%zu members, %zu chunks stored, %llu bytes\n", r->members().size(), r->chunks().size(),
                static_cast<unsigned long long>(r->file_bytes()));
  return kExitOk;
}

}  // namespace

bool IsPackFile(const std::string& path) { return FileStartsWith(path, std::string_view("\x89KVP\r\n\x1a\n", 8)); }

int RunPackVerify(const std::string& path, bool json) {
  SetCurrentPath(path);
  std::unique_ptr<PackReader> r;
  Status st = PackReader::Open(path, nullptr, &r);
  PackVerifyReport rep;
  if (st.ok()) st = r->Verify(&rep);
  if (!st.ok()) return json ? ReportErrorAsJson(path, st) : ReportError(st);
  if (json) {
    nlohmann::ordered_json j = nlohmann::json::array();
    j.push_back({{"path", path}, {"ok", true}, {"members", rep.members}, {"chunks", rep.chunks},
                 {"bytes", r->file_bytes()}, {"payload_bytes", rep.payload_bytes}});
    PrintJson(j);
  } else {
    std::printf("%s: ok: %llu members, %llu chunks, %llu bytes\n", path.c_str(),
                static_cast<unsigned long long>(rep.members), static_cast<unsigned long long>(rep.chunks),
                static_cast<unsigned long long>(r->file_bytes()));
  }
  return kExitOk;
}

void RegisterPack(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<PackArgs>();
  CLI::App* cmd = app.add_subcommand(
      "pack",
      "Pack .kv files into one .kvpack archive; chunks members share are stored once (spec/PACK.md).\n"
      "A directory gives its *.kv files, named by their paths relative to it; a file, its file name.\n"
      "Example: kvfile pack corpus/ -o corpus.kvpack");
  cmd->add_option("INPUT", args->inputs, "directories or .kv files")->required();
  cmd->add_option("-o,--output", args->out, "the .kvpack to write")->required();
  cmd->add_option("--chunk-tokens", args->chunk_tokens, "tokens per pack chunk (sharing is found at multiples of it)")
      ->check(Count(1, 65536))->capture_default_str();
  cmd->add_option("--dtype", args->dtype,
                  "requantize on the way, as kvfile convert --dtype: e4m3/e5m2/nvfp4 re-encode fp8 and nvfp4\n"
                  "streams (raw streams stay raw), bf16/f16/f32 store every stream raw")
      ->check(CLI::IsMember({"e4m3", "e5m2", "nvfp4", "bf16", "f16", "f32"}));
  cmd->add_option("--jobs", args->jobs,
                  "threads reading and checking each input (all read the state its one open found); the\n"
                  "pack's bytes are the same for any value")
      ->check(Count(1, 256))
      ->capture_default_str();
  cmd->add_flag("--force", args->force, "replace OUT if it exists");
  cmd->callback([args, exit_code] { *exit_code = RunPack(*args); });
}

void RegisterUnpack(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<UnpackArgs>();
  CLI::App* cmd = app.add_subcommand(
      "unpack",
      "Write members of a .kvpack as .kv files under DIR (all members, or those named).\n"
      "Example: kvfile unpack corpus.kvpack -o out/ docs/a.kv");
  cmd->add_option("PACK", args->pack, "the .kvpack")->required();
  cmd->add_option("MEMBER", args->members, "members to write (default: all)");
  cmd->add_option("-o,--output", args->out, "the directory to write into")->required();
  cmd->add_flag("--force", args->force, "replace existing files");
  cmd->callback([args, exit_code] { *exit_code = RunUnpack(*args); });
}

void RegisterLs(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<LsArgs>();
  CLI::App* cmd = app.add_subcommand(
      "ls",
      "List the members of a .kvpack: tokens, bytes (its chunks and record), bytes shared with others.\n"
      "Example: kvfile ls corpus.kvpack --json");
  cmd->add_option("PACK", args->pack, "the .kvpack")->required();
  cmd->add_flag("--json", args->json, "print one JSON object");
  cmd->callback([args, exit_code] { *exit_code = RunLs(*args); });
}

}  // namespace kvfile::cli
