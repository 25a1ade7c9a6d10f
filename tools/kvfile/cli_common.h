// SPDX-License-Identifier: Apache-2.0
// What every kvfile subcommand shares: registration, exit codes and the one
// line of error output.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvfile/geometry.h"
#include "kvfile/reader.h"
#include "kvfile/status.h"

namespace kvfile::cli {

// Exit status: 0 success; 1 the data is at fault; 2 usage or environment.
inline constexpr int kExitOk = 0;
inline constexpr int kExitData = 1;
inline constexpr int kExitUsage = 2;

// Prints "kvfile: error: <message>" to stderr and returns the exit status
// for the status's code, or 128 + the signal once one was received
// (signals.h: 130 SIGINT, 143 SIGTERM, 129 SIGHUP). A non-empty `after`
// is added to the same line as " (after <after>)".
int ReportError(const Status& st, const std::string& after = "");
// For failures that carry no Status (for example a bad flag combination).
int UsageError(const std::string& message);
// Writes "kvfile: <kind>: <message>" as exactly one line (EscapeLine).
void PrintLine(const char* kind, std::string_view message);
// `text` with every byte below 0x20 and 0x7f escaped ("\n", "\t", "\r",
// else "\xHH"), so that a path or message never splits the line.
std::string EscapeLine(std::string_view text);

// The path an out-of-memory failure (std::bad_alloc caught in main) names:
// each verb sets it to the file it works on.
void SetCurrentPath(const std::string& path);
const std::string& CurrentPath();

// A CLI11 check for a numeric flag: a decimal integer in [min, max]. A
// negative, overflowing or non-numeric value is refused with a message
// saying so (exit 2), never wrapped around.
CLI::Validator Count(uint64_t min, uint64_t max);

// One line for a file cut inside its committed region (TailInfo::
// committed_data_missing): what is gone and what to do; info and dump
// print it.
std::string MissingCommittedData(const TailInfo& tail);

// InvalidArgument naming the first of `names` that is no stream of `g`
// ("--keep-raw: no stream 'x' (streams: k, v)"), else OK.
Status CheckStreamNames(const std::string& path, const Geometry& g, const std::vector<std::string>& names);
// Sixteen lowercase hex digits: checksums, salts, fingerprints, flags.
std::string Hex16(uint64_t v);
// The memory a conversion's block of tokens may take (safetensors::BlockTokens).
inline constexpr uint64_t kConvertBufferBudget = uint64_t{128} << 20;
// "format 1.0 (k bf16, v bf16)".
std::string FormatAndDtypes(uint16_t major, uint16_t minor, const Geometry& g);
// What an upgrade on open did (append, rewind, repair): "upgraded from
// format 1.0 (k bf16, v bf16) to format 2 (k e4m3, v e4m3)". The verb
// prints it as its one stderr line on success ("kvfile: note: PATH: ..."),
// or adds it to its error line (ReportError's `after`).
std::string UpgradeNote(const std::string& old_format, const Geometry& now);

// Each subcommand registers itself; its callback stores the exit status.
void RegisterSynth(CLI::App& app, int* exit_code);
void RegisterInfo(CLI::App& app, int* exit_code);
void RegisterVerify(CLI::App& app, int* exit_code);
void RegisterRepair(CLI::App& app, int* exit_code);
void RegisterDump(CLI::App& app, int* exit_code);
void RegisterRewind(CLI::App& app, int* exit_code);
void RegisterAppend(CLI::App& app, int* exit_code);
void RegisterConvert(CLI::App& app, int* exit_code);
void RegisterLlamaServer(CLI::App& app, int* exit_code);
void RegisterBench(CLI::App& app, int* exit_code);
// `kvfile find` and `kvfile index` (cmd_find.cc).
void RegisterFind(CLI::App& app, int* exit_code);
void RegisterIndex(CLI::App& app, int* exit_code);
// `kvfile version`, and `kvfile completion bash|zsh|man` (completion.cc).
void RegisterVersion(CLI::App& app, int* exit_code);
void RegisterCompletion(CLI::App& app, int* exit_code);

}  // namespace kvfile::cli
