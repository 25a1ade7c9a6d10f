// SPDX-License-Identifier: Apache-2.0
// What a user can do about damage inside a .kv file: how many tokens before
// it are intact, and the exact command that keeps them. verify and repair
// add it to their one error line.
#pragma once

#include <string>

#include "kvfile/verify.h"

namespace kvfile::cli {

// The tokens before the first damaged chunk of `report` (a VerifyFile
// report of `path`), or -1 when no chunk is named or the file cannot be
// opened.
int64_t IntactTokens(const std::string& path, const VerifyReport& report);

// "tokens 0-4095 are intact; keep them: kvfile convert PATH PATH.salvaged.kv
// --salvage", or "" when IntactTokens is -1. `shown` is the name to print.
std::string IntactAdvice(const std::string& path, const std::string& shown, const VerifyReport& report);

// For a file cut inside its committed data (TailInfo::committed_data_missing):
// one short line, "PATH: file truncated: committed data missing: the file
// ends at offset E (chunk C at offset O); N committed tokens gone; KEEP the
// K before it", else "" (the file is not cut, or cannot be opened).
// `verify --json` keeps the library's full finding.
std::string ShortTruncation(const std::string& path, const std::string& keep = "repair --force keeps");

// Corruption with ShortTruncation's line (`opened` named `shown`) when the
// file is cut inside its committed data, else OK: info and dump show the
// readable prefix and then fail with it (exit 1).
Status CutInsideCommittedData(const std::string& opened, const std::string& shown);

}  // namespace kvfile::cli
