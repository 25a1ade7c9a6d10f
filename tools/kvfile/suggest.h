// SPDX-License-Identifier: Apache-2.0
// Did-you-mean for the command line: an unknown verb is answered with the
// nearest known one ("unknown command 'verfy'; did you mean 'verify'?").
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace kvfile::cli {

// The candidate nearest to `word` by edit distance (a swap of two adjacent
// letters counts as one edit), if it is within max(1, size/3) edits or
// `word` is a prefix of exactly one candidate; else "".
std::string Suggest(std::string_view word, const std::vector<std::string>& candidates);

// The verb on the command line (the first argument not starting with '-',
// global flags being the only ones allowed before it) checked against the
// subcommands of `app`. Returns -1 when it is one of them or there is none
// (CLI11 then reports what is missing), else prints the one error line and
// returns the exit status (2).
int CheckVerb(const CLI::App& app, int argc, char** argv);

// The one error line for a parse error of `app` (after app.parse threw
// `e`), pointing at the verb's own help: an unknown flag is named as it
// was typed, with the nearest flag of that verb ("info: unknown flag
// '--jsn'; did you mean '--json'? (see kvfile info --help)"); other
// unexpected arguments are listed in command-line order; any other parse
// error keeps CLI11's words.
std::string ParseErrorLine(const CLI::App& app, const CLI::ParseError& e);

}  // namespace kvfile::cli
