// SPDX-License-Identifier: Apache-2.0
// The file backends behind FileSystem::Default(): the same behavioural checks
// on POSIX and io_uring (io_uring skipped where this process cannot use it),
// byte-identical results from both, and the KVFILE_IO choice.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "io/file_backends.h"

namespace kvfile {
namespace {

using Bytes = std::vector<uint8_t>;
constexpr size_t kMiB = size_t{1} << 20;

// Null (and why) when io_uring cannot be initialised here.
FileSystem* UringFs(std::string* why) {
  FileSystem* fs = nullptr;
  Status st = internal::UringFileSystemInstance(&fs);
  if (!st.ok() && why != nullptr) *why = st.ToString();
  return st.ok() ? fs : nullptr;
}

struct PosixBackend {
  static constexpr const char* kName = "posix";
  static FileSystem* Get(std::string*) { return internal::PosixFileSystemInstance(); }
};
struct UringBackend {
  static constexpr const char* kName = "io_uring";
  static FileSystem* Get(std::string* why) { return UringFs(why); }
};

struct BackendNames {
  template <typename T>
  static std::string GetName(int) {
    return T::kName;
  }
};

Bytes RandomBytes(std::mt19937_64& rng, size_t n) {
  Bytes b(n);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    std::memcpy(b.data() + i, &v, 8);
  }
  for (; i < n; ++i) b[i] = static_cast<uint8_t>(rng());
  return b;
}

// Writes b at offset into the model of the file's bytes.
void Apply(Bytes* model, uint64_t offset, const Bytes& b) {
  if (b.empty()) return;
  if (model->size() < offset + b.size()) model->resize(offset + b.size(), 0);
  std::memcpy(model->data() + offset, b.data(), b.size());
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = testing::TempDir() + "kvfile_uring_test_XXXXXX";
    char* made = ::mkdtemp(tmpl.data());
    EXPECT_NE(made, nullptr) << std::strerror(errno);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string Path(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

Bytes ReadAll(File* f) {
  uint64_t size = 0;
  EXPECT_TRUE(f->Size(&size).ok());
  Bytes b(size);
  Status st = f->ReadAt(0, b.data(), b.size());
  EXPECT_TRUE(st.ok()) << st.ToString();
  return b;
}

// Lowers RLIMIT_FSIZE (and ignores SIGXFSZ) for one scope, so that a write
// crossing `limit` comes back short and the next one fails with EFBIG.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(uint64_t limit) {
    EXPECT_EQ(::getrlimit(RLIMIT_FSIZE, &saved_), 0);
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    Set(limit);
  }
  ~FileSizeLimit() {
    EXPECT_EQ(::setrlimit(RLIMIT_FSIZE, &saved_), 0);
    ::signal(SIGXFSZ, old_handler_);
  }
  void Set(uint64_t limit) {
    struct rlimit r = saved_;
    r.rlim_cur = static_cast<rlim_t>(limit);
    EXPECT_EQ(::setrlimit(RLIMIT_FSIZE, &r), 0) << std::strerror(errno);
  }
  void Lift() { EXPECT_EQ(::setrlimit(RLIMIT_FSIZE, &saved_), 0); }

 private:
  struct rlimit saved_ {};
  sighandler_t old_handler_ = SIG_DFL;
};

template <typename B>
class FileBackendTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    fs_ = B::Get(&why);
    if (fs_ == nullptr) GTEST_SKIP() << "io_uring cannot be initialised here: " << why;
  }

  std::unique_ptr<File> Create(const std::string& name) {
    std::unique_ptr<File> f;
    Status st = fs_->Open(dir_.Path(name), OpenMode::kCreateExclusive, &f);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return f;
  }
  std::unique_ptr<File> Open(const std::string& name, OpenMode mode) {
    std::unique_ptr<File> f;
    Status st = fs_->Open(dir_.Path(name), mode, &f);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return f;
  }

  FileSystem* fs_ = nullptr;
  TempDir dir_;
};

using Backends = testing::Types<PosixBackend, UringBackend>;
TYPED_TEST_SUITE(FileBackendTest, Backends, BackendNames);

