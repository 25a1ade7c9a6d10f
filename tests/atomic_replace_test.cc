// SPDX-License-Identifier: Apache-2.0
// PendingReplace (src/io/atomic_replace.h): whole-file replacement. Faults at
// every step on the fault-injecting file system, and the real file system
// for what it alone has: symlinks, special files, locks held by other open
// files, owners and modes, stale temporary files.
#include "io/atomic_replace.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "io/file_backends.h"
#include "support/fault_fs.h"
#include "support/forwarding_fs.h"
#include "support/file_util.h"
#include "support/scratch_dir.h"

namespace kvfile::internal {
namespace {

namespace fs = std::filesystem;
using kvfile::testing::DiskImage;
using kvfile::testing::FaultFs;
using kvfile::testing::FsOp;
using kvfile::testing::ReadFile;
using kvfile::testing::WriteFile;

const std::vector<uint8_t> kOld = {'o', 'l', 'd', ' ', 'f', 'i', 'l', 'e'};
const std::vector<uint8_t> kNew(10000, 'n');

// Writes `bytes` as a new file at `path` through `fs`, synced.
Status WriteWhole(FileSystem& fs, const std::string& path, const std::vector<uint8_t>& bytes) {
  std::unique_ptr<File> f;
  KVFILE_RETURN_IF_ERROR(fs.Open(path, OpenMode::kCreateExclusive, &f));
  KVFILE_RETURN_IF_ERROR(f->WriteAt(0, bytes.data(), bytes.size()));
  return f->Sync();
}

// One whole replacement of "d/x.kv" with kNew: Begin, write, Commit.
Status ReplaceOnce(FaultFs& ffs) {
  std::unique_ptr<PendingReplace> r;
  KVFILE_RETURN_IF_ERROR(PendingReplace::Begin("d/x.kv", &ffs, &r));
  KVFILE_RETURN_IF_ERROR(WriteWhole(ffs, r->temp_path(), kNew));
  return r->Commit();
}

// A fault (ENOSPC, EIO) at each operation of each kind: the destination is
// the old file (or, once the rename is done, the new one), and no temporary
// file is left, whatever fails.
TEST(AtomicReplaceTest, FaultAtEveryStepLeavesTheOldFileAndNoTemp) {
  const FsOp::Kind kinds[] = {FsOp::kCreate, FsOp::kWrite, FsOp::kSync, FsOp::kRename, FsOp::kRemove,
                              FsOp::kSyncDir};
  for (bool existed : {true, false}) {
    int failures = 0;
    for (FsOp::Kind kind : kinds) {
      for (int nth = 0;; ++nth) {
        DiskImage start;
        if (existed) start["d/x.kv"] = kOld;
        FaultFs ffs(start);
        ffs.FailOn(kind, nth, ENOSPC, /*persistent=*/false);
        Status st = ReplaceOnce(ffs);
        DiskImage img = ffs.Image();
        SCOPED_TRACE("kind " + std::to_string(kind) + " nth " + std::to_string(nth) + ": " + st.ToString());
        EXPECT_LE(img.size(), 1u) << "a temporary file was left";
        bool renamed = false;
        for (const FsOp& op : ffs.log()) renamed |= op.kind == FsOp::kRename;
        if (st.ok() || renamed) {
          ASSERT_TRUE(img.count("d/x.kv"));
          EXPECT_EQ(img["d/x.kv"], kNew);
          EXPECT_TRUE(st.ok() || kind == FsOp::kSyncDir);
        } else if (existed) {
          ASSERT_TRUE(img.count("d/x.kv"));
          EXPECT_EQ(img["d/x.kv"], kOld);
        } else {
          EXPECT_TRUE(img.empty());
        }
        if (st.ok()) break;  // the fault was never reached: every step of this kind is covered
        ++failures;
        ASSERT_LT(nth, 100);
      }
    }
    // Create, write, sync (twice: writer and commit), rename and directory
    // sync can each fail.
    EXPECT_GE(failures, 5);
  }
}

TEST(AtomicReplaceTest, TempNames) {
  long pid;
  EXPECT_TRUE(IsReplaceTemp("x.kv", "x.kv.kvtmp-123-4", &pid));
  EXPECT_EQ(pid, 123);
  EXPECT_TRUE(IsReplaceTemp("x.kv", "x.kv.kvtmp-123-4.kvnew", &pid));
  EXPECT_TRUE(IsReplaceTemp("x.kv", "x.kv.kvtmp-77", &pid));
  EXPECT_EQ(pid, 77);
  EXPECT_TRUE(IsReplaceTemp("x.kv", "x.kv.kvnew", &pid));
  EXPECT_EQ(pid, 0);
  EXPECT_FALSE(IsReplaceTemp("x.kv", "x.kv", &pid));
  EXPECT_FALSE(IsReplaceTemp("x.kv", "y.kv.kvtmp-1-2", &pid));
  EXPECT_FALSE(IsReplaceTemp("x.kv", "x.kv.kvtmp-", &pid));
  EXPECT_FALSE(IsReplaceTemp("x.kv", "x.kv.kvtmp-abc", &pid));
  EXPECT_FALSE(IsReplaceTemp("x.kv", "x.kv.kvtmp-1-2.bak", &pid));
  EXPECT_FALSE(IsReplaceTemp("x.kv", "x.kv.kvtmp-1-", &pid));
  EXPECT_FALSE(IsReplaceTemp("x", "x.kv.kvtmp-1-2", &pid));
}

// Temporary names of long destination names fit NAME_MAX: the stem keeps
// 190 bytes (never half a UTF-8 character), then "~" and the hash of the
// whole name; a name of up to 207 bytes is its own stem.
TEST(AtomicReplaceTest, LongNamesGetAStemThatLeavesRoomForEverySuffix) {
  const std::string short_name(207, 's');
  EXPECT_EQ(TempStem(short_name), short_name);
  const std::string a(255, 'a'), b = std::string(254, 'a') + "b";
  const std::string sa = TempStem(a), sb = TempStem(b);
  EXPECT_EQ(sa.size(), 207u);
  EXPECT_EQ(sa.substr(0, 191), std::string(190, 'a') + "~");
  EXPECT_NE(sa, sb);  // the hash tells names apart that share their first bytes
  EXPECT_EQ(sa.find_first_not_of("0123456789abcdef", 191), std::string::npos);
  // 189 ASCII bytes and then 2-byte characters: the cut does not split one.
  std::string utf8(189, 'u');
  while (utf8.size() < 250) utf8 += "\xc3\xa9";
  EXPECT_EQ(TempStem(utf8).substr(0, 190), utf8.substr(0, 189) + "~");
  // TempPathFor: the whole name where it fits, else the stem; the directory kept.
  EXPECT_EQ(TempPathFor("d/x.kv", ".kvnew"), "d/x.kv.kvnew");
  EXPECT_EQ(TempPathFor("d/" + std::string(249, 'n'), ".kvnew"), "d/" + std::string(249, 'n') + ".kvnew");
  EXPECT_EQ(TempPathFor("d/" + a, ".kvupgrade"), "d/" + sa + ".kvupgrade");
  EXPECT_EQ(TempPathFor(a, ".kvnew"), sa + ".kvnew");
  // The stale-temp patterns recognise both forms.
  long pid;
  EXPECT_TRUE(IsReplaceTemp(a, sa + ".kvtmp-123-4", &pid));
  EXPECT_EQ(pid, 123);
  EXPECT_TRUE(IsReplaceTemp(a, sa + ".kvtmp-123-4.kvnew", &pid));
  EXPECT_TRUE(IsReplaceTemp(a, sa + ".kvnew", &pid));
  EXPECT_FALSE(IsReplaceTemp(b, sa + ".kvtmp-123-4", &pid));
}

class AtomicReplaceFsTest : public kvfile::testing::ScratchDirTest {
 protected:
  std::vector<std::string> Names() const { return kvfile::testing::SortedNames(dir_); }
  // Replaces `dest` with `content` through a PendingReplace.
  static Status Replace(const std::string& dest, const std::string& content) {
    std::unique_ptr<PendingReplace> r;
    KVFILE_RETURN_IF_ERROR(PendingReplace::Begin(dest, nullptr, &r));
    WriteFile(r->temp_path(), content);
    return r->Commit();
  }
};

TEST_F(AtomicReplaceFsTest, ReplacesAndCreates) {
  ASSERT_TRUE(Replace(P("x.kv"), "first").ok());
  EXPECT_EQ(ReadFile(P("x.kv")), "first");
  ASSERT_TRUE(Replace(P("x.kv"), "second").ok());
  EXPECT_EQ(ReadFile(P("x.kv")), "second");
  EXPECT_EQ(Names(), std::vector<std::string>{"x.kv"});
}

TEST_F(AtomicReplaceFsTest, UncommittedTempIsRemoved) {
  WriteFile(P("x.kv"), "old");
  std::string temp;
  {
    std::unique_ptr<PendingReplace> r;
    ASSERT_TRUE(PendingReplace::Begin(P("x.kv"), nullptr, &r).ok());
    temp = r->temp_path();
    EXPECT_EQ(fs::path(temp).parent_path(), dir_);
    WriteFile(temp, "half");
    WriteFile(temp + ".kvnew", "header");
  }
  EXPECT_EQ(Names(), std::vector<std::string>{"x.kv"});
  EXPECT_EQ(ReadFile(P("x.kv")), "old");
}

TEST_F(AtomicReplaceFsTest, SymlinkStaysALinkAndItsTargetIsReplaced) {
  fs::create_directories(dir_ / "real");
  WriteFile(P("real/t.kv"), "old");
  fs::create_symlink("real/t.kv", dir_ / "link.kv");
  ASSERT_TRUE(Replace(P("link.kv"), "new").ok());
  EXPECT_TRUE(fs::is_symlink(dir_ / "link.kv"));
  EXPECT_EQ(fs::read_symlink(dir_ / "link.kv"), "real/t.kv");
  EXPECT_EQ(ReadFile(P("real/t.kv")), "new");
  EXPECT_EQ(Names(), (std::vector<std::string>{"link.kv", "real"}));
  EXPECT_EQ(fs::directory_iterator(dir_ / "real")->path().filename(), "t.kv");
  // A dangling link: its target is created, the link kept.
  fs::create_symlink("real/new.kv", dir_ / "dangling.kv");
  ASSERT_TRUE(Replace(P("dangling.kv"), "created").ok());
  EXPECT_TRUE(fs::is_symlink(dir_ / "dangling.kv"));
  EXPECT_EQ(ReadFile(P("real/new.kv")), "created");
}

TEST_F(AtomicReplaceFsTest, RefusesWhatIsNotARegularFileAtOnce) {
  ASSERT_EQ(::mkfifo(P("fifo.kv").c_str(), 0644), 0);
  fs::create_directories(dir_ / "dir.kv");
  // A device node of the test's own (a copy of /dev/null), so that a
  // regression replaces nothing outside the test directory.
  if (::mknod(P("dev").c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0)
    GTEST_SKIP() << "mknod needs root: " << std::strerror(errno);
  fs::create_symlink("dev", dir_ / "null.kv");
  for (const char* name : {"fifo.kv", "dir.kv", "null.kv"}) {
    auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<PendingReplace> r;
    Status st = PendingReplace::Begin(P(name), nullptr, &r);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << name;
    EXPECT_EQ(st.message(), P(name) + ": not a regular file; not replaced");
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  }
  EXPECT_TRUE(fs::is_fifo(dir_ / "fifo.kv"));
  EXPECT_TRUE(fs::is_character_file(P("dev")));
  // The backends' opens refuse them too, without waiting for a FIFO writer.
  for (const char* name : {"fifo.kv", "null.kv", "dir.kv"}) {
    std::unique_ptr<File> f;
    Status st = FileSystem::Default()->Open(P(name), OpenMode::kRead, &f);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << name;
    EXPECT_NE(st.message().find(": not a regular file ("), std::string::npos) << st.message();
  }
  std::unique_ptr<File> f;
  EXPECT_EQ(FileSystem::Default()->Open(P("fifo.kv"), OpenMode::kRead, &f).message(),
            P("fifo.kv") + ": not a regular file (a FIFO)");
  EXPECT_EQ(FileSystem::Default()->Open(P("dev"), OpenMode::kReadWrite, &f).message(),
            P("dev") + ": not a regular file (a character device)");
}

// A socket cannot be opened at all (open fails with ENXIO): both backends
// refuse it by what it is, as they refuse a FIFO, and name it.
TEST_F(AtomicReplaceFsTest, RefusesASocketByWhatItIs) {
  const std::string path = P("sock.kv");
  int s = testing::BindUnixSocket(path);
  ASSERT_GE(s, 0) << path << ": " << std::strerror(errno);
  std::vector<FileSystem*> backends = {internal::PosixFileSystemInstance()};
  FileSystem* uring = nullptr;
  if (internal::UringFileSystemInstance(&uring).ok()) backends.push_back(uring);
  for (FileSystem* fs : backends)
    for (OpenMode mode : {OpenMode::kRead, OpenMode::kReadWrite}) {
      std::unique_ptr<File> f;
      Status st = fs->Open(path, mode, &f);
      EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
      EXPECT_EQ(st.message(), path + ": not a regular file (a socket)");
    }
  std::unique_ptr<PendingReplace> r;
  EXPECT_EQ(PendingReplace::Begin(path, nullptr, &r).message(), path + ": not a regular file; not replaced");
  ::close(s);
}

TEST_F(AtomicReplaceFsTest, LockedDestinationIsNotReplaced) {
  WriteFile(P("x.kv"), "old");
  std::unique_ptr<PendingReplace> r;
  ASSERT_TRUE(PendingReplace::Begin(P("x.kv"), nullptr, &r).ok());
  WriteFile(r->temp_path(), "new");
  // Another open file description holds the writer lock, as a writer does.
  int fd = ::open(P("x.kv").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  auto t0 = std::chrono::steady_clock::now();
  Status st = r->Commit();
  auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(st.code(), Status::Code::kBusy);
  EXPECT_EQ(st.message(), P("x.kv") + ": another writer has the file open; not replaced");
  EXPECT_GE(waited, std::chrono::milliseconds(900));  // it waited for the lock
  r.reset();
  ::close(fd);
  EXPECT_EQ(ReadFile(P("x.kv")), "old");
  EXPECT_EQ(Names(), std::vector<std::string>{"x.kv"});
}

TEST_F(AtomicReplaceFsTest, DestinationReplacedOrCreatedMeanwhileIsKept) {
  WriteFile(P("x.kv"), "old");
  {
    std::unique_ptr<PendingReplace> r;
    ASSERT_TRUE(PendingReplace::Begin(P("x.kv"), nullptr, &r).ok());
    WriteFile(r->temp_path(), "mine");
    WriteFile(P("other"), "theirs");
    fs::rename(P("other"), P("x.kv"));
    Status st = r->Commit();
    EXPECT_EQ(st.code(), Status::Code::kBusy);
    EXPECT_EQ(st.message(), P("x.kv") + ": replaced by another process while the new file was written; not replaced");
  }
  EXPECT_EQ(ReadFile(P("x.kv")), "theirs");
  {
    std::unique_ptr<PendingReplace> r;
    ASSERT_TRUE(PendingReplace::Begin(P("y.kv"), nullptr, &r).ok());
    WriteFile(r->temp_path(), "mine");
    WriteFile(P("y.kv"), "theirs");
    Status st = r->Commit();
    EXPECT_EQ(st.code(), Status::Code::kBusy);
    EXPECT_EQ(st.message(), P("y.kv") + ": created by another process while the new file was written; not replaced");
  }
  EXPECT_EQ(ReadFile(P("y.kv")), "theirs");
  EXPECT_EQ(Names(), (std::vector<std::string>{"x.kv", "y.kv"}));
}

TEST_F(AtomicReplaceFsTest, KeepsModeOwnerAndGroup) {
  WriteFile(P("x.kv"), "old");
  ASSERT_EQ(::chmod(P("x.kv").c_str(), 0600), 0);
  if (::chown(P("x.kv").c_str(), 4321, 8765) != 0) GTEST_SKIP() << "chown needs root: " << std::strerror(errno);
  ASSERT_TRUE(Replace(P("x.kv"), "new").ok());
  struct stat st;
  ASSERT_EQ(::stat(P("x.kv").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_uid, 4321u);
  EXPECT_EQ(st.st_gid, 8765u);
  EXPECT_EQ(ReadFile(P("x.kv")), "new");
}

// The temporary file of a creator that is gone but whose lock is still
// held for a moment (the kernel keeps a killed process's io_uring files,
// and their locks, until it has torn its ring down) is waited for and
// removed. Here another thread holds the lock and lets it go after 50 ms,
// well inside the second LockWithGrace waits.
// A file that counts its lock attempts (the stale temporary's, below).
class LockCountingFile : public File {
 public:
  LockCountingFile(std::unique_ptr<File> f, std::atomic<int>* attempts) : f_(std::move(f)), attempts_(attempts) {}
  Status ReadAt(uint64_t offset, void* buf, size_t n) override { return f_->ReadAt(offset, buf, n); }
  Status WriteAt(uint64_t offset, const void* buf, size_t n) override { return f_->WriteAt(offset, buf, n); }
  Status Sync() override { return f_->Sync(); }
  Status Truncate(uint64_t size) override { return f_->Truncate(size); }
  Status Size(uint64_t* size) override { return f_->Size(size); }
  Status LockExclusive() override {
    attempts_->fetch_add(1);
    return f_->LockExclusive();
  }
  Status Id(FileId* id) override { return f_->Id(id); }
  const char* backend() const override { return f_->backend(); }
  const std::string& path() const override { return f_->path(); }

 private:
  std::unique_ptr<File> f_;
  std::atomic<int>* attempts_;
};

TEST_F(AtomicReplaceFsTest, StaleTempLockedForAMomentAfterItsCreatorDiedIsRemoved) {
  WriteFile(P("x.kv"), "old");
  const std::string stale = P("x.kv.kvtmp-999999999-0");  // above any pid_max
  WriteFile(stale, "stale");
  int fd = ::open(stale.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  // The lock is released only once Begin has found it held and tried
  // again: the grace wait is what removes the file, not a lucky order.
  std::atomic<int> attempts{0};
  struct Watch : kvfile::testing::ForwardingFs {
    std::string watched;
    std::atomic<int>* attempts;
    Status Open(const std::string& path, OpenMode mode, std::unique_ptr<File>* out) override {
      Status st = base_->Open(path, mode, out);
      if (st.ok() && path == watched) *out = std::make_unique<LockCountingFile>(std::move(*out), attempts);
      return st;
    }
  } watch;
  watch.watched = stale;
  watch.attempts = &attempts;
  std::atomic<bool> returned{false};  // so that a Begin that never retries fails, not hangs
  std::thread release([fd, &attempts, &returned] {
    while (attempts.load() < 2 && !returned.load()) std::this_thread::yield();
    ::close(fd);
  });
  std::unique_ptr<PendingReplace> r;
  Status st = PendingReplace::Begin(P("x.kv"), &watch, &r);
  returned = true;
  release.join();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(r->removed_stale(), 1);
  EXPECT_GE(attempts.load(), 3);  // two refused while held, then the one that took it
  EXPECT_FALSE(fs::exists(stale));
}

// Temporary files of this destination whose creator is gone and that no
// one holds locked are removed; live ones and other names are not.
TEST_F(AtomicReplaceFsTest, RemovesStaleTempsOnly) {
  WriteFile(P("x.kv"), "old");
  const std::string dead = "999999999";  // above any pid_max
  for (const std::string& n : std::vector<std::string>{"x.kv.kvtmp-" + dead + "-0", "x.kv.kvtmp-" + dead + "-3.kvnew",
                               "x.kv.kvtmp-" + dead, "x.kv.kvnew"})
    WriteFile(P(n), "stale");
  // Kept: another destination's, an unrelated name, one of a live process
  // (this one's parent), and one a live process holds locked.
  const std::string live = "x.kv.kvtmp-" + std::to_string(::getppid()) + "-1";
  const std::string locked = "x.kv.kvtmp-" + dead + "-7";
  for (const std::string& n : {std::string("y.kv.kvtmp-") + dead + "-0", std::string("x.kv.kvtmp-old"), live, locked})
    WriteFile(P(n), "keep");
  int fd = ::open(P(locked).c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  std::unique_ptr<PendingReplace> r;
  ASSERT_TRUE(PendingReplace::Begin(P("x.kv"), nullptr, &r).ok());
  EXPECT_EQ(r->removed_stale(), 4);
  ::close(fd);
  std::vector<std::string> want = {"x.kv", "x.kv.kvtmp-old", live, locked, "y.kv.kvtmp-" + dead + "-0"};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(Names(), want);
}

// A destination of 255 bytes: its temporary file fits (the stem), the
// replacement works, and a dead process's temporaries of it are removed.
TEST_F(AtomicReplaceFsTest, DestinationNameOf255Bytes) {
  const std::string name(255, 'x');
  const std::string stem = TempStem(name);
  const std::string dead = "999999999";
  for (const std::string& n : {stem + ".kvtmp-" + dead + "-0", stem + ".kvtmp-" + dead + "-1.kvnew", stem + ".kvnew"})
    WriteFile(P(n), "stale");
  std::unique_ptr<PendingReplace> r;
  ASSERT_TRUE(PendingReplace::Begin(P(name), nullptr, &r).ok());
  EXPECT_EQ(r->removed_stale(), 3);
  EXPECT_TRUE(r->temp_path().starts_with(P(stem + ".kvtmp-" + std::to_string(::getpid()) + "-"))) << r->temp_path();
  WriteFile(r->temp_path(), "new");
  ASSERT_TRUE(r->Commit().ok());
  EXPECT_EQ(Names(), std::vector<std::string>{name});
  EXPECT_EQ(ReadFile(P(name)), "new");
}

}  // namespace
}  // namespace kvfile::internal
