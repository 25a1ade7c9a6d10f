// SPDX-License-Identifier: Apache-2.0
// SwiftStore: a real S3-compatible object store for a test, OpenStack
// Swift with s3api on 127.0.0.1 (tests/support/swift_store.py, the
// harness: one node, one replica, memcached and four server processes, in
// a temporary directory under the given one). The constructor waits until
// the store answers (about 5 s on a quiet 2-core machine) and fails the test
// if it does not; the destructor (or Stop) stops every server and removes
// the directory. The harness's standard input is a pipe held only by this
// process (close-on-exec, so children started by the test do not keep it):
// if the test process dies, however, the harness sees its end and stops
// (it also stops by itself after --max-lifetime, 1800 s, and its servers
// die with it even when it is SIGKILLed).
//
//   SwiftStore store(dir_);
//   ASSERT_TRUE(store.ok());
//   ASSERT_TRUE(store.CreateBucket("kvtest"));   // 3 to 63 characters
//   store.ExportEnvironment();                   // AWS_* for this process and its children
//   ... kvfile ... s3://kvtest/key ...
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace kvfile::testing {

class SwiftStore {
 public:
  // Starts the harness with its temporary directory under `dir` (which must
  // exist); waits for its ready line (at most `timeout_s`).
  explicit SwiftStore(const std::filesystem::path& dir, int timeout_s = 180) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe2 failed";
      return;
    }
    const std::string script = std::string(KVFILE_TEST_DATA) + "/support/swift_store.py";
    const std::string d = dir.string();
    pid_ = ::fork();
    if (pid_ == 0) {
      // SIGTERM when this thread's process dies: the harness stops cleanly.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::execl("/usr/bin/python3", "python3", script.c_str(), "--dir", d.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    to_ = in[1];
    from_ = out[0];
    if (pid_ < 0) {
      ADD_FAILURE() << "fork failed";
      return;
    }
    std::string line = ReadLine(timeout_s);
    std::istringstream words(line);
    std::string w;
    words >> w;
    if (w != "ready") {
      ADD_FAILURE() << "the Swift harness did not start (" << script << "; its stderr is the test's): " << line;
      Stop();
      return;
    }
    while (words >> w) {
      size_t eq = w.find('=');
      if (eq != std::string::npos) fields_[w.substr(0, eq)] = w.substr(eq + 1);
    }
    ok_ = true;
  }
  ~SwiftStore() { Stop(); }
  SwiftStore(const SwiftStore&) = delete;
  SwiftStore& operator=(const SwiftStore&) = delete;

  bool ok() const { return ok_; }
  // Whether Debian's python3-swift is there to start (scripts/deps.sh
  // installs it; tests skip without it).
  static bool Installed() { return std::filesystem::exists("/usr/lib/python3/dist-packages/swift/__init__.py"); }
  // http://127.0.0.1:PORT, path-style addressing.
  std::string endpoint() const { return Field("endpoint"); }
  std::string access_key() const { return Field("access_key"); }  // "test:tester"
  std::string secret_key() const { return Field("secret_key"); }  // tempauth's password
  std::string region() const { return Field("region"); }
  // The arguments that make curl sign its requests for this store (SigV4;
  // the credentials in a netrc file, as curl's --user cuts the access key
  // at its ':'), for shell commands.
  std::string CurlArgs() const {
    return "--aws-sigv4 aws:amz:" + region() + ":s3 --netrc-file " + Field("netrc") +
           " -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD'";
  }
  // The proxy server's process (the one the clients talk to): SIGSTOP it to
  // freeze the store, SIGKILL it to stop it under a client.
  pid_t proxy_pid() const { return static_cast<pid_t>(std::stol(Field("proxy_pid", "-1"))); }
  // The harness's temporary directory (the servers' files and logs).
  std::string dir() const { return Field("dir"); }
  // The harness process (memcached and the servers are its children).
  pid_t harness_pid() const { return pid_; }
  // Seconds from the harness's start to ready.
  double ready_seconds() const { return std::stod(Field("ready_s", "0")); }

  // Creates bucket `name` through the harness (Swift's own API, so no S3
  // client code is involved); false with the harness's answer on failure.
  bool CreateBucket(const std::string& name) {
    if (!ok_) return false;
    if (!WriteLine("bucket " + name + "\n")) return false;
    std::string answer = ReadLine(60);
    if (answer != "ok") ADD_FAILURE() << "creating bucket " << name << ": " << answer;
    return answer == "ok";
  }

  // The requests clients made of the store so far (the harness's own not
  // counted), from the proxy's access log: {"total": N, "GET": N, ...};
  // empty on failure. Diff two calls to count an operation's requests.
  std::map<std::string, long> Requests() {
    std::map<std::string, long> counts;
    if (!ok_ || !WriteLine("requests\n")) return counts;
    std::istringstream words(ReadLine(60));
    std::string w;
    words >> w;
    if (w != "ok") return counts;
    while (words >> w) {
      size_t eq = w.find('=');
      if (eq != std::string::npos) counts[w.substr(0, eq)] = std::stol(w.substr(eq + 1));
    }
    return counts;
  }

  // The AWS variables a client reads (credentials, region, endpoint), set in
  // this process's environment so that the children it starts inherit them.
  void ExportEnvironment() const {
    ::setenv("AWS_ACCESS_KEY_ID", access_key().c_str(), 1);
    ::setenv("AWS_SECRET_ACCESS_KEY", secret_key().c_str(), 1);
    ::setenv("AWS_REGION", region().c_str(), 1);
    ::setenv("AWS_ENDPOINT_URL", endpoint().c_str(), 1);
    ::unsetenv("AWS_SESSION_TOKEN");
    ::unsetenv("AWS_PROFILE");
  }

  // Stops every server and waits for the harness (which removes its
  // directory). Idempotent.
  void Stop() {
    if (to_ >= 0) {
      WriteLine("stop\n");
      ::close(to_);
      to_ = -1;
    }
    if (pid_ > 0) {
      // The harness waits at most 10 s per server; SIGKILL after 60 s.
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      int status;
      while (::waitpid(pid_, &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > deadline) {
          ::kill(pid_, SIGKILL);
          ::waitpid(pid_, &status, 0);
          break;
        }
        ::usleep(10000);
      }
      pid_ = -1;
    }
    if (from_ >= 0) ::close(from_);
    from_ = -1;
    ok_ = false;
  }

 private:
  // Writes a command to the harness; false if it is gone (EPIPE: the
  // SIGPIPE that comes with it is blocked and taken, not delivered).
  bool WriteLine(const std::string& line) {
    if (to_ < 0) return false;
    sigset_t pipe_set, old;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    ::pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    ssize_t n = ::write(to_, line.data(), line.size());
    if (n < 0 && errno == EPIPE) {
      timespec zero{0, 0};
      ::sigtimedwait(&pipe_set, nullptr, &zero);
    }
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return n == static_cast<ssize_t>(line.size());
  }
  std::string Field(const std::string& key, const std::string& fallback = "") const {
    auto it = fields_.find(key);
    return it == fields_.end() ? fallback : it->second;
  }
  // One line from the harness, without its newline; "" on end of file or
  // after `timeout_s`.
  std::string ReadLine(int timeout_s) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    std::string line;
    for (;;) {
      size_t nl = buffer_.find('\n');
      if (nl != std::string::npos) {
        line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return "";
      pollfd p{from_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char b[4096];
      ssize_t n = ::read(from_, b, sizeof b);
      if (n <= 0) return "";
      buffer_.append(b, static_cast<size_t>(n));
    }
  }

  pid_t pid_ = -1;
  int to_ = -1;
  int from_ = -1;
  bool ok_ = false;
  std::string buffer_;
  std::map<std::string, std::string> fields_;
};

}  // namespace kvfile::testing
