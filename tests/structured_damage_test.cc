// SPDX-License-Identifier: Apache-2.0
// Structured damage of the sweep fixtures (support/sweep_fixtures.h), at
// least 10^5 cases from a fixed seed: runs of 1-64 garbage bytes, 512-byte
// and 4 KiB blocks zeroed or filled with garbage, a chunk duplicated (over
// another of its size, or appended), two chunks swapped, a chunk spliced in
// from a file of the same geometry and another salt, the header (or the
// header and the commit slots) of such a file, and header, commit slot and
// chunk header fields set to 0, to their maximum and to overflowing values
// with their checksum recomputed.
//
// What counts as correct, for every case:
// - VerifyFile examines the file (returns OK) and the reader neither
//   crashes nor hangs (the sanitizer build checks for undefined behaviour
//   and reads outside buffers);
// - no corrupt read: the reader's token ids are a prefix of the original's,
//   every successful read returns exactly the original's bytes for those
//   tokens, and a failed read leaves its destination untouched
//   (testing::ReadAndCompare).
// For plain damage (the bytes changed and no checksum was recomputed), also:
// - verify reports it: an error when it lies inside the original bytes of a
//   closed file (everything there is committed); an error or a warning
//   otherwise (past the commit record, a damaged last chunk is what a crash
//   leaves, a torn tail);
// - the reader returns fewer tokens than the original only then (a shorter
//   valid prefix is acceptable when the damage lies past the commit
//   record, never silently).
// A spliced-in chunk or header of another file must always be caught: the
// reader never returns the other file's rows (the twin's rows differ, so
// ReadAndCompare would see them) and verify reports it.
// Edited fields with recomputed checksums are forged, well-formed records:
// only "correct" applies to them. A forged row width or row count can give
// a geometry that the chunks still fit (the chunk heads do not repeat the
// geometry; only the sections' spans must match); the reader then reads
// the rows as that geometry lays them out, and a read is correct if it
// stays inside its destination, sized for that geometry (checked under
// AddressSanitizer), since there is no original to compare with.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "format/endian.h"
#include "format/header.h"
#include "kvfile/reader.h"
#include "kvfile/verify.h"
#include "support/sweep_fixtures.h"