TYPED_TEST(FileBackendTest, ReportsItsBackend) {
  auto f = this->Create("a");
  ASSERT_TRUE(f);
  EXPECT_STREQ(f->backend(), TypeParam::kName);
  EXPECT_EQ(f->path(), this->dir_.Path("a"));
}

TYPED_TEST(FileBackendTest, RoundTripRandomSizesAndOffsets) {
  auto f = this->Create("rt");
  ASSERT_TRUE(f);
  std::mt19937_64 rng(42);
  Bytes model;
  const size_t sizes[] = {0, 1, 7, 4095, 4096, 4097, 65536, 1 * kMiB + 3, 3 * kMiB};
  for (int i = 0; i < 150; ++i) {
    size_t n = sizes[rng() % std::size(sizes)];
    if (rng() % 2) n = rng() % (n + 1);
    uint64_t offset = rng() % (6 * kMiB);
    Bytes b = RandomBytes(rng, n);
    Status st = f->WriteAt(offset, b.data(), b.size());
    ASSERT_TRUE(st.ok()) << st.ToString();
    Apply(&model, offset, b);
    if (model.empty()) continue;
    uint64_t ro = rng() % model.size();
    size_t rn = static_cast<size_t>(rng() % (model.size() - ro + 1));
    Bytes got(rn);
    st = f->ReadAt(ro, got.data(), rn);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_EQ(0, std::memcmp(got.data(), model.data() + ro, rn)) << "read " << rn << " at " << ro;
  }
  uint64_t size = 0;
  ASSERT_TRUE(f->Size(&size).ok());
  EXPECT_EQ(size, model.size());
  EXPECT_TRUE(ReadAll(f.get()) == model);

  // And through a second, read-only open.
  auto r = this->Open("rt", OpenMode::kRead);
  ASSERT_TRUE(r);
  EXPECT_TRUE(ReadAll(r.get()) == model);
}

TYPED_TEST(FileBackendTest, ReadPastEndIsCorruption) {
  auto f = this->Create("eof");
  ASSERT_TRUE(f);
  Bytes b(100, 0xab);
  ASSERT_TRUE(f->WriteAt(0, b.data(), b.size()).ok());
  Bytes got(100);
  Status st = f->ReadAt(50, got.data(), 100);
  EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
  EXPECT_EQ(st.message(), this->dir_.Path("eof") + ": unexpected end of file at offset 100");
  st = f->ReadAt(1000, got.data(), 10);
  EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
  EXPECT_EQ(st.message(), this->dir_.Path("eof") + ": unexpected end of file at offset 1000");
  EXPECT_TRUE(f->ReadAt(100, got.data(), 0).ok());
  EXPECT_TRUE(f->ReadAt(0, got.data(), 100).ok());
  EXPECT_TRUE(got == b);
}

TYPED_TEST(FileBackendTest, SubmitWriteManyBuffersThenWait) {
  auto f = this->Create("many");
  ASSERT_TRUE(f);
  std::mt19937_64 rng(7);
  // Several larger than one 8 MiB SQE, one longer than a whole link chain,
  // and more small ones than the ring holds.
  std::vector<size_t> sizes = {1,        4096,         9 * kMiB + 7, 100,     17 * kMiB,
                               8 * kMiB, 3,            66 * kMiB + 1, 8 * kMiB - 1};
  for (int i = 0; i < 200; ++i) sizes.push_back(1 + rng() % 20000);
  std::vector<Bytes> bufs;
  bufs.reserve(sizes.size());
  Bytes model;
  uint64_t offset = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    bufs.push_back(RandomBytes(rng, sizes[i]));
    bool sync_after = i % 25 == 2;
    Status st = f->SubmitWrite(offset, bufs.back().data(), bufs.back().size(), sync_after);
    ASSERT_TRUE(st.ok()) << st.ToString();
    Apply(&model, offset, bufs.back());
    offset += sizes[i] + (rng() % 3 == 0 ? rng() % 5000 : 0);  // sometimes leave a hole
  }
  Status st = f->WaitWrites();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(ReadAll(f.get()) == model);
  EXPECT_TRUE(f->WaitWrites().ok());  // nothing queued
}

