// SPDX-License-Identifier: Apache-2.0
// Faults injected at the system-call level inside both real backends, by
// the tests' injector (tests/support/io_faults.h) through the backends'
// SyscallFilter seam: EINTR, EAGAIN and short counts on the Nth write,
// fsync or read (pwrite/pread/fdatasync for POSIX, the SQE's completion for
// io_uring), once and persistently; EIO and ENOSPC on the Nth write and
// fsync. What is checked:
//   - transient faults are invisible: the File's bytes on disk and the bytes
//     read back are exactly right, and a Writer's file is byte-identical to
//     one written without faults, and reads back through a Reader;
//   - a persistent EINTR/EAGAIN does not hang: after 1000 attempts in a row
//     without progress (both backends' bound) the call fails;
//   - EIO/ENOSPC: the Writer reports the error with the path and the errno
//     text, fails every later call, never acknowledges more, and the file
//     opens with at least every acknowledged token;
//   - the same Writer calls through POSIX and io_uring give identical files.
// io_uring cases are skipped where this process cannot use io_uring.
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "io/file_backends.h"
#include "support/io_faults.h"
#include "kvfile/presets.h"
#include "kvfile/reader.h"
#include "kvfile/replace.h"
#include "kvfile/writer.h"
#include "support/testing_hooks.h"

