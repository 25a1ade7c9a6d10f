// SPDX-License-Identifier: Apache-2.0
// Sparse files: what a reader does costs what the file holds, not what its
// size or its commit record claims (issue 13, "never scale with what a file
// claims"; spec/FORMAT.md 7.1).
//
// - A valid file with a 16 GiB hole after it opens, verifies and infos in
//   well under 2 s through both I/O backends (the search for a valid chunk
//   past the tail read every 4 KiB block of the hole: 25 s), and its tail
//   is classified exactly as when every byte is read (a FaultFs image, whose
//   files have no holes to skip): a torn tail, or damage before the end when
//   a valid chunk lies past the hole.
// - A commit record claiming 10^7 chunks over a sparse file: `kvfile info`
//   and `kvfile verify` refuse it with their peak RSS (wait4) a few MiB (the
//   scan reserved its tables for the claim: 828 MB).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "io/file_backends.h"
#include "format/endian.h"
#include "format/header.h"
#include "kvfile/reader.h"
#include "kvfile/verify.h"
#include "support/fault_fs.h"
#include "support/sweep_fixtures.h"

namespace kvfile {
namespace {

using namespace format;
using testing::SweepFixture;

constexpr uint64_t kGiB = uint64_t{1} << 30;

const SweepFixture& Base() {
  for (const auto& f : testing::SweepFixtures(true))
    if (f.name == "v2-several-chunks-closed") return f;
  throw std::runtime_error("no base fixture");
}

void SetBothSlots(std::vector<uint8_t>& image, uint64_t tokens, uint64_t end, uint64_t chunks) {
  for (uint64_t slot : kCommitSlotOffset) {
    uint8_t* p = image.data() + slot;
    StoreU64(p + cs::kCommittedTokens, tokens);
    StoreU64(p + cs::kCommittedEnd, end);
    StoreU64(p + cs::kCommittedChunks, chunks);
    StoreU64(p + cs::kChecksum, Checksum(p, cs::kChecksum));
  }
}

double Seconds(const std::function<void()>& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A sparse file on disk: `pieces` (offset, bytes) written, the rest holes,
// `size` bytes in all.
class SparseFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "kvfile_sparse_" + std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::vector<std::pair<uint64_t, std::vector<uint8_t>>>& pieces,
                    uint64_t size) {
    std::string path = dir_ + "/" + name;
    int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
    EXPECT_GE(fd, 0);
    for (const auto& [offset, bytes] : pieces)
      EXPECT_EQ(::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset)),
                static_cast<ssize_t>(bytes.size()));
    EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(size)), 0);
    ::close(fd);
    return path;
  }

  // True if the file system reports the holes (SEEK_DATA) of `path`, whose
  // offset `hole` lies in one.
  static bool ReportsHoles(const std::string& path, uint64_t hole) {
    int fd = ::open(path.c_str(), O_RDONLY);
    off_t at = ::lseek(fd, static_cast<off_t>(hole), SEEK_DATA);
    ::close(fd);
    return at < 0 || static_cast<uint64_t>(at) > hole;
  }

  // The POSIX backend, and io_uring where this process can use it.
  static std::vector<FileSystem*> Backends() {
    std::vector<FileSystem*> out = {internal::PosixFileSystemInstance()};
    FileSystem* uring = nullptr;
    if (internal::UringFileSystemInstance(&uring).ok()) out.push_back(uring);
    return out;
  }

  std::string dir_;
};

// What an open made of a file's tail.
struct Seen {
  uint64_t tokens = 0;
  TailInfo tail;
  std::vector<std::pair<bool, std::string>> findings;  // verify's (error, message)
};

Seen Look(FileSystem* fs, const std::string& path) {
  Seen s;
  ReaderOptions ro;
  ro.fs = fs;
  std::unique_ptr<Reader> r;
  Status st = Reader::Open(path, ro, &r);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (!st.ok()) return s;
  s.tokens = r->token_count();
  s.tail = r->tail();
  VerifyOptions vo;
  vo.fs = fs;
  VerifyReport rep;
  st = VerifyFile(path, vo, &rep);
  EXPECT_TRUE(st.ok()) << st.ToString();
  for (const auto& f : rep.findings) s.findings.emplace_back(f.error, f.message);
  return s;
}

void ExpectSameTail(const Seen& a, const Seen& b) {
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.tail.valid_end, b.tail.valid_end);
  EXPECT_EQ(a.tail.torn_reason, b.tail.torn_reason);
  EXPECT_EQ(a.tail.valid_data_follows, b.tail.valid_data_follows);
  EXPECT_EQ(a.tail.valid_data_offset, b.tail.valid_data_offset);
  EXPECT_EQ(a.tail.committed_data_missing, b.tail.committed_data_missing);
  ASSERT_EQ(a.findings.size(), b.findings.size());
  for (size_t i = 0; i < a.findings.size(); ++i) EXPECT_EQ(a.findings[i].first, b.findings[i].first) << i;
}

