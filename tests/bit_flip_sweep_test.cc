// SPDX-License-Identifier: Apache-2.0
// Every single-bit flip of every byte of the closed sweep fixtures
// (support/sweep_fixtures.h), and every bit of every reserved or padding
// byte flipped with its checksum recomputed, so that the structural check
// itself is what must catch it.
//
// What is correct for a plain flip at byte b of a closed file:
// - VerifyFile reports an error (not only a warning), naming the chunk and
//   the chunk's offset when b lies in a chunk, the slot's offset when b lies
//   in a commit slot, offset 0 in the header.
// - b in the file header or in a chunk head: Open fails.
// - b in a commit slot: Open succeeds on the other slot (a torn slot is what
//   a crash leaves; spec/FORMAT.md section 6) and every token and row reads
//   back exactly as in the original.
// - b in section i of a chunk (its rows, scales or padding): Open succeeds,
//   the read of that (layer, stream) fails and leaves its destination as it
//   was, and every other read returns exactly the original bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "format/chunk_layout.h"
#include "format/endian.h"
#include "format/header.h"
#include "kvfile/reader.h"
#include "kvfile/verify.h"
#include "support/sweep_fixtures.h"

namespace kvfile {
namespace {

using namespace format;
using testing::SweepFixture;

// Where byte b of a fixture lies.
struct Place {
  enum Kind { kHeader, kSlot, kChunkHead, kSection } kind;
  int64_t chunk = -1;
  int64_t section = -1;     // layer * streams + stream
  int64_t region_offset = 0;  // offset of the header, the slot or the chunk
};

Place Locate(const SweepFixture& f, uint64_t b) {
  if (b < kHeaderSize) return {Place::kHeader, -1, -1, 0};
  if (b < kDataOffset) return {Place::kSlot, -1, -1, static_cast<int64_t>(b / kBlockSize * kBlockSize)};
  for (size_t i = 0; i < f.chunks.size(); ++i) {
    const auto& c = f.chunks[i];
    if (b >= c.end) continue;
    for (size_t s = 0; s < c.sections.size(); ++s)
      if (b >= c.sections[s].first && b < c.sections[s].second)
        return {Place::kSection, static_cast<int64_t>(i), static_cast<int64_t>(s), static_cast<int64_t>(c.begin)};
    return {Place::kChunkHead, static_cast<int64_t>(i), -1, static_cast<int64_t>(c.begin)};
  }
  ADD_FAILURE() << "byte " << b << " lies outside the fixture";
  return {Place::kHeader};
}

// Checks one damaged image against the rules of the file comment.
void CheckFlip(const SweepFixture& f, const std::vector<uint8_t>& image, const Place& at) {
  testing::ImageCheck check = testing::CheckImage(image, f);
  ASSERT_TRUE(check.verify_status.ok()) << check.verify_status.ToString();
  ASSERT_TRUE(check.report.HasErrors()) << "verify missed it";
  const VerifyFinding& first = check.report.findings[0];
  EXPECT_EQ(first.offset, at.region_offset) << first.message;
  if (at.kind == Place::kChunkHead || at.kind == Place::kSection) {
    EXPECT_EQ(first.chunk, at.chunk) << first.message;
  }
  const testing::ReadCheck& rc = check.read;
  ASSERT_TRUE(rc.corrupt.empty()) << rc.corrupt;
  if (at.kind == Place::kHeader || at.kind == Place::kChunkHead) {
    ASSERT_FALSE(rc.open.ok()) << "the reader opened a file with a damaged header or chunk head";
    ASSERT_TRUE(rc.open.IsDataError()) << rc.open.ToString();
    return;
  }
  ASSERT_TRUE(rc.open.ok()) << rc.open.ToString();
  ASSERT_EQ(rc.tokens, f.tokens.size());
  for (size_t i = 0; i < rc.read_ok.size(); ++i)
    ASSERT_EQ(rc.read_ok[i], static_cast<int64_t>(i) != at.section) << "read of section " << i;
}

// Sweeps the quick set of fixtures (label unit) or the others (label long).
void SweepFlips(bool quick) {
  auto start = std::chrono::steady_clock::now();
  const unsigned sample = testing::SweepSample();
  size_t cases = 0;
  size_t by_kind[4] = {};
  for (const SweepFixture& f : testing::SweepFixtures(true)) {
    if (testing::InQuickSet(f) != quick) continue;
    SCOPED_TRACE(f.name);
    std::vector<uint8_t> image = f.bytes;
    for (uint64_t b = 0; b < image.size(); ++b) {
      Place at = Locate(f, b);
      for (int bit = 0; bit < 8; ++bit) {
        if ((b + bit) % sample != 0) continue;
        SCOPED_TRACE("byte " + std::to_string(b) + " bit " + std::to_string(bit));
        image[b] ^= static_cast<uint8_t>(1u << bit);
        CheckFlip(f, image, at);
        image[b] ^= static_cast<uint8_t>(1u << bit);
        if (::testing::Test::HasFatalFailure()) return;
        ++cases;
        ++by_kind[at.kind];
      }
    }
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%zu single-bit flips (header %zu, commit slots %zu, chunk heads %zu, sections %zu; 1 in %u) "
              "in %.2f s\n",
              cases, by_kind[0], by_kind[1], by_kind[2], by_kind[3], sample, s);
  for (size_t n : by_kind) EXPECT_GT(n, 0u);
}

TEST(BitFlipSweep, QuickEveryFlipOfAClosedFileIsDetected) { SweepFlips(true); }
TEST(BitFlipSweep, FullEveryFlipOfAClosedFileIsDetected) { SweepFlips(false); }

// ---- Reserved and padding bytes, checksums recomputed ----------------------------------

struct Range {
  uint64_t begin, end;
};

// The reserved and padding bytes of the file header of `f`.
std::vector<Range> HeaderReserved(const SweepFixture& f) {
  std::vector<Range> r = {{68, hdr::kModelId}};
  uint32_t model_len = LoadU32(f.bytes.data() + hdr::kModelIdLength);
  r.push_back({hdr::kModelId + model_len, hdr::kModelId + hdr::kModelIdCapacity});
  for (size_t i = 0; i < hdr::kMaxStreams; ++i) {
    uint64_t base = hdr::kStreams + i * hdr::kStreamDescriptorSize;
    if (i >= f.geometry.streams.size()) {
      r.push_back({base, base + hdr::kStreamDescriptorSize});
      continue;
    }
    r.push_back({base + f.geometry.streams[i].name.size(), base + sd::kNameCapacity});
    r.push_back({base + sd::kDtype + 1, base + sd::kRowsPerToken});
    r.push_back({base + sd::kRowWidth + 4, base + hdr::kStreamDescriptorSize});
  }
  r.push_back({hdr::kStreams + hdr::kMaxStreams * hdr::kStreamDescriptorSize, hdr::kChecksum});
  return r;
}

// Rewrites every checksum of `image` that covers byte b, innermost first,
// so that only the structural checks can tell the flip.
void Rechecksum(const SweepFixture& f, std::vector<uint8_t>& image, uint64_t b) {
  uint8_t* p = image.data();
  if (b < kHeaderSize) {
    StoreU64(p + hdr::kChecksum, Checksum(p, hdr::kChecksum));
    return;
  }
  if (b < kDataOffset) {
    uint8_t* slot = p + b / kBlockSize * kBlockSize;
    StoreU64(slot + cs::kChecksum, Checksum(slot, cs::kChecksum));
    return;
  }
  for (const auto& c : f.chunks) {
    if (b >= c.end) continue;
    uint8_t* chunk = p + c.begin;
    for (size_t s = 0; s < c.sections.size(); ++s)
      if (b >= c.sections[s].first && b < c.sections[s].second)
        StoreU64(chunk + ch::kHeaderSize + 8 * s,
                 Checksum(p + c.sections[s].first, c.sections[s].second - c.sections[s].first));
    uint64_t head_bytes = c.sections[0].first - c.begin;
    StoreU64(chunk + head_bytes - 8, Checksum(chunk, head_bytes - 8));
    return;
  }
}

// Who must refuse a nonzero reserved byte (besides verify, always).
enum class Refuser {
  kOpen,     // header and chunk heads: Open fails
  kVerify,   // a commit slot: Open falls back to the other slot and reads everything
  kRead,     // section padding: the read of that section fails
};

// Flips every bit of the given ranges, recomputes the checksums and checks
// that the flip is still refused: by verify always, and as `refuser` says.
size_t FlipReservedWithChecksums(const SweepFixture& f, const std::vector<Range>& ranges, Refuser refuser) {
  const unsigned sample = testing::SweepSample();
  size_t cases = 0;
  for (const Range& r : ranges) {
    for (uint64_t b = r.begin; b < r.end; ++b) {
      for (int bit = 0; bit < 8; ++bit) {
        if ((b + bit) % sample != 0) continue;
        SCOPED_TRACE(f.name + ": reserved byte " + std::to_string(b) + " bit " + std::to_string(bit));
        std::vector<uint8_t> image = f.bytes;
        image[b] ^= static_cast<uint8_t>(1u << bit);
        Rechecksum(f, image, b);
        testing::ImageCheck check = testing::CheckImage(image, f);
        EXPECT_TRUE(check.verify_status.ok()) << check.verify_status.ToString();
        EXPECT_TRUE(check.report.HasErrors()) << "verify accepted a nonzero reserved byte";
        const testing::ReadCheck& rc = check.read;
        EXPECT_TRUE(rc.corrupt.empty()) << rc.corrupt;
        switch (refuser) {
          case Refuser::kOpen: EXPECT_FALSE(rc.open.ok()) << "the reader accepted a nonzero reserved byte"; break;
          case Refuser::kVerify:
            EXPECT_TRUE(rc.open.ok()) << rc.open.ToString();
            EXPECT_EQ(rc.tokens, f.tokens.size());
            EXPECT_EQ(rc.failed_reads, 0u);
            break;
          case Refuser::kRead:
            EXPECT_TRUE(rc.open.ok()) << rc.open.ToString();
            EXPECT_EQ(rc.failed_reads, 1u) << "the reader accepted nonzero section padding";
            // ... and verify names the very byte.
            EXPECT_TRUE(std::any_of(check.report.findings.begin(), check.report.findings.end(),
                                    [b](const VerifyFinding& v) {
                                      return v.message.find("nonzero section padding at offset " +
                                                            std::to_string(b)) != std::string::npos;
                                    }))
                << "no finding names padding byte " << b;
            break;
        }
        if (::testing::Test::HasFailure()) return cases;
        ++cases;
      }
    }
  }
  return cases;
}

void SweepReserved(bool quick) {
  size_t header = 0, slots = 0, heads = 0, sections = 0;
  for (const SweepFixture& f : testing::SweepFixtures(true)) {
    if (testing::InQuickSet(f) != quick) continue;
    header += FlipReservedWithChecksums(f, HeaderReserved(f), Refuser::kOpen);
    // Both slots: the inactive one is what a reader falls back to, so a
    // damaged one must be reported by verify even though Open succeeds.
    for (uint64_t slot : kCommitSlotOffset) {
      std::vector<Range> r = {{slot + 4, slot + 8}, {slot + cs::kEpoch + 4, slot + cs::kCommittedTokens},
                              {slot + cs::kCommittedChunks + 8, slot + cs::kChecksum}};
      slots += FlipReservedWithChecksums(f, r, Refuser::kVerify);
    }
    for (const auto& c : f.chunks) {
      uint64_t head_end = c.sections[0].first;
      uint64_t tokens_end = c.begin + ch::kHeaderSize + 8 * c.sections.size() +
                            4 * LoadU32(f.bytes.data() + c.begin + ch::kTokenCount);
      // In files with append ends (2.1) the four bytes after the epoch are a field.
      const bool append_ends = (LoadU64(f.bytes.data() + hdr::kRequiredFlags) & kFlagAppendEnds) != 0;
      const uint64_t reserved = append_ends ? ch::kAppendEnd + 4 : ch::kEpoch + 4;
      std::vector<Range> r = {{c.begin + reserved, c.begin + ch::kHeaderSize}, {tokens_end, head_end - 8}};
      heads += FlipReservedWithChecksums(f, r, Refuser::kOpen);
      // Section padding: after the rows (and after the scale arrays of fp8
      // and nvfp4 sections) up to the next 64-byte boundary, and the last section's
      // padding to the chunk's end.
      format::ChunkLayout layout;
      ASSERT_TRUE(ComputeChunkLayout(f.geometry, LoadU32(f.bytes.data() + c.begin + ch::kTokenCount), &layout).ok());
      ASSERT_EQ(layout.sections.size(), c.sections.size());
      std::vector<Range> pad;
      for (const SectionLayout& s : layout.sections) {
        // The gaps after each array (rows; nvfp4 block scales; scales).
        const auto parts = s.parts();
        for (size_t k = 0; k < parts.size(); ++k) {
          if (parts[k].bytes == 0) continue;
          size_t next = k + 1;
          while (next < parts.size() && parts[next].bytes == 0) ++next;
          uint64_t gap_end = next < parts.size() ? parts[next].offset : s.end;
          pad.push_back({c.begin + parts[k].offset + parts[k].bytes, c.begin + gap_end});
        }
      }
      sections += FlipReservedWithChecksums(f, pad, Refuser::kRead);
    }
    if (::testing::Test::HasFailure()) return;
  }
  std::printf("reserved-byte flips with checksums recomputed: header %zu, commit slots %zu, chunk heads %zu, "
              "section padding %zu (1 in %u)\n", header, slots, heads, sections, testing::SweepSample());
  EXPECT_GT(header, 0u);
  EXPECT_GT(slots, 0u);
  EXPECT_GT(heads, 0u);
  EXPECT_GT(sections, 0u);
}

TEST(BitFlipSweep, QuickReservedBytesAreCheckedNotOnlyChecksummed) { SweepReserved(true); }
TEST(BitFlipSweep, FullReservedBytesAreCheckedNotOnlyChecksummed) { SweepReserved(false); }

}  // namespace
}  // namespace kvfile
