// SPDX-License-Identifier: Apache-2.0
// The kvfile command line: dispatches to one subcommand per file.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <new>
#include <string_view>

#include "cli_common.h"
#include "cmd_pack.h"
#include "kvfile/writer.h"
#include "progress.h"
#include "signals.h"
#include "suggest.h"

namespace kvfile::cli {

namespace {
std::string g_current_path;
}

std::string EscapeLine(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    auto b = static_cast<unsigned char>(c);
    if (b >= 0x20 && b != 0x7f) {
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", b);
      out += buf;
    }
  }
  return out;
}

void PrintLine(const char* kind, std::string_view message) {
  std::string line = std::string("kvfile: ") + kind + ": " + EscapeLine(message) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
}

int ReportError(const Status& st, const std::string& after) {
  PrintLine("error", after.empty() ? st.message() : st.message() + " (after " + after + ")");
  if (int sig = PendingSignal()) return 128 + sig;
  return st.IsDataError() ? kExitData : kExitUsage;
}

int UsageError(const std::string& message) {
  PrintLine("error", message);
  if (int sig = PendingSignal()) return 128 + sig;
  return kExitUsage;
}

void SetCurrentPath(const std::string& path) { g_current_path = path; }
const std::string& CurrentPath() { return g_current_path; }

CLI::Validator Count(uint64_t min, uint64_t max) {
  auto check = [min, max](std::string& s) -> std::string {
    std::string_view v = s;
    bool negative = v.starts_with('-');
    std::string_view digits = negative ? v.substr(1) : v;
    bool numeric = !digits.empty() && digits.find_first_not_of("0123456789") == std::string_view::npos;
    if (negative && numeric) return "expected a non-negative number, got '" + EscapeLine(s) + "'";
    if (!numeric) return "must be an integer, not '" + EscapeLine(s) + "'";
    uint64_t n = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    if (ec != std::errc() || n > max) return "must be at most " + std::to_string(max) + ", not " + s;
    if (n < min) return "must be at least " + std::to_string(min) + ", not " + s;
    return "";
  };
  return CLI::Validator(check, "INT in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
}

std::string MissingCommittedData(const TailInfo& tail) {
  return "the file ends inside its committed data: " + std::to_string(tail.committed_chunks_missing) +
         " chunk(s), " + std::to_string(tail.committed_tokens_missing) + " token(s), " +
         std::to_string(tail.committed_bytes_missing) +
         " byte(s) the commit record vouched for are gone (kvfile verify reports it; kvfile repair --force "
         "keeps the readable prefix)";
}

Status CheckStreamNames(const std::string& path, const Geometry& g, const std::vector<std::string>& names) {
  for (const std::string& n : names)
    if (!g.FindStream(n)) {
      std::string all;
      for (const StreamSpec& s : g.streams) all += (all.empty() ? "" : ", ") + s.name;
      return Status::InvalidArgument(path + ": --keep-raw: no stream '" + n + "' (streams: " + all + ")");
    }
  return Status::OK();
}

namespace {
std::string Dtypes(const Geometry& g) {
  std::string s = "(";
  for (size_t i = 0; i < g.streams.size(); ++i)
    s += (i ? ", " : "") + g.streams[i].name + " " + DtypeName(g.streams[i].dtype);
  return s + ")";
}
}  // namespace

std::string Hex16(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string FormatAndDtypes(uint16_t major, uint16_t minor, const Geometry& g) {
  return "format " + std::to_string(major) + "." + std::to_string(minor) + " " + Dtypes(g);
}

std::string UpgradeNote(const std::string& old_format, const Geometry& now) {
  return "upgraded from " + (old_format.empty() ? std::string("format 1") : old_format) + " to format 2 " + Dtypes(now);
}

}  // namespace kvfile::cli

int main(int argc, char** argv) {
  using namespace kvfile::cli;
  CLI::App app{"kvfile: persist LLM KV caches as checksummed fp8 .kv files"};
  app.set_version_flag("--version,-V", std::string("kvfile ") + KVFILE_VERSION);
  app.require_subcommand(1);
  // Global flags (--quiet) are accepted after the verb too.
  app.fallthrough();
  // --quiet is global; it is read before parsing so that it holds for every
  // verb whatever its position on the command line.
  bool quiet = false;
  app.add_flag("--quiet,-q", quiet, "no progress bar (one is drawn on stderr only when it is a terminal)");
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]) == "--quiet" || std::string_view(argv[i]) == "-q") SetQuiet(true);
  int exit_code = kExitOk;
  RegisterSynth(app, &exit_code);
  RegisterInfo(app, &exit_code);
  RegisterVerify(app, &exit_code);
  RegisterRepair(app, &exit_code);
  RegisterDump(app, &exit_code);
  RegisterRewind(app, &exit_code);
  RegisterAppend(app, &exit_code);
  RegisterConvert(app, &exit_code);
  RegisterLlamaServer(app, &exit_code);
  RegisterBench(app, &exit_code);
  RegisterPack(app, &exit_code);
  RegisterUnpack(app, &exit_code);
  RegisterLs(app, &exit_code);
  RegisterFind(app, &exit_code);
  RegisterIndex(app, &exit_code);
  RegisterVersion(app, &exit_code);
  RegisterCompletion(app, &exit_code);
  if (int code = CheckVerb(app, argc, argv); code >= 0) return code;
  // The library ignores an unknown backend name; a user who set one meant it.
  if (const char* io = std::getenv("KVFILE_IO"); io && *io) {
    std::string_view v = io;
    if (v != "posix" && v != "uring" && v != "io_uring")
      return UsageError("KVFILE_IO=" + EscapeLine(v) + ": unknown I/O backend (posix or uring)");
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    PrintLine("error", ParseErrorLine(app, e));
    return kExitUsage;
  } catch (const std::bad_alloc&) {
    // Nothing in the library throws; a verb's own buffers can.
    std::string path = CurrentPath().empty() ? "kvfile" : CurrentPath();
    return UsageError(path + ": out of memory");
  } catch (const std::exception& e) {
    std::string path = CurrentPath().empty() ? "kvfile" : CurrentPath();
    return UsageError(path + ": " + e.what());
  }
  return exit_code;
}
