// SPDX-License-Identifier: Apache-2.0
// Inputs that are no .kv file, and the copies the read-only verbs make
// (issue 27, classes 3 and 5), through the real binary:
// - a token list that is a FIFO, a character device, a directory or a
//   socket is refused at once with one line naming it (never waited on,
//   never read); one larger than the cap, from a file or from standard
//   input, is refused without reading more than the cap;
// - `verify PACK:MEMBER` and `verify -` killed with SIGKILL while their
//   copy is being written (frozen there) leave nothing in $TMPDIR, and
//   the disk space comes back (a real tmpfs as $TMPDIR).
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "support/adversity.h"
#include "support/cli_run.h"
#include "support/file_util.h"
#include "support/scratch_dir.h"

namespace kvfile {
namespace {

namespace fs = std::filesystem;
using testing::CliRun;
using testing::Kvfile;
using testing::KvfileChild;
using testing::Names;
using testing::SmallTmpfs;

class CliInputsTest : public testing::ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    fs::create_directories(dir_ / "corpus");
    CliRun r = Kvfile("synth " + P("corpus/a.kv") + " --preset tiny --tokens 8");
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  // `find` over the corpus with the token list `tokens`. A regression that
  // waits on a FIFO (where SIGTERM is only noted) or reads /dev/zero
  // without end is killed after 30 s (exit 137).
  CliRun Find(const std::string& tokens, const std::string& redirect = "") {
    return Kvfile("find " + P("corpus") + " --tokens " + tokens + redirect, "timeout -s KILL 30");
  }
};

// 3. A token list that is no regular file: exit 2, one line naming it and
// what it is, at once; the FIFO is still a FIFO.
TEST_F(CliInputsTest, TokenListThatIsNoRegularFileIsRefusedAtOnce) {
  ASSERT_EQ(::mkfifo(P("fifo").c_str(), 0644), 0);
  fs::create_directories(P("dir"));
  const std::string sock = P("sock");
  int s = testing::BindUnixSocket(sock);
  ASSERT_GE(s, 0) << sock << ": " << std::strerror(errno);
  const std::pair<std::string, std::string> cases[] = {
      {P("fifo"), "a FIFO"},
      {"/dev/zero", "a character device"},
      {P("dir"), "a directory"},
      {sock, "a socket"},
  };
  for (const auto& [path, what] : cases) {
    CliRun r = Find(path);
    EXPECT_EQ(r.exit_code, 2) << path;
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err, "kvfile: error: " + path + ": not a regular file (" + what + ")\n");
  }
  ::close(s);
  EXPECT_TRUE(fs::is_fifo(P("fifo")));
}

// 3. The cap: a token file larger than 256 MiB is refused before it is
// read (exit 1, the data is at fault); standard input that goes on past
// 256 MiB (/dev/zero) is refused after 256 MiB + 1 bytes (exit 2).
TEST_F(CliInputsTest, TokenListsLargerThanTheCapAreRefused) {
  const uint64_t cap = uint64_t{256} << 20;
  {
    std::ofstream(P("huge.txt")) << "1 2 3";
  }
  fs::resize_file(P("huge.txt"), cap + 1);  // sparse: no disk needed
  CliRun r = Find(P("huge.txt"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "kvfile: error: " + P("huge.txt") + ": " + std::to_string(cap + 1) +
                       " bytes; more than the " + std::to_string(cap) + " bytes it may have\n");
  r = Find("-", " </dev/zero");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: -: more than " + std::to_string(cap) + " bytes on standard input\n");
  // At the cap itself it is read (and then parsed).
  fs::resize_file(P("huge.txt"), 5);
  r = Find(P("huge.txt"));
  EXPECT_EQ(r.exit_code, 1) << r.err;  // no file starts with token 1
  EXPECT_EQ(r.err, "kvfile: error: " + P("corpus") + ": no file shares the first token of the query (1 searched)\n");
}

// Bytes used on the file system that holds `dir`.
uint64_t UsedBytes(const std::string& dir) {
  struct statvfs v;
  if (::statvfs(dir.c_str(), &v) != 0) return ~uint64_t{0};
  return (v.f_blocks - v.f_bfree) * v.f_frsize;
}

// The size of the largest file under `dir` that process `pid` has open
// (named or not: an unnamed one reads "DIR/#INODE (deleted)").
uint64_t OpenBytesUnder(pid_t pid, const std::string& dir) {
  const std::string fds = "/proc/" + std::to_string(pid) + "/fd";
  uint64_t most = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fds, ec)) {
    std::error_code lec;
    fs::path target = fs::read_symlink(e.path(), lec);
    if (lec || !target.string().starts_with(dir + "/")) continue;
    struct stat st;
    if (::stat(e.path().c_str(), &st) == 0) most = std::max(most, static_cast<uint64_t>(st.st_size));
  }
  return most;
}

