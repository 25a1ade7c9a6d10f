// SPDX-License-Identifier: Apache-2.0
// kvfile index and kvfile find: the persistent prefix index of a directory
// and the longest-prefix lookup over a directory or a pack (spec/INDEX.md).
#include <nlohmann/json.hpp>

#include <charconv>
#include <cstdio>
#include <filesystem>

#include "cli_common.h"
#include "input_file.h"
#include "json_output.h"
#include "kvfile/prefix_index.h"
#include "progress_fs.h"
#include "signals.h"

namespace kvfile::cli {

namespace {

struct FindArgs {
  std::string path;
  std::string tokens_file;
  std::string fingerprint;
  bool json = false;
  bool no_write = false;
};

struct IndexArgs {
  std::string dir;
  bool json = false;
};

std::string Hex(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// 1 to 16 hex digits, with or without 0x.
bool ParseHex(std::string_view s, uint64_t* out) {
  if (s.starts_with("0x") || s.starts_with("0X")) s.remove_prefix(2);
  if (s.empty() || s.size() > 16) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out, 16);
  return ec == std::errc() && end == s.data() + s.size();
}

// The most bytes a token file (or standard input) may hold: about 24
// million token ids of 10 digits and a separator.
constexpr uint64_t kMaxTokenFileBytes = uint64_t{256} << 20;

// Whitespace-separated decimal token ids from `file` (- : standard input).
// A FIFO, device, directory or socket is refused without reading it.
Status ReadTokens(const std::string& file, std::vector<uint32_t>* tokens) {
  std::vector<uint8_t> text;
  KVFILE_RETURN_IF_ERROR(file == "-" ? ReadWholeStdin(kMaxTokenFileBytes, &text)
                                     : ReadWholeFile(file, kMaxTokenFileBytes, &text));
  const char* p = reinterpret_cast<const char*>(text.data());
  const char* end = p + text.size();
  auto space = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; };
  while (true) {
    while (p < end && space(*p)) ++p;
    if (p == end) break;
    const char* word = p;
    while (p < end && !space(*p)) ++p;
    uint32_t v = 0;
    auto [stop, ec] = std::from_chars(word, p, v);
    if (ec != std::errc() || stop != p) {
      std::string w(word, std::min<size_t>(p - word, 40));
      return Status::InvalidArgument(file + ": token " + std::to_string(tokens->size() + 1) + " ('" + w +
                                     "') is not a token id (0 to 4294967295)");
    }
    tokens->push_back(v);
  }
  if (tokens->empty()) return Status::InvalidArgument(file + ": no token ids");
  return Status::OK();
}

// At most one warning line: what the index left out or could not save.
void Warn(const std::string& dir, const PrefixIndexReport& r) {
  std::string line;
  if (!r.not_written.empty())
    line = (std::filesystem::path(dir) / kPrefixIndexName).string() + ": not updated (" + r.not_written +
           "); answered from a scan of the directory";
  if (r.skipped > 0) {
    std::string left = std::to_string(r.skipped) + " unreadable .kv file(s) or directories left out of the index" +
                       (r.first_skipped.empty() ? "" : " (first: " + r.first_skipped + ")");
    line = line.empty() ? dir + ": " + left : line + "; " + left;
  }
  if (!line.empty()) PrintLine("warning", line);
}

int RunFind(const FindArgs& a) {
  InstallSignalHandlers();
  SetCurrentPath(a.path);
  PrefixFindOptions opt;
  opt.write_index = !a.no_write;
  if (!a.fingerprint.empty()) {
    uint64_t fp = 0;
    if (!ParseHex(a.fingerprint, &fp))
      return UsageError("--model-fingerprint: '" + EscapeLine(a.fingerprint) + "' is not 1 to 16 hex digits");
    opt.fingerprint = fp;
  }
  std::vector<uint32_t> query;
  Status st = ReadTokens(a.tokens_file, &query);
  if (!st.ok()) return ReportError(st);
  std::error_code ec;
  const bool dir = IsObjectPrefix(a.path) || std::filesystem::is_directory(a.path, ec);
  std::optional<PrefixMatch> m;
  PrefixIndexReport report;
  // A signal stops the refresh of a directory's index at its next read or
  // write; the old index stays.
  ReadProgressFileSystem stop_fs(FileSystem::Default(), nullptr, ReadProgressFileSystem::Signals::kStop);
  opt.fs = &stop_fs;
  st = FindPrefix(a.path, query, opt, &m, &report);
  if (PendingSignal())
    st = CheckInterrupt(dir ? (std::filesystem::path(a.path) / kPrefixIndexName).string() : a.path);
  if (!st.ok()) return a.json ? ReportErrorAsJson(a.path, st) : ReportError(st);
  std::string where;
  if (m) where = dir ? (std::filesystem::path(a.path) / m->path).string() : a.path + ":" + m->path;
  if (a.json) {
    nlohmann::ordered_json j;
    j["path"] = m ? nlohmann::json(dir ? where : a.path) : nlohmann::json(nullptr);
    j["member"] = m && !dir ? nlohmann::json(m->path) : nlohmann::json(nullptr);
    j["tokens"] = m ? m->tokens : 0;
    j["matched"] = m ? m->matched : 0;
    j["model"] = m ? nlohmann::json(m->model_id) : nlohmann::json(nullptr);
    j["fingerprint"] = m ? nlohmann::json(Hex(m->fingerprint)) : nlohmann::json(nullptr);
    PrintJson(j);
  }
  if (!m) {
    std::fflush(stdout);
    // Not found is the data's answer (exit 1), like grep's.
    PrintLine("error", a.path + ": no " + (dir ? "file" : "member") + " shares the first token of the query (" +
                           std::to_string(report.indexed) + " searched" +
                           (opt.fingerprint ? " with that fingerprint" : "") + ")");
    return kExitData;
  }
  if (!a.json)
    std::printf("%s: %llu of %zu tokens match (%llu tokens, model %s, fingerprint %s)\n", EscapeLine(where).c_str(),
                static_cast<unsigned long long>(m->matched), query.size(), static_cast<unsigned long long>(m->tokens),
                EscapeLine(m->model_id).c_str(), Hex(m->fingerprint).c_str());
  if (dir) Warn(a.path, report);
  return kExitOk;
}

int RunIndex(const IndexArgs& a) {
  InstallSignalHandlers();
  SetCurrentPath(a.dir);
  PrefixIndexReport r;
  // A signal stops the refresh at its next read or write; the old index stays.
  ReadProgressFileSystem stop_fs(FileSystem::Default(), nullptr, ReadProgressFileSystem::Signals::kStop);
  Status st = IndexDirectory(a.dir, &stop_fs, &r);
  std::string index_path = (std::filesystem::path(a.dir) / kPrefixIndexName).string();
  if (!st.ok() && PendingSignal()) st = CheckInterrupt(index_path);
  if (!st.ok()) return a.json ? ReportErrorAsJson(a.dir, st) : ReportError(st);
  if (a.json) {
    nlohmann::ordered_json j;
    j["path"] = index_path;
    j["files"] = r.files;
    j["indexed"] = r.indexed;
    j["read"] = r.reread;
    j["kept"] = r.kept;
    j["skipped"] = r.skipped;
    j["written"] = r.written;
    j["up_to_date"] = r.was_fresh;  // the text's "up to date"
    j["rebuilt"] = r.rebuilt;       // the text's "the old index was damaged and is replaced"
    PrintJson(j);
  } else if (r.was_fresh) {
    std::printf("%s: up to date (%llu files)\n", EscapeLine(index_path).c_str(), static_cast<unsigned long long>(r.indexed));
  } else {
    std::printf("%s: %llu files indexed (%llu read, %llu unchanged)%s\n", EscapeLine(index_path).c_str(),
                static_cast<unsigned long long>(r.indexed), static_cast<unsigned long long>(r.reread),
                static_cast<unsigned long long>(r.kept), r.rebuilt ? "; the old index was damaged and is replaced" : "");
  }
  Warn(a.dir, r);
  return kExitOk;
}

}  // namespace