namespace kvfile {
namespace {

using hooks::IoFault;
using Bytes = std::vector<uint8_t>;

constexpr int kShort = IoFault::kShort;
constexpr uint64_t kSalt = 0x10FA017E57ull;
constexpr uint32_t kTokens = 40;
constexpr uint64_t kRetryBound = 1000;  // both backends' EINTR/EAGAIN bound

#define ASSERT_OK(expr)                                         \
  do {                                                          \
    ::kvfile::Status _st = (expr);                              \
    ASSERT_TRUE(_st.ok()) << #expr << ": " << _st.ToString();   \
  } while (0)

// ---- backends, faults, files ----------------------------------------------------

// Null (and why) when the backend cannot be used in this process.
FileSystem* Backend(const std::string& name, std::string* why) {
  if (name == "posix") return hooks::FaultablePosix();
  FileSystem* fs = nullptr;
  Status st = hooks::FaultableUring(&fs);
  if (!st.ok()) *why = st.ToString();
  return st.ok() ? fs : nullptr;
}

const std::vector<std::string>& BackendNames() {
  static const std::vector<std::string> names = {"posix", "io_uring"};
  return names;
}

// Arms faults for one scope (cleared even when an assertion returns early).
class Armed {
 public:
  explicit Armed(std::vector<IoFault> faults) { hooks::SetIoFaults(std::move(faults)); }
  ~Armed() { hooks::ClearIoFaults(); }
  Armed(const Armed&) = delete;
  Armed& operator=(const Armed&) = delete;
};

struct Case {
  IoFault::Op op;
  int result;  // -errno or kShort
  bool persistent;
  const char* name;
};

IoFault FaultAt(const Case& c, int nth) { return IoFault{c.op, nth, c.result, c.persistent}; }

std::string ErrText(int result) { return std::strerror(-result); }

class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "kvfile_io_fault_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) ADD_FAILURE() << "mkdtemp: " << std::strerror(errno);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string Path(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The file's bytes, read without either backend.
Bytes DiskBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

Bytes RandomBytes(std::mt19937_64& rng, size_t n) {
  Bytes b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

void Apply(Bytes* model, uint64_t offset, const Bytes& b) {
  if (model->size() < offset + b.size()) model->resize(offset + b.size(), 0);
  std::memcpy(model->data() + offset, b.data(), b.size());
}

// ---- File level -------------------------------------------------------------------

// Six writes (synchronous and queued, overlapping), six fsyncs (alone and
// linked after queued writes) and reads in pieces; every byte is checked,
// through the backend and directly on disk. Faults must be armed by the
// caller; they stay armed throughout.
void RunFileScript(FileSystem* fs, const std::string& path) {
  std::unique_ptr<File> f;
  ASSERT_OK(fs->Open(path, OpenMode::kCreateExclusive, &f));
  std::mt19937_64 rng(77);
  std::vector<Bytes> keep;
  keep.reserve(8);
  auto data = [&](size_t n) -> const Bytes& { return keep.emplace_back(RandomBytes(rng, n)); };
  Bytes model;

  const Bytes& a = data(5000);
  ASSERT_OK(f->WriteAt(0, a.data(), a.size()));
  Apply(&model, 0, a);
  const Bytes& b = data(7001);
  const Bytes& c = data(3000);
  ASSERT_OK(f->SubmitWrite(6000, b.data(), b.size(), /*sync_after=*/true));
  ASSERT_OK(f->SubmitWrite(16384, c.data(), c.size(), false));
  ASSERT_OK(f->SubmitWrite(0, nullptr, 0, true));
  ASSERT_OK(f->WaitWrites());
  Apply(&model, 6000, b);
  Apply(&model, 16384, c);
  const Bytes& d = data(4000);
  ASSERT_OK(f->WriteAt(2500, d.data(), d.size()));
  Apply(&model, 2500, d);
  ASSERT_OK(f->Sync());
  const Bytes& e = data(9000);
  const Bytes& g = data(1234);
  ASSERT_OK(f->SubmitWrite(20000, e.data(), e.size(), true));
  ASSERT_OK(f->SubmitWrite(30000, g.data(), g.size(), true));
  ASSERT_OK(f->WaitWrites());
  Apply(&model, 20000, e);
  Apply(&model, 30000, g);
  ASSERT_OK(f->Sync());

  uint64_t size = 0;
  ASSERT_OK(f->Size(&size));
  ASSERT_EQ(size, model.size());
  Bytes got(model.size(), 0xEE);
  const size_t cuts[] = {0, 7, 4097, 9000, 22222, 30001, model.size()};
  for (size_t i = 0; i + 1 < std::size(cuts); ++i)
    ASSERT_OK(f->ReadAt(cuts[i], got.data() + cuts[i], cuts[i + 1] - cuts[i]));
  EXPECT_TRUE(got == model) << "pieces read back differ";
  Bytes whole(model.size(), 0xEE);
  ASSERT_OK(f->ReadAt(0, whole.data(), whole.size()));
  EXPECT_TRUE(whole == model) << "whole file read back differs";
  f.reset();
  EXPECT_TRUE(DiskBytes(path) == model) << "bytes on disk differ";
}

const Case kTransient[] = {
    {IoFault::kWrite, -EINTR, false, "WriteEintrOnce"},
    {IoFault::kWrite, -EAGAIN, false, "WriteEagainOnce"},
    {IoFault::kWrite, kShort, false, "WriteShortOnce"},
    {IoFault::kWrite, kShort, true, "WriteShortPersistent"},
    {IoFault::kSync, -EINTR, false, "SyncEintrOnce"},
    {IoFault::kSync, -EAGAIN, false, "SyncEagainOnce"},
    {IoFault::kRead, -EINTR, false, "ReadEintrOnce"},
    {IoFault::kRead, -EAGAIN, false, "ReadEagainOnce"},
    {IoFault::kRead, kShort, false, "ReadShortOnce"},
    {IoFault::kRead, kShort, true, "ReadShortPersistent"},
};

using BackendCase = std::tuple<std::string, Case>;

std::string BackendCaseName(const ::testing::TestParamInfo<BackendCase>& p) {
  std::string b = std::get<0>(p.param) == "posix" ? "Posix" : "Uring";
  return b + "_" + std::get<1>(p.param).name;
}

class BackendCaseTest : public ::testing::TestWithParam<BackendCase> {
 protected:
  void SetUp() override {
    std::string why;
    fs_ = Backend(std::get<0>(GetParam()), &why);
    if (fs_ == nullptr) GTEST_SKIP() << "io_uring cannot be initialised here: " << why;
  }
  const Case& fault() const { return std::get<1>(GetParam()); }
  bool uring() const { return std::get<0>(GetParam()) == "io_uring"; }
  FileSystem* fs_ = nullptr;
  TempDir dir_;
};

class FileTransientTest : public BackendCaseTest {};

TEST_P(FileTransientTest, InvisibleInBytesWrittenAndRead) {
  for (int nth = 0; nth <= 5; ++nth) {
    SCOPED_TRACE(std::string(fault().name) + " at operation " + std::to_string(nth));
    Armed armed({FaultAt(fault(), nth)});
    RunFileScript(fs_, dir_.Path("f" + std::to_string(nth)));
    EXPECT_GE(hooks::IoFaultsInjected(), 1u) << "the fault never fired";
  }
}

INSTANTIATE_TEST_SUITE_P(All, FileTransientTest,
                         ::testing::Combine(::testing::ValuesIn(BackendNames()),
                                            ::testing::ValuesIn(kTransient)),
                         BackendCaseName);

// io_uring only (POSIX writes it with one pwrite): one queued write of two
// SQEs (8 MiB each at most) with a linked fsync, then a Sync. Writes 0 and
// 1 are the two SQEs, fsync 0 the linked one, fsync 1 the Sync: a fault on
// any of them is finished by resubmitting the chain.
const Case kChainCases[] = {
    {IoFault::kWrite, -EINTR, false, "WriteEintrOnce"},
    {IoFault::kWrite, -EAGAIN, false, "WriteEagainOnce"},
    {IoFault::kWrite, kShort, false, "WriteShortOnce"},
    {IoFault::kWrite, kShort, true, "WriteShortPersistent"},
    {IoFault::kSync, -EINTR, false, "SyncEintrOnce"},
    {IoFault::kSync, -EAGAIN, false, "SyncEagainOnce"},
};

class UringChainTest : public ::testing::TestWithParam<Case> {};

TEST_P(UringChainTest, LargeQueuedWriteWithLinkedFsync) {
  const Case& c = GetParam();
  std::string why;
  FileSystem* fs = Backend("io_uring", &why);
  if (fs == nullptr) GTEST_SKIP() << "io_uring cannot be initialised here: " << why;
  TempDir dir;
  std::mt19937_64 rng(5);
  const Bytes big = RandomBytes(rng, (8u << 20) + 4099);
  Bytes model;
  Apply(&model, 512, big);
  for (int nth = 0; nth <= 1; ++nth) {
    SCOPED_TRACE(std::string(c.name) + " at operation " + std::to_string(nth));
    const std::string path = dir.Path("big" + std::to_string(nth));
    const uint64_t resubmitted = internal::UringChainResubmissions();
    {
      std::unique_ptr<File> f;
      ASSERT_OK(fs->Open(path, OpenMode::kCreateExclusive, &f));
      Armed armed({FaultAt(c, nth)});
      ASSERT_OK(f->SubmitWrite(512, big.data(), big.size(), /*sync_after=*/true));
      ASSERT_OK(f->WaitWrites());
      ASSERT_OK(f->Sync());
      EXPECT_GE(hooks::IoFaultsInjected(), 1u) << "the fault never fired";
    }
    EXPECT_TRUE(DiskBytes(path) == model);
    if (c.op == IoFault::kWrite || nth == 0) {
      EXPECT_GT(internal::UringChainResubmissions(), resubmitted) << "nothing was resubmitted";
    }
    std::filesystem::remove(path);
  }
}

INSTANTIATE_TEST_SUITE_P(All, UringChainTest, ::testing::ValuesIn(kChainCases),
                         [](const ::testing::TestParamInfo<Case>& p) {
                           return std::string(p.param.name);
                         });

// A short queued write on io_uring breaks its link: the fsync linked after
// it is cancelled (not run, not counted) and resubmitted with the rest.
TEST(UringFaults, ShortQueuedWriteCancelsItsLinkedFsync) {
  std::string why;
  FileSystem* fs = Backend("io_uring", &why);
  if (fs == nullptr) GTEST_SKIP() << "io_uring cannot be initialised here: " << why;
  TempDir dir;
  std::mt19937_64 rng(9);
  const Bytes b = RandomBytes(rng, 10000);
  std::unique_ptr<File> f;
  ASSERT_OK(fs->Open(dir.Path("s"), OpenMode::kCreateExclusive, &f));
  const uint64_t before = internal::UringChainResubmissions();
  {
    Armed armed({{IoFault::kWrite, 0, kShort, false}});
    ASSERT_OK(f->SubmitWrite(0, b.data(), b.size(), true));
    ASSERT_OK(f->WaitWrites());
    EXPECT_EQ(hooks::IoOpsCounted(IoFault::kWrite), 2u);  // half, then the rest
    EXPECT_EQ(hooks::IoOpsCounted(IoFault::kSync), 1u);   // cancelled once, run once
  }
  EXPECT_EQ(internal::UringChainResubmissions() - before, 1u);
  f.reset();
  EXPECT_TRUE(DiskBytes(dir.Path("s")) == b);
}

// ---- bounded retries ------------------------------------------------------------

const Case kEndless[] = {
    {IoFault::kWrite, -EINTR, true, "WriteEintrPersistent"},
    {IoFault::kWrite, -EAGAIN, true, "WriteEagainPersistent"},
    {IoFault::kSync, -EINTR, true, "SyncEintrPersistent"},
    {IoFault::kSync, -EAGAIN, true, "SyncEagainPersistent"},
    {IoFault::kRead, -EINTR, true, "ReadEintrPersistent"},
    {IoFault::kRead, -EAGAIN, true, "ReadEagainPersistent"},
};

class FileEndlessRetryTest : public BackendCaseTest {};

// EINTR or EAGAIN on every attempt: each call gives up after 1000 attempts
// in a row and fails, naming the path and the errno; once the fault is gone
// the same File works again.
TEST_P(FileEndlessRetryTest, FailsAfterTheBound) {
  const Case& c = fault();
  const std::string path = dir_.Path("e");
  std::unique_ptr<File> f;
  ASSERT_OK(fs_->Open(path, OpenMode::kCreateExclusive, &f));
  Bytes data(3000, 0x5A);
  ASSERT_OK(f->WriteAt(0, data.data(), data.size()));
  Bytes buf(data.size());
  auto call = [&]() -> Status {
    switch (c.op) {
      case IoFault::kWrite: return f->WriteAt(0, data.data(), data.size());
      case IoFault::kSync: return f->Sync();
      case IoFault::kRead: return f->ReadAt(0, buf.data(), buf.size());
      case IoFault::kSyncDir: break;  // not a File's operation
    }
    return Status::OK();
  };
  const auto start = std::chrono::steady_clock::now();
  {
    Armed armed({FaultAt(c, 1)});
    ASSERT_OK(call());  // operation 0 is not faulted
    Status st = call();
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), Status::Code::kIOError) << st.ToString();
    EXPECT_NE(st.message().find(path), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find(ErrText(c.result)), std::string::npos) << st.ToString();
    EXPECT_EQ(hooks::IoFaultsInjected(), kRetryBound);
    EXPECT_EQ(hooks::IoOpsCounted(c.op), 1 + kRetryBound);
    if (c.op != IoFault::kRead) {
      // Queued (io_uring: the chain is resubmitted up to the same bound;
      // POSIX runs it at once), the failure comes from either call.
      bool sync_after = c.op == IoFault::kSync;
      Status q = f->SubmitWrite(0, data.data(), data.size(), sync_after);
      if (q.ok()) q = f->WaitWrites();
      ASSERT_FALSE(q.ok());
      EXPECT_NE(q.message().find(path), std::string::npos) << q.ToString();
    }
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(secs, 20.0);
  ASSERT_OK(call());
  ASSERT_OK(f->WaitWrites());
  ASSERT_OK(f->ReadAt(0, buf.data(), buf.size()));
  EXPECT_TRUE(buf == data);
}

INSTANTIATE_TEST_SUITE_P(All, FileEndlessRetryTest,
                         ::testing::Combine(::testing::ValuesIn(BackendNames()),
                                            ::testing::ValuesIn(kEndless)),
                         BackendCaseName);

// EIO and ENOSPC on the File calls themselves: reported with path and errno
// text (by WaitWrites for a queued write or fsync), never retried.
const Case kHard[] = {
    {IoFault::kWrite, -EIO, false, "WriteEioOnce"},
    {IoFault::kWrite, -EIO, true, "WriteEioPersistent"},
    {IoFault::kWrite, -ENOSPC, false, "WriteEnospcOnce"},
    {IoFault::kWrite, -ENOSPC, true, "WriteEnospcPersistent"},
    {IoFault::kSync, -EIO, false, "SyncEioOnce"},
    {IoFault::kSync, -EIO, true, "SyncEioPersistent"},
    {IoFault::kSync, -ENOSPC, false, "SyncEnospcOnce"},
    {IoFault::kSync, -ENOSPC, true, "SyncEnospcPersistent"},
};

class FileHardErrorTest : public BackendCaseTest {};

TEST_P(FileHardErrorTest, ReportedOnceWithPathAndErrno) {
  const Case& c = fault();
  const std::string path = dir_.Path("h");
  std::unique_ptr<File> f;
  ASSERT_OK(fs_->Open(path, OpenMode::kCreateExclusive, &f));
  Bytes data(3000, 0x33);
  auto check = [&](const Status& st, const char* what) {
    ASSERT_FALSE(st.ok()) << what;
    EXPECT_EQ(st.code(), Status::Code::kIOError) << what << ": " << st.ToString();
    EXPECT_NE(st.message().find(path), std::string::npos) << what << ": " << st.ToString();
    EXPECT_NE(st.message().find(ErrText(c.result)), std::string::npos)
        << what << ": " << st.ToString();
  };
  {
    Armed armed({FaultAt(c, 0)});
    if (c.op == IoFault::kWrite)
      check(f->WriteAt(0, data.data(), data.size()), "WriteAt");
    else
      check(f->Sync(), "Sync");
    EXPECT_EQ(hooks::IoFaultsInjected(), 1u) << "retried a hard error";
    Status st = f->SubmitWrite(0, data.data(), data.size(), /*sync_after=*/true);
    if (st.ok()) st = f->WaitWrites();
    if (c.persistent) check(st, "SubmitWrite/WaitWrites");
    else ASSERT_OK(st);
  }
  ASSERT_OK(f->WaitWrites());  // reported once
  ASSERT_OK(f->WriteAt(0, data.data(), data.size()));
  ASSERT_OK(f->Sync());
  f.reset();
  EXPECT_TRUE(DiskBytes(path) == data);
}

INSTANTIATE_TEST_SUITE_P(All, FileHardErrorTest,
                         ::testing::Combine(::testing::ValuesIn(BackendNames()),
                                            ::testing::ValuesIn(kHard)),
                         BackendCaseName);

// ---- ReadBatch ------------------------------------------------------------------

// 100 reads of 1..20000 bytes at scattered offsets of a 1 MiB file (none of
// 0 bytes, so that read N of the fault hook is request N), checked against
// pread of the same ranges.
struct BatchFixture {
  Bytes content;
  std::vector<Bytes> bufs;
  std::vector<ReadRequest> reqs;

