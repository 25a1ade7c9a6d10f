// SPDX-License-Identifier: Apache-2.0
// kvfile pack, unpack and index are transactions (issue 17, after the rule
// of issue 13 and tests/cli_convert_adversity_test.cc): under a real full
// disk (a small tmpfs), real signals mid-write (SIGKILL, SIGINT, SIGTERM,
// SIGHUP), symlinked and hard-linked destinations, owners and modes, FIFOs,
// a writer lock held by another process and a concurrent writer. Each
// asserts the exit status, the one stderr line, the bytes of every file
// (unchanged, or the whole new one) and that no temporary file is left.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "kvfile/reader.h"
#include "support/adversity.h"
#include "support/cli_run.h"

namespace kvfile {
namespace {

namespace fs = std::filesystem;
using testing::CliRun;
using testing::ExpectOneErrorLine;
using testing::Kvfile;
using testing::KvfileChild;
using testing::Names;
using testing::ReadFile;
using testing::SmallTmpfs;
using testing::Tree;

using NameSet = std::set<std::string>;

// Token ids, model and every code and scale of a .kv file: what a member
// holds, whatever the salt of the file it was written to.
std::string KvContent(const std::string& path) {
  std::unique_ptr<Reader> r;
  Status st = Reader::Open(path, {}, &r);
  if (!st.ok()) return "<" + st.ToString() + ">";
  std::string s(reinterpret_cast<const char*>(r->tokens().data()), r->tokens().size() * 4);
  s += r->identity().model_id;
  const Geometry& g = r->geometry();
  const uint64_t n = r->token_count();
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t k = 0; k < g.streams.size(); ++k) {
      const uint64_t rows = n * g.streams[k].rows_per_token;
      std::string codes(rows * g.streams[k].row_width, '\0');
      std::vector<float> scales(rows);
      st = r->ReadCodes(l, k, 0, n, reinterpret_cast<uint8_t*>(codes.data()), scales.data());
      if (!st.ok()) return "<" + st.ToString() + ">";
      s += codes + std::string(reinterpret_cast<const char*>(scales.data()), rows * 4);
    }
  return s;
}

class PackAdversity : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("kvfile_packadv_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "in");
    fs::create_directories(dir_ / "d");
  }
  void TearDown() override {
    tmpfs_.reset();
    fs::remove_all(dir_);
  }
  // Inputs under in/, destinations under d/ (a tmpfs in the full-disk tests).
  std::string I(const std::string& name) const { return (dir_ / "in" / name).string(); }
  std::string D(const std::string& name) const { return (dir_ / "d" / name).string(); }
  NameSet DNames() const { return Names(dir_ / "d"); }

  // in/NAME.kv: `tiny` sessions of `tokens` tokens (a: 40, b: 300, mid:
  // 10,000 = 1.7 MB, more than the tmpfs holds), made once.
  std::string Kv(const std::string& name, int tokens, const std::string& preset = "tiny") {
    std::string kv = I(name + ".kv");
    if (!fs::exists(kv)) {
      CliRun r = Kvfile("-q synth " + kv + " --preset " + preset + " --tokens " + std::to_string(tokens) +
                        " --seed " + std::to_string(tokens));
      EXPECT_EQ(r.exit_code, 0) << r.err;
    }
    return kv;
  }
  std::string A() { return Kv("a", 40); }
  std::string B() { return Kv("b", 300); }
  std::string Mid() { return Kv("mid", 10000); }
  // A session that takes a moment to pack and unpack (17 MB).
  std::string Big() { return Kv("big", 256, "llama-3.1-8b"); }
  // A pack of in/ files under in/MEMBERS/ (copies named as given).
  std::string Pack(const std::string& name, const std::vector<std::pair<std::string, std::string>>& members) {
    std::string pack = I(name + ".kvpack");
    fs::create_directories(I(name));
    for (const auto& [member, kv] : members) fs::copy_file(kv, I(name + "/" + member));
    CliRun r = Kvfile("pack " + I(name) + " -o " + pack);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return pack;
  }
  bool MountSmall() {
    tmpfs_ = std::make_unique<SmallTmpfs>();
    return tmpfs_->Mount(D(""));
  }

  fs::path dir_;
  std::unique_ptr<SmallTmpfs> tmpfs_;
};

size_t Occurrences(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// A usage or environment refusal: exit 2 and exactly this error line.
void ExpectRefusal(const CliRun& r, const std::string& line) {
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.err, "kvfile: error: " + line + "\n");
}

// A failure on a full disk: exit 2, one line naming `dest` (or its temporary
// name, which starts with it) once, saying the disk is full.
void ExpectDiskFull(const CliRun& r, const std::string& dest) {
  EXPECT_EQ(r.exit_code, 2) << r.err;
  ExpectOneErrorLine(r);
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  EXPECT_EQ(Occurrences(r.err, dest), 1u) << r.err;
}

// 1. A full disk (a real 1 MiB tmpfs). pack: the old pack unchanged, a new
// one not created, no temp. unpack: the old member file unchanged, created
// directories removed again; several members: each file is its own
// transaction (the one that fits is replaced whole). index: the old index
// unchanged.
TEST_F(PackAdversity, FullDiskLeavesEveryFileAsItWas) {
  const std::string pack = Pack("p", {{"a.kv", A()}, {"mid.kv", Mid()}});
  const std::string big_pack = Pack("big", {{"big.kv", Big()}});
  if (!MountSmall()) GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  ASSERT_EQ(Kvfile("pack " + A() + " -o " + D("p.kvpack")).exit_code, 0);
  std::string before = ReadFile(D("p.kvpack"));
  ExpectDiskFull(Kvfile("pack " + Mid() + " -o " + D("p.kvpack") + " --force"), D("p.kvpack"));
  EXPECT_TRUE(ReadFile(D("p.kvpack")) == before);
  ExpectDiskFull(Kvfile("pack " + Mid() + " -o " + D("new.kvpack")), D("new.kvpack"));
  EXPECT_EQ(DNames(), NameSet{"p.kvpack"});

  ASSERT_EQ(Kvfile("unpack " + pack + " -o " + D("") + " a.kv").exit_code, 0);
  const std::string old_a = ReadFile(D("a.kv"));
  ExpectDiskFull(Kvfile("unpack " + pack + " -o " + D("") + " mid.kv"), D("mid.kv"));
  ExpectDiskFull(Kvfile("unpack " + pack + " -o " + D("x/y") + " mid.kv"), D("x/y/mid.kv"));
  EXPECT_TRUE(ReadFile(D("a.kv")) == old_a);
  EXPECT_EQ(DNames(), (NameSet{"a.kv", "p.kvpack"}));
  ExpectDiskFull(Kvfile("unpack " + pack + " -o " + D("") + " a.kv mid.kv --force"), D("mid.kv"));
  EXPECT_FALSE(ReadFile(D("a.kv")) == old_a);  // replaced: a new file
  EXPECT_EQ(KvContent(D("a.kv")), KvContent(A()));
  EXPECT_EQ(DNames(), (NameSet{"a.kv", "p.kvpack"}));
  // A member of llama-3.1-8b geometry goes the direct path (sections
  // written straight from the pack, docs/packs.md): the same outcome.
  fs::copy_file(A(), D("big.kv"));
  const std::string old_big = ReadFile(D("big.kv"));
  ExpectDiskFull(Kvfile("unpack " + big_pack + " -o " + D("") + " big.kv --force"), D("big.kv"));
  EXPECT_TRUE(ReadFile(D("big.kv")) == old_big);
  ExpectDiskFull(Kvfile("unpack " + big_pack + " -o " + D("z") + " big.kv"), D("z/big.kv"));
  EXPECT_EQ(DNames(), (NameSet{"a.kv", "big.kv", "p.kvpack"}));
  fs::remove(D("big.kv"));

  // index: a new file to index, and the disk filled up to the last byte.
  fs::remove(D("p.kvpack"));
  ASSERT_EQ(Kvfile("index " + D("")).exit_code, 0);
  before = ReadFile(D(".kvfile-index"));
  fs::copy_file(B(), D("b.kv"));
  {
    std::ofstream fill(D("filler"), std::ios::binary);
    std::string block(4096, 'x');
    while (fill.write(block.data(), static_cast<std::streamsize>(block.size())) && fill.flush()) {
    }
  }
  CliRun r = Kvfile("index " + D(""));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  ExpectOneErrorLine(r);
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  EXPECT_TRUE(ReadFile(D(".kvfile-index")) == before);
  EXPECT_EQ(DNames(), (NameSet{".kvfile-index", "a.kv", "b.kv", "filler"}));
}

