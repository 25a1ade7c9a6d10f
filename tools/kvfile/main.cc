// The kvfile command line: dispatches to one subcommand per file.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string_view>

#include "cli_common.h"
#include "kvfile/format/chunk_layout.h"
#include "progress.h"

namespace kvfile::cli {

int ReportError(const Status& st) {
  std::fprintf(stderr, "kvfile: error: %s\n", st.message().c_str());
  return st.IsDataError() ? kExitData : kExitUsage;
}

int UsageError(const std::string& message) {
  std::fprintf(stderr, "kvfile: error: %s\n", message.c_str());
  return kExitUsage;
}

uint32_t BoundedChunkTokens(const Geometry& g, uint32_t wanted, const std::string& input) {
  std::error_code ec;
  uint64_t input_bytes = std::filesystem::file_size(input, ec);
  const uint64_t cap = std::max<uint64_t>(uint64_t{64} << 20, ec ? 0 : input_bytes);
  format::ChunkLayout layout;
  while (wanted > 1 && (!format::ComputeChunkLayout(g, wanted, &layout).ok() || layout.chunk_bytes > cap))
    wanted /= 2;
  return wanted;
}

std::string MissingCommittedData(const TailInfo& tail) {
  return "the file ends inside its committed data: " + std::to_string(tail.committed_chunks_missing) +
         " chunk(s), " + std::to_string(tail.committed_tokens_missing) + " token(s), " +
         std::to_string(tail.committed_bytes_missing) +
         " byte(s) the commit record vouched for are gone (kvfile verify reports it; kvfile repair --force "
         "keeps the readable prefix)";
}

}  // namespace kvfile::cli

int main(int argc, char** argv) {
  using namespace kvfile::cli;
  CLI::App app{"kvfile: persist LLM KV caches as checksummed fp8 .kv files"};
  app.set_version_flag("--version", std::string("kvfile ") + KVFILE_VERSION);
  app.require_subcommand(1);
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
  RegisterBench(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "kvfile: error: %s (see kvfile --help)\n", e.what());
    return kExitUsage;
  } catch (const std::exception& e) {
    // Nothing in the library throws; this catches allocation failures.
    std::fprintf(stderr, "kvfile: error: %s\n", e.what());
    return kExitUsage;
  }
  return exit_code;
}