  explicit BatchFixture(const std::string& path) {
    std::mt19937_64 rng(41);
    content = RandomBytes(rng, (1u << 20) + 77);
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(content.data()),
               static_cast<std::streamsize>(content.size()));
    for (int i = 0; i < 100; ++i) {
      const size_t n = 1 + rng() % 20000;
      bufs.emplace_back(n, 0xEE);
      reqs.push_back({rng() % (content.size() - n + 1), bufs.back().data(), n});
    }
  }
  void Expect() const {
    for (size_t i = 0; i < reqs.size(); ++i)
      ASSERT_TRUE(reqs[i].n == 0 || std::memcmp(bufs[i].data(), content.data() + reqs[i].offset, reqs[i].n) == 0)
          << "request " << i;
  }
};

const Case kBatchTransient[] = {
    {IoFault::kRead, -EINTR, false, "ReadEintrOnce"},
    {IoFault::kRead, -EAGAIN, false, "ReadEagainOnce"},
    {IoFault::kRead, kShort, false, "ReadShortOnce"},
    {IoFault::kRead, kShort, true, "ReadShortPersistent"},
};

class ReadBatchTransientTest : public BackendCaseTest {};

// The fault on the first read, the last of the first submission, the first
// of the second, and the last: the batch completes with the right bytes.
TEST_P(ReadBatchTransientTest, CompletedTransparently) {
  BatchFixture b(dir_.Path("rb"));
  std::unique_ptr<File> f;
  ASSERT_OK(fs_->Open(dir_.Path("rb"), OpenMode::kRead, &f));
  for (int nth : {0, 1, 63, 64, 65, 99}) {
    SCOPED_TRACE(std::string(fault().name) + " at read " + std::to_string(nth));
    for (Bytes& buf : b.bufs) std::fill(buf.begin(), buf.end(), 0xEE);
    Armed armed({FaultAt(fault(), nth)});
    ASSERT_OK(f->ReadBatch(b.reqs));
    EXPECT_GE(hooks::IoFaultsInjected(), 1u) << "the fault never fired";
    EXPECT_GT(hooks::IoOpsCounted(IoFault::kRead), b.reqs.size()) << "nothing was retried";
    b.Expect();
  }
}

INSTANTIATE_TEST_SUITE_P(All, ReadBatchTransientTest,
                         ::testing::Combine(::testing::ValuesIn(BackendNames()),
                                            ::testing::ValuesIn(kBatchTransient)),
                         BackendCaseName);

class ReadBatchErrorTest : public ::testing::TestWithParam<std::string> {};

// EIO on one read of the batch: ReadBatch fails, naming the path, that
// read's offset and the errno, without retrying it; the File works after.
TEST_P(ReadBatchErrorTest, EioNamesTheOffset) {
  std::string why;
  FileSystem* fs = Backend(GetParam(), &why);
  if (fs == nullptr) GTEST_SKIP() << "io_uring cannot be initialised here: " << why;
  TempDir dir;
  const std::string path = dir.Path("rb");
  BatchFixture b(path);
  std::unique_ptr<File> f;
  ASSERT_OK(fs->Open(path, OpenMode::kRead, &f));
  for (int nth : {0, 5, 63, 64, 99}) {
    SCOPED_TRACE("EIO at read " + std::to_string(nth));
    Status st;
    {
      Armed armed({{IoFault::kRead, nth, -EIO, false}});
      st = f->ReadBatch(b.reqs);
      EXPECT_EQ(hooks::IoFaultsInjected(), 1u);
    }
    EXPECT_EQ(st.code(), Status::Code::kIOError) << st.ToString();
    const std::string want =
        path + ": read at offset " + std::to_string(b.reqs[nth].offset) + ": ";
    EXPECT_EQ(st.message().rfind(want, 0), 0u) << st.ToString();
    EXPECT_NE(st.message().find(ErrText(-EIO)), std::string::npos) << st.ToString();
    for (Bytes& buf : b.bufs) std::fill(buf.begin(), buf.end(), 0xEE);
    ASSERT_OK(f->ReadBatch(b.reqs));
    b.Expect();
  }
}

INSTANTIATE_TEST_SUITE_P(All, ReadBatchErrorTest, ::testing::ValuesIn(BackendNames()),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           return std::string(p.param == "posix" ? "Posix" : "Uring");
                         });

