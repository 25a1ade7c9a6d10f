// SPDX-License-Identifier: Apache-2.0
// The kvfile binary under real signals (tools/kvfile/signals.*): started as a
// child, sent SIGINT, SIGTERM or SIGHUP once it has begun writing (or
// reading), it must stop at a safe point, exit 130 / 143 / 129 with exactly
// one stderr line, leave no temporary file, and leave its destination as it
// was.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "support/adversity.h"
#include "support/cli_run.h"
#include "support/scratch_dir.h"

namespace {

namespace fs = std::filesystem;
using kvfile::testing::CliRun;
using kvfile::testing::Kvfile;
using kvfile::testing::ReadFile;
using Clock = std::chrono::steady_clock;

// What a directory holds: name -> (inode, size).
using Listing = std::map<std::string, std::pair<uint64_t, uint64_t>>;

Listing List(const fs::path& dir) {
  Listing l;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    struct stat st;
    if (::lstat(e.path().c_str(), &st) == 0 && S_ISREG(st.st_mode))
      l[e.path().lexically_relative(dir).string()] = {st.st_ino, static_cast<uint64_t>(st.st_size)};
  }
  return l;
}

std::vector<std::string> Names(const Listing& l) {
  std::vector<std::string> v;
  for (const auto& [name, _] : l) v.push_back(name);
  return v;
}

class CliSignalsTest : public kvfile::testing::ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    fs::create_directories(dir_ / "work");
  }
  void TearDown() override {
    child_.reset();  // kills a child still running
    ScratchDirTest::TearDown();
  }
  std::string W(const std::string& name) const { return (dir_ / "work" / name).string(); }

  // Starts `kvfile ARGS...` with stdout to /dev/null and stderr to a file.
  void Start(const std::vector<std::string>& args) {
    err_path_ = P("stderr.txt");
    std::string joined;
    for (const std::string& a : args) joined += (joined.empty() ? "" : " ") + a;
    child_ = std::make_unique<kvfile::testing::KvfileChild>(err_path_);
    child_->Start(joined);
  }

  // Polls `started` (up to 60 s) and stops the child there (SIGSTOP), so
  // that the signal sent next lands at that point however loaded the
  // machine; false if the child exited first.
  template <typename Pred>
  bool WaitUntil(Pred started) {
    return child_->WaitUntil(started) && child_->Freeze();
  }

  // Sends `sig`, continues the child and waits for its exit status (1000 +
  // the signal that ended it).
  int SignalAndWait(int sig) { return child_->SignalAndWait(sig); }

  std::string Stderr() const { return ReadFile(err_path_); }

  // A qwen2.5-7b session of `tokens` tokens (about 28 KiB a token): large
  // enough that every verb below runs for many batches.
  void MakeBig(const std::string& path, uint64_t tokens) {
    CliRun r = Kvfile("-q synth " + path + " --preset qwen2.5-7b --tokens " + std::to_string(tokens));
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }

  std::unique_ptr<kvfile::testing::KvfileChild> child_;
  std::string err_path_;
};

// The directory changed: a new file, or one replaced or grown.
auto Changed(const fs::path& dir, const Listing& before) {
  return [dir, before] { return List(dir) != before; };
}

TEST_F(CliSignalsTest, SynthForceInterruptedBySigint) {
  std::string x = W("x.kv");
  ASSERT_EQ(Kvfile("-q synth " + x + " --preset tiny --tokens 100").exit_code, 0);
  Listing before = List(dir_ / "work");
  Start({"-q", "synth", x, "--force", "--preset", "qwen2.5-7b", "--tokens", "65536", "--chunk-tokens", "64"});
  ASSERT_TRUE(WaitUntil(Changed(dir_ / "work", before))) << Stderr();
  EXPECT_EQ(SignalAndWait(SIGINT), 130);
  EXPECT_EQ(Stderr(), "kvfile: error: " + x + ": interrupted by SIGINT\n");
  EXPECT_EQ(Names(List(dir_ / "work")), std::vector<std::string>{"x.kv"});
  CliRun v = Kvfile("verify " + x);
  EXPECT_EQ(v.exit_code, 0) << v.err;
}