TYPED_TEST(FileBackendTest, OverlappingSubmitWritesLandInOrder) {
  auto f = this->Create("overlap");
  ASSERT_TRUE(f);
  std::mt19937_64 rng(11);
  std::vector<Bytes> bufs;
  bufs.reserve(300);
  Bytes model;
  for (int i = 0; i < 300; ++i) {
    size_t n = (i % 50 == 0) ? 12 * kMiB + rng() % 1000 : 1 + rng() % 100000;
    uint64_t offset = rng() % (2 * kMiB);
    bufs.push_back(RandomBytes(rng, n));
    ASSERT_TRUE(f->SubmitWrite(offset, bufs.back().data(), n, i % 7 == 0).ok());
    Apply(&model, offset, bufs.back());
  }
  Status st = f->WaitWrites();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(ReadAll(f.get()) == model);
}

TYPED_TEST(FileBackendTest, SubmitWriteWithSyncAfter) {
  auto f = this->Create("sync");
  ASSERT_TRUE(f);
  std::mt19937_64 rng(3);
  Bytes a = RandomBytes(rng, 20 * kMiB + 5);
  Bytes b = RandomBytes(rng, 4096);
  ASSERT_TRUE(f->SubmitWrite(0, a.data(), a.size(), /*sync_after=*/true).ok());
  ASSERT_TRUE(f->SubmitWrite(a.size(), b.data(), b.size(), /*sync_after=*/false).ok());
  ASSERT_TRUE(f->SubmitWrite(a.size() + b.size(), nullptr, 0, /*sync_after=*/true).ok());
  Status st = f->WaitWrites();
  ASSERT_TRUE(st.ok()) << st.ToString();
  Bytes model;
  Apply(&model, 0, a);
  Apply(&model, a.size(), b);
  EXPECT_TRUE(ReadAll(f.get()) == model);
  EXPECT_TRUE(f->Sync().ok());
}

TYPED_TEST(FileBackendTest, SynchronousCallsSeeQueuedWrites) {
  auto f = this->Create("seen");
  ASSERT_TRUE(f);
  std::mt19937_64 rng(5);
  Bytes a = RandomBytes(rng, 9 * kMiB);
  ASSERT_TRUE(f->SubmitWrite(0, a.data(), a.size(), false).ok());
  uint64_t size = 0;
  ASSERT_TRUE(f->Size(&size).ok());
  EXPECT_EQ(size, a.size());
  Bytes got(a.size());
  ASSERT_TRUE(f->ReadAt(0, got.data(), got.size()).ok());
  EXPECT_TRUE(got == a);
  ASSERT_TRUE(f->SubmitWrite(a.size(), a.data(), a.size(), true).ok());
  ASSERT_TRUE(f->Truncate(100).ok());  // after the queued write, not before
  ASSERT_TRUE(f->Size(&size).ok());
  EXPECT_EQ(size, 100u);
  EXPECT_TRUE(f->WaitWrites().ok());
}

TYPED_TEST(FileBackendTest, TruncateAndSize) {
  auto f = this->Create("trunc");
  ASSERT_TRUE(f);
  uint64_t size = 1;
  ASSERT_TRUE(f->Size(&size).ok());
  EXPECT_EQ(size, 0u);
  Bytes b(5000, 0x5a);
  ASSERT_TRUE(f->WriteAt(0, b.data(), b.size()).ok());
  ASSERT_TRUE(f->Truncate(1234).ok());
  ASSERT_TRUE(f->Size(&size).ok());
  EXPECT_EQ(size, 1234u);
  ASSERT_TRUE(f->Truncate(3 * kMiB).ok());
  ASSERT_TRUE(f->Size(&size).ok());
  EXPECT_EQ(size, 3 * kMiB);
  Bytes got(10);
  ASSERT_TRUE(f->ReadAt(1230, got.data(), got.size()).ok());
  EXPECT_EQ(got, (Bytes{0x5a, 0x5a, 0x5a, 0x5a, 0, 0, 0, 0, 0, 0}));
  ASSERT_TRUE(f->Sync().ok());
}

TYPED_TEST(FileBackendTest, SecondExclusiveLockIsBusy) {
  auto a = this->Create("lock");
  ASSERT_TRUE(a);
  auto b = this->Open("lock", OpenMode::kReadWrite);
  ASSERT_TRUE(b);
  ASSERT_TRUE(a->LockExclusive().ok());
  Status st = b->LockExclusive();
  EXPECT_EQ(st.code(), Status::Code::kBusy) << st.ToString();
  EXPECT_NE(st.message().find(this->dir_.Path("lock")), std::string::npos) << st.message();
  a.reset();
  EXPECT_TRUE(b->LockExclusive().ok());
}

TYPED_TEST(FileBackendTest, OpenErrors) {
  std::unique_ptr<File> f;
  EXPECT_EQ(this->fs_->Open(this->dir_.Path("missing"), OpenMode::kRead, &f).code(),
            Status::Code::kNotFound);
  EXPECT_EQ(this->fs_->Open(this->dir_.path(), OpenMode::kRead, &f).code(),
            Status::Code::kInvalidArgument);
  ASSERT_TRUE(this->Create("x"));
  EXPECT_EQ(this->fs_->Open(this->dir_.Path("x"), OpenMode::kCreateExclusive, &f).code(),
            Status::Code::kIOError);
}

TYPED_TEST(FileBackendTest, DirectoryOperations) {
  ASSERT_TRUE(this->Create("from"));
  ASSERT_TRUE(this->Create("to"));
  FileSystem* fs = this->fs_;
  EXPECT_EQ(fs->Rename(this->dir_.Path("from"), this->dir_.Path("to"), false).code(),
            Status::Code::kIOError);
  EXPECT_TRUE(fs->Rename(this->dir_.Path("from"), this->dir_.Path("to"), true).ok());
  bool exists = true;
  ASSERT_TRUE(fs->Exists(this->dir_.Path("from"), &exists).ok());
  EXPECT_FALSE(exists);
  EXPECT_TRUE(fs->SyncDir(this->dir_.path()).ok());
  EXPECT_TRUE(fs->Remove(this->dir_.Path("to")).ok());
  ASSERT_TRUE(fs->Exists(this->dir_.Path("to"), &exists).ok());
  EXPECT_FALSE(exists);
}

TYPED_TEST(FileBackendTest, WriteErrorsNameThePathAndOffset) {
  ASSERT_TRUE(this->Create("ro"));
  auto f = this->Open("ro", OpenMode::kRead);
  ASSERT_TRUE(f);
  Bytes b(10, 1);
  Status st = f->WriteAt(5, b.data(), b.size());
  EXPECT_EQ(st.code(), Status::Code::kIOError);
  EXPECT_EQ(st.message().rfind(this->dir_.Path("ro") + ": write at offset 5: ", 0), 0u)
      << st.message();

  // Queued: the failure comes from SubmitWrite (posix runs it at once) or
  // from WaitWrites, once.
  st = f->SubmitWrite(77, b.data(), b.size(), true);
  Status waited = f->WaitWrites();
  EXPECT_NE(st.ok(), waited.ok()) << st.ToString() << " / " << waited.ToString();
  Status failure = st.ok() ? waited : st;
  EXPECT_EQ(failure.code(), Status::Code::kIOError);
  EXPECT_EQ(failure.message().rfind(this->dir_.Path("ro") + ": write at offset 77: ", 0), 0u)
      << failure.message();
  EXPECT_TRUE(f->WaitWrites().ok());  // reported once
}

// A write crossing RLIMIT_FSIZE comes back short; the remainder must be
// submitted, and its EFBIG reported at the limit's offset.
TYPED_TEST(FileBackendTest, ShortWriteRemainderIsWrittenAndItsErrorReported) {
  auto f = this->Create("fsize");
  ASSERT_TRUE(f);
  const uint64_t limit = kMiB + 123;
  std::mt19937_64 rng(9);
  Bytes b = RandomBytes(rng, 1000);
  const std::string want = this->dir_.Path("fsize") + ": write at offset " + std::to_string(limit);
  {
    FileSizeLimit lim(limit);
    Status st = f->WriteAt(limit - 100, b.data(), b.size());
    EXPECT_EQ(st.code(), Status::Code::kIOError) << st.ToString();
    EXPECT_EQ(st.message().rfind(want + ": ", 0), 0u) << st.message();

    Bytes big = RandomBytes(rng, 18 * kMiB);
    std::memcpy(big.data() + 4900, b.data(), 100);
    st = f->SubmitWrite(limit - 5000, big.data(), big.size(), true);
    Status waited = f->WaitWrites();
    Status failure = st.ok() ? waited : st;
    EXPECT_EQ(failure.code(), Status::Code::kIOError) << failure.ToString();
    EXPECT_EQ(failure.message().rfind(want + ": ", 0), 0u) << failure.message();
  }
  uint64_t size = 0;
  ASSERT_TRUE(f->Size(&size).ok());
  EXPECT_EQ(size, limit);
  Bytes got(100);
  ASSERT_TRUE(f->ReadAt(limit - 100, got.data(), got.size()).ok());
  EXPECT_EQ(0, std::memcmp(got.data(), b.data(), 100));
}