void RegisterFind(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<FindArgs>();
  CLI::App* cmd = app.add_subcommand(
      "find",
      "Print the .kv file or pack member of a directory, or the member of a pack, that shares the longest\n"
      "prefix of token ids with a query, and the length of that prefix. A directory is searched through\n"
      "its index (DIR/.kvfile-index), which is refreshed first when files changed (kvfile index); a pack\n"
      "through the index beside it when that lists the pack as it is, else member by member. Among equally\n"
      "long matches: the smallest fingerprint, then the smallest token sequence, then the smallest path.\n"
      "No file sharing the first token: exit 1.\n"
      "Example: kvfile find snapshots/ --tokens prompt.txt\n"
      "         echo 1 2 3 | kvfile find corpus.kvpack --tokens - --json");
  cmd->add_option("PATH", args->path, "a directory of .kv and .kvpack files, or a .kvpack")->required();
  cmd->add_option("--tokens", args->tokens_file, "file of whitespace-separated token ids (- : standard input)")->required();
  cmd->add_option("--model-fingerprint", args->fingerprint, "only files of this model fingerprint (hex)");
  cmd->add_flag("--json", args->json, "print one JSON object: path, member, tokens, matched, model, fingerprint");
  cmd->add_flag("--no-write", args->no_write, "do not write a refreshed index back to the directory");
  cmd->callback([args, exit_code] { *exit_code = RunFind(*args); });
}

void RegisterIndex(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<IndexArgs>();
  CLI::App* cmd = app.add_subcommand(
      "index",
      "Write or refresh DIR/.kvfile-index, the prefix index kvfile find uses, of the .kv files and the\n"
      "members of the .kvpack files under DIR (PACK:MEMBER), for DIR and for each pack in it (only changed\n"
      "and new files are read; a damaged index is rebuilt). Unreadable files are left out, with one\n"
      "warning line.\n"
      "Example: kvfile index snapshots/");
  cmd->add_option("DIR", args->dir, "a directory searched for *.kv and *.kvpack")->required();
  cmd->add_flag("--json", args->json, "print one JSON object");
  cmd->callback([args, exit_code] { *exit_code = RunIndex(*args); });
}

}  // namespace kvfile::cli