// synth --force writes under a temporary name (atomic_replace.h): until
// the rename, X keeps its old bytes.
TEST_F(CliSignalsTest, SynthForceInterruptedBySigintLeavesTheOldBytes) {
  std::string x = W("x.kv");
  ASSERT_EQ(Kvfile("-q synth " + x + " --preset tiny --tokens 100").exit_code, 0);
  std::string old = ReadFile(x);
  Listing before = List(dir_ / "work");
  Start({"-q", "synth", x, "--force", "--preset", "qwen2.5-7b", "--tokens", "65536", "--chunk-tokens", "64"});
  ASSERT_TRUE(WaitUntil(Changed(dir_ / "work", before))) << Stderr();
  EXPECT_EQ(SignalAndWait(SIGINT), 130);
  EXPECT_EQ(Stderr(), "kvfile: error: " + x + ": interrupted by SIGINT\n");
  EXPECT_EQ(Names(List(dir_ / "work")), std::vector<std::string>{"x.kv"});
  EXPECT_TRUE(ReadFile(x) == old) << "X was changed by an interrupted synth --force";
}

TEST_F(CliSignalsTest, ConvertInterruptedBySigtermLeavesOutAndNoTempFile) {
  std::string in = P("in.kv"), out = W("out.kv");
  MakeBig(in, 4096);
  ASSERT_EQ(Kvfile("-q synth " + out + " --preset tiny --tokens 10").exit_code, 0);
  std::string old = ReadFile(out);
  Listing before = List(dir_ / "work");
  Start({"-q", "convert", in, out, "--force", "--dtype", "e5m2", "--chunk-tokens", "16"});
  ASSERT_TRUE(WaitUntil(Changed(dir_ / "work", before))) << Stderr();
  EXPECT_EQ(SignalAndWait(SIGTERM), 143);
  EXPECT_EQ(Stderr(), "kvfile: error: " + out + ": interrupted by SIGTERM\n");
  EXPECT_EQ(Names(List(dir_ / "work")), std::vector<std::string>{"out.kv"});
  EXPECT_TRUE(ReadFile(out) == old);
}

TEST_F(CliSignalsTest, ExportInterruptedBySighupWritesNothing) {
  std::string in = P("in.kv"), out = W("out.safetensors");
  MakeBig(in, 4096);
  Start({"-q", "convert", in, out});
  ASSERT_TRUE(WaitUntil(Changed(dir_ / "work", {}))) << Stderr();
  EXPECT_EQ(SignalAndWait(SIGHUP), 129);
  EXPECT_EQ(Stderr(), "kvfile: error: " + out + ": interrupted by SIGHUP\n");
  EXPECT_TRUE(List(dir_ / "work").empty()) << Names(List(dir_ / "work")).front();
}

TEST_F(CliSignalsTest, DirectoryConvertInterruptedReportsOnceAndLeavesNoTempFile) {
  fs::create_directories(dir_ / "tree");
  std::string first = (dir_ / "tree" / "a.kv").string();
  MakeBig(first, 2048);
  for (const char* name : {"b.kv", "c.kv", "d.kv"}) fs::create_hard_link(first, dir_ / "tree" / name);
  std::string out = W("out");
  Start({"-q", "convert", P("tree"), out, "--dtype", "e5m2", "--jobs", "2"});
  ASSERT_TRUE(WaitUntil([&] {
    std::error_code ec;
    return fs::exists(out, ec) && !List(out).empty();
  })) << Stderr();
  EXPECT_EQ(SignalAndWait(SIGINT), 130);
  EXPECT_EQ(Stderr(), "kvfile: error: " + out + ": interrupted by SIGINT\n");
  // Only whole conversions are left, each one a valid file.
  for (const auto& [name, _] : List(out)) {
    EXPECT_TRUE(name.ends_with(".kv") && name.size() == 4) << "leftover " << name;
    CliRun v = Kvfile("verify " + (fs::path(out) / name).string());
    EXPECT_EQ(v.exit_code, 0) << v.err;
  }
}

