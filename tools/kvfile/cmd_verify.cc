// SPDX-License-Identifier: Apache-2.0
// kvfile verify: check every byte of files or of corpus directories.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <thread>

#include "cli_common.h"
#include "cmd_pack.h"
#include "damage_advice.h"
#include "json_output.h"
#include "kvfile/pack.h"
#include "kvfile/parallel.h"
#include "input_file.h"
#include "kvfile/verify.h"
#include "natural_sort.h"
#include "pack_member.h"
#include "progress.h"
#include "signals.h"
#include "stdin_copy.h"

namespace kvfile::cli {

namespace {

struct VerifyArgs {
  std::vector<std::string> paths;
  bool json = false;
  bool quick = false;
  bool strict = false;
  bool errors_only = false;
  unsigned jobs = 1;
};

// A finding's message with its chunk and file offset in front, unless the
// message already names them (most do: "chunk 3 at offset 24576: ...").
std::string Located(const VerifyFinding& f) {
  std::string where;
  if (f.chunk >= 0 && f.message.find("chunk " + std::to_string(f.chunk)) == std::string::npos)
    where = "chunk " + std::to_string(f.chunk);
  if (f.offset >= 0 && f.message.find("offset " + std::to_string(f.offset)) == std::string::npos)
    where += (where.empty() ? "at offset " : " at offset ") + std::to_string(f.offset);
  return where.empty() ? f.message : where + ": " + f.message;
}

struct FileResult {
  std::string path;
  Status status;  // environment failure (file missing, I/O error), or a pack's damage
  VerifyReport report;
  bool done = false;  // false: not reached before a signal
  bool pack = false;  // a .kvpack: pack_report, and damage in status
  PackVerifyReport pack_report;
  uint64_t pack_bytes = 0;
};

// A whole .kvpack among several paths: every record and chunk once.
void VerifyPack(const std::string& path, FileResult* out) {
  out->pack = true;
  std::unique_ptr<PackReader> r;
  out->status = PackReader::Open(path, nullptr, &r);
  if (out->status.ok()) out->status = r->Verify(&out->pack_report);
  if (out->status.ok()) out->pack_bytes = r->file_bytes();
}

// Expands directories into the *.kv files under them, in natural order
// (doc2 before doc10); a directory without any is a usage error. A
// subdirectory that cannot be read is listed too, its error in *unreadable:
// it fails as an unreadable file does, and the others are still checked.
Status Expand(const std::vector<std::string>& paths, std::vector<std::string>* files, bool* directory,
              std::map<std::string, Status>* unreadable) {
  namespace fs = std::filesystem;
  for (const std::string& p : paths) {
    std::error_code ec;
    // An s3:// path ending in '/' is a key prefix: its .kv files and packs.
    const bool prefix = IsObjectPrefix(p);
    if (prefix || (p != "-" && fs::is_directory(p, ec))) {  // "-" is standard input, whatever is named "-" (./- is that)
      std::vector<WalkEntry> walked;
      if (prefix)
        KVFILE_RETURN_IF_ERROR(WalkDirectory(p, {".kv", ".kvpack"}, &walked));
      else
        KVFILE_RETURN_IF_ERROR(WalkDirectory(p, {".kv"}, &walked));
      std::vector<std::string> found;
      for (WalkEntry& w : walked) {
        if (!w.error.ok()) unreadable->emplace(w.path, w.error);
        found.push_back(std::move(w.path));
      }
      if (found.empty())
        return Status::InvalidArgument(p + (prefix ? ": no .kv or .kvpack objects under this prefix"
                                                   : ": no .kv files in this directory"));
      NaturalSort(&found);
      *directory = true;
      files->insert(files->end(), found.begin(), found.end());
    } else {
      files->push_back(p);
    }
  }
  return Status::OK();
}

int RunVerify(const VerifyArgs& a) {
  InstallSignalHandlers();
  if (!a.paths.empty()) SetCurrentPath(a.paths[0]);
  if (a.paths.size() == 1 && a.paths[0] != "-" && IsPackFile(a.paths[0])) return RunPackVerify(a.paths[0], a.json);
  std::vector<std::string> files;
  bool directory = false;
  std::map<std::string, Status> unreadable;  // subdirectories a walk could not read
  Status st = Expand(a.paths, &files, &directory, &unreadable);
  if (!st.ok()) {
    if (!a.json) return ReportError(st);
    nlohmann::ordered_json failed = nlohmann::json::array();
    failed.push_back({{"path", nullptr}, {"ok", false}, {"error", st.message()}});
    PrintJson(failed);
    return ReportError(st);
  }
  // "-": standard input, copied to a temporary file first.
  StdinCopy stdin_copy;
  std::string stdin_path;
  if (std::find(files.begin(), files.end(), "-") != files.end()) {
    st = stdin_copy.Copy(&stdin_path);
    if (!st.ok()) return ReportError(st);
  }
  // PACK:MEMBER: the member materialised (and checked) first, in order.
  PackMemberInputs members;
  std::vector<std::string> opened_paths(files.size());
  std::vector<Status> resolved(files.size());
  for (size_t i = 0; i < files.size(); ++i)
    if (auto u = unreadable.find(files[i]); u != unreadable.end()) resolved[i] = u->second;
    else if (files[i] != "-") resolved[i] = members.Resolve(files[i], &opened_paths[i]);
  std::map<std::string, size_t> index_of;
  for (size_t i = 0; i < files.size(); ++i) index_of.emplace(files[i], i);
  auto opened = [&](const std::string& f) { return f == "-" ? stdin_path : opened_paths[index_of.at(f)]; };
  // Several files: one line each and a summary on stdout, one error line.
  const bool many = files.size() > 1 || directory;
  std::vector<FileResult> results(files.size());
  uint64_t total_bytes = 0;
  for (const std::string& f : files) {
    std::error_code size_ec;
    uint64_t n = std::filesystem::file_size(opened(f), size_ec);
    if (!size_ec) total_bytes += n;
  }
  Progress progress("verify", total_bytes);
  // After a signal no further file is started; the signal is reported
  // once, after the results of the files already checked.
  unsigned jobs = std::max(1u, std::min<unsigned>(a.jobs, static_cast<unsigned>(files.size())));
  // The cores not taken by --jobs split each file's chunks between them.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const unsigned threads_per_file = std::max(1u, cores / jobs);
  ParallelFor(
      0, files.size(), jobs,
      [&](unsigned, size_t i) {
        results[i].path = files[i];
        VerifyOptions opt;
        opt.quick = a.quick;
        opt.threads = threads_per_file;
        try {
          if (!resolved[i].ok()) {
            results[i].pack = resolved[i].IsDataError();  // a damaged pack, reported as one
            results[i].status = resolved[i];
          } else if (IsPackFile(opened(files[i]))) {
            VerifyPack(opened(files[i]), &results[i]);
          } else {
            results[i].status = members.Name(VerifyFile(opened(files[i]), opt, &results[i].report));
            for (VerifyFinding& f : results[i].report.findings) f.message = members.Name(f.message);
          }
          if (files[i] == "-") {
            results[i].status = NameStdin(results[i].status, stdin_path);
            for (VerifyFinding& f : results[i].report.findings) f.message = NameStdin(Status::Corruption(f.message), stdin_path).message();
          }
        } catch (const std::bad_alloc&) {
          results[i].status = Status::Failed(files[i] + ": out of memory");
        }
        results[i].done = true;
        progress.Add(results[i].report.bytes);
      },
      PendingSignal);
  progress.Finish();

  int exit_code = kExitOk;
  size_t checked = 0, failed = 0;
  std::string first_failure;  // many: the stderr line's "PATH: finding"
  nlohmann::ordered_json out = nlohmann::json::array();
  for (const FileResult& r : results) {
    if (!r.done) continue;
    const VerifyReport& rep = r.report;
    bool bad = !r.status.ok() || rep.HasErrors() || (a.strict && rep.HasWarnings());
    if (!r.status.ok() && !(r.pack && r.status.IsDataError())) exit_code = kExitUsage;
    else if (bad && exit_code == kExitOk) exit_code = kExitData;
    ++checked;
    if (bad) ++failed;
    if (!bad && a.errors_only) continue;
    if (r.pack) {
      const PackVerifyReport& pr = r.pack_report;
      if (a.json) {
        nlohmann::ordered_json j{{"path", r.path}, {"ok", !bad}};
        if (bad) j["errors"] = {{{"offset", nullptr}, {"chunk", nullptr}, {"message", r.status.message()}}};
        else j.update({{"members", pr.members}, {"chunks", pr.chunks}, {"bytes", r.pack_bytes},
                       {"payload_bytes", pr.payload_bytes}});
        out.push_back(j);
      } else if (bad && !many) {
        ReportError(r.status);
      } else if (bad) {
        std::printf("%s: FAILED: %s\n", r.path.c_str(), EscapeLine(r.status.message()).c_str());
        if (first_failure.empty()) first_failure = r.status.message();  // names the pack
      } else {
        std::printf("%s: ok: %llu members, %llu chunks, %llu bytes\n", r.path.c_str(),
                    static_cast<unsigned long long>(pr.members), static_cast<unsigned long long>(pr.chunks),
                    static_cast<unsigned long long>(r.pack_bytes));
      }
      continue;
    }
    if (a.json) {
      nlohmann::ordered_json j;
      j["path"] = r.path;
      j["ok"] = !bad;
      j["version"] = rep.opened ? std::to_string(rep.major) + "." + std::to_string(rep.minor) : "";
      j["tokens"] = rep.tokens;
      j["chunks"] = rep.chunks;
      j["bytes"] = rep.bytes;
      j["torn_tail_bytes"] = rep.torn_tail_bytes;
      j["errors"] = nlohmann::json::array();
      j["warnings"] = nlohmann::json::array();
      if (!r.status.ok()) j["errors"].push_back({{"offset", nullptr}, {"chunk", nullptr}, {"message", r.status.message()}});
      for (const VerifyFinding& f : rep.findings) {
        nlohmann::ordered_json e;
        e["offset"] = f.offset >= 0 ? nlohmann::json(f.offset) : nlohmann::json(nullptr);
        e["chunk"] = f.chunk >= 0 ? nlohmann::json(f.chunk) : nlohmann::json(nullptr);
        e["message"] = f.message;
        (f.error || a.strict ? j["errors"] : j["warnings"]).push_back(e);
      }
      out.push_back(j);
      continue;
    }
    if (many) {
      std::string finding;
      if (!r.status.ok()) finding = r.status.message();
      for (const VerifyFinding& f : rep.findings)
        if (finding.empty() && (f.error || a.strict)) finding = Located(f);
      if (bad && first_failure.empty()) first_failure = finding.starts_with(r.path) ? finding : r.path + ": " + finding;
      if (bad) {
        std::printf("%s: FAILED: %s\n", r.path.c_str(), EscapeLine(finding).c_str());
        continue;
      }
    }
    if (!r.status.ok()) {
      ReportError(r.status);
      continue;
    }
    // One line: the first finding, what is intact and how to keep it;
    // --json lists every finding.
    const VerifyFinding* first = nullptr;
    size_t more = 0;
    for (const VerifyFinding& f : rep.findings) {
      if (!f.error && !a.strict) continue;
      if (first) ++more;
      else first = &f;
    }
    if (first) {
      std::string cut = rep.committed_data_missing && r.path != "-" ? ShortTruncation(r.path) : "";
      if (!cut.empty()) {
        PrintLine("error", cut + (more ? "; " + std::to_string(more) + " more in --json" : ""));
        continue;
      }
      std::string advice = r.path == "-" ? "" : IntactAdvice(r.path, r.path, rep);
      PrintLine("error", r.path + ": " + Located(*first) + (advice.empty() ? "" : "; " + advice) +
                             (more ? "; " + std::to_string(more) + " more in --json" : ""));
      continue;
    }
    std::printf("%s: ok: %llu tokens in %llu chunks, %llu bytes", r.path.c_str(),
                static_cast<unsigned long long>(rep.tokens), static_cast<unsigned long long>(rep.chunks),
                static_cast<unsigned long long>(rep.bytes));
    for (const VerifyFinding& f : rep.findings) std::printf("; warning: %s", Located(f).c_str());
    std::printf("\n");
  }
  if (a.json) PrintJson(out);
  if (many && !a.json)
    std::printf("%zu of %zu files damaged%s\n", failed, checked, checked < files.size() ? " (interrupted)" : "");
  if (many && failed > 0 && !PendingSignal()) {
    std::fflush(stdout);
    std::string line = std::to_string(failed) + " of " + std::to_string(checked) + " files failed; first: ";
    // The one error line stays short; the findings are in the output.
    std::string rest = first_failure.size() + line.size() > 190 ? first_failure.substr(0, 190 - line.size()) + "..." : first_failure;
    PrintLine("error", line + rest);
    return exit_code;
  }
  if (PendingSignal()) {
    std::fflush(stdout);
    // Names the argument given (a directory), or the first file not checked.
    std::string where = a.paths.front();
    if (a.paths.size() > 1)
      for (size_t i = 0; i < files.size(); ++i)
        if (!results[i].done) {
          where = files[i];
          break;
        }
    return ReportError(CheckInterrupt(where));
  }
  return exit_code;
}

}  // namespace

void RegisterVerify(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<VerifyArgs>();
  CLI::App* cmd = app.add_subcommand(
      "verify",
      "Check every checksum, the structure, the codes and the scales of .kv files (read-only).\n"
      "A torn tail left by a crash is a warning (exit 0) unless --strict. Several files (or a directory):\n"
      "one line per file and a summary line on stdout, in natural order (doc2 before doc10); exit 1 if\n"
      "any failed. A file's chunks are checked on all cores (divided by --jobs).\n"
      "Example: kvfile verify session.kv\n"
      "         kvfile verify snapshots/ --jobs 2 --json");
  cmd->add_option("PATH", args->paths,
                  "files, .kvpack archives, PACK:MEMBER, or directories searched for *.kv (- reads a file from\n"
                  "standard input)")
      ->required();
  cmd->add_flag("--json", args->json, "print one JSON array, one object per file");
  cmd->add_flag("--quick", args->quick, "headers and structure only, without reading payloads");
  cmd->add_flag("--strict", args->strict, "treat a torn tail as an error");
  cmd->add_flag("--errors-only", args->errors_only, "list only the files that fail (and the summary line)");
  cmd->add_option("--jobs", args->jobs, "files checked in parallel")->check(Count(1, 256))->capture_default_str();
  cmd->callback([args, exit_code] { *exit_code = RunVerify(*args); });
}

}  // namespace kvfile::cli