// Runs the kvfile binary; its exit code, its stderr and its peak RSS (MiB),
// measured for this run alone (fork + wait4).
struct CliRun {
  int exit_code = -1;
  std::string err;
  long peak_mib = 0;
  double seconds = 0;
};

CliRun Kvfile(const std::string& dir, std::vector<std::string> args) {
  std::string err_path = dir + "/stderr";
  std::vector<char*> argv = {const_cast<char*>(KVFILE_BINARY)};
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  CliRun r;
  auto t0 = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    int devnull = ::open("/dev/null", O_WRONLY);
    int err = ::open(err_path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
    dup2(devnull, 1);
    dup2(err, 2);
    execv(KVFILE_BINARY, argv.data());
    _exit(127);
  }
  int status = 0;
  rusage usage{};
  if (pid < 0 || wait4(pid, &status, 0, &usage) != pid) return r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.peak_mib = usage.ru_maxrss / 1024;
  std::ifstream in(err_path);
  r.err.assign(std::istreambuf_iterator<char>(in), {});
  return r;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr double kFastSeconds = 20.0;  // sanitizers: 10x slower, yet far from the old 25 s per open
constexpr long kSmallPeakMib = 200;    // the sanitizer's own shadow memory and quarantine
#else
constexpr double kFastSeconds = 5.0;  // idle: under 0.3 s; the margin is for a loaded machine
constexpr long kSmallPeakMib = 48;
#endif

TEST_F(SparseFileTest, HugeHoleAfterAValidFileIsATornTailFoundFast) {
  const SweepFixture& f = Base();
  uint64_t end = f.bytes.size();
  std::string path = Write("tail.kv", {{0, f.bytes}}, 16 * kGiB);
  if (!ReportsHoles(path, 8 * kGiB)) GTEST_SKIP() << "the file system does not report holes (SEEK_DATA)";
  for (FileSystem* fs : Backends()) {
    SCOPED_TRACE(fs == internal::PosixFileSystemInstance() ? "posix" : "io_uring");
    Seen s;
    double secs = Seconds([&] { s = Look(fs, path); });
    std::printf("16 GiB sparse tail: open + verify %.3f s\n", secs);
    EXPECT_LT(secs, kFastSeconds);
    // Exactly the valid file, the rest a torn tail (a warning, not damage).
    EXPECT_EQ(s.tokens, f.tokens.size());
    EXPECT_EQ(s.tail.valid_end, end);
    EXPECT_EQ(s.tail.torn_tail_bytes, 16 * kGiB - end);
    EXPECT_FALSE(s.tail.valid_data_follows);
    EXPECT_FALSE(s.tail.committed_data_missing);
    ASSERT_EQ(s.findings.size(), 1u);
    EXPECT_FALSE(s.findings[0].first);
    EXPECT_EQ(s.findings[0].second.rfind("torn tail: " + std::to_string(16 * kGiB - end) + " bytes", 0), 0u)
        << s.findings[0].second;
  }
  // The same classification as when every byte of a (smaller) hole is read.
  std::vector<uint8_t> image = f.bytes;
  image.resize(end + (uint64_t{4} << 20));
  testing::FaultFs mem({{testing::kSweepPath, image}});
  std::string small = Write("small.kv", {{0, f.bytes}}, image.size());
  ExpectSameTail(Look(internal::PosixFileSystemInstance(), small), Look(&mem, testing::kSweepPath));

  CliRun info = Kvfile(dir_, {"info", path});
  EXPECT_EQ(info.exit_code, 0) << info.err;
  EXPECT_EQ(info.err, "");
  EXPECT_LT(info.seconds, kFastSeconds);
  CliRun verify = Kvfile(dir_, {"verify", path});
  EXPECT_EQ(verify.exit_code, 0) << verify.err;
  EXPECT_LT(verify.seconds, kFastSeconds);
}

// The file's second chunk moved (its offset field and head checksum
// rewritten) to 16 GiB, past a hole, the commit record covering the first
// chunk alone: a valid chunk of the file's epoch after damage, which is
// "damage before the end", whatever lies between.
TEST_F(SparseFileTest, ValidChunkPastAHugeHoleIsDamageBeforeTheEnd) {
  const SweepFixture& f = Base();
  ASSERT_GE(f.chunks.size(), 2u);
  const auto& c0 = f.chunks[0];
  const auto& c1 = f.chunks[1];
  auto image_with_chunk_at = [&](uint64_t at) {
    std::vector<uint8_t> head(f.bytes.begin(), f.bytes.begin() + static_cast<ptrdiff_t>(c0.end));
    SetBothSlots(head, c0.tokens_after, c0.end, 1);
    std::vector<uint8_t> chunk(f.bytes.begin() + static_cast<ptrdiff_t>(c1.begin),
                               f.bytes.begin() + static_cast<ptrdiff_t>(c1.end));
    StoreU64(chunk.data() + ch::kChunkOffset, at);
    uint64_t head_bytes = c1.sections[0].first - c1.begin;
    StoreU64(chunk.data() + head_bytes - 8, Checksum(chunk.data(), head_bytes - 8));
    return std::make_pair(head, chunk);
  };
  uint64_t at = 16 * kGiB;
  auto [head, chunk] = image_with_chunk_at(at);
  std::string path = Write("damaged.kv", {{0, head}, {at, chunk}}, at + chunk.size());
  if (!ReportsHoles(path, 8 * kGiB)) GTEST_SKIP() << "the file system does not report holes (SEEK_DATA)";
  for (FileSystem* fs : Backends()) {
    SCOPED_TRACE(fs == internal::PosixFileSystemInstance() ? "posix" : "io_uring");
    Seen s;
    double secs = Seconds([&] { s = Look(fs, path); });
    std::printf("valid chunk past a 16 GiB hole: open + verify %.3f s\n", secs);
    EXPECT_LT(secs, kFastSeconds);
    EXPECT_EQ(s.tokens, c0.tokens_after);
    EXPECT_EQ(s.tail.valid_end, c0.end);
    EXPECT_TRUE(s.tail.valid_data_follows);
    EXPECT_EQ(s.tail.valid_data_offset, at);
    ASSERT_EQ(s.findings.size(), 1u);
    EXPECT_TRUE(s.findings[0].first);
    EXPECT_NE(s.findings[0].second.find("a valid chunk follows at offset " + std::to_string(at)), std::string::npos)
        << s.findings[0].second;
  }
  // The same classification as when every byte of a (smaller) hole is read.
  uint64_t small_at = c0.end + (uint64_t{4} << 20);
  auto [small_head, small_chunk] = image_with_chunk_at(small_at);
  std::vector<uint8_t> image = small_head;
  image.resize(small_at);
  image.insert(image.end(), small_chunk.begin(), small_chunk.end());
  testing::FaultFs mem({{testing::kSweepPath, image}});
  std::string small = Write("small.kv", {{0, small_head}, {small_at, small_chunk}}, image.size());
  Seen on_disk = Look(internal::PosixFileSystemInstance(), small);
  EXPECT_TRUE(on_disk.tail.valid_data_follows);
  ExpectSameTail(on_disk, Look(&mem, testing::kSweepPath));

  CliRun verify = Kvfile(dir_, {"verify", path});
  EXPECT_EQ(verify.exit_code, 1) << verify.err;
  EXPECT_LT(verify.seconds, kFastSeconds);
}

// A commit record claiming 10^7 chunks (and tokens) ending 41 GB in, over a
// sparse file of that size whose first chunks are real: the scan walks the
// real chunks, finds a hole where the next one should be, and refuses the
// file, with memory for the chunks it read, not for the ones claimed.
TEST_F(SparseFileTest, HostileCommitRecordOverASparseFileNeedsLittleMemory) {
  const SweepFixture& f = Base();
  const uint64_t claimed = 10'000'000;
  std::vector<uint8_t> image = f.bytes;
  uint64_t end = kDataOffset + claimed * kBlockSize;
  SetBothSlots(image, claimed, end, claimed);
  std::string path = Write("hostile.kv", {{0, image}}, end);
  std::string at = std::to_string(f.chunks.size()) + " at offset " + std::to_string(f.bytes.size());
  for (const char* verb : {"info", "verify"}) {
    SCOPED_TRACE(verb);
    CliRun r = Kvfile(dir_, {verb, path});
    std::printf("kvfile %s, commit record of 10^7 chunks over a sparse file: exit %d, peak RSS %ld MiB, %.3f s: %s",
                verb, r.exit_code, r.peak_mib, r.seconds, r.err.c_str());
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_LT(r.peak_mib, kSmallPeakMib);  // the old scan: 808 MiB
    EXPECT_LT(r.seconds, kFastSeconds);
    EXPECT_NE(r.err.find("chunk " + at), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

}  // namespace
}  // namespace kvfile