// ---- Writer level ---------------------------------------------------------------

// 40 tokens of the tiny preset with distinct rows, as f32 input.
struct Payload {
  Geometry g;
  std::vector<uint32_t> ids;
  std::vector<std::vector<float>> blocks;  // per (layer, stream): [token][row][width]

  explicit Payload(uint32_t tokens = kTokens) {
    EXPECT_TRUE(GetPreset("tiny", Dtype::kE4M3, &g).ok());
    for (uint32_t t = 0; t < tokens; ++t) ids.push_back(1000 + 3 * t);
    for (uint32_t l = 0; l < g.layers; ++l)
      for (uint32_t s = 0; s < g.streams.size(); ++s) {
        const uint64_t per = g.streams[s].ElementsPerToken();
        std::vector<float> v(tokens * per);
        for (size_t i = 0; i < v.size(); ++i)
          v[i] = static_cast<float>(static_cast<int>((i * 37 + l * 11 + s * 5) % 97) - 48) / 16.0f;
        blocks.push_back(std::move(v));
      }
  }

  AppendBatch Batch(uint32_t from, uint32_t n) const {
    AppendBatch b;
    b.tokens = std::span<const uint32_t>(ids).subspan(from, n);
    for (size_t i = 0; i < blocks.size(); ++i) {
      const uint64_t per = g.streams[i % g.streams.size()].ElementsPerToken();
      b.blocks.push_back({Dtype::kF32, blocks[i].data() + from * per, nullptr});
    }
    return b;
  }
};

