// SPDX-License-Identifier: Apache-2.0
// Running the kvfile binary from a test: exit status, stdout and stderr.
// KVFILE_BINARY is the path of the binary (a compile definition).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <gtest/gtest.h>

#include "support/file_util.h"

namespace kvfile::testing {

struct CliRun {
  int exit_code;
  std::string out;
  std::string err;
};

// Runs `kvfile ARGS` through the shell (after `prefix`, e.g. "timeout 10").
// stderr goes through a file named after the process, so that tests
// running in parallel never share one.
inline CliRun Kvfile(const std::string& args, const std::string& prefix = "") {
  static int counter = 0;
  std::string err_path = ::testing::TempDir() + "kvfile_cli_err_" + std::to_string(::getpid()) + "_" +
                         std::to_string(++counter);
  std::string cmd = prefix + " " + std::string(KVFILE_BINARY) + " " + args + " 2>" + err_path;
  CliRun r{};
  FILE* p = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream e(err_path);
  r.err.assign(std::istreambuf_iterator<char>(e), {});
  std::filesystem::remove(err_path);
  return r;
}

}  // namespace kvfile::testing