// SIGKILL cannot be handled: what the process left is what a crash leaves,
// whole chunks of the append past the commit record, in the page cache.
// The file is 2.1, so readers and recovery stop at the last append end:
// the append is all or nothing (spec/RECOVERY.md, "Atomic appends").
TEST_F(CliSignalsTest, AppendKilledBySigkillLeavesNoPartOfIt) {
  std::string big = P("big.kv"), input = P("turn.safetensors"), x = W("x.kv");
  MakeBig(big, 4096);
  ASSERT_EQ(Kvfile("-q convert " + big + " " + input).exit_code, 0);
  ASSERT_EQ(Kvfile("-q synth " + x + " --preset qwen2.5-7b --tokens 16").exit_code, 0);
  for (uint64_t grown : {uint64_t{1}, uint64_t{40} << 20}) {  // the first chunk; about half the append
    SCOPED_TRACE("killed once the file grew by " + std::to_string(grown) + " bytes");
    uint64_t size = fs::file_size(x);
    Start({"-q", "append", x, input});
    ASSERT_TRUE(WaitUntil([&] { return fs::file_size(x) >= size + grown; })) << Stderr();
    EXPECT_EQ(SignalAndWait(SIGKILL), 1000 + SIGKILL);
    ASSERT_GT(fs::file_size(x), size) << "nothing reached the file: the kill proves nothing";
    CliRun info = Kvfile("info --json " + x);
    ASSERT_EQ(info.exit_code, 0) << info.err;
    auto j = nlohmann::json::parse(info.out);
    // Either none of the append or, had it finished before the kill, all of it.
    ASSERT_TRUE(j["tokens"] == 16 || j["tokens"] == 16 + 4096) << j["tokens"];
    if (j["tokens"] == 16) {
      EXPECT_GT(j["torn_tail_bytes"].get<uint64_t>(), 0u);
    }
    CliRun v = Kvfile("verify " + x);
    EXPECT_EQ(v.exit_code, 0) << v.err;
    CliRun check = Kvfile("synth --check " + x);
    EXPECT_EQ(check.exit_code, j["tokens"] == 16 ? 0 : 1) << check.out << check.err;
    if (j["tokens"] != 16) return;  // the machine was fast: nothing more to prove here
    CliRun repair = Kvfile("repair " + x);
    EXPECT_EQ(repair.exit_code, 0) << repair.err;
    EXPECT_EQ(nlohmann::json::parse(Kvfile("info --json " + x).out)["tokens"], 16);
    EXPECT_EQ(fs::file_size(x), size) << "repair left the killed append's chunks";
  }
}

TEST_F(CliSignalsTest, AppendInterruptedBySigtermKeepsOnlyTheOldTokens) {
  std::string big = P("big.kv"), input = P("turn.safetensors"), x = W("x.kv");
  MakeBig(big, 4096);
  ASSERT_EQ(Kvfile("-q convert " + big + " " + input).exit_code, 0);
  ASSERT_EQ(Kvfile("-q synth " + x + " --preset qwen2.5-7b --tokens 16").exit_code, 0);
  uint64_t size = fs::file_size(x);
  Start({"-q", "append", x, input});
  ASSERT_TRUE(WaitUntil([&] { return fs::file_size(x) > size; })) << Stderr();
  EXPECT_EQ(SignalAndWait(SIGTERM), 143);
  EXPECT_EQ(Stderr(), "kvfile: error: " + x + ": interrupted by SIGTERM\n");
  EXPECT_EQ(Names(List(dir_ / "work")), std::vector<std::string>{"x.kv"});
  // None of the interrupted append is in the file, for a reader or for a
  // writer's recovery (repair would commit whole chunks past the record).
  CliRun info = Kvfile("info --json " + x);
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_EQ(nlohmann::json::parse(info.out)["tokens"], 16);
  CliRun v = Kvfile("verify --strict " + x);
  EXPECT_EQ(v.exit_code, 0) << v.err;
  CliRun repair = Kvfile("repair " + x);
  EXPECT_EQ(repair.exit_code, 0) << repair.err;
  CliRun check = Kvfile("synth --check " + x);
  EXPECT_EQ(check.exit_code, 0) << check.err;
  EXPECT_NE(check.out.find("all 16 tokens match"), std::string::npos) << check.out;
  // And the same append, retried, appends each token once.
  CliRun again = Kvfile("-q append " + x + " " + input);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(nlohmann::json::parse(Kvfile("info --json " + x).out)["tokens"], 16 + 4096);
}

TEST_F(CliSignalsTest, VerifyOfADirectoryInterruptedBySighup) {
  fs::create_directories(dir_ / "tree");
  std::string first = (dir_ / "tree" / "f00.kv").string();
  MakeBig(first, 4096);
  for (int i = 1; i < 60; ++i) {
    char name[16];
    std::snprintf(name, sizeof name, "f%02d.kv", i);
    fs::create_hard_link(first, dir_ / "tree" / name);
  }
  std::string tree = P("tree");
  Start({"-q", "verify", tree});
  // Started: it has one of the files open.
  ASSERT_TRUE(WaitUntil([&] {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(child_->pid()) + "/fd", ec)) {
      std::string target = fs::read_symlink(e.path(), ec).string();
      if (!ec && target.starts_with(tree)) return true;
    }
    return false;
  })) << Stderr();
  EXPECT_EQ(SignalAndWait(SIGHUP), 129);
  EXPECT_EQ(Stderr(), "kvfile: error: " + tree + ": interrupted by SIGHUP\n");
}

}  // namespace