const Payload& ThePayload() {
  static const Payload p;
  return p;
}

WriterOptions Options(FileSystem* fs, SyncMode mode) {
  WriterOptions o;
  o.fs = fs;
  o.sync = mode;
  o.chunk_tokens = 4;
  hooks::SetWriterSalt(kSalt);
  return o;
}

struct Outcome {
  bool created = false;
  bool failed = false;
  uint64_t acked = 0;  // durable_tokens() after the last successful call
  Status first_error;
};

// Creates the file and appends the 40 tokens in pieces of 1..6 with a Sync
// after every third append, in sync mode chunk, then closes; stops at the
// first failure, then checks that every later call fails and nothing more
// is acknowledged.
Outcome RunWriter(FileSystem* fs, const std::string& path) {
  const Payload& p = ThePayload();
  Outcome out;
  std::unique_ptr<Writer> w;
  Status st = hooks::CreateWriter(path, p.g, {"io-fault-model", 42}, Options(fs, SyncMode::kChunk), &w);
  if (!st.ok()) {
    out.failed = true;
    out.first_error = st;
    return out;
  }
  out.created = true;
  uint32_t done = 0;
  for (int step = 0; st.ok() && done < kTokens; ++step) {
    const uint32_t n = std::min<uint32_t>(kTokens - done, 1 + step % 6);
    st = w->Append(p.Batch(done, n));
    if (st.ok()) {
      EXPECT_GE(w->durable_tokens(), out.acked);
      out.acked = w->durable_tokens();
      done += n;
      if (step % 3 == 2) st = w->Sync();
      if (st.ok()) out.acked = w->durable_tokens();
    }
  }
  if (st.ok()) st = w->Close();
  if (st.ok()) {
    out.acked = kTokens;
    return out;
  }
  out.failed = true;
  out.first_error = st;
  const uint64_t acked = w->durable_tokens();
  EXPECT_EQ(acked, out.acked) << "the failed call acknowledged more";
  Status again = w->Append(p.Batch(0, 1));
  EXPECT_EQ(again.code(), Status::Code::kFailed) << again.ToString();
  EXPECT_FALSE(w->Sync().ok());
  EXPECT_FALSE(w->Flush().ok());
  EXPECT_FALSE(w->Rewind(0).ok());
  EXPECT_EQ(w->durable_tokens(), acked);
  w.reset();  // the destructor's Close fails quietly
  return out;
}

// Every (layer, stream)'s rows of tokens [0, n), decoded to f32.
std::vector<std::vector<float>> ReadAllRows(Reader& r, uint64_t n) {
  std::vector<std::vector<float>> rows;
  const Geometry& g = r.geometry();
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t s = 0; s < g.streams.size(); ++s) {
      std::vector<float> v(n * g.streams[s].ElementsPerToken());
      Status st = r.ReadRows(l, s, 0, n, Dtype::kF32, v.data());
      EXPECT_TRUE(st.ok()) << st.ToString();
      rows.push_back(std::move(v));
    }
  return rows;
}

// The file written without faults, and its rows as a Reader decodes them.
struct Reference {
  Bytes bytes;
  std::vector<std::vector<float>> rows;
};

const Reference& TheReference() {
  static const Reference ref = [] {
    Reference r;
    TempDir dir;
    const std::string path = dir.Path("ref.kv");
    Outcome o = RunWriter(hooks::FaultablePosix(), path);
    EXPECT_FALSE(o.failed) << o.first_error.ToString();
    r.bytes = DiskBytes(path);
    ReaderOptions ro;
    ro.fs = hooks::FaultablePosix();
    std::unique_ptr<Reader> reader;
    Status st = Reader::Open(path, ro, &reader);
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (reader) r.rows = ReadAllRows(*reader, reader->token_count());
    return r;
  }();
  return ref;
}

// Opens the file through `fs` and checks it holds at least `at_least` of
// the payload's tokens, with the reference's rows.
void ExpectReadsBack(FileSystem* fs, const std::string& path, uint64_t at_least) {
  const Payload& p = ThePayload();
  const Reference& ref = TheReference();
  ReaderOptions ro;
  ro.fs = fs;
  std::unique_ptr<Reader> r;
  Status st = Reader::Open(path, ro, &r);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const uint64_t n = r->token_count();
  ASSERT_GE(n, at_least);
  ASSERT_LE(n, kTokens);
  for (uint64_t t = 0; t < n; ++t) ASSERT_EQ(r->tokens()[t], p.ids[t]) << "token " << t;
  auto rows = ReadAllRows(*r, n);
  ASSERT_EQ(rows.size(), ref.rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    ASSERT_EQ(rows[i].size() * kTokens, ref.rows[i].size() * n);
    EXPECT_TRUE(std::equal(rows[i].begin(), rows[i].end(), ref.rows[i].begin()))
        << "rows of (layer, stream) " << i;
  }
}

class WriterTransientTest : public BackendCaseTest {};

