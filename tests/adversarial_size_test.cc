// SPDX-License-Identifier: Apache-2.0
// Hostile counts and sizes: headers, commit slots and chunk headers that
// claim 2^40 tokens, 2^31 layers, rows of 2^32-1 elements, chunks of huge
// token counts or sizes, and safetensors header lengths of 2^63 and of the
// file's size + 1. Each field is written raw and its checksum recomputed
// with the format's own Checksum(), so that the parser's checks, not the
// checksum, are what is tested.
//
// Each case must fail with a clear error (kCorruption naming the field) in
// milliseconds, and stay inside the allocation bound of spec/FORMAT.md
// ("Limits a reader enforces"): no single allocation larger than
// max(2 x file size, 1 MiB), and no more than 4 x file size + 8 MiB in all.
// This binary replaces operator new (support/alloc_tracker.h) to measure.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "format/endian.h"
#include "format/header.h"
#include "kvfile/reader.h"
#include "kvfile/formats/safetensors.h"
#include "kvfile/verify.h"
#include "support/alloc_tracker.h"
#include "support/fault_fs.h"
#include "support/sweep_fixtures.h"

namespace kvfile {
namespace {

using namespace format;
using testing::FaultFs;
using testing::kSweepPath;

// The allocation bound of spec/FORMAT.md for a file of `size` bytes.
size_t LargestAllowed(uint64_t size) { return std::max<size_t>(2 * size, size_t{1} << 20); }
size_t TotalAllowed(uint64_t size) { return 4 * size + (size_t{8} << 20); }

// Runs `open` (which must fail with kCorruption naming `needle`) under the
// allocation tracker and the clock, and checks both bounds.
void ExpectFastBoundedFailure(const std::string& what, uint64_t file_size, const std::function<Status()>& open,
                              const std::string& needle) {
  SCOPED_TRACE(what);
  auto t0 = std::chrono::steady_clock::now();
  testing::StartAllocTracking();
  Status st = open();
  testing::AllocStats a = testing::StopAllocTracking();
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%-48s %7.3f ms, largest allocation %zu B, total %zu B in %zu: %s\n", what.c_str(), ms, a.largest,
              a.total, a.count, st.message().c_str());
  EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  EXPECT_LT(ms, 1000.0);  // milliseconds in the normal build; generous for sanitizers
  EXPECT_GT(a.count, 0u) << "the allocation tracker is not counting";
  EXPECT_LE(a.largest, LargestAllowed(file_size));
  EXPECT_LE(a.total, TotalAllowed(file_size));
}

// VerifyFile's first error as a status (OK if it finds none).
Status VerifyFirstError(FaultFs& fs) {
  VerifyOptions vo;
  vo.fs = &fs;
  VerifyReport rep;
  KVFILE_RETURN_IF_ERROR(VerifyFile(kSweepPath, vo, &rep));
  if (!rep.HasErrors()) return Status::OK();
  return Status::Corruption(rep.findings[0].message);
}

// Opens `image` with a Reader and with VerifyFile; both must refuse it.
void ExpectRefused(const std::string& what, const std::vector<uint8_t>& image, const std::string& needle) {
  FaultFs fs({{kSweepPath, image}});
  ExpectFastBoundedFailure(what + " (open)", image.size(), [&] {
    std::unique_ptr<Reader> r;
    ReaderOptions ro;
    ro.fs = &fs;
    return Reader::Open(kSweepPath, ro, &r);
  }, needle);
  ExpectFastBoundedFailure(what + " (verify)", image.size(), [&] { return VerifyFirstError(fs); }, needle);
}

// A commit record claiming more than the file holds reads as a file cut
// inside its committed data: open returns the real chunks (and records the
// loss), verify reports "file truncated"; both within the same bounds.
void ExpectReadAsTruncated(const std::string& what, const std::vector<uint8_t>& image, uint64_t tokens) {
  FaultFs fs({{kSweepPath, image}});
  ExpectFastBoundedFailure(what + " (open)", image.size(), [&] {
    std::unique_ptr<Reader> r;
    ReaderOptions ro;
    ro.fs = &fs;
    KVFILE_RETURN_IF_ERROR(Reader::Open(kSweepPath, ro, &r));
    EXPECT_EQ(r->token_count(), tokens);
    if (!r->tail().committed_data_missing) return Status::OK();
    return Status::Corruption("file truncated (open read the prefix)");
  }, "file truncated");
  ExpectFastBoundedFailure(what + " (verify)", image.size(), [&] { return VerifyFirstError(fs); }, "file truncated");
}

const testing::SweepFixture& Base() {
  for (const auto& f : testing::SweepFixtures(true))
    if (f.name == "v2-several-chunks-closed") return f;
  throw std::runtime_error("no base fixture");
}

void RechecksumHeader(std::vector<uint8_t>& image) {
  StoreU64(image.data() + hdr::kChecksum, Checksum(image.data(), hdr::kChecksum));
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

// Sets a field of chunk 0's header and recomputes its head checksum over
// the head as the original token count lays it out.
std::vector<uint8_t> WithChunkField(size_t field, int width, uint64_t v) {
  const auto& f = Base();
  std::vector<uint8_t> image = f.bytes;
  uint8_t* head = image.data() + f.chunks[0].begin;
  if (width == 4) StoreU32(head + field, static_cast<uint32_t>(v));
  else StoreU64(head + field, v);
  uint64_t head_bytes = f.chunks[0].sections[0].first - f.chunks[0].begin;
  StoreU64(head + head_bytes - 8, Checksum(head, head_bytes - 8));
  return image;
}

TEST(AdversarialSizes, HeaderCountsBeyondTheLimits) {
  std::vector<uint8_t> image = Base().bytes;
  StoreU32(image.data() + hdr::kLayerCount, 1u << 31);
  RechecksumHeader(image);
  ExpectRefused("header: 2^31 layers", image, "layer count 2147483648 outside 1..1024");

  image = Base().bytes;
  StoreU32(image.data() + hdr::kStreams + sd::kRowWidth, 0xFFFFFFFFu);
  RechecksumHeader(image);
  ExpectRefused("header: row width 2^32-1", image, "row width 4294967295 outside 1..65536");

  image = Base().bytes;
  StoreU32(image.data() + hdr::kStreams + sd::kRowsPerToken, 0xFFFFFFFFu);
  RechecksumHeader(image);
  ExpectRefused("header: 2^32-1 rows per token", image, "rows per token 4294967295 outside 1..1024");

  image = Base().bytes;
  StoreU32(image.data() + hdr::kStreamCount, 0xFFFFFFFFu);
  RechecksumHeader(image);
  ExpectRefused("header: 2^32-1 streams", image, "stream count 4294967295 outside 1..16");

  image = Base().bytes;
  StoreU32(image.data() + hdr::kChunkTokens, 0xFFFFFFFFu);
  RechecksumHeader(image);
  ExpectRefused("header: 2^32-1 tokens per chunk", image, "chunk tokens 4294967295 outside 1..65536");
}

TEST(AdversarialSizes, CommitRecordsClaimingHugeCounts) {
  const auto& f = Base();
  uint64_t end = f.chunks.back().end;
  std::vector<uint8_t> image = f.bytes;
  // Consistent counts: 2^40 tokens in 2^40 chunks of 4096 bytes.
  SetBothSlots(image, uint64_t{1} << 40, kDataOffset + (uint64_t{1} << 52), uint64_t{1} << 40);
  ExpectReadAsTruncated("commit: 2^40 tokens, 2^40 chunks", image, f.tokens.size());
  image = f.bytes;
  SetBothSlots(image, uint64_t{1} << 40, end, f.chunks.size());
  ExpectRefused("commit: 2^40 tokens in the real chunks", image, "does not fall in the last committed chunk");
  image = f.bytes;
  // An end that overflows when the slot's checks add to it.
  SetBothSlots(image, ~uint64_t{0}, ~uint64_t{0} - 4095, uint64_t{1} << 40);
  ExpectReadAsTruncated("commit: end 2^64-4096", image, f.tokens.size());
  image = f.bytes;
  SetBothSlots(image, ~uint64_t{0}, end, ~uint64_t{0});
  ExpectRefused("commit: 2^64-1 chunks", image, "commit record counts are inconsistent");
}

TEST(AdversarialSizes, ChunksClaimingHugeTokenCountsOrSizes) {
  ExpectRefused("chunk: 2^32-1 tokens", WithChunkField(ch::kTokenCount, 4, 0xFFFFFFFFu),
                "chunk token count 4294967295 outside 1..65536");
  ExpectRefused("chunk: 65536 tokens in 4096 bytes", WithChunkField(ch::kTokenCount, 4, 65536),
                "is too small for 65536 tokens");
  ExpectRefused("chunk: 2^30 bytes", WithChunkField(ch::kChunkBytes, 8, uint64_t{1} << 30), "incomplete chunk");
  ExpectRefused("chunk: 2^64-4096 bytes", WithChunkField(ch::kChunkBytes, 8, ~uint64_t{0} - 4095),
                "is not a multiple of 4096 up to 1 GiB");
  ExpectRefused("chunk: first token 2^64-1", WithChunkField(ch::kFirstToken, 8, ~uint64_t{0}),
                "first chunk starts at token 18446744073709551615");
}

// The largest geometry the format allows (1024 layers x 16 streams of 1024
// rows x 65536 elements, 65536 tokens per chunk) in a 16 KiB file: the
// header is legal, so the file opens with no tokens; the chunk after it
// claims 65536 tokens. Nothing may be allocated for the geometry's sake.
TEST(AdversarialSizes, LargestLegalGeometryInATinyFile) {
  FileHeader h;
  h.salt = 0x1234;
  h.chunk_tokens = 65536;
  h.identity = {"hostile", 1};
  h.geometry.layers = 1024;
  for (int s = 0; s < 16; ++s) h.geometry.streams.push_back({"s" + std::to_string(s), 1024, 65536, Dtype::kE4M3});
  std::vector<uint8_t> image(kDataOffset + kBlockSize, 0);
  EncodeFileHeader(h, std::span<uint8_t, kHeaderSize>(image.data(), kHeaderSize));
  for (int i = 0; i < 2; ++i) {
    CommitRecord c{static_cast<uint64_t>(2 - i), h.salt, 1, 0, kDataOffset, 0};
    EncodeCommitRecord(c, std::span<uint8_t, kCommitSlotSize>(image.data() + kCommitSlotOffset[i], kCommitSlotSize));
  }
  ChunkHeader c{65536, h.salt, 0, kDataOffset, kBlockSize, 1};
  EncodeChunkHeader(c, std::span<uint8_t, ch::kHeaderSize>(image.data() + kDataOffset, ch::kHeaderSize));

  FaultFs fs({{kSweepPath, image}});
  ReaderOptions ro;
  ro.fs = &fs;
  std::unique_ptr<Reader> r;
  testing::StartAllocTracking();
  Status st = Reader::Open(kSweepPath, ro, &r);
  testing::AllocStats a = testing::StopAllocTracking();
  ASSERT_TRUE(st.ok()) << st.ToString();
  std::printf("largest legal geometry, 16 KiB file: open %s; largest allocation %zu B, total %zu B\n",
              r->tail().torn_reason.c_str(), a.largest, a.total);
  EXPECT_EQ(r->token_count(), 0u);
  EXPECT_EQ(r->tail().torn_tail_bytes, kBlockSize);
  EXPECT_NE(r->tail().torn_reason.find("too small for 65536 tokens"), std::string::npos);
  EXPECT_LE(a.largest, LargestAllowed(image.size()));
  EXPECT_LE(a.total, TotalAllowed(image.size()));
  float dst = 1.0f;
  EXPECT_TRUE(r->ReadRows(1023, 15, 0, 0, Dtype::kF32, &dst).ok());
  EXPECT_EQ(r->ReadRows(1023, 15, 0, 1, Dtype::kF32, &dst).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(dst, 1.0f);
}

TEST(AdversarialSizes, SafetensorsHeaderLengths) {
  std::string dir = ::testing::TempDir() + "kvfile_adversarial_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, uint64_t length, const std::string& body) {
    std::string path = dir + "/" + name;
    uint8_t len[8];
    StoreU64(len, length);
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(len), 8);
    out << body;
    return path;
  };
  std::string body = "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}    ";
  for (auto [name, length] : {std::pair<std::string, uint64_t>{"2^63", uint64_t{1} << 63},
                              {"file size + 1", body.size() + 8 + 1},
                              {"data size + 1", body.size() + 1}}) {
    std::string path = write("st.safetensors", length, body);
    ExpectFastBoundedFailure("safetensors: header length " + name, 8 + body.size(), [&] {
      std::unique_ptr<safetensors::SafetensorsFile> f;
      return safetensors::SafetensorsFile::Open(path, nullptr, &f);
    }, "header length");
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvfile
