// SPDX-License-Identifier: Apache-2.0
// Running the kvfile binary from a test: exit status, stdout and stderr.
// KVFILE_BINARY is the path of the binary (a compile definition).
#pragma once

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

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

// Starts `kvfile ARGS...` without a shell and without waiting: stdout to
// /dev/null, stderr to the file `err_path`, stdin `stdin_fd` if not -1.
// Returns the child's pid (-1 if fork failed); the caller signals it and
// reaps it with waitpid.
inline pid_t StartKvfile(const std::vector<std::string>& args, const std::string& err_path, int stdin_fd = -1) {
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  int out = ::open("/dev/null", O_WRONLY);
  if (err < 0 || out < 0) ::_exit(127);
  ::dup2(err, 2);
  ::dup2(out, 1);
  if (stdin_fd >= 0) ::dup2(stdin_fd, 0);
  std::vector<std::string> copy = args;
  std::string bin = KVFILE_BINARY;
  std::vector<char*> argv{bin.data()};
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv(bin.c_str(), argv.data());
  ::_exit(127);
}

// Runs `kvfile ARGS...` (StartKvfile) and waits: its exit status, its
// stderr and its own peak resident set in MiB, as wait4 reports it.
struct MeasuredRun {
  int exit_code = -1;
  std::string err;
  long peak_mib = 0;
};
inline MeasuredRun KvfileMeasuringPeak(const std::vector<std::string>& args) {
  static int counter = 0;
  std::string err_path = ::testing::TempDir() + "kvfile_cli_peak_" + std::to_string(::getpid()) + "_" +
                         std::to_string(++counter);
  MeasuredRun r;
  pid_t pid = StartKvfile(args, err_path);
  int status = 0;
  rusage usage{};
  if (pid > 0 && ::wait4(pid, &status, 0, &usage) == pid) {
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.peak_mib = usage.ru_maxrss / 1024;
  }
  std::ifstream e(err_path);
  r.err.assign(std::istreambuf_iterator<char>(e), {});
  std::filesystem::remove(err_path);
  return r;
}

}  // namespace kvfile::testing