TYPED_TEST(FileBackendTest, DestroyingAFileWaitsForQueuedWrites) {
  std::mt19937_64 rng(13);
  Bytes a = RandomBytes(rng, 30 * kMiB + 1);
  {
    auto f = this->Create("dtor");
    ASSERT_TRUE(f);
    ASSERT_TRUE(f->SubmitWrite(4096, a.data(), a.size(), true).ok());
  }  // no WaitWrites
  a.push_back(0);  // may reallocate: the kernel must be done with the old buffer
  a.pop_back();
  auto r = this->Open("dtor", OpenMode::kRead);
  ASSERT_TRUE(r);
  Bytes got(a.size());
  ASSERT_TRUE(r->ReadAt(4096, got.data(), got.size()).ok());
  EXPECT_TRUE(got == a);
}

// ---- ReadBatch ---------------------------------------------------------------

// Requests of every shape at scattered offsets into a file of `size` bytes:
// mostly small, some of 0 bytes (also at the very end), a few of MiBs.
std::vector<ReadRequest> ScatteredRequests(std::mt19937_64& rng, size_t count, uint64_t size,
                                           std::vector<Bytes>* bufs) {
  const size_t sizes[] = {0, 1, 7, 512, 4095, 4096, 4097, 65536, 3 * kMiB + 5};
  std::vector<ReadRequest> reqs;
  bufs->clear();
  bufs->reserve(count);
  for (size_t i = 0; i < count; ++i) {
    size_t n = sizes[rng() % std::size(sizes)];
    if (n > 65536 && rng() % 4 != 0) n = rng() % 20000;  // MiB reads: now and then
    if (rng() % 3 == 0) n = rng() % (n + 1);
    n = std::min<size_t>(n, size);
    uint64_t offset = i % 37 == 5 ? size - n : rng() % (size - n + 1);
    bufs->emplace_back(n, 0xEE);
    reqs.push_back({offset, bufs->back().data(), n});
  }
  return reqs;
}

// What pread returns for the same ranges (through a descriptor of its own).
void ExpectEqualsPread(const std::string& path, std::span<const ReadRequest> reqs) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  for (size_t i = 0; i < reqs.size(); ++i) {
    Bytes want(reqs[i].n);
    ssize_t got = ::pread(fd, want.data(), want.size(), static_cast<off_t>(reqs[i].offset));
    ASSERT_EQ(got, static_cast<ssize_t>(want.size())) << "request " << i;
    // (memcmp of zero bytes: the buffers may be null, which memcmp must not get)
    ASSERT_TRUE(want.empty() || std::memcmp(reqs[i].buf, want.data(), want.size()) == 0)
        << "request " << i << ": " << reqs[i].n << " bytes at " << reqs[i].offset;
  }
  ::close(fd);
}