// Faults on write/fsync while writing: the file is the one written without
// faults. Faults on read while reading it back: the same tokens and rows.
TEST_P(WriterTransientTest, SameFileAndSameRows) {
  const Reference& ref = TheReference();
  ASSERT_FALSE(ref.bytes.empty());
  for (int nth : {0, 1, 2, 3, 4, 5, 17}) {
    SCOPED_TRACE(std::string(fault().name) + " at operation " + std::to_string(nth));
    const std::string path = dir_.Path("w" + std::to_string(nth) + ".kv");
    uint64_t injected = 0;
    if (fault().op == IoFault::kRead) {
      std::ofstream(path, std::ios::binary)
          .write(reinterpret_cast<const char*>(ref.bytes.data()),
                 static_cast<std::streamsize>(ref.bytes.size()));
    } else {
      Armed armed({FaultAt(fault(), nth)});
      Outcome o = RunWriter(fs_, path);
      ASSERT_FALSE(o.failed) << o.first_error.ToString();
      injected += hooks::IoFaultsInjected();
    }
    EXPECT_TRUE(DiskBytes(path) == ref.bytes) << "the file differs from the one written without faults";
    {
      Armed armed({FaultAt(fault(), nth)});
      ExpectReadsBack(fs_, path, kTokens);
      injected += hooks::IoFaultsInjected();
    }
    EXPECT_GE(injected, 1u) << "the fault never fired";
  }
}

INSTANTIATE_TEST_SUITE_P(All, WriterTransientTest,
                         ::testing::Combine(::testing::ValuesIn(BackendNames()),
                                            ::testing::ValuesIn(kTransient)),
                         BackendCaseName);

const Case kWriterErrors[] = {
    {IoFault::kWrite, -EIO, false, "WriteEioOnce"},
    {IoFault::kWrite, -EIO, true, "WriteEioPersistent"},
    {IoFault::kWrite, -ENOSPC, false, "WriteEnospcOnce"},
    {IoFault::kWrite, -ENOSPC, true, "WriteEnospcPersistent"},
    {IoFault::kSync, -EIO, false, "SyncEioOnce"},
    {IoFault::kSync, -EIO, true, "SyncEioPersistent"},
    {IoFault::kSync, -ENOSPC, false, "SyncEnospcOnce"},
    {IoFault::kSync, -ENOSPC, true, "SyncEnospcPersistent"},
    {IoFault::kWrite, -EINTR, true, "WriteEintrPersistent"},
    {IoFault::kSync, -EAGAIN, true, "SyncEagainPersistent"},
};

// The workload's writes and fsyncs (each kind counted from 0).
constexpr int kWorkloadOps = 23;

class WriterErrorTest : public BackendCaseTest {};

// The workload makes 23 writes and 23 fsyncs: each of them fails in turn
// (EIO), or every third one (the other errors: the workload is fsync-bound).
// The first failure names the path and the errno; later calls fail, nothing
// more is acknowledged, and the file opens with every acknowledged token
// (Create fails before the file exists when the fault hits it). Every
// fourth time, a Writer reopens the file through the same backend and
// completes the payload.
TEST_P(WriterErrorTest, FailsLoudlyAndKeepsWhatWasAcknowledged) {
  const Case& c = fault();
  const int stride = c.result == -EIO ? 1 : 3;
  int failures = 0;
  for (int nth = 0; nth < kWorkloadOps + 5; nth += stride) {
    SCOPED_TRACE(std::string(c.name) + " at operation " + std::to_string(nth));
    const std::string path = dir_.Path("e" + std::to_string(nth) + ".kv");
    Outcome o;
    {
      Armed armed({FaultAt(c, nth)});
      o = RunWriter(fs_, path);
    }
    if (!o.failed) {
      EXPECT_GE(nth, kWorkloadOps) << "operation " << nth << " did not fail the workload";
      break;
    }
    ++failures;
    const std::string& msg = o.first_error.message();
    EXPECT_EQ(o.first_error.code(), Status::Code::kIOError) << o.first_error.ToString();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    // A queued io_uring write interrupted without end says so in words.
    const bool named = msg.find(ErrText(c.result)) != std::string::npos ||
                       (c.result == -EINTR && msg.find("kept interrupting") != std::string::npos);
    EXPECT_TRUE(named) << msg;
    std::error_code ec;
    if (!o.created) {
      EXPECT_FALSE(std::filesystem::exists(path, ec)) << "a failed Create left the file";
      EXPECT_FALSE(std::filesystem::exists(path + ".kvnew", ec)) << "a failed Create left its temp";
      continue;
    }
    ExpectReadsBack(hooks::FaultablePosix(), path, o.acked);
    if (nth % 4 != 0) continue;
    // The file can be appended to again, up to the full payload.
    std::unique_ptr<Writer> w;
    Status st = Writer::Open(path, Options(fs_, SyncMode::kChunk), &w);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_GE(w->token_count(), o.acked);
    const auto have = static_cast<uint32_t>(w->token_count());
    if (have < kTokens) ASSERT_OK(w->Append(ThePayload().Batch(have, kTokens - have)));
    ASSERT_OK(w->Close());
    ExpectReadsBack(fs_, path, kTokens);
  }
  EXPECT_EQ(failures, (kWorkloadOps + stride - 1) / stride) << "the workload changed";
}

INSTANTIATE_TEST_SUITE_P(All, WriterErrorTest,
                         ::testing::Combine(::testing::ValuesIn(BackendNames()),
                                            ::testing::ValuesIn(kWriterErrors)),
                         BackendCaseName);

// ---- the differential test ------------------------------------------------------

// Appends, syncs, rewinds (of staged and of written tokens), a close, a
// reopen for append and more of the same: the sequence ends with the first
// 35 tokens.
void RunScript(FileSystem* fs, const std::string& path, SyncMode mode) {
  const Payload& p = ThePayload();
  std::unique_ptr<Writer> w;
  ASSERT_OK(hooks::CreateWriter(path, p.g, {"io-fault-model", 42}, Options(fs, mode), &w));
  ASSERT_OK(w->Append(p.Batch(0, 3)));
  ASSERT_OK(w->Append(p.Batch(3, 6)));
  ASSERT_OK(w->Sync());
  ASSERT_OK(w->Append(p.Batch(9, 11)));
  ASSERT_OK(w->Rewind(13));  // cuts a written chunk
  ASSERT_OK(w->Append(p.Batch(13, 9)));
  ASSERT_OK(w->Flush());
  ASSERT_OK(w->Append(p.Batch(22, 3)));
  ASSERT_OK(w->Rewind(23));  // staged tokens only
  ASSERT_OK(w->Append(p.Batch(23, 5)));
  ASSERT_OK(w->Close());
  ASSERT_OK(Writer::Open(path, Options(fs, mode), &w));
  ASSERT_EQ(w->token_count(), 28u);
  ASSERT_OK(w->Append(p.Batch(28, 12)));
  ASSERT_OK(w->Sync());
  ASSERT_OK(w->Rewind(35));
  ASSERT_OK(w->Close());
}

