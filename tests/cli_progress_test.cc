// SPDX-License-Identifier: Apache-2.0
// The progress bars (tools/kvfile/progress.*), seen as a user sees them:
// the kvfile binary runs on a pseudo-terminal, and what it draws there is
// checked byte for byte. A bar on a terminal for export, import, append,
// repair and the v1 -> v2 upgrade of an open; none when stderr is not a
// terminal, with --quiet, or before the delay (KVFILE_PROGRESS_DELAY_MS,
// set to 0 here so that small files draw at once).
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <regex>
#include <string>

#include "support/cli_run.h"

namespace {

namespace fs = std::filesystem;
using kvfile::testing::CliRun;
using kvfile::testing::Kvfile;
using kvfile::testing::ReadFile;

struct PtyRun {
  int exit_code = -1;
  std::string out;  // everything written to the terminal (stdout and stderr)
};

// Runs `sh -c CMD` with stdin, stdout and stderr on a new pseudo-terminal
// in raw mode (no "\n" -> "\r\n"), and returns what it wrote there. Killed
// after 30 s.
PtyRun OnPty(const std::string& cmd) {
  PtyRun r;
  termios raw{};
  cfmakeraw(&raw);
  winsize ws{};
  ws.ws_row = 24;
  ws.ws_col = 200;
  int master = -1;
  pid_t pid = forkpty(&master, nullptr, &raw, &ws);
  if (pid < 0) {
    ADD_FAILURE() << "forkpty: " << std::strerror(errno);
    return r;
  }
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  char buf[4096];
  for (;;) {
    pollfd p{master, POLLIN, 0};
    int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
    if (left <= 0 || poll(&p, 1, left) == 0) {
      ADD_FAILURE() << "timed out: " << cmd;
      kill(pid, SIGKILL);
      break;
    }
    ssize_t n = read(master, buf, sizeof buf);
    if (n > 0) {
      r.out.append(buf, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;  // EIO: every holder of the terminal's other end has closed it
    }
  }
  close(master);
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The bar as progress.cc draws it at 100%, and the sequence that erases it.
std::string FullBar(const std::string& label) { return "\r" + label + " [" + std::string(30, '#') + "] 100%"; }
const std::string kErase = "\r\033[K";

class CliProgressTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(testing::TempDir()) / ("kvfile_progress_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ASSERT_EQ(Kvfile("synth " + P("a.kv") + " --preset tiny --tokens 300 --chunk-tokens 64 --seed 1").exit_code, 0);
    ASSERT_EQ(Kvfile("convert " + P("a.kv") + " " + P("a.safetensors")).exit_code, 0);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string P(const std::string& name) const { return (dir_ / name).string(); }
  // `kvfile ARGS` on a terminal, the bar drawn at once unless `env` says otherwise.
  PtyRun Tty(const std::string& args, const std::string& env = "KVFILE_PROGRESS_DELAY_MS=0") {
    return OnPty(env + " " + KVFILE_BINARY + " " + args);
  }
  // Checks that `r` shows the 100% bar of `label`, erased before the
  // command's result `line` (its stdout), and nothing else.
  void ExpectBar(const PtyRun& r, const std::string& label, const std::string& line) {
    EXPECT_EQ(r.exit_code, 0) << r.out;
    // An elapsed-time line of a step before or after the counted one
    // (append's open, its final sync: "LABEL: opening ... 0 s", redrawn,
    // then erased) may come first or between; with no delay it is drawn
    // unless the step ends first, which depends on the machine's load.
    static const std::regex activity("\r[^\r\n]* \\.\\.\\. [0-9]+ s(\r[^\r\n]* \\.\\.\\. [0-9]+ s)*\r\x1b\\[K");
    const std::string out = std::regex_replace(r.out, activity, "");
    size_t full = out.find(FullBar(label));
    ASSERT_NE(full, std::string::npos) << testing::PrintToString(r.out);
    EXPECT_TRUE(out.starts_with("\r" + label + " [")) << testing::PrintToString(r.out);
    size_t erase = out.find(kErase, full);
    ASSERT_NE(erase, std::string::npos) << testing::PrintToString(r.out);
    EXPECT_EQ(out.substr(erase + kErase.size()), line) << testing::PrintToString(r.out);
  }
  fs::path dir_;
};

TEST_F(CliProgressTest, ExportDrawsABarOnATerminalOnly) {
  PtyRun r = Tty("convert " + P("a.kv") + " " + P("x.safetensors"));
  // The result line, as a run without a terminal prints it.
  CliRun plain = Kvfile("convert " + P("a.kv") + " " + P("y.safetensors"));
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(plain.err, "");
  std::string result = plain.out;
  result.replace(result.find(P("y.safetensors")), P("y.safetensors").size(), P("x.safetensors"));
  ExpectBar(r, "export " + P("a.kv"), result);
  EXPECT_EQ(ReadFile(P("x.safetensors")), ReadFile(P("y.safetensors")));

  // stderr not a terminal (stdout still is): no bar anywhere.
  r = Tty("convert " + P("a.kv") + " " + P("x.safetensors") + " --force 2>" + P("err.txt"));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, result);
  EXPECT_EQ(ReadFile(P("err.txt")), "");
  // --quiet (after the verb, and before it as -q): no bar.
  r = Tty("convert " + P("a.kv") + " " + P("x.safetensors") + " --force --quiet");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, result);
  r = Tty("-q convert " + P("a.kv") + " " + P("x.safetensors") + " --force");
  EXPECT_EQ(r.out, result);
  // Work shorter than the delay draws nothing.
  r = Tty("convert " + P("a.kv") + " " + P("x.safetensors") + " --force", "KVFILE_PROGRESS_DELAY_MS=60000");
  EXPECT_EQ(r.out, result);
  r = Tty("convert " + P("a.kv") + " " + P("x.safetensors") + " --force", "KVFILE_PROGRESS_DELAY_MS=");
  EXPECT_EQ(r.out, result);
}

TEST_F(CliProgressTest, ImportAndAppendDrawABar) {
  CliRun plain = Kvfile("convert " + P("a.safetensors") + " " + P("y.kv"));
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  PtyRun r = Tty("convert " + P("a.safetensors") + " " + P("x.kv"));
  std::string result = plain.out;
  result.replace(result.find(P("y.kv")), P("y.kv").size(), P("x.kv"));
  ExpectBar(r, "import " + P("a.safetensors"), result);

  // Append to an existing file: 300 tokens more.
  r = Tty("append " + P("x.kv") + " " + P("a.safetensors"));
  ExpectBar(r, "append " + P("x.kv"),
            P("x.kv") + ": appended 300 tokens from " + P("a.safetensors") + " (600 in total)\n");
  r = Tty("append " + P("x.kv") + " " + P("a.safetensors") + " 2>" + P("err.txt"));
  EXPECT_EQ(r.out, P("x.kv") + ": appended 300 tokens from " + P("a.safetensors") + " (900 in total)\n");
  EXPECT_EQ(ReadFile(P("err.txt")), "");
  r = Tty("append " + P("x.kv") + " " + P("a.safetensors") + " -q");
  EXPECT_EQ(r.out, P("x.kv") + ": appended 300 tokens from " + P("a.safetensors") + " (1200 in total)\n");
}

// The drivers of kvfile::Convert report their progress through
// ConvertOptions::progress: a llama.cpp import, a Mooncake export and its
// import draw their bars too.
TEST_F(CliProgressTest, FormatDriversDrawABar) {
  const std::string slot = std::string(KVFILE_TEST_DATA) + "/fixtures/llama/seq-f16-fa1.bin";
  CliRun plain = Kvfile("convert " + slot + " " + P("y.kv") + " --head-size 64");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  std::string result = plain.out;
  result.replace(result.find(P("y.kv")), P("y.kv").size(), P("x.kv"));
  ExpectBar(Tty("convert " + slot + " " + P("x.kv") + " --head-size 64"), "convert " + slot, result);
  plain = Kvfile("convert " + P("a.kv") + " " + P("mc-plain") + " --format mooncake");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  result = plain.out;
  result.replace(result.find(P("mc-plain")), P("mc-plain").size(), P("mc"));
  ExpectBar(Tty("convert " + P("a.kv") + " " + P("mc") + " --format mooncake"), "export " + P("a.kv"), result);
  ExpectBar(Tty("convert " + P("mc") + " " + P("b.kv")), "import " + P("mc"),
            P("mc") + " -> " + P("b.kv") +
                ": 20 Mooncake records (20 with codes and scales as stored, 0 requantized), 300 tokens\n");
}

TEST_F(CliProgressTest, RepairChecksWithABar) {
  PtyRun r = Tty("repair " + P("a.kv"));
  ExpectBar(r, "repair " + P("a.kv") + ": checking", P("a.kv") + ": healthy, nothing to repair (300 tokens)\n");
  r = Tty("repair " + P("a.kv") + " --quiet");
  EXPECT_EQ(r.out, P("a.kv") + ": healthy, nothing to repair (300 tokens)\n");
}

// The v1 -> v2 upgrade of a writable open: its bar counts the v1 bytes read.
TEST_F(CliProgressTest, UpgradeOnOpenDrawsABar) {
  ASSERT_EQ(Kvfile("convert " + P("a.kv") + " " + P("v1.kv") + " --format v1").exit_code, 0);
  fs::copy_file(P("v1.kv"), P("v1b.kv"));
  PtyRun r = Tty("rewind " + P("v1.kv") + " --to 100");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find(FullBar("rewind " + P("v1.kv") + ": upgrading") + kErase), std::string::npos)
      << testing::PrintToString(r.out);
  EXPECT_NE(r.out.find("kvfile: note: " + P("v1.kv") + ": upgraded from format 1."), std::string::npos) << r.out;
  // Without a terminal the same upgrade draws nothing: the note alone.
  r = Tty("rewind " + P("v1b.kv") + " --to 100 2>" + P("err.txt"));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.find('\r'), std::string::npos) << testing::PrintToString(r.out);
  std::string err = ReadFile(P("err.txt"));
  EXPECT_TRUE(err.starts_with("kvfile: note: " + P("v1b.kv") + ": upgraded from format 1.")) << err;
  EXPECT_EQ(err.find('\r'), std::string::npos);
}

TEST_F(CliProgressTest, ManPageNamesTheDelay) {
  CliRun man = Kvfile("manpage");
  ASSERT_EQ(man.exit_code, 0);
  EXPECT_NE(man.out.find(".TP\nKVFILE_PROGRESS_DELAY_MS\n"), std::string::npos);
}

}  // namespace