TYPED_TEST(FileBackendTest, ReadBatchEqualsPread) {
  auto f = this->Create("batch");
  ASSERT_TRUE(f);
  std::mt19937_64 rng(31);
  const Bytes content = RandomBytes(rng, 12 * kMiB + 333);
  ASSERT_TRUE(f->WriteAt(0, content.data(), content.size()).ok());
  auto r = this->Open("batch", OpenMode::kRead);
  ASSERT_TRUE(r);
  std::vector<Bytes> bufs;
  for (size_t count : {0, 1, 63, 64, 65, 200}) {
    SCOPED_TRACE("batch of " + std::to_string(count));
    auto reqs = ScatteredRequests(rng, count, content.size(), &bufs);
    for (File* file : {f.get(), r.get()}) {
      for (Bytes& b : bufs) std::fill(b.begin(), b.end(), 0xEE);
      Status st = file->ReadBatch(reqs);
      ASSERT_TRUE(st.ok()) << st.ToString();
      ExpectEqualsPread(this->dir_.Path("batch"), reqs);
    }
  }
  // The same range many times over, and reads that all end at the end.
  std::vector<ReadRequest> reqs;
  bufs.assign(130, Bytes(4096, 0xEE));
  for (size_t i = 0; i < bufs.size(); ++i)
    reqs.push_back({i % 2 ? 4096 : content.size() - 4096, bufs[i].data(), 4096});
  ASSERT_TRUE(r->ReadBatch(reqs).ok());
  ExpectEqualsPread(this->dir_.Path("batch"), reqs);
}

TYPED_TEST(FileBackendTest, ReadBatchPastEndIsCorruption) {
  auto f = this->Create("beof");
  ASSERT_TRUE(f);
  Bytes b(100, 0xab);
  ASSERT_TRUE(f->WriteAt(0, b.data(), b.size()).ok());
  const std::string eof = this->dir_.Path("beof") + ": unexpected end of file at offset ";
  // Past the end in the first submission, in the second, alone, and a
  // 0-byte read past the end (which, as for ReadAt, is fine).
  for (size_t bad : {0, 3, 63, 64, 66}) {
    for (uint64_t at : {50, 100, 1000}) {
      SCOPED_TRACE("request " + std::to_string(bad) + " at " + std::to_string(at));
      std::vector<Bytes> bufs(bad + 5, Bytes(10));
      std::vector<ReadRequest> reqs;
      for (size_t i = 0; i < bufs.size(); ++i) reqs.push_back({i % 90, bufs[i].data(), 10});
      bufs[bad].resize(100);
      reqs[bad] = {at, bufs[bad].data(), 100};
      Status st = f->ReadBatch(reqs);
      EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
      EXPECT_EQ(st.message(), eof + std::to_string(std::max<uint64_t>(at, 100)));
      Status one = f->ReadAt(at, bufs[bad].data(), 100);
      EXPECT_EQ(one.code(), st.code());
      EXPECT_EQ(one.message(), st.message());
    }
  }
  Bytes got(100);
  std::vector<ReadRequest> reqs = {{5000, got.data(), 0}, {100, got.data(), 0}, {0, got.data(), 100}};
  ASSERT_TRUE(f->ReadBatch(reqs).ok());
  EXPECT_TRUE(got == b);
}

TYPED_TEST(FileBackendTest, ReadBatchSeesQueuedWrites) {
  auto f = this->Create("bqueued");
  ASSERT_TRUE(f);
  std::mt19937_64 rng(37);
  std::vector<Bytes> writes;
  Bytes model;
  uint64_t offset = 0;
  for (size_t n : {9 * kMiB + 1, size_t{100}, size_t{4096}, 2 * kMiB, size_t{1}, size_t{70000}}) {
    writes.push_back(RandomBytes(rng, n));
    Apply(&model, offset, writes.back());
    offset += n + 1000;  // holes between them
  }
  for (int round = 0; round < 2; ++round) {  // then over the same bytes again
    offset = 0;
    for (size_t i = 0; i < writes.size(); ++i) {
      if (round == 1) writes[i] = RandomBytes(rng, writes[i].size());
      Apply(&model, offset, writes[i]);
      ASSERT_TRUE(f->SubmitWrite(offset, writes[i].data(), writes[i].size(), i == 2).ok());
      offset += writes[i].size() + 1000;
    }
    std::vector<Bytes> bufs;
    auto reqs = ScatteredRequests(rng, 150, model.size(), &bufs);
    Status st = f->ReadBatch(reqs);  // no WaitWrites
    ASSERT_TRUE(st.ok()) << st.ToString();
    for (size_t i = 0; i < reqs.size(); ++i)
      ASSERT_TRUE(reqs[i].n == 0 || std::memcmp(bufs[i].data(), model.data() + reqs[i].offset, reqs[i].n) == 0)
          << "round " << round << ", request " << i;
    ASSERT_TRUE(f->WaitWrites().ok());
  }
  EXPECT_TRUE(ReadAll(f.get()) == model);
}

