// SPDX-License-Identifier: Apache-2.0
// The pack verbs (cmd_pack.cc): pack, unpack, ls, and verify of a .kvpack.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace kvfile::cli {

void RegisterPack(CLI::App& app, int* exit_code);
void RegisterUnpack(CLI::App& app, int* exit_code);
void RegisterLs(CLI::App& app, int* exit_code);
// Whether `path` starts with the .kvpack magic (an unreadable path: no).
bool IsPackFile(const std::string& path);
// `kvfile verify PACK`: every member record and every chunk once.
int RunPackVerify(const std::string& path, bool json);

}  // namespace kvfile::cli
