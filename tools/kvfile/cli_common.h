// What every kvfile subcommand shares: registration, exit codes and the one
// line of error output.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "kvfile/geometry.h"
#include "kvfile/reader.h"
#include "kvfile/status.h"

namespace kvfile::cli {

// Exit status: 0 success; 1 the data is at fault; 2 usage or environment.
inline constexpr int kExitOk = 0;
inline constexpr int kExitData = 1;
inline constexpr int kExitUsage = 2;

// Prints "kvfile: error: <message>" to stderr and returns the exit status
// for the status's code.
int ReportError(const Status& st);
// For failures that carry no Status (for example a bad flag combination).
int UsageError(const std::string& message);

// Tokens per chunk of a file created from `input` (convert, append) when
// --chunk-tokens is not given: `wanted`, halved until one chunk of `g` fits
// in max(64 MiB, the input's size). The new file's two staging buffers then
// stay within a bound tied to the input (FORMAT.md section 7.1): a hostile
// or odd header may declare a huge geometry over a handful of tokens, or none.
uint32_t BoundedChunkTokens(const Geometry& g, uint32_t wanted, const std::string& input);

// One line for a file cut inside its committed region (TailInfo::
// committed_data_missing): what is gone and what to do; info and dump
// print it.
std::string MissingCommittedData(const TailInfo& tail);

// Each subcommand registers itself; its callback stores the exit status.
void RegisterSynth(CLI::App& app, int* exit_code);
void RegisterInfo(CLI::App& app, int* exit_code);
void RegisterVerify(CLI::App& app, int* exit_code);
void RegisterRepair(CLI::App& app, int* exit_code);
void RegisterDump(CLI::App& app, int* exit_code);
void RegisterRewind(CLI::App& app, int* exit_code);
void RegisterAppend(CLI::App& app, int* exit_code);
void RegisterConvert(CLI::App& app, int* exit_code);
void RegisterBench(CLI::App& app, int* exit_code);

}  // namespace kvfile::cli