class TempCopyTest : public CliInputsTest {
 protected:
  void SetUp() override {
    CliInputsTest::SetUp();
    tmp_ = P("tmp");
    fs::create_directories(tmp_);
    tmpfs_ = std::make_unique<SmallTmpfs>();
    if (!tmpfs_->Mount(tmp_, "256m")) GTEST_SKIP() << "mounting a tmpfs needs root: " << std::strerror(errno);
    used_before_ = UsedBytes(tmp_);
  }
  void TearDown() override {
    child_.reset();
    tmpfs_.reset();  // unmounted before the directory is removed
    CliInputsTest::TearDown();
  }
  // Starts `kvfile ARGS` with $TMPDIR the tmpfs.
  void Start(const std::string& args, int stdin_fd = -1) {
    const char* old = std::getenv("TMPDIR");
    std::string saved = old ? old : "";
    ::setenv("TMPDIR", tmp_.c_str(), 1);
    child_ = std::make_unique<KvfileChild>(P("stderr.txt"));
    child_->Start(args, stdin_fd);
    if (old) ::setenv("TMPDIR", saved.c_str(), 1);
    else ::unsetenv("TMPDIR");
  }
  // SIGKILL, then: nothing in $TMPDIR, and its space back. The kernel
  // frees the bytes when the last reference goes, which for a process
  // killed with io_uring requests in flight is when it has torn the ring
  // down, just after the process is gone: polled for up to 10 s.
  void KillAndExpectNothingLeft() {
    EXPECT_EQ(child_->SignalAndWait(SIGKILL), 1000 + SIGKILL);
    EXPECT_TRUE(Names(tmp_).empty()) << "left in $TMPDIR: " << *Names(tmp_).begin();
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (UsedBytes(tmp_) != used_before_ && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(UsedBytes(tmp_), used_before_) << "the killed copy's bytes were not freed";
  }

  std::unique_ptr<SmallTmpfs> tmpfs_;
  std::string tmp_;
  uint64_t used_before_ = 0;
  std::unique_ptr<KvfileChild> child_;
};

// 5. `verify PACK:MEMBER` stopped while it writes the member's copy (over
// 1 MiB of it in $TMPDIR), then SIGKILL.
TEST_F(TempCopyTest, KilledVerifyOfAPackMemberLeavesNothing) {
  CliRun r = Kvfile("-q synth " + P("big.kv") + " --preset qwen2.5-7b --tokens 1024");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Kvfile("-q pack " + P("big.kv") + " -o " + P("p.kvpack"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Start("verify " + P("p.kvpack") + ":big.kv");
  ASSERT_TRUE(child_->WaitUntil([&] { return OpenBytesUnder(child_->pid(), tmp_) >= (uint64_t{1} << 20); }))
      << child_->err();
  ASSERT_TRUE(child_->Freeze()) << "verify ended before it could be stopped";
  ASSERT_GE(UsedBytes(tmp_), used_before_ + (uint64_t{1} << 20));
  KillAndExpectNothingLeft();
}

// 5. `verify -` with 4 MiB copied from a pipe the test keeps open (the
// child waits in read for more), then SIGKILL.
TEST_F(TempCopyTest, KilledVerifyOfStandardInputLeavesNothing) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  Start("verify -", p[0]);
  ::close(p[0]);
  std::vector<char> chunk(1 << 20, 'x');
  for (int i = 0; i < 4; ++i) ASSERT_EQ(::write(p[1], chunk.data(), chunk.size()), ssize_t(chunk.size()));
  ASSERT_TRUE(child_->WaitUntil([&] { return OpenBytesUnder(child_->pid(), tmp_) >= (uint64_t{4} << 20); }))
      << child_->err();
  ASSERT_TRUE(child_->Freeze());
  ASSERT_GE(UsedBytes(tmp_), used_before_ + (uint64_t{4} << 20));
  KillAndExpectNothingLeft();
  ::close(p[1]);
}

// 5. Unkilled, both copies go too: the verb's result and an empty $TMPDIR.
TEST_F(TempCopyTest, FinishedVerbsLeaveNothing) {
  CliRun r = Kvfile("-q pack " + P("corpus/a.kv") + " -o " + P("p.kvpack"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string env = "TMPDIR=" + tmp_;
  r = Kvfile("verify " + P("p.kvpack") + ":a.kv", env);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.out.starts_with(P("p.kvpack") + ":a.kv: ok: 8 tokens")) << r.out;
  r = Kvfile("verify -", "cat " + P("corpus/a.kv") + " | " + env);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.out.starts_with("-: ok: 8 tokens")) << r.out;
  EXPECT_TRUE(Names(tmp_).empty());
  EXPECT_EQ(UsedBytes(tmp_), used_before_);
}

}  // namespace
}  // namespace kvfile
