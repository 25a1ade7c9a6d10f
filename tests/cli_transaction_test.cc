// SPDX-License-Identifier: Apache-2.0
// The CLI's writing verbs replace whole files atomically (issue 13, class
// 1; spec/RECOVERY.md "Replacing a file"), on real full disks (a small
// tmpfs), real locks held by another process, real symlinks, hard links,
// owners, FIFOs and devices, and a real SIGKILL.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kvfile/reader.h"
#include "support/adversity.h"
#include "support/cli_run.h"
#include "support/file_util.h"
#include "support/scratch_dir.h"

namespace kvfile {
namespace {

namespace fs = std::filesystem;
using testing::CliRun;
using testing::Kvfile;
using testing::ReadFile;

class CliTransactionTest : public testing::ScratchDirTest {
 protected:
  void TearDown() override {
    if (mounted_) ::umount2(P("small").c_str(), MNT_DETACH);
    ScratchDirTest::TearDown();
  }
  void Synth(const std::string& name, const std::string& flags) {
    CliRun r = Kvfile("synth " + P(name) + " " + flags);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  // A 1 MiB tmpfs at P("small"); false if this process may not mount one.
  bool MountSmall() {
    fs::create_directories(P("small"));
    if (::mount("tmpfs", P("small").c_str(), "tmpfs", 0, "size=1m") != 0) return false;
    mounted_ = true;
    return true;
  }
  // Every name under `sub` of the test directory.
  std::vector<std::string> Names(const std::string& sub = "") const { return testing::SortedNames(dir_ / sub); }
  uint64_t Tokens(const std::string& path) {
    std::unique_ptr<Reader> r;
    Status st = Reader::Open(path, {}, &r);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return st.ok() ? r->token_count() : 0;
  }
  int Major(const std::string& path) {
    std::unique_ptr<Reader> r;
    Status st = Reader::Open(path, {}, &r);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return st.ok() ? r->major_version() : 0;
  }
  // One line, naming `path`, saying the disk is full.
  static void ExpectDiskFull(const CliRun& r, const std::string& path) {
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(r.err.rfind("kvfile: error: " + path + ": ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  bool mounted_ = false;
};

// tiny: 160 bytes a token, so 20000 tokens (3 MB) never fit in 1 MiB.
TEST_F(CliTransactionTest, FullDiskLeavesTheOldFileAndNoTemp) {
  if (!MountSmall()) GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  Synth("small/x.kv", "--preset tiny --tokens 1000 --seed 1");
  std::string before = ReadFile(P("small/x.kv"));
  CliRun synth = Kvfile("synth " + P("small/x.kv") + " --preset tiny --tokens 20000 --seed 2 --force");
  ExpectDiskFull(synth, P("small/x.kv"));
  EXPECT_TRUE(ReadFile(P("small/x.kv")) == before);
  EXPECT_EQ(Names("small"), std::vector<std::string>{"x.kv"});

  Synth("big.kv", "--preset tiny --tokens 20000 --seed 3");
  CliRun convert = Kvfile("convert " + P("big.kv") + " " + P("small/x.kv") + " --force");
  EXPECT_EQ(convert.exit_code, 2) << convert.err;
  EXPECT_NE(convert.err.find("No space left on device"), std::string::npos) << convert.err;
  EXPECT_EQ(std::count(convert.err.begin(), convert.err.end(), '\n'), 1) << convert.err;
  EXPECT_TRUE(ReadFile(P("small/x.kv")) == before);
  EXPECT_EQ(Names("small"), std::vector<std::string>{"x.kv"});

  // New files: nothing under the final name, no temp.
  CliRun fresh = Kvfile("synth " + P("small/n.kv") + " --preset tiny --tokens 20000");
  ExpectDiskFull(fresh, P("small/n.kv"));
  ASSERT_EQ(Kvfile("convert " + P("big.kv") + " " + P("big.safetensors")).exit_code, 0);
  CliRun append = Kvfile("append " + P("small/a.kv") + " " + P("big.safetensors"));
  ExpectDiskFull(append, P("small/a.kv"));
  EXPECT_EQ(Names("small"), std::vector<std::string>{"x.kv"});
  EXPECT_TRUE(ReadFile(P("small/x.kv")) == before);

  // An append to the existing file that fills the disk: none of it stays
  // (the writer cuts the file back to its last commit), byte for byte.
  Synth("same.kv", "--preset tiny --tokens 20000 --seed 1");  // x.kv's model and geometry
  ASSERT_EQ(Kvfile("convert " + P("same.kv") + " " + P("same.safetensors")).exit_code, 0);
  CliRun grow = Kvfile("append " + P("small/x.kv") + " " + P("same.safetensors"));
  ExpectDiskFull(grow, P("small/x.kv"));
  EXPECT_TRUE(ReadFile(P("small/x.kv")) == before) << "the failed append left bytes in the file";
  EXPECT_EQ(Tokens(P("small/x.kv")), 1000u);
  EXPECT_EQ(Names("small"), std::vector<std::string>{"x.kv"});
}

// `convert --force` onto a file another process holds the writer lock of
// (as a running `append` does): refused, the file untouched.
TEST_F(CliTransactionTest, ConvertForceWaitsForNoWriter) {
  Synth("a.kv", "--preset tiny --tokens 9 --seed 1");
  Synth("x.kv", "--preset tiny --tokens 5 --seed 2");
  std::string before = ReadFile(P("x.kv"));
  int fd = ::open(P("x.kv").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  CliRun r = Kvfile("convert " + P("a.kv") + " " + P("x.kv") + " --force");
  ::close(fd);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + P("x.kv") + ": another writer has the file open; not replaced\n");
  EXPECT_TRUE(ReadFile(P("x.kv")) == before);
  EXPECT_EQ(Names(), (std::vector<std::string>{"a.kv", "x.kv"}));
  // Without the lock it goes through.
  ASSERT_EQ(Kvfile("convert " + P("a.kv") + " " + P("x.kv") + " --force").exit_code, 0);
  EXPECT_EQ(Tokens(P("x.kv")), 9u);
}

TEST_F(CliTransactionTest, SymlinkDestinationStaysALink) {
  Synth("a.kv", "--preset tiny --tokens 9 --seed 1");
  fs::create_directories(dir_ / "real");
  Synth("real/t.kv", "--preset tiny --tokens 5 --seed 2");
  fs::create_symlink("real/t.kv", dir_ / "link.kv");
  CliRun r = Kvfile("convert " + P("a.kv") + " " + P("link.kv") + " --force");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(dir_ / "link.kv"));
  EXPECT_EQ(fs::read_symlink(dir_ / "link.kv"), "real/t.kv");
  EXPECT_EQ(Tokens(P("real/t.kv")), 9u);
  CliRun s = Kvfile("synth " + P("link.kv") + " --preset tiny --tokens 7 --force");
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_TRUE(fs::is_symlink(dir_ / "link.kv"));
  EXPECT_EQ(Tokens(P("real/t.kv")), 7u);
  EXPECT_EQ(Names("real"), std::vector<std::string>{"t.kv"});
}

// An upgrade on append: through a symlink the target becomes v2 and the
// link stays; a v1 file with two hard links is refused, both names kept.
TEST_F(CliTransactionTest, UpgradeFollowsSymlinksAndRefusesHardLinks) {
  Synth("a.kv", "--preset tiny --tokens 9 --seed 1");
  ASSERT_EQ(Kvfile("convert " + P("a.kv") + " " + P("in.safetensors")).exit_code, 0);
  ASSERT_EQ(Kvfile("convert " + P("a.kv") + " " + P("v1.kv") + " --format v1").exit_code, 0);
  fs::create_hard_link(P("v1.kv"), P("v1b.kv"));
  std::string before = ReadFile(P("v1.kv"));
  CliRun r = Kvfile("append " + P("v1.kv") + " " + P("in.safetensors"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + P("v1.kv") +
                       ": a v1 file with 2 hard links is not upgraded to v2 in place (the other names would "
                       "keep the old v1 data); write a v2 copy with `kvfile convert`, or remove the other "
                       "links first\n");
  EXPECT_TRUE(ReadFile(P("v1.kv")) == before);
  EXPECT_TRUE(ReadFile(P("v1b.kv")) == before);
  EXPECT_TRUE(fs::equivalent(P("v1.kv"), P("v1b.kv")));
  EXPECT_EQ(fs::hard_link_count(P("v1.kv")), 2u);

  fs::remove(P("v1b.kv"));
  fs::create_symlink("v1.kv", dir_ / "link.kv");
  CliRun up = Kvfile("append " + P("link.kv") + " " + P("in.safetensors"));
  ASSERT_EQ(up.exit_code, 0) << up.err;
  EXPECT_TRUE(fs::is_symlink(dir_ / "link.kv"));
  EXPECT_EQ(Major(P("v1.kv")), 2);
  EXPECT_EQ(Tokens(P("v1.kv")), 18u);
  EXPECT_EQ(Names(), (std::vector<std::string>{"a.kv", "in.safetensors", "link.kv", "v1.kv"}));
}

// Mode, owner and group survive `convert --force` and an upgrade.
TEST_F(CliTransactionTest, ReplacementKeepsModeAndOwner) {
  Synth("a.kv", "--preset tiny --tokens 9 --seed 1");
  ASSERT_EQ(Kvfile("convert " + P("a.kv") + " " + P("in.safetensors")).exit_code, 0);
  Synth("x.kv", "--preset tiny --tokens 5 --seed 2");
  ASSERT_EQ(Kvfile("convert " + P("a.kv") + " " + P("v1.kv") + " --format v1").exit_code, 0);
  for (const char* name : {"x.kv", "v1.kv"}) {
    ASSERT_EQ(::chmod(P(name).c_str(), 0600), 0);
    if (::chown(P(name).c_str(), 4321, 8765) != 0) GTEST_SKIP() << "chown needs root: " << std::strerror(errno);
  }
  ASSERT_EQ(Kvfile("convert " + P("a.kv") + " " + P("x.kv") + " --force").exit_code, 0);
  CliRun up = Kvfile("append " + P("v1.kv") + " " + P("in.safetensors"));
  ASSERT_EQ(up.exit_code, 0) << up.err;
  EXPECT_EQ(Major(P("v1.kv")), 2);
  EXPECT_EQ(Tokens(P("x.kv")), 9u);
  for (const char* name : {"x.kv", "v1.kv"}) {
    struct stat st;
    ASSERT_EQ(::stat(P(name).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0600u) << name;
    EXPECT_EQ(st.st_uid, 4321u) << name;
    EXPECT_EQ(st.st_gid, 8765u) << name;
  }
}

// FIFOs and devices, as input and as destination: exit 2 at once. A
// regression that blocks is stopped by `timeout` (exit 124). Destinations
// are a FIFO and a device node of the test's own (a copy of /dev/null,
// reached through a symlink), so that a regression replaces nothing
// outside the test directory; /dev/null itself is only read.
TEST_F(CliTransactionTest, FifoAndDeviceAreRefusedAtOnce) {
  Synth("a.kv", "--preset tiny --tokens 9 --seed 1");
  ASSERT_EQ(::mkfifo(P("f.kv").c_str(), 0644), 0);
  if (::mknod(P("dev").c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0)
    GTEST_SKIP() << "mknod needs root: " << std::strerror(errno);
  fs::create_symlink("dev", dir_ / "null.kv");
  const std::string t = "timeout 20";
  for (std::string verb : {"info", "verify", "dump"}) {
    CliRun r = Kvfile(verb + " " + P("f.kv"), t);
    EXPECT_EQ(r.exit_code, 2) << verb;
    EXPECT_EQ(r.err, "kvfile: error: " + P("f.kv") + ": not a regular file (a FIFO)\n") << verb;
    CliRun n = Kvfile(verb + " /dev/null", t);
    EXPECT_EQ(n.exit_code, 2) << verb;
    EXPECT_EQ(n.err, "kvfile: error: /dev/null: not a regular file (a character device)\n") << verb;
  }
  CliRun in = Kvfile("convert " + P("f.kv") + " " + P("out.kv"), t);
  EXPECT_EQ(in.exit_code, 2);
  EXPECT_EQ(in.err, "kvfile: error: " + P("f.kv") + ": not a regular file (a FIFO)\n");
  for (const std::string& dest : {P("f.kv"), P("null.kv")}) {
    CliRun c = Kvfile("convert " + P("a.kv") + " " + dest + " --force", t);
    EXPECT_EQ(c.exit_code, 2) << dest;
    EXPECT_EQ(c.err, "kvfile: error: " + dest + ": not a regular file; not replaced\n");
    CliRun s = Kvfile("synth " + dest + " --preset tiny --tokens 5 --force", t);
    EXPECT_EQ(s.exit_code, 2) << dest;
    EXPECT_EQ(s.err, "kvfile: error: " + dest + ": not a regular file; not replaced\n");
  }
  CliRun s = Kvfile("synth " + P("dev") + " --preset tiny --tokens 5 --force", t);
  EXPECT_EQ(s.exit_code, 2);
  EXPECT_EQ(s.err, "kvfile: error: " + P("dev") + ": not a regular file; not replaced\n");
  EXPECT_TRUE(fs::is_fifo(P("f.kv")));
  EXPECT_TRUE(fs::is_symlink(dir_ / "null.kv"));
  EXPECT_TRUE(fs::is_character_file(P("dev")));
  EXPECT_EQ(Names(), (std::vector<std::string>{"a.kv", "dev", "f.kv", "null.kv"}));
}

// A convert killed with SIGKILL mid-write leaves its temporary file; the
// next command writing that destination removes it. So does one made by
// hand with a process id no process has.
TEST_F(CliTransactionTest, StaleTempOfAKilledConvertIsRemoved) {
  Synth("big.kv", "--preset tiny --tokens 400000 --seed 1");
  Synth("a.kv", "--preset tiny --tokens 9 --seed 2");
  std::string out = P("out.kv");
  auto temps = [&] {
    std::vector<std::string> found;
    for (const std::string& n : Names())
      if (n.starts_with("out.kv.kvtmp-")) found.push_back(n);
    return found;
  };
  {
    testing::KvfileChild child(P("stderr.txt"));
    child.Start("convert " + P("big.kv") + " " + out + " --dtype e5m2");
    ASSERT_TRUE(child.WaitUntil([&] { return !temps().empty(); })) << child.err();
    ASSERT_TRUE(child.Freeze()) << "the convert finished before it could be stopped";  // mid-write
    ASSERT_EQ(child.SignalAndWait(SIGKILL), 1000 + SIGKILL);
  }
  fs::remove(P("stderr.txt"));
  ASSERT_FALSE(temps().empty());
  EXPECT_FALSE(fs::exists(out));
  CliRun r = Kvfile("convert " + P("a.kv") + " " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(temps().empty());
  EXPECT_EQ(Tokens(out), 9u);

  // By hand: no process 999999999 exists, and no one holds these locked.
  for (const std::string& n : std::vector<std::string>{"out.kv.kvtmp-999999999-0", "out.kv.kvtmp-999999999", "out.kv.kvnew"})
    std::ofstream(P(n)) << "stale";
  ASSERT_EQ(Kvfile("synth " + out + " --preset tiny --tokens 5 --force").exit_code, 0);
  EXPECT_EQ(Names(), (std::vector<std::string>{"a.kv", "big.kv", "out.kv"}));
}

}  // namespace
}  // namespace kvfile