// A File moves between threads; the thread that queued the writes exits
// before they are waited for (the kernel may cancel what it still had).
TYPED_TEST(FileBackendTest, QueuedOnOneThreadWaitedOnAnother) {
  auto f = this->Create("threads");
  ASSERT_TRUE(f);
  std::mt19937_64 rng(17);
  std::vector<Bytes> bufs;
  for (int i = 0; i < 40; ++i) bufs.push_back(RandomBytes(rng, 1 + rng() % (3 * kMiB)));
  Bytes model;
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const Bytes& b : bufs) {
    offsets.push_back(offset);
    Apply(&model, offset, b);
    offset += b.size();
  }
  Status submitted;
  std::thread t([&] {
    for (size_t i = 0; i < bufs.size() && submitted.ok(); ++i)
      submitted = f->SubmitWrite(offsets[i], bufs[i].data(), bufs[i].size(), i % 4 == 3);
  });
  t.join();
  ASSERT_TRUE(submitted.ok()) << submitted.ToString();
  const uint64_t before = internal::UringChainResubmissions();
  Status st = f->WaitWrites();
  ASSERT_TRUE(st.ok()) << st.ToString();
  if (std::string(f->backend()) == "io_uring")
    std::printf("[ info     ] chains resubmitted after the submitting thread exited: %llu\n",
                static_cast<unsigned long long>(internal::UringChainResubmissions() - before));
  EXPECT_TRUE(ReadAll(f.get()) == model);
}

