// SPDX-License-Identifier: Apache-2.0
// Helpers of the CLI adversity tests: what a path holds (to compare before
// and after), a small tmpfs for a real full disk, and a kvfile child
// process to signal mid-write.
#pragma once

#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/cli_run.h"

namespace kvfile::testing {

// What a path holds: a file's bytes; a directory's names, each with its
// bytes (files) or kind; a FIFO as such. Symlinks are not followed.
inline std::string Tree(const std::filesystem::path& p) {
  struct stat st;
  if (::lstat(p.c_str(), &st) != 0) return "<absent>";
  if (S_ISLNK(st.st_mode)) return "<link " + std::filesystem::read_symlink(p).string() + ">";
  if (S_ISFIFO(st.st_mode)) return "<fifo>";
  if (S_ISREG(st.st_mode)) return ReadFile(p);
  std::map<std::string, std::string> entries;
  for (const auto& e : std::filesystem::directory_iterator(p)) entries[e.path().filename().string()] = Tree(e.path());
  std::string s = "<dir>";
  for (const auto& [name, what] : entries) s += "\n" + name + " " + std::to_string(what.size()) + "\n" + what;
  return s;
}

// The names in a directory (dot files included).
inline std::set<std::string> Names(const std::filesystem::path& dir) {
  std::set<std::string> n;
  for (const auto& e : std::filesystem::directory_iterator(dir)) n.insert(e.path().filename().string());
  return n;
}

// Exactly one line on stderr, an error line.
inline void ExpectOneErrorLine(const CliRun& r) {
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.rfind("kvfile: error: ", 0), 0u) << r.err;
}

// A tmpfs of `size` (1 MiB unless told) at `dir`, unmounted by the
// destructor; false from Mount if this process may not mount one.
class SmallTmpfs {
 public:
  bool Mount(const std::string& dir, const std::string& size = "1m") {
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, ("size=" + size).c_str()) != 0) return false;
    dir_ = dir;
    return true;
  }
  ~SmallTmpfs() {
    if (!dir_.empty()) ::umount2(dir_.c_str(), MNT_DETACH);
  }

 private:
  std::string dir_;
};

// A kvfile process started without waiting (stdout to /dev/null, stderr
// to `err_path`), killed and reaped by the destructor if still running.
class KvfileChild {
 public:
  explicit KvfileChild(std::string err_path) : err_path_(std::move(err_path)) {}
  ~KvfileChild() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  // Starts `kvfile ARGS` (split at spaces), its standard input `stdin_fd`
  // when one is given.
  void Start(const std::string& args, int stdin_fd = -1) {
    std::vector<std::string> words;
    for (size_t i = 0; i < args.size();) {
      size_t j = args.find(' ', i);
      if (j == std::string::npos) j = args.size();
      if (j > i) words.push_back(args.substr(i, j - i));
      i = j + 1;
    }
    pid_ = StartKvfile(words, err_path_, stdin_fd);
    ASSERT_GE(pid_, 0);
  }
  pid_t pid() const { return pid_; }
  // Polls `started` until it is true (up to 60 s); false if the child
  // exited first.
  template <typename Pred>
  bool WaitUntil(Pred started) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      if (started()) return true;
      int status;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    return false;
  }
  // Polls until a name that `before` lacks appears in `dir` (the command's
  // temporary file); false if the child exited first.
  bool WaitForNewName(const std::filesystem::path& dir, const std::set<std::string>& before) {
    return WaitUntil([&] {
      for (const std::string& n : Names(dir))
        if (!before.count(n)) return true;
      return false;
    });
  }
  // Stops the child where it is (SIGSTOP), so that a signal sent next
  // lands at that point however loaded the machine; false if it had
  // exited. SignalAndWait continues it.
  bool Freeze() {
    int status = 0;
    if (::kill(pid_, SIGSTOP) != 0 || ::waitpid(pid_, &status, WUNTRACED) != pid_) return false;
    if (!WIFSTOPPED(status)) {
      pid_ = -1;
      return false;
    }
    frozen_ = true;
    return true;
  }
  // Sends `sig` (and SIGCONT after it if frozen: the handler runs as the
  // child goes on); the exit status, or 1000 + the signal that ended it.
  int SignalAndWait(int sig) {
    EXPECT_EQ(::kill(pid_, sig), 0);
    if (frozen_) ::kill(pid_, SIGCONT);
    frozen_ = false;
    int status = 0;
    EXPECT_EQ(::waitpid(pid_, &status, 0), pid_);
    pid_ = -1;
    if (WIFSIGNALED(status)) return 1000 + WTERMSIG(status);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  std::string err() const { return ReadFile(err_path_); }

 private:
  std::string err_path_;
  pid_t pid_ = -1;
  bool frozen_ = false;
};

}  // namespace kvfile::testing
