// SPDX-License-Identifier: Apache-2.0
// What a piece of work costs in memory: run in a forked child, whose peak
// RSS (VmHWM) before and after it is compared, so that what the test
// process touched earlier does not count.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <string>

namespace kvfile::testing {

inline long VmHwmKib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

struct ChildCost {
  std::string result;     // what `work` returned
  long growth_mib = -1;   // how far the child's peak RSS rose over `work`; -1 if it did not report
};

// Runs `work` in a forked child and reports its result and peak RSS growth.
inline ChildCost RunInChild(const std::function<std::string()>& work) {
  int p[2];
  if (::pipe(p) != 0) return {};
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    long before = VmHwmKib();
    std::string result = work();
    std::string out = std::to_string((VmHwmKib() - before) / 1024) + " " + result;
    (void)!::write(p[1], out.data(), out.size());
    _exit(0);
  }
  ::close(p[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(p[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
  ::close(p[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ChildCost c;
  size_t space = text.find(' ');
  if (pid < 0 || space == std::string::npos) return c;
  c.growth_mib = std::stol(text.substr(0, space));
  c.result = text.substr(space + 1);
  return c;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr long kSmallGrowthMib = 64;  // the sanitizer's quarantine and shadow
#else
inline constexpr long kSmallGrowthMib = 16;
#endif

}  // namespace kvfile::testing
