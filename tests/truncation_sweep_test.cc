// SPDX-License-Identifier: Apache-2.0
// Every truncation of every sweep fixture (support/sweep_fixtures.h), from
// 0 bytes to the whole file, through VerifyFile and a Reader.
//
// What is correct:
// - Always: VerifyFile examines the file (returns OK) and no read returns a
//   byte that differs from the original's (ReadAndCompare).
// - A closed file (every chunk committed) cut at length n >= 12288: the
//   commit record vouches for bytes that are gone. The reader returns exactly
//   the chunks that lie wholly in [0, n) (at a chunk boundary: the original's
//   prefix of those chunks), never a byte of a partial chunk; verify reports
//   one error, "file truncated", naming the chunk and the offset n where the
//   file now ends.
// - A file whose chunks are all past the commit record (SyncMode::kNone),
//   cut at length n >= 12288: the reader returns exactly the chunks that lie
//   wholly in [0, n), with their tokens and rows, and nothing of a partial
//   chunk. At a chunk boundary verify finds nothing; anywhere else it warns
//   of a torn tail that starts where the last whole chunk ends.
// - Shorter than 12288 bytes: Open fails, verify reports an error.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "format/kv_format.h"
#include "kvfile/reader.h"
#include "kvfile/verify.h"
#include "support/sweep_fixtures.h"

namespace kvfile {
namespace {

using testing::SweepFixture;

constexpr uint64_t kFixedRegion = 12288;

// The tokens and the end offset a reader keeps of [0, n): the longest chain
// of whole chunks, committed ones; uncommitted ones in a file with append
// ends only up to the last append end in them.
std::pair<uint64_t, uint64_t> WholeChunksIn(const SweepFixture& f, uint64_t n) {
  std::pair<uint64_t, uint64_t> r{0, kFixedRegion};
  for (const auto& c : f.chunks)
    if (c.end <= n) r = f.committed ? std::pair{c.tokens_after, c.end} : std::pair{c.uncommitted_tokens, c.uncommitted_end};
  return r;
}

int64_t WholeChunkCount(const SweepFixture& f, uint64_t n) {
  int64_t k = 0;
  for (const auto& c : f.chunks) k += c.end <= n;
  return k;
}

void SweepTruncations(const SweepFixture& f, size_t* cases) {
  SCOPED_TRACE(f.name);
  // Sampled (KVFILE_SWEEP_SAMPLE): one length in `sample`, and always the
  // lengths at and next to every 4096-byte boundary (where chunks, slots
  // and the header end) and the whole file.
  const unsigned sample = testing::SweepSample();
  for (uint64_t n = 0; n <= f.bytes.size(); ++n) {
    if (n % sample != 0 && (n + 1) % format::kBlockSize > 2 && n != f.bytes.size()) continue;
    SCOPED_TRACE("truncated to " + std::to_string(n) + " bytes");
    testing::ImageCheck check = testing::CheckImage(
        std::vector<uint8_t>(f.bytes.begin(), f.bytes.begin() + static_cast<ptrdiff_t>(n)), f);
    ASSERT_TRUE(check.verify_status.ok()) << check.verify_status.ToString();
    const VerifyReport& rep = check.report;
    const testing::ReadCheck& rc = check.read;
    ASSERT_TRUE(rc.corrupt.empty()) << rc.corrupt;
    ++*cases;
    bool whole = n == f.bytes.size();
    if (whole) {
      ASSERT_TRUE(rc.open.ok()) << rc.open.ToString();
      ASSERT_EQ(rc.tokens, f.tokens.size());
      ASSERT_EQ(rc.failed_reads, 0u);
      ASSERT_TRUE(rep.findings.empty()) << rep.findings[0].message;
      continue;
    }
    if (n < kFixedRegion) {
      ASSERT_FALSE(rc.open.ok());
      ASSERT_EQ(rc.open.code(), Status::Code::kCorruption) << rc.open.ToString();
      ASSERT_TRUE(rep.HasErrors());
      ASSERT_EQ(rep.findings.size(), 1u);
      // A file too short to hold a magic is "not a kvfile"; past that, the
      // finding says where the file ends.
      if (n >= 8) {
        EXPECT_EQ(rep.findings[0].offset, static_cast<int64_t>(n)) << rep.findings[0].message;
        EXPECT_NE(rep.findings[0].message.find("truncated"), std::string::npos) << rep.findings[0].message;
      }
      continue;
    }
    auto [tokens, valid_end] = WholeChunksIn(f, n);
    // ReadAndCompare has checked every byte read against the original's.
    ASSERT_TRUE(rc.open.ok()) << rc.open.ToString();
    ASSERT_EQ(rc.tokens, tokens);
    ASSERT_EQ(rc.failed_reads, 0u);
    if (f.committed) {
      ASSERT_TRUE(rep.committed_data_missing);
      ASSERT_TRUE(rep.HasErrors());
      ASSERT_EQ(rep.findings.size(), 1u) << rep.findings[0].message;
      EXPECT_EQ(rep.findings[0].offset, static_cast<int64_t>(n)) << rep.findings[0].message;
      EXPECT_EQ(rep.findings[0].chunk, WholeChunkCount(f, n)) << rep.findings[0].message;
      EXPECT_NE(rep.findings[0].message.find("file truncated: committed data missing"), std::string::npos)
          << rep.findings[0].message;
      EXPECT_EQ(rep.tokens, tokens);
      EXPECT_EQ(rep.valid_end, valid_end);
      continue;
    }
    ASSERT_FALSE(rep.HasErrors()) << rep.findings[0].message;
    if (valid_end == n) {
      ASSERT_TRUE(rep.findings.empty()) << rep.findings[0].message;
    } else {
      ASSERT_EQ(rep.findings.size(), 1u);
      EXPECT_EQ(rep.findings[0].offset, static_cast<int64_t>(valid_end));
      EXPECT_EQ(rep.torn_tail_bytes, n - valid_end);
    }
  }
}

// Sweeps the quick set of fixtures (label unit) or the others (label long).
void SweepAll(bool committed, bool quick) {
  auto start = std::chrono::steady_clock::now();
  size_t cases = 0, fixtures = 0;
  for (const SweepFixture& f : testing::SweepFixtures(committed)) {
    if (testing::InQuickSet(f) != quick) continue;
    ++fixtures;
    SweepTruncations(f, &cases);
    if (::testing::Test::HasFatalFailure()) return;
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%zu truncations of %zu fixtures (1 in %u) in %.2f s\n", cases, fixtures, testing::SweepSample(), s);
  EXPECT_GT(fixtures, 0u);
}

TEST(TruncationSweep, QuickClosedFilesReadAsTheWholeChunksBeforeEveryCut) { SweepAll(true, true); }
TEST(TruncationSweep, QuickUncommittedFilesReadAsTheWholeChunksBeforeEveryCut) { SweepAll(false, true); }
TEST(TruncationSweep, FullClosedFilesReadAsTheWholeChunksBeforeEveryCut) { SweepAll(true, false); }
TEST(TruncationSweep, FullUncommittedFilesReadAsTheWholeChunksBeforeEveryCut) { SweepAll(false, false); }

}  // namespace
}  // namespace kvfile