class DifferentialTest : public ::testing::TestWithParam<std::tuple<SyncMode, bool>> {};

TEST_P(DifferentialTest, PosixAndUringWriteIdenticalFiles) {
  const auto [mode, faulted] = GetParam();
  std::string why;
  FileSystem* uring = Backend("io_uring", &why);
  if (uring == nullptr) GTEST_SKIP() << "io_uring cannot be initialised here: " << why;
  // With faults: transient ones of every kind at once, invisible again.
  std::vector<IoFault> faults;
  if (faulted)
    faults = {{IoFault::kWrite, 3, -EINTR, false}, {IoFault::kWrite, 5, kShort, true},
              {IoFault::kSync, 2, -EAGAIN, false}, {IoFault::kSync, 7, -EINTR, false},
              {IoFault::kRead, 0, kShort, true},   {IoFault::kRead, 4, -EINTR, false}};
  TempDir dir;
  const std::string pp = dir.Path("posix.kv");
  const std::string up = dir.Path("uring.kv");
  {
    Armed armed(faults);
    RunScript(hooks::FaultablePosix(), pp, mode);
  }
  {
    Armed armed(faults);
    RunScript(uring, up, mode);
  }
  const Bytes pb = DiskBytes(pp);
  const Bytes ub = DiskBytes(up);
  ASSERT_FALSE(pb.empty());
  EXPECT_TRUE(pb == ub) << "posix wrote " << pb.size() << " bytes, io_uring " << ub.size();
  for (FileSystem* fs : {hooks::FaultablePosix(), uring}) {
    ReaderOptions ro;
    ro.fs = fs;
    std::unique_ptr<Reader> r;
    ASSERT_OK(Reader::Open(up, ro, &r));
    EXPECT_EQ(r->token_count(), 35u);
    EXPECT_STREQ(r->io_backend(), fs == uring ? "io_uring" : "posix");
    auto rows = ReadAllRows(*r, 35);
    const auto& ref = TheReference().rows;
    for (size_t i = 0; i < rows.size(); ++i)
      EXPECT_TRUE(std::equal(rows[i].begin(), rows[i].end(), ref[i].begin()));
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, DifferentialTest,
    ::testing::Combine(::testing::Values(SyncMode::kChunk, SyncMode::kClose, SyncMode::kNone),
                       ::testing::Bool()),
    [](const ::testing::TestParamInfo<std::tuple<SyncMode, bool>>& p) {
      const SyncMode m = std::get<0>(p.param);
      std::string name = m == SyncMode::kChunk ? "Chunk" : m == SyncMode::kClose ? "Close" : "None";
      return name + (std::get<1>(p.param) ? "_Faulted" : "_Clean");
    });

// ---- open: the chunk-head prefetcher ----------------------------------------------

constexpr uint32_t kManyTokens = 800;

const Payload& TheBigPayload() {
  static const Payload p(kManyTokens);
  return p;
}

// Writes the first n tokens with chunk_tokens ct, in appends of 1..7
// tokens; a Sync() after each token count in sync_at leaves a short chunk.
void WriteChunked(const std::string& path, uint32_t n, uint32_t ct,
                  const std::vector<uint32_t>& sync_at) {
  const Payload& p = TheBigPayload();
  WriterOptions o = Options(hooks::FaultablePosix(), SyncMode::kClose);
  o.chunk_tokens = ct;
  std::unique_ptr<Writer> w;
  ASSERT_OK(hooks::CreateWriter(path, p.g, {"io-fault-model", 42}, o, &w));
  uint32_t done = 0;
  for (int step = 0; done < n; ++step) {
    uint32_t until = n;
    for (uint32_t at : sync_at)
      if (at > done) until = std::min(until, at);
    const uint32_t k = std::min<uint32_t>(until - done, 1 + step % 7);
    ASSERT_OK(w->Append(p.Batch(done, k)));
    done += k;
    if (std::find(sync_at.begin(), sync_at.end(), done) != sync_at.end()) ASSERT_OK(w->Sync());
  }
  ASSERT_OK(w->Close());
}

// The rows of the first n tokens as a Reader decodes them from a file of
// one chunk (the prefetcher has nothing to guess).
std::vector<std::vector<float>> ReferenceRows(uint32_t n) {
  TempDir dir;
  const std::string path = dir.Path("one.kv");
  WriteChunked(path, n, 65536, {});
  ReaderOptions ro;
  ro.fs = hooks::FaultablePosix();
  std::unique_ptr<Reader> r;
  Status st = Reader::Open(path, ro, &r);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (!r) return {};
  EXPECT_EQ(r->chunks().size(), 1u);
  return ReadAllRows(*r, n);
}

class OpenPrefetchTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    fs_ = Backend(GetParam(), &why);
    if (fs_ == nullptr) GTEST_SKIP() << "io_uring cannot be initialised here: " << why;
  }

  // Opens through the backend (with `faults` armed) and checks the chunks'
  // token counts, the tokens and the rows.
  void ExpectOpens(const std::string& path, uint32_t n, const std::vector<uint32_t>& chunk_sizes,
                   std::vector<IoFault> faults = {}) {
    const Payload& p = TheBigPayload();
    ReaderOptions ro;
    ro.fs = fs_;
    std::unique_ptr<Reader> r;
    {
      Armed armed(std::move(faults));
      ASSERT_OK(Reader::Open(path, ro, &r));
    }
    EXPECT_STREQ(r->io_backend(), GetParam() == "posix" ? "posix" : "io_uring");
    ASSERT_EQ(r->token_count(), n);
    ASSERT_EQ(r->chunks().size(), chunk_sizes.size());
    for (size_t i = 0; i < chunk_sizes.size(); ++i)
      ASSERT_EQ(r->chunks()[i].stored_tokens, chunk_sizes[i]) << "chunk " << i;
    for (uint32_t t = 0; t < n; ++t) ASSERT_EQ(r->tokens()[t], p.ids[t]) << "token " << t;
    const auto rows = ReadAllRows(*r, n);
    const auto ref = ReferenceRows(n);
    ASSERT_EQ(rows.size(), ref.size());
    for (size_t i = 0; i < rows.size(); ++i)
      EXPECT_TRUE(rows[i] == ref[i]) << "rows of (layer, stream) " << i;
  }

  FileSystem* fs_ = nullptr;
  TempDir dir_;
};