// io_uring only: a short queued write followed by a linked fsync; the limit
// is lifted before WaitWrites, so the remainder, the writes cancelled behind
// it and the fsync all succeed when resubmitted. A later write with its own
// fsync (queued behind the first chain) completes meanwhile; its fsync ran
// before the remainder was written, so it must be run again.
TEST(UringFile, ShortQueuedWriteIsFinishedAndFsyncsReissued) {
  std::string why;
  FileSystem* fs = UringFs(&why);
  if (fs == nullptr) GTEST_SKIP() << "io_uring cannot be initialised here: " << why;
  TempDir dir;
  std::unique_ptr<File> f;
  ASSERT_TRUE(fs->Open(dir.Path("short"), OpenMode::kCreateExclusive, &f).ok());
  std::mt19937_64 rng(21);
  const uint64_t a_at = 8192;
  Bytes a = RandomBytes(rng, 3 * 8 * kMiB + 17);  // three SQEs, then the fsync
  Bytes b = RandomBytes(rng, 4096);               // below the limit
  const uint64_t before = internal::UringChainResubmissions();
  {
    FileSizeLimit lim(kMiB);
    ASSERT_TRUE(f->SubmitWrite(a_at, a.data(), a.size(), true).ok());
    ASSERT_TRUE(f->SubmitWrite(0, b.data(), b.size(), true).ok());
    // Lift the limit once the first write has come back short (the file
    // has grown to the limit) and before its completion is reaped.
    for (int ms = 0; ms < 10000; ++ms) {
      std::error_code ec;
      if (std::filesystem::file_size(dir.Path("short"), ec) == kMiB) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    lim.Lift();
    Status st = f->WaitWrites();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  const uint64_t resubmitted = internal::UringChainResubmissions() - before;
  std::printf("[ info     ] chains resubmitted after the short write: %llu\n",
              static_cast<unsigned long long>(resubmitted));
  EXPECT_GE(resubmitted, 2u);  // the first chain, and the second one's fsync
  Bytes model;
  Apply(&model, a_at, a);
  Apply(&model, 0, b);
  EXPECT_TRUE(ReadAll(f.get()) == model);
}

// The same operations through both backends give the same bytes.
void RunScript(FileSystem* fs, const std::string& path) {
  std::unique_ptr<File> f;
  ASSERT_TRUE(fs->Open(path, OpenMode::kCreateExclusive, &f).ok());
  ASSERT_TRUE(f->LockExclusive().ok());
  std::mt19937_64 rng(1234);
  std::vector<Bytes> keep;
  keep.reserve(400);
  for (int round = 0; round < 4; ++round) {
    for (int i = 0; i < 60; ++i) {
      size_t n = (i % 20 == 0) ? 9 * kMiB + rng() % 4096 : rng() % 50000;
      uint64_t offset = rng() % (24 * kMiB);
      keep.push_back(RandomBytes(rng, n));
      if (rng() % 3 == 0) {
        ASSERT_TRUE(f->WriteAt(offset, keep.back().data(), n).ok());
      } else {
        ASSERT_TRUE(f->SubmitWrite(offset, keep.back().data(), n, rng() % 4 == 0).ok());
      }
    }
    ASSERT_TRUE(f->SubmitWrite(0, nullptr, 0, true).ok());
    ASSERT_TRUE(f->WaitWrites().ok());
    uint64_t size = 0;
    ASSERT_TRUE(f->Size(&size).ok());
    ASSERT_TRUE(f->Truncate(size - size / 3 + round).ok());
    ASSERT_TRUE(f->Sync().ok());
  }
  ASSERT_TRUE(f->Truncate(30 * kMiB).ok());
}

TEST(UringFile, BothBackendsWriteIdenticalFiles) {
  std::string why;
  FileSystem* uring = UringFs(&why);
  if (uring == nullptr) GTEST_SKIP() << "io_uring cannot be initialised here: " << why;
  TempDir dir;
  RunScript(internal::PosixFileSystemInstance(), dir.Path("posix"));
  RunScript(uring, dir.Path("uring"));
  std::unique_ptr<File> p, u;
  ASSERT_TRUE(internal::PosixFileSystemInstance()->Open(dir.Path("posix"), OpenMode::kRead, &p).ok());
  ASSERT_TRUE(internal::PosixFileSystemInstance()->Open(dir.Path("uring"), OpenMode::kRead, &u).ok());
  Bytes pb = ReadAll(p.get());
  Bytes ub = ReadAll(u.get());
  EXPECT_EQ(pb.size(), 30 * kMiB);
  EXPECT_TRUE(pb == ub);
}

std::string BackendOf(FileSystem* fs) {
  TempDir dir;
  std::unique_ptr<File> f;
  Status st = fs->Open(dir.Path("probe"), OpenMode::kCreateExclusive, &f);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return f ? f->backend() : "";
}

TEST(KvfileIo, ChoosesTheBackend) {
  std::string why;
  FileSystem* uring = UringFs(&why);
  FileSystem* posix = internal::PosixFileSystemInstance();
  FileSystem* best = uring != nullptr ? uring : posix;

  FileSystem* fs = nullptr;
  EXPECT_TRUE(internal::MakeFileSystemFromEnv("posix", &fs).ok());
  EXPECT_EQ(fs, posix);
  EXPECT_EQ(BackendOf(fs), "posix");

  fs = nullptr;
  Status st = internal::MakeFileSystemFromEnv("uring", &fs);
  if (uring != nullptr) {
    EXPECT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(fs, uring);
    EXPECT_EQ(BackendOf(fs), "io_uring");
  } else {
    EXPECT_FALSE(st.ok());  // says why; Default() falls back silently
    EXPECT_EQ(fs, posix);
  }

  for (const char* value : {static_cast<const char*>(nullptr), "bogus", "", "POSIX"}) {
    fs = nullptr;
    st = internal::MakeFileSystemFromEnv(value, &fs);
    EXPECT_TRUE(st.ok()) << (value ? value : "(unset)") << ": " << st.ToString();
    EXPECT_EQ(fs, best) << (value ? value : "(unset)");
  }

  const char* env = std::getenv("KVFILE_IO");
  std::printf("[ info     ] io_uring here: %s; KVFILE_IO=%s; FileSystem::Default() uses: %s\n",
              uring != nullptr ? "available" : why.c_str(), env ? env : "(unset)",
              BackendOf(FileSystem::Default()).c_str());
  if (env == nullptr) {
    // Default() routes s3:// paths elsewhere and every other path to `best`.
    EXPECT_EQ(BackendOf(FileSystem::Default()), BackendOf(best));
  }
}

}  // namespace
}  // namespace kvfile