// 2. SIGKILL mid-write leaves a temporary file, never a part of the
// destination; the next run removes it. That one, interrupted by SIGINT,
// SIGTERM or SIGHUP mid-write, exits 130/143/129 with one line and leaves
// the old destination and no temp; a last run writes the whole new one.
struct SignalCase {
  std::string args;  // the command, writing `dest` under d/
  std::string dest;  // the file it replaces
  int sig;
  std::string sig_name;
};

void RunSignalCase(const SignalCase& c, const fs::path& d, const std::string& err_path) {
  const std::string before = ReadFile(c.dest);
  ASSERT_FALSE(before.empty());
  const NameSet names = Names(d);
  KvfileChild child(err_path);
  child.Start(c.args);
  ASSERT_TRUE(child.WaitForNewName(d, names)) << child.err();
  ASSERT_TRUE(child.Freeze()) << "it finished before it could be stopped";  // mid-write
  ASSERT_EQ(child.SignalAndWait(SIGKILL), 1000 + SIGKILL);
  const NameSet stale = Names(d);
  ASSERT_GT(stale.size(), names.size()) << "SIGKILL left no temporary file: the kill proves nothing";
  EXPECT_TRUE(ReadFile(c.dest) == before) << "a killed run changed " << c.dest;
  for (const std::string& n : stale)
    if (!names.count(n)) {
      EXPECT_TRUE(n.starts_with(fs::path(c.dest).filename().string() + ".kvtmp-")) << n;
    }

  child.Start(c.args);
  ASSERT_TRUE(child.WaitForNewName(d, stale)) << child.err();
  ASSERT_TRUE(child.Freeze()) << "it finished before it could be stopped";
  EXPECT_EQ(child.SignalAndWait(c.sig), 128 + c.sig);
  EXPECT_EQ(child.err(), "kvfile: error: " + c.dest + ": interrupted by " + c.sig_name + "\n");
  EXPECT_TRUE(ReadFile(c.dest) == before) << "an interrupted run changed " << c.dest;
  EXPECT_EQ(Names(d), names) << "the killed run's stale temp, or the interrupted run's own, is left";

  CliRun r = Kvfile(c.args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(ReadFile(c.dest) == before);
  EXPECT_EQ(Names(d), names);
}

TEST_F(PackAdversity, PackSignalsLeaveTheOldPack) {
  ASSERT_EQ(Kvfile("pack " + A() + " -o " + D("p.kvpack")).exit_code, 0);
  RunSignalCase({"pack " + Big() + " -o " + D("p.kvpack") + " --force", D("p.kvpack"), SIGINT, "SIGINT"}, dir_ / "d",
                I("err.txt"));
  EXPECT_EQ(Kvfile("verify " + D("p.kvpack")).exit_code, 0);
}

TEST_F(PackAdversity, UnpackSignalsLeaveTheOldMember) {
  const std::string pack = Pack("p", {{"a.kv", Big()}});
  const std::string small = Pack("s", {{"a.kv", A()}});
  ASSERT_EQ(Kvfile("unpack " + small + " -o " + D("")).exit_code, 0);
  RunSignalCase({"unpack " + pack + " -o " + D("") + " a.kv --force", D("a.kv"), SIGTERM, "SIGTERM"}, dir_ / "d",
                I("err.txt"));
  EXPECT_EQ(KvContent(D("a.kv")), KvContent(Big()));
}

// index reads every file anew after the old index is gone: 2,000 names of
// one small file (hard links) keep it busy for a moment.
TEST_F(PackAdversity, IndexSignalsLeaveTheOldIndex) {
  fs::copy_file(A(), D("s0.kv"));
  ASSERT_EQ(Kvfile("index " + D("")).exit_code, 0);
  for (int i = 1; i < 2000; ++i) fs::create_hard_link(D("s0.kv"), D("s" + std::to_string(i) + ".kv"));
  RunSignalCase({"index " + D(""), D(".kvfile-index"), SIGHUP, "SIGHUP"}, dir_ / "d", I("err.txt"));
  CliRun r = Kvfile("index " + D(""));
  EXPECT_EQ(r.out, D(".kvfile-index") + ": up to date (2000 files)\n");
}

// find refreshes and writes the index as index does.
TEST_F(PackAdversity, FindSignalsLeaveTheOldIndex) {
  fs::copy_file(A(), D("s0.kv"));
  ASSERT_EQ(Kvfile("index " + D("")).exit_code, 0);
  for (int i = 1; i < 2000; ++i) fs::create_hard_link(D("s0.kv"), D("s" + std::to_string(i) + ".kv"));
  std::unique_ptr<Reader> r;
  ASSERT_TRUE(Reader::Open(A(), {}, &r).ok());
  testing::WriteFile(I("q.txt"), std::to_string(r->tokens()[0]) + "\n");
  RunSignalCase({"find " + D("") + " --tokens " + I("q.txt"), D(".kvfile-index"), SIGINT, "SIGINT"}, dir_ / "d",
                I("err.txt"));
}

// 3. A symlinked destination: --force replaces its target whole and the
// link stays a link (pack, unpack of a member, the index of a directory).
TEST_F(PackAdversity, SymlinkDestinationStaysALink) {
  fs::create_directories(D("real"));
  ASSERT_EQ(Kvfile("pack " + A() + " -o " + D("real/p.kvpack")).exit_code, 0);
  fs::create_symlink("real/p.kvpack", D("p.kvpack"));
  CliRun r = Kvfile("pack " + B() + " -o " + D("p.kvpack") + " --force");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(fs::read_symlink(D("p.kvpack")), "real/p.kvpack");
  EXPECT_EQ(Kvfile("unpack " + D("p.kvpack") + " -o " + D("u")).exit_code, 0);
  EXPECT_EQ(KvContent(D("u/b.kv")), KvContent(B()));

  const std::string pack = Pack("p", {{"a.kv", A()}, {"b.kv", B()}});
  ASSERT_EQ(Kvfile("unpack " + pack + " -o " + D("real") + " a.kv").exit_code, 0);
  fs::create_symlink("../real/a.kv", D("u/a.kv"));
  r = Kvfile("unpack " + pack + " -o " + D("u") + " b.kv a.kv --force");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(fs::read_symlink(D("u/a.kv")), "../real/a.kv");
  EXPECT_EQ(KvContent(D("real/a.kv")), KvContent(A()));
  EXPECT_EQ(Names(dir_ / "d/real"), (NameSet{"a.kv", "p.kvpack"}));
  EXPECT_EQ(Names(dir_ / "d/u"), (NameSet{"a.kv", "b.kv"}));

  fs::remove(D("u/a.kv"));
  ASSERT_EQ(Kvfile("index " + D("u")).exit_code, 0);
  fs::rename(D("u/.kvfile-index"), D("real/index"));
  fs::create_symlink("../real/index", D("u/.kvfile-index"));
  fs::copy_file(A(), D("u/a.kv"));
  r = Kvfile("index " + D("u"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, D("u/.kvfile-index") + ": 2 files indexed (1 read, 1 unchanged)\n");
  EXPECT_EQ(fs::read_symlink(D("u/.kvfile-index")), "../real/index");
  EXPECT_EQ(Kvfile("index " + D("u")).out, D("u/.kvfile-index") + ": up to date (2 files)\n");
}

// 3b. A destination with a second hard link is replaced by the name given;
// the other name keeps the old bytes.
TEST_F(PackAdversity, HardLinkedDestinationIsReplacedByName) {
  ASSERT_EQ(Kvfile("pack " + A() + " -o " + D("p.kvpack")).exit_code, 0);
  std::string before = ReadFile(D("p.kvpack"));
  fs::create_hard_link(D("p.kvpack"), D("other.kvpack"));
  ASSERT_EQ(Kvfile("pack " + B() + " -o " + D("p.kvpack") + " --force").exit_code, 0);
  EXPECT_TRUE(ReadFile(D("other.kvpack")) == before);
  EXPECT_EQ(fs::hard_link_count(D("other.kvpack")), 1u);
  EXPECT_FALSE(ReadFile(D("p.kvpack")) == before);

  ASSERT_EQ(Kvfile("unpack " + D("other.kvpack") + " -o " + D("u")).exit_code, 0);
  before = ReadFile(D("u/a.kv"));
  fs::create_hard_link(D("u/a.kv"), D("other.kv"));
  ASSERT_EQ(Kvfile("unpack " + D("other.kvpack") + " -o " + D("u") + " a.kv --force").exit_code, 0);
  EXPECT_TRUE(ReadFile(D("other.kv")) == before);
  EXPECT_EQ(fs::hard_link_count(D("other.kv")), 1u);
  EXPECT_EQ(KvContent(D("u/a.kv")), KvContent(A()));
}

// 4. The mode, owner and group of a replaced pack, member file and index
// are kept.
TEST_F(PackAdversity, ReplacementKeepsModeAndOwner) {
  ASSERT_EQ(Kvfile("pack " + A() + " -o " + D("p.kvpack")).exit_code, 0);
  ASSERT_EQ(Kvfile("unpack " + D("p.kvpack") + " -o " + D("u")).exit_code, 0);
  ASSERT_EQ(Kvfile("index " + D("u")).exit_code, 0);
  const std::string files[] = {D("p.kvpack"), D("u/a.kv"), D("u/.kvfile-index")};
  for (const std::string& f : files) {
    ASSERT_EQ(::chmod(f.c_str(), 0640), 0);
    if (::chown(f.c_str(), 4321, 8765) != 0) GTEST_SKIP() << "chown needs root: " << std::strerror(errno);
  }
  ASSERT_EQ(Kvfile("pack " + A() + " " + B() + " -o " + D("p.kvpack") + " --force").exit_code, 0);
  ASSERT_EQ(Kvfile("unpack " + D("p.kvpack") + " -o " + D("u") + " --force").exit_code, 0);
  CliRun r = Kvfile("index " + D("u"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, D("u/.kvfile-index") + ": 2 files indexed (2 read, 0 unchanged)\n");
  for (const std::string& f : files) {
    struct stat st;
    ASSERT_EQ(::stat(f.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0640u) << f;
    EXPECT_EQ(st.st_uid, 4321u) << f;
    EXPECT_EQ(st.st_gid, 8765u) << f;
  }
}

// 5. FIFOs: refused at once as an input or a destination (exit 2, one
// line, the FIFO left a FIFO); one among a directory's files is not read.
// A regression that blocks is stopped by `timeout` (exit 124).
TEST_F(PackAdversity, FifoIsRefusedAtOnce) {
  const std::string t = "timeout 20";
  ASSERT_EQ(::mkfifo(I("f.kv").c_str(), 0644), 0);
  CliRun r = Kvfile("pack " + I("f.kv") + " -o " + D("p.kvpack"), t);
  ExpectRefusal(r, I("f.kv") + ": not a regular file (a FIFO)");
  EXPECT_EQ(DNames(), NameSet{});
  fs::create_directories(I("dir"));
  fs::copy_file(A(), I("dir/a.kv"));
  ASSERT_EQ(::mkfifo(I("dir/g.kv").c_str(), 0644), 0);
  r = Kvfile("pack " + I("dir") + " -o " + D("p.kvpack"), t);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, D("p.kvpack") + ": 1 members, 40 tokens, 1 chunks stored of 1 used, " +
                       std::to_string(fs::file_size(D("p.kvpack"))) + " bytes\n");

  ASSERT_EQ(::mkfifo(D("q.kvpack").c_str(), 0644), 0);
  r = Kvfile("pack " + A() + " -o " + D("q.kvpack") + " --force", t);
  ExpectRefusal(r, D("q.kvpack") + ": not a regular file; not replaced");
  EXPECT_TRUE(fs::is_fifo(D("q.kvpack")));

  r = Kvfile("unpack " + D("q.kvpack") + " -o " + D("u"), t);
  ExpectRefusal(r, D("q.kvpack") + ": not a regular file (a FIFO)");
  fs::create_directories(D("u"));
  ASSERT_EQ(::mkfifo(D("u/a.kv").c_str(), 0644), 0);
  r = Kvfile("unpack " + D("p.kvpack") + " -o " + D("u") + " --force", t);
  ExpectRefusal(r, D("u/a.kv") + ": not a regular file; not replaced");
  EXPECT_TRUE(fs::is_fifo(D("u/a.kv")));
  r = Kvfile("unpack " + D("p.kvpack") + " -o " + D("q.kvpack"), t);
  ExpectRefusal(r, D("q.kvpack") + ": exists and is not a directory");
  EXPECT_EQ(DNames(), (NameSet{"p.kvpack", "q.kvpack", "u"}));
  EXPECT_EQ(Names(dir_ / "d/u"), NameSet{"a.kv"});

  // index: the FIFO among the .kv files is left out unread; a FIFO where
  // the index goes is not replaced.
  fs::copy_file(A(), D("u/b.kv"));
  r = Kvfile("index " + D("u"), t);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.out, D("u/.kvfile-index") + ": 1 files indexed (1 read, 0 unchanged)\n");
  fs::remove(D("u/.kvfile-index"));
  ASSERT_EQ(::mkfifo(D("u/.kvfile-index").c_str(), 0644), 0);
  r = Kvfile("index " + D("u"), t);
  ExpectRefusal(r, D("u/.kvfile-index") + ": not a regular file; not replaced");
  EXPECT_TRUE(fs::is_fifo(D("u/.kvfile-index")));
}

// 6. A writer lock held by another process (as a running `append` holds
// it): on a destination, refused and unchanged (after the second the lock
// is waited for); on a .kv input, pack reads the committed file.
class PackAdversityLock : public PackAdversity {
 protected:
  // Runs `args` while `locked` is locked; it must be refused, `locked` unchanged.
  void ExpectRefused(const std::string& args, const std::string& locked) {
    const std::string before = ReadFile(locked);
    int fd = ::open(locked.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
    CliRun r = Kvfile(args);
    ::close(fd);
    ExpectRefusal(r, locked + ": another writer has the file open; not replaced");
    EXPECT_TRUE(ReadFile(locked) == before);
  }
};

TEST_F(PackAdversityLock, PackDestinationAndInput) {
  ASSERT_EQ(Kvfile("pack " + A() + " -o " + D("p.kvpack")).exit_code, 0);
  ExpectRefused("pack " + B() + " -o " + D("p.kvpack") + " --force", D("p.kvpack"));
  int fd = ::open(B().c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  CliRun r = Kvfile("pack " + B() + " -o " + D("b.kvpack"));
  ::close(fd);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Kvfile("unpack " + D("b.kvpack") + " -o " + D("v")).exit_code, 0);
  EXPECT_EQ(KvContent(D("v/b.kv")), KvContent(B()));
  EXPECT_EQ(DNames(), (NameSet{"b.kvpack", "p.kvpack", "v"}));
}

TEST_F(PackAdversityLock, UnpackDestination) {
  ASSERT_EQ(Kvfile("pack " + A() + " -o " + D("p.kvpack")).exit_code, 0);
  ASSERT_EQ(Kvfile("unpack " + D("p.kvpack") + " -o " + D("u")).exit_code, 0);
  ExpectRefused("unpack " + D("p.kvpack") + " -o " + D("u") + " a.kv --force", D("u/a.kv"));
  EXPECT_EQ(Names(dir_ / "d/u"), NameSet{"a.kv"});
}

TEST_F(PackAdversityLock, IndexFile) {
  fs::copy_file(A(), D("a.kv"));
  ASSERT_EQ(Kvfile("index " + D("")).exit_code, 0);
  fs::copy_file(B(), D("b.kv"));
  ExpectRefused("index " + D(""), D(".kvfile-index"));
  EXPECT_EQ(DNames(), (NameSet{".kvfile-index", "a.kv", "b.kv"}));
}

// Two `index` runs at once: each succeeds or is refused with one line, and
// the index left is whole and current.
TEST_F(PackAdversity, ConcurrentIndexRuns) {
  fs::copy_file(A(), D("a.kv"));
  for (int i = 0; i < 300; ++i) fs::create_hard_link(D("a.kv"), D("c" + std::to_string(i) + ".kv"));
  KvfileChild other(I("err.txt"));
  other.Start("index " + D(""));
  CliRun r = Kvfile("index " + D(""));
  int other_exit = other.SignalAndWait(0);  // signal 0: none, only the wait
  for (const auto& [exit_code, err] : {std::pair{r.exit_code, r.err}, std::pair{other_exit, other.err()}}) {
    if (exit_code == 0) {
      EXPECT_EQ(err, "");
    } else {
      EXPECT_EQ(exit_code, 2) << err;
      EXPECT_EQ(err, "kvfile: error: " + D(".kvfile-index") +
                         ": created by another process while the new file was written; not replaced\n");
    }
  }
  EXPECT_EQ(DNames().size(), 302u);  // a.kv, 300 links, the index: no temp
  EXPECT_EQ(Kvfile("index " + D("")).out, D(".kvfile-index") + ": up to date (301 files)\n");
}

// 7. A damaged pack: unpack of one member (one pass, no check first) finds
// the damage in its last chunk after the first is written to the temporary
// file, and leaves nothing: no file, no temp, not the directories it made.
TEST_F(PackAdversity, DamagedMemberWritesNothing) {
  const std::string pack = Pack("p", {{"a.kv", A()}, {"b.kv", B()}});
  CliRun r = Kvfile("ls " + pack + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  // b.kv: 300 tokens in two chunks (256 + 44), stored after a.kv's 40
  // tokens; its bytes are its chunks and its record of 4 x (300 + 2).
  ASSERT_EQ(j["members"][1]["name"], "b.kv");
  const uint64_t per_token = (j["members"][1]["bytes"].get<uint64_t>() - 4 * 302) / 300;
  std::string bytes = ReadFile(pack);
  bytes[128 + (40 + 256) * per_token + 10] ^= 0x40;  // in b.kv's second chunk
  testing::WriteFile(I("bad.kvpack"), bytes);
  r = Kvfile("unpack " + I("bad.kvpack") + " -o " + D("x/y") + " b.kv");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  ExpectOneErrorLine(r);
  EXPECT_EQ(r.err.rfind("kvfile: error: " + I("bad.kvpack") + ": chunk ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("checksum mismatch"), std::string::npos) << r.err;
  EXPECT_EQ(DNames(), NameSet{});
  r = Kvfile("unpack " + I("bad.kvpack") + " -o " + D("x/y") + " a.kv");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(KvContent(D("x/y/a.kv")), KvContent(A()));
}

// 8. An input changed by another process while `pack --jobs 8` reads it
// (issue 27, classes 4 and 9). in/x.kv: 3000 tokens in chunks of 4 (750
// chunks: the pack takes a moment); in/y.kv the same model and token count,
// other rows. The pack is frozen once it has x.kv open, the change is made,
// and the pack goes on: its member is wholly x.kv as it was before or as
// it is after the change (the pack may have been stopped before its open
// read the file), or it is refused with one line saying the file changed
// (exit 2, not blaming the data), and then no pack is left.
class PackInputChange : public PackAdversity {
 protected:
  std::string X() const { return I("x.kv"); }
  std::string Synth(const std::string& name, int seed, int tokens = 3000) {
    std::string kv = I(name + ".kv");
    CliRun r = Kvfile("-q synth " + kv + " --preset tiny --tokens " + std::to_string(tokens) +
                      " --chunk-tokens 4 --prefix-tokens 1 --prefix-seed 9 --seed " + std::to_string(seed));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return kv;
  }
  // How many open files of process `pid` are the file at `path`.
  static size_t OpenCount(pid_t pid, const std::string& path) {
    struct stat want;
    if (::stat(path.c_str(), &want) != 0) return 0;
    size_t n = 0;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
      struct stat st;
      if (::stat(e.path().c_str(), &st) == 0 && st.st_dev == want.st_dev && st.st_ino == want.st_ino) ++n;
    }
    return n;
  }
  // Packs x.kv with --jobs 8, frozen while it has x.kv open for `change`;
  // checks the outcome as said above, `refusal` being the allowed line.
  void PackWhile(const std::function<void()>& change, const std::string& refusal) {
    const std::string x = Synth("x", 5);
    const std::string before = KvContent(x);
    KvfileChild child(I("err.txt"));
    child.Start("-q pack " + x + " -o " + D("p.kvpack") + " --jobs 8");
    ASSERT_TRUE(child.WaitUntil([&] { return OpenCount(child.pid(), x) > 0; })) << child.err();
    ASSERT_TRUE(child.Freeze()) << "the pack ended before it could be stopped";
    change();
    const int exit_code = child.SignalAndWait(SIGCONT);
    if (exit_code == 0) {
      ASSERT_EQ(Kvfile("-q unpack " + D("p.kvpack") + " -o " + D("out")).exit_code, 0);
      const std::string member = KvContent(D("out/x.kv"));
      EXPECT_TRUE(member == before || member == KvContent(x)) << "the member mixes two versions";
    } else {
      EXPECT_EQ(exit_code, 2) << child.err();
      EXPECT_EQ(child.err(), "kvfile: error: " + x + ": " + refusal + "\n");
      EXPECT_EQ(DNames(), NameSet{});
    }
  }
};

// Another file renamed over x.kv.
TEST_F(PackInputChange, RenamedOver) {
  PackWhile([&] { fs::rename(Synth("y", 6), X()); }, "the file was replaced since it was opened");
}

// A writer appends to x.kv and commits: never refused. (Before: each
// thread opened x.kv again; any that found the longer file failed the
// pack.)
TEST_F(PackInputChange, AppendedTo) {
  Synth("turn", 7, 50);
  ASSERT_EQ(Kvfile("-q convert " + I("turn.kv") + " " + I("turn.safetensors")).exit_code, 0);
  PackWhile(
      [&] {
        CliRun r = Kvfile("-q append " + X() + " " + I("turn.safetensors"));
        ASSERT_EQ(r.exit_code, 0) << r.err;
      },
      "<none: the pack holds the tokens it found>");
}

// `kvfile rewind` cuts x.kv to 1 token. (Before: the reads past the new end
// failed as damage, exit 1.)
TEST_F(PackInputChange, Rewound) {
  PackWhile(
      [&] {
        CliRun r = Kvfile("-q rewind " + X() + " --to 1");
        ASSERT_EQ(r.exit_code, 0) << r.err;
      },
      "changed while being read (rewound or repaired by another process); read it again");
}

}  // namespace
}  // namespace kvfile