namespace kvfile {
namespace {

using namespace format;
using testing::SplitMix;
using testing::SweepFixture;

constexpr uint64_t kSeed = 0x7E57DA3A6E5EEDull;
constexpr size_t kMinCases = 100000;

enum Kind {
  kGarbageRun,
  kZero512,
  kGarbage512,
  kZero4K,
  kGarbage4K,
  kDuplicateChunk,
  kSwapChunks,
  kSpliceChunk,
  kForeignHeader,
  kForeignHeaderAndSlots,
  kHeaderField,
  kSlotField,
  kChunkField,
  kKinds
};
const char* const kKindNames[kKinds] = {
    "garbage run",    "512 B zeroed",       "512 B garbage",          "4 KiB zeroed", "4 KiB garbage",
    "chunk duplicated", "chunks swapped",   "chunk of another file",  "header of another file",
    "header and slots of another file", "header field", "commit slot field", "chunk header field"};

struct Field {
  uint64_t offset;  // within the record
  int width;        // bytes
};

// Values a field is set to: 0, all ones, the top bit, just past the
// format's limits and values whose products overflow 64 bits.
uint64_t HostileValue(SplitMix& rng, int width) {
  static constexpr uint64_t kValues[] = {0, ~0ull, 1ull << 63, 1ull << 40, 1ull << 32, (1ull << 32) - 1,
                                         1ull << 31, 65537, 1025, 17, 256, (1ull << 30) + 4096, ~0ull - 4095};
  uint64_t v = kValues[rng.Below(std::size(kValues))];
  return width == 8 ? v : width == 4 ? v & 0xFFFFFFFFull : v & 0xFFFF;
}

void StoreField(uint8_t* p, const Field& f, uint64_t v) {
  if (f.width == 2) StoreU16(p + f.offset, static_cast<uint16_t>(v));
  else if (f.width == 4) StoreU32(p + f.offset, static_cast<uint32_t>(v));
  else StoreU64(p + f.offset, v);
}

struct Damage {
  Kind kind;
  bool plain = true;     // bytes changed without recomputing a checksum
  bool in_place = true;  // the damage lies inside the original's bytes
};

// Applies one damage of `kind` to `image` (a copy of f.bytes).
Damage Apply(Kind kind, SplitMix& rng, const SweepFixture& f, const SweepFixture& twin,
             std::vector<uint8_t>& image) {
  Damage d{kind};
  const uint64_t size = image.size();
  auto garbage = [&](uint64_t at, uint64_t n) {
    for (uint64_t i = at; i < at + n && i < size; ++i) image[i] = static_cast<uint8_t>(rng.Next());
  };
  auto block = [&](uint64_t block_size, bool zero) {
    uint64_t at = rng.Below(size / block_size) * block_size;
    if (zero) std::memset(image.data() + at, 0, block_size);
    else garbage(at, block_size);
  };
  const auto& chunks = f.chunks;
  switch (kind) {
    case kGarbageRun: garbage(rng.Below(size), 1 + rng.Below(64)); break;
    case kZero512: block(512, true); break;
    case kGarbage512: block(512, false); break;
    case kZero4K: block(4096, true); break;
    case kGarbage4K: block(4096, false); break;
    case kDuplicateChunk: {
      const auto& from = chunks[rng.Below(chunks.size())];
      const auto& to = chunks[rng.Below(chunks.size())];
      if (&from != &to && from.end - from.begin == to.end - to.begin) {
        std::memmove(image.data() + to.begin, image.data() + from.begin, from.end - from.begin);
      } else {
        image.insert(image.end(), image.begin() + static_cast<ptrdiff_t>(from.begin),
                     image.begin() + static_cast<ptrdiff_t>(from.end));
        d.in_place = false;
      }
      break;
    }
    case kSwapChunks: {
      size_t i = rng.Below(chunks.size()), j = rng.Below(chunks.size());
      if (i > j) std::swap(i, j);
      if (i == j) j = (i + 1) % chunks.size();
      std::vector<uint8_t> region;
      for (size_t k = 0; k < chunks.size(); ++k) {
        const auto& c = chunks[k == i ? j : k == j ? i : k];
        region.insert(region.end(), f.bytes.begin() + static_cast<ptrdiff_t>(c.begin),
                      f.bytes.begin() + static_cast<ptrdiff_t>(c.end));
      }
      std::memcpy(image.data() + kDataOffset, region.data(), region.size());
      break;
    }
    case kSpliceChunk: {
      size_t i = rng.Below(chunks.size());
      std::memcpy(image.data() + chunks[i].begin, twin.bytes.data() + twin.chunks[i].begin,
                  chunks[i].end - chunks[i].begin);
      break;
    }
    case kForeignHeader: std::memcpy(image.data(), twin.bytes.data(), kHeaderSize); break;
    case kForeignHeaderAndSlots: std::memcpy(image.data(), twin.bytes.data(), kDataOffset); break;
    case kHeaderField: {
      static constexpr Field kFields[] = {{hdr::kMajor, 2},          {hdr::kMinor, 2},       {hdr::kHeaderBytes, 4},
                                          {hdr::kRequiredFlags, 8},  {hdr::kOptionalFlags, 8}, {hdr::kSalt, 8},
                                          {hdr::kLayerCount, 4},     {hdr::kStreamCount, 4}, {hdr::kChunkTokens, 4},
                                          {hdr::kDataOffsetField, 4}, {hdr::kModelIdLength, 4},
                                          {hdr::kStreams + sd::kRowsPerToken, 4}, {hdr::kStreams + sd::kRowWidth, 4},
                                          {hdr::kStreams + hdr::kStreamDescriptorSize + sd::kRowWidth, 4}};
      const Field& fld = kFields[rng.Below(std::size(kFields))];
      StoreField(image.data(), fld, HostileValue(rng, fld.width));
      StoreU64(image.data() + hdr::kChecksum, Checksum(image.data(), hdr::kChecksum));
      d.plain = false;
      break;
    }
    case kSlotField: {
      static constexpr Field kFields[] = {{cs::kSequence, 8},        {cs::kEpoch, 4},        {cs::kCommittedTokens, 8},
                                          {cs::kCommittedEnd, 8},    {cs::kCommittedChunks, 8}};
      const Field& fld = kFields[rng.Below(std::size(kFields))];
      uint8_t* slot = image.data() + kCommitSlotOffset[rng.Below(2)];
      StoreField(slot, fld, HostileValue(rng, fld.width));
      StoreU64(slot + cs::kChecksum, Checksum(slot, cs::kChecksum));
      d.plain = false;
      break;
    }
    case kChunkField: {
      static constexpr Field kFields[] = {{ch::kTokenCount, 4}, {ch::kFirstToken, 8}, {ch::kChunkOffset, 8},
                                          {ch::kChunkBytes, 8}, {ch::kEpoch, 4}};
      const Field& fld = kFields[rng.Below(std::size(kFields))];
      const auto& c = chunks[rng.Below(chunks.size())];
      uint8_t* head = image.data() + c.begin;
      StoreField(head, fld, HostileValue(rng, fld.width));
      uint64_t head_bytes = c.sections[0].first - c.begin;
      StoreU64(head + head_bytes - 8, Checksum(head, head_bytes - 8));
      d.plain = false;
      break;
    }
    case kKinds: break;
  }
  return d;
}

// Runs one case; returns false (with a test failure) if it was not correct.
// *opened says whether the reader opened the damaged file, *other_geometry
// whether it took another geometry from a forged header.
bool CheckCase(const SweepFixture& f, const std::vector<uint8_t>& image, const Damage& d, bool* opened,
               bool* other_geometry) {
  testing::ImageCheck check = testing::CheckImage(image, f);
  EXPECT_TRUE(check.verify_status.ok()) << check.verify_status.ToString();
  const VerifyReport& rep = check.report;
  const testing::ReadCheck& rc = check.read;
  EXPECT_TRUE(rc.corrupt.empty()) << rc.corrupt;
  *opened = rc.open.ok();
  *other_geometry = rc.geometry_differs;
  if (rc.geometry_differs) {
    EXPECT_EQ(d.kind, kHeaderField) << "the reader took another geometry from a header that was not edited";
  }
  bool changed = image != f.bytes;
  bool reported = !rep.findings.empty();
  if (d.plain && changed) {
    if (f.committed && d.in_place) {
      EXPECT_TRUE(rep.HasErrors()) << "verify missed damage in the committed region";
    } else {
      EXPECT_TRUE(reported) << "verify missed damage";
    }
    if (rc.open.ok() && rc.tokens < f.tokens.size()) {
      EXPECT_TRUE(reported) << "the reader dropped tokens silently";
    }
  }
  if (d.kind == kSpliceChunk || d.kind == kForeignHeader || d.kind == kForeignHeaderAndSlots) {
    EXPECT_TRUE(reported) << "a part of another file was not caught";
  }
  return !::testing::Test::HasFailure();
}

TEST(StructuredDamage, NoCorruptReadInAHundredThousandCases) {
  auto start = std::chrono::steady_clock::now();
  std::vector<const SweepFixture*> fixtures, twins;
  for (bool committed : {true, false}) {
    for (const SweepFixture& f : testing::SweepFixtures(committed)) fixtures.push_back(&f);
    for (const SweepFixture& f : testing::SweepFixtures(committed, true)) twins.push_back(&f);
  }
  ASSERT_EQ(fixtures.size(), twins.size());
  const size_t per_fixture = (kMinCases + fixtures.size() - 1) / fixtures.size();
  SplitMix rng(kSeed);
  // Sampled (KVFILE_SWEEP_SAMPLE): every case is still drawn, so the cases
  // checked are the same ones whatever else is sampled.
  const unsigned sample = testing::SweepSample();
  size_t cases = 0, by_kind[kKinds] = {}, opened = 0, refused = 0, forged_geometry = 0;
  for (size_t fi = 0; fi < fixtures.size(); ++fi) {
    const SweepFixture& f = *fixtures[fi];
    for (size_t n = 0; n < per_fixture; ++n) {
      auto kind = static_cast<Kind>(rng.Below(kKinds));
      std::vector<uint8_t> image = f.bytes;
      Damage d = Apply(kind, rng, f, *twins[fi], image);
      if (n % sample != 0) continue;
      bool was_opened = false, other_geometry = false;
      if (!CheckCase(f, image, d, &was_opened, &other_geometry)) {
        ADD_FAILURE() << f.name << ", case " << n << ": " << kKindNames[kind];
        return;
      }
      ++cases;
      ++by_kind[kind];
      (was_opened ? opened : refused)++;
      forged_geometry += other_geometry ? 1 : 0;
    }
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%zu structured damage cases (seed 0x%llx, 1 in %u) over %zu fixtures in %.2f s; opened %zu (%zu "
              "of them with a forged geometry), refused %zu\n",
              cases, static_cast<unsigned long long>(kSeed), sample, fixtures.size(), s, opened, forged_geometry,
              refused);
  for (int k = 0; k < kKinds; ++k) std::printf("  %-34s %zu\n", kKindNames[k], by_kind[k]);
  EXPECT_GE(cases, kMinCases / sample);
}

}  // namespace
}  // namespace kvfile