// 200 chunks of one token: four batches of heads, all where expected.
TEST_P(OpenPrefetchTest, TwoHundredChunks) {
  const std::string path = dir_.Path("tiny.kv");
  WriteChunked(path, 200, 1, {});
  ExpectOpens(path, 200, std::vector<uint32_t>(200, 1));
  // And with reads interrupted and cut short while opening.
  ExpectOpens(path, 200, std::vector<uint32_t>(200, 1),
              {{IoFault::kRead, 3, -EINTR, false}, {IoFault::kRead, 70, -EAGAIN, false},
               {IoFault::kRead, 1, kShort, true}});
}

// Short chunks (a Sync() before a chunk is full) inside the first batch,
// two in a row in the middle, and late: every head after one is not at its
// nominal offset, so the prefetcher must batch again from there.
TEST_P(OpenPrefetchTest, ShortChunksInTheMiddle) {
  const std::vector<uint32_t> syncs = {3, 150, 151, 263, 701};
  const uint32_t n = 790;
  const std::string path = dir_.Path("short.kv");
  WriteChunked(path, n, 4, syncs);
  std::vector<uint32_t> sizes;
  for (uint32_t at = 0; at < n;) {
    uint32_t end = std::min(n, at + 4);
    for (uint32_t s : syncs)
      if (s > at && s < end) end = s;
    sizes.push_back(end - at);
    at = end;
  }
  ASSERT_GT(sizes.size(), 195u);
  ExpectOpens(path, n, sizes);
  ExpectOpens(path, n, sizes,
              {{IoFault::kRead, 5, -EINTR, false}, {IoFault::kRead, 100, -EAGAIN, false},
               {IoFault::kRead, 2, kShort, true}});
}

INSTANTIATE_TEST_SUITE_P(All, OpenPrefetchTest, ::testing::ValuesIn(BackendNames()),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           return std::string(p.param == "posix" ? "Posix" : "Uring");
                         });

// The hook itself: which operation is faulted, what a short count is, and
// nothing at all once cleared.
TEST(IoFaultHook, CountsAndFiresAsArmed) {
  hooks::ClearIoFaults();
  ssize_t r = 0;
  EXPECT_FALSE(hooks::TakeIoFault(IoFault::kWrite, 100, &r));
  hooks::SetIoFaults({{IoFault::kWrite, 1, kShort, false}, {IoFault::kSync, 0, -EIO, true}});
  EXPECT_FALSE(hooks::TakeIoFault(IoFault::kWrite, 100, &r));
  EXPECT_TRUE(hooks::TakeIoFault(IoFault::kWrite, 100, &r));
  EXPECT_EQ(r, 50);
  EXPECT_FALSE(hooks::TakeIoFault(IoFault::kWrite, 100, &r));
  EXPECT_TRUE(hooks::TakeIoFault(IoFault::kSync, 0, &r));
  EXPECT_EQ(r, -EIO);
  EXPECT_TRUE(hooks::TakeIoFault(IoFault::kSync, 0, &r));
  EXPECT_FALSE(hooks::TakeIoFault(IoFault::kRead, 1, &r));
  EXPECT_EQ(hooks::IoOpsCounted(IoFault::kWrite), 3u);
  EXPECT_EQ(hooks::IoFaultsInjected(), 3u);
  hooks::SetIoFaults({{IoFault::kRead, 0, kShort, true}});
  EXPECT_FALSE(hooks::TakeIoFault(IoFault::kRead, 1, &r)) << "one byte cannot be short";
  EXPECT_TRUE(hooks::TakeIoFault(IoFault::kRead, 3, &r));
  EXPECT_EQ(r, 1);
  hooks::ClearIoFaults();
  EXPECT_FALSE(hooks::TakeIoFault(IoFault::kRead, 3, &r));
}

// ---- Directory syncs ----------------------------------------------------------------

// A directory fsync that fails is named by the directory: as given where
// the destination has a directory part, by its full path where it is a
// bare name (never "."). Through a replacement (every CLI output) and a
// Writer::Create, each failing on the sync after its rename.
TEST(DirectorySyncFaults, NameTheDirectory) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / ("io_fault_dirsync_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "sub");
  const fs::path before = fs::current_path();
  fs::current_path(dir);
  const std::string full = fs::current_path().string();
  FileSystem* posix = hooks::FaultablePosix();
  const std::string eio = ": fsync directory: " + std::string(std::strerror(EIO));
  using DirCase = std::pair<std::string, std::string>;  // destination, the directory its error names
  for (const auto& [dest, named] : std::vector<DirCase>{{"bare.bin", full}, {"sub/x.bin", "sub"}}) {
    std::unique_ptr<PendingReplace> r;
    ASSERT_OK(PendingReplace::Begin(dest, posix, &r));
    std::ofstream(r->temp_path()) << "new";
    hooks::SetIoFaults({{IoFault::kSyncDir, 0, -EIO, false}});
    Status st = r->Commit();
    hooks::ClearIoFaults();
    EXPECT_EQ(st.message(), named + eio) << dest;
  }
  for (const auto& [dest, named] : std::vector<DirCase>{{"bare.kv", full}, {"sub/y.kv", "sub"}}) {
    const Payload& p = ThePayload();
    std::unique_ptr<Writer> w;
    hooks::SetIoFaults({{IoFault::kSyncDir, 0, -EIO, false}});
    Status st = hooks::CreateWriter(dest, p.g, {"io-fault-model", 42}, Options(posix, SyncMode::kClose), &w);
    hooks::ClearIoFaults();
    EXPECT_EQ(st.message(), named + eio) << dest;
  }
  fs::current_path(before);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvfile
