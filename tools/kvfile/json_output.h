// SPDX-License-Identifier: Apache-2.0
// JSON output of the CLI (--json): one valid document on stdout whatever
// the input holds. Paths and model ids come from outside and may be any
// bytes; they are escaped by the JSON library and invalid UTF-8 is
// replaced (U+FFFD) instead of making the library throw.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "kvfile/status.h"

namespace kvfile::cli {

// Prints `j` (indented) and a newline to stdout.
void PrintJson(const nlohmann::ordered_json& j);

// For a --json command that failed: prints {"path", "ok": false, "error"}
// to stdout, the usual "kvfile: error:" line to stderr, and returns the
// exit status for the status's code.
int ReportErrorAsJson(const std::string& path, const Status& st);

}  // namespace kvfile::cli
