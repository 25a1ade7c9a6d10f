// SPDX-License-Identifier: Apache-2.0
// Tests of the writer's chunk builder (src/writer/chunk_builder.h), on memory only:
// the bytes of sealed chunks (head fields, tokens, rows, checksums, zero
// padding), short chunks, the reuse of a staging buffer after a short or a
// full chunk (no byte of the earlier chunk may show through), and what
// staging refuses (non-finite rows, wrong block shapes) without a trace;
// and the default chunk-size rule the writer and the CLI share.
#include "writer/chunk_builder.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "format/endian.h"
#include "kvfile/writer.h"  // FitChunkTokens

namespace kvfile::internal {
namespace {

using namespace kvfile::format;

// Layer-major geometry: an fp8 stream (rows, then scales) and a raw one.
Geometry Mixed() {
  Geometry g;
  g.layers = 2;
  g.streams = {{"k", 2, 16, Dtype::kE4M3}, {"v", 2, 16, Dtype::kBF16}};
  return g;
}

// Input rows for tokens [first, first + n) of one append: f32 for the fp8
// stream, bf16 bit patterns for the raw one. Values depend on `seed` and
// the token, so chunks of different tokens differ in every section.
struct Input {
  std::vector<uint32_t> tokens;
  std::vector<std::vector<float>> f32;      // per layer (stream k)
  std::vector<std::vector<uint16_t>> bf16;  // per layer (stream v)
  AppendBatch batch;

  Input(const Geometry& g, uint64_t first, uint32_t n, int seed) {
    for (uint32_t t = 0; t < n; ++t) tokens.push_back(static_cast<uint32_t>(1000 + first + t));
    const size_t elems = size_t{n} * 2 * 16;
    for (uint32_t l = 0; l < g.layers; ++l) {
      std::vector<float> k(elems);
      std::vector<uint16_t> v(elems);
      for (size_t i = 0; i < elems; ++i) {
        k[i] = static_cast<float>((static_cast<int>(i + first * 32) * 7 + seed + static_cast<int>(l)) % 23 - 11) * 0.25f;
        v[i] = static_cast<uint16_t>(0x3f00 + ((i + first * 32) * 13 + static_cast<size_t>(seed) + l) % 200);
      }
      f32.push_back(std::move(k));
      bf16.push_back(std::move(v));
    }
    batch.tokens = tokens;
    for (uint32_t l = 0; l < g.layers; ++l) {
      batch.blocks.push_back({Dtype::kF32, f32[l].data(), nullptr});
      batch.blocks.push_back({Dtype::kBF16, bf16[l].data(), nullptr});
    }
  }
};

ChunkHeader Head(uint64_t first_token, uint64_t offset) {
  ChunkHeader h;
  h.salt = 0x1234567890abcdefull;
  h.first_token = first_token;
  h.chunk_offset = offset;
  h.epoch = 3;
  return h;
}

// Checks a sealed chunk the way a reader would, byte for byte: head fields,
// token ids, the raw stream's rows as given, both checksums over their
// ranges, and every padding byte zero.
void ExpectValidChunk(const Geometry& g, std::span<const uint8_t> c, const Input& in, uint64_t first_token) {
  const uint32_t n = static_cast<uint32_t>(in.tokens.size());
  ChunkLayout l;
  ASSERT_TRUE(ComputeChunkLayout(g, n, &l).ok());
  ASSERT_EQ(c.size(), l.chunk_bytes);
  ChunkHeader h;
  ASSERT_TRUE(DecodeChunkHeader(std::span<const uint8_t, ch::kHeaderSize>(c.data(), ch::kHeaderSize), true, &h).ok());
  EXPECT_EQ(h.token_count, n);
  EXPECT_EQ(h.first_token, first_token);
  EXPECT_EQ(h.chunk_bytes, l.chunk_bytes);
  EXPECT_EQ(h.epoch, 3u);
  EXPECT_EQ(h.salt, 0x1234567890abcdefull);
  for (uint32_t t = 0; t < n; ++t) EXPECT_EQ(LoadU32(c.data() + l.tokens_offset + 4 * t), in.tokens[t]) << t;
  EXPECT_EQ(LoadU64(c.data() + l.head_checksum_offset), Checksum(c.data(), l.head_checksum_offset));
  const uint64_t tokens_end = l.tokens_offset + 4ull * n;
  EXPECT_TRUE(AllZero(c.subspan(tokens_end, l.head_checksum_offset - tokens_end)));
  for (size_t i = 0; i < l.sections.size(); ++i) {
    const SectionLayout& s = l.sections[i];
    EXPECT_EQ(LoadU64(c.data() + l.section_checksums_offset + 8 * i), Checksum(c.data() + s.offset, s.end - s.offset))
        << "section " << i;
    uint64_t data_end = s.offset + s.data_bytes;
    if (s.scales_bytes > 0) {
      EXPECT_TRUE(AllZero(c.subspan(data_end, s.scales_offset - data_end))) << "section " << i;
      data_end = s.scales_offset + s.scales_bytes;
    }
    EXPECT_TRUE(AllZero(c.subspan(data_end, s.end - data_end))) << "section " << i;
    if (i % 2 == 1) {  // stream v: bf16 in, bf16 stored, unchanged
      EXPECT_EQ(std::memcmp(c.data() + s.offset, in.bf16[i / 2].data(), s.data_bytes), 0) << "section " << i;
    }
  }
}

std::vector<uint8_t> Bytes(std::span<const uint8_t> s) { return {s.begin(), s.end()}; }

// The sealed bytes of `in` staged into a builder that never held anything.
std::vector<uint8_t> FreshChunk(const Geometry& g, uint32_t capacity, const Input& in, uint64_t first, uint64_t offset) {
  ChunkBuilder b;
  EXPECT_TRUE(b.Init(&g, capacity).ok());
  EXPECT_TRUE(b.Allocate());
  EXPECT_TRUE(b.Stage(in.batch, 0, static_cast<uint32_t>(in.tokens.size()), first).ok());
  std::span<const uint8_t> c;
  EXPECT_TRUE(b.Seal(Head(first, offset), &c).ok());
  return Bytes(c);
}

TEST(ChunkBuilder, FullChunkIsValidByteForByte) {
  const Geometry g = Mixed();
  ChunkBuilder b;
  ASSERT_TRUE(b.Init(&g, 8).ok());
  ASSERT_TRUE(b.Allocate());
  Input in(g, 0, 8, 1);
  // Two pieces, as an append that spans calls stages them.
  ASSERT_TRUE(b.Stage(in.batch, 0, 5, 0).ok());
  EXPECT_EQ(b.staged(), 5u);
  EXPECT_EQ(b.room(), 3u);
  ASSERT_TRUE(b.Stage(in.batch, 5, 3, 0).ok());
  EXPECT_EQ(b.room(), 0u);
  std::span<const uint8_t> c;
  ASSERT_TRUE(b.Seal(Head(0, kDataOffset), &c).ok());
  ExpectValidChunk(g, c, in, 0);
  EXPECT_EQ(Bytes(c), FreshChunk(g, 8, in, 0, kDataOffset));
}

TEST(ChunkBuilder, ShortChunkHasTheShortLayout) {
  const Geometry g = Mixed();
  ChunkBuilder b;
  ASSERT_TRUE(b.Init(&g, 8).ok());
  ASSERT_TRUE(b.Allocate());
  Input in(g, 0, 3, 2);
  ASSERT_TRUE(b.Stage(in.batch, 0, 3, 0).ok());
  std::span<const uint8_t> c;
  ASSERT_TRUE(b.Seal(Head(0, kDataOffset), &c).ok());
  ChunkLayout full, short3;
  ASSERT_TRUE(ComputeChunkLayout(g, 8, &full).ok());
  ASSERT_TRUE(ComputeChunkLayout(g, 3, &short3).ok());
  ASSERT_LT(short3.sections[1].offset, full.sections[1].offset);  // sections really move down
  ExpectValidChunk(g, c, in, 0);
  // The same three tokens staged in a builder whose chunks hold 3 tokens.
  EXPECT_EQ(Bytes(c), FreshChunk(g, 3, in, 0, kDataOffset));
}

// A staging buffer is reused every other chunk. Whatever it held before (a
// short chunk, whose sections were moved down over the full layout's
// padding; or a full chunk, whose rows lie where a short chunk's padding
// goes) must not show: the next chunk from it is byte for byte the chunk a
// fresh buffer gives. (The writer used to zero the whole buffer after a
// short chunk as well; the seal's own zeroing of every padding byte is what
// this test checks.)
TEST(ChunkBuilder, ReusedBufferShowsNothingOfItsEarlierChunk) {
  const Geometry g = Mixed();
  ChunkBuilder b;
  ASSERT_TRUE(b.Init(&g, 8).ok());
  ASSERT_TRUE(b.Allocate());
  uint64_t first = 0, offset = kDataOffset;
  // Buffer 0: short (3), buffer 1: full, buffer 0: full after the short
  // one, buffer 1: short after a full one, buffer 0: short (5) after full.
  const uint32_t sizes[] = {3, 8, 8, 2, 5};
  for (int i = 0; i < 5; ++i) {
    SCOPED_TRACE(i);
    Input in(g, first, sizes[i], 10 + i);
    ASSERT_TRUE(b.Stage(in.batch, 0, sizes[i], first).ok());
    std::span<const uint8_t> c;
    ASSERT_TRUE(b.Seal(Head(first, offset), &c).ok());
    ExpectValidChunk(g, c, in, first);
    EXPECT_EQ(Bytes(c), FreshChunk(g, 8, in, first, offset));
    b.Advance();
    first += sizes[i];
    offset += c.size();
  }
}

TEST(ChunkBuilder, KeepStagedDropsTheLastStagedTokens) {
  const Geometry g = Mixed();
  ChunkBuilder b;
  ASSERT_TRUE(b.Init(&g, 8).ok());
  ASSERT_TRUE(b.Allocate());
  Input in(g, 0, 6, 4);
  ASSERT_TRUE(b.Stage(in.batch, 0, 6, 0).ok());
  b.KeepStaged(2);
  Input two(g, 0, 2, 4);  // the same first two tokens
  std::span<const uint8_t> c;
  ASSERT_TRUE(b.Seal(Head(0, kDataOffset), &c).ok());
  EXPECT_EQ(Bytes(c), FreshChunk(g, 8, two, 0, kDataOffset));
}

TEST(ChunkBuilder, NonFiniteRowStagesNothing) {
  const Geometry g = Mixed();
  ChunkBuilder b;
  ASSERT_TRUE(b.Init(&g, 8).ok());
  ASSERT_TRUE(b.Allocate());
  Input ok(g, 0, 2, 5);
  ASSERT_TRUE(b.Stage(ok.batch, 0, 2, 100).ok());
  Input bad(g, 2, 3, 6);
  // Layer 1, stream v, token 1 of the batch, row 1: an infinity (bf16 0x7f80).
  bad.bf16[1][1 * 32 + 16 + 4] = 0x7f80;
  Status st = b.Stage(bad.batch, 0, 3, 100);
  EXPECT_EQ(st.code(), Status::Code::kNonFinite);
  // Sequence index: 100 sealed + 2 staged + token 1 of the batch.
  EXPECT_EQ(st.message(), "non-finite value in layer 1, stream 'v', token 103, row 1");
  EXPECT_EQ(b.staged(), 2u);
  // Validate finds the same row before anything is staged.
  st = b.Validate(bad.batch, /*scan_values=*/true, 100);
  EXPECT_EQ(st.message(), "non-finite value in layer 1, stream 'v', token 103, row 1");
  EXPECT_TRUE(b.Validate(bad.batch, /*scan_values=*/false, 100).ok());
  // An f32 NaN for the fp8 stream: found while quantizing.
  Input nan(g, 2, 1, 7);
  nan.f32[0][17] = std::numeric_limits<float>::quiet_NaN();
  st = b.Stage(nan.batch, 0, 1, 100);
  EXPECT_EQ(st.message(), "non-finite value in layer 0, stream 'k', token 102, row 1");
  EXPECT_EQ(b.staged(), 2u);
  // The chunk holds the two good tokens only.
  std::span<const uint8_t> c;
  ASSERT_TRUE(b.Seal(Head(0, kDataOffset), &c).ok());
  EXPECT_EQ(Bytes(c), FreshChunk(g, 8, ok, 0, kDataOffset));
}

// A large batch is checked and staged on several threads, one (layer,
// stream) section each: the sealed bytes are those of one thread, and a bad
// value is reported for the first bad section in (layer, stream) order
// whichever thread finds one first.
TEST(ChunkBuilder, ThreadsChangeNeitherBytesNorErrors) {
  Geometry g;
  g.layers = 6;
  g.streams = {{"k", 2, 16, Dtype::kE4M3}, {"v", 2, 16, Dtype::kBF16}};
  // Per token 6 x 2 sections of 2 rows x 16: enough tokens that each of 4
  // threads gets over a MiB of rows.
  const uint32_t n = 65536;
  auto stage = [&](unsigned threads, const Input& in, std::vector<uint8_t>* bytes, unsigned* workers) {
    ChunkBuilder b;
    EXPECT_TRUE(b.Init(&g, n, threads).ok());
    EXPECT_TRUE(b.Allocate());
    Status st = b.Validate(in.batch, /*scan_values=*/true, 0);
    if (st.ok()) st = b.Stage(in.batch, 0, n, 0);
    *workers = b.last_workers();
    std::span<const uint8_t> c;
    if (st.ok() && b.Seal(Head(0, kDataOffset), &c).ok()) *bytes = Bytes(c);
    return st;
  };
  Input in(g, 0, n, 9);
  std::vector<uint8_t> one, four;
  unsigned w1 = 0, w4 = 0;
  ASSERT_TRUE(stage(1, in, &one, &w1).ok());
  ASSERT_TRUE(stage(4, in, &four, &w4).ok());
  EXPECT_EQ(w1, 1u);
  EXPECT_EQ(w4, 4u);  // the work really was spread
  ASSERT_FALSE(one.empty());
  EXPECT_TRUE(one == four);
  ExpectValidChunk(g, four, in, 0);
  // Bad values in layer 4 (v) and layer 2 (k): layer 2's is the one named,
  // by Validate and by Stage, on one thread or four.
  in.bf16[4][1000 * 32 + 5] = 0x7f80;
  in.f32[2][2000 * 32 + 20] = std::numeric_limits<float>::infinity();
  for (unsigned threads : {1u, 4u}) {
    ChunkBuilder b;
    ASSERT_TRUE(b.Init(&g, n, threads).ok());
    ASSERT_TRUE(b.Allocate());
    EXPECT_EQ(b.Validate(in.batch, true, 0).message(), "non-finite value in layer 2, stream 'k', token 2000, row 1")
        << threads;
    EXPECT_EQ(b.Stage(in.batch, 0, n, 0).message(), "non-finite value in layer 2, stream 'k', token 2000, row 1")
        << threads;
    EXPECT_EQ(b.last_workers(), threads);
    EXPECT_EQ(b.staged(), 0u);
  }
}

TEST(ChunkBuilder, ValidateChecksTheShapeOfTheBatch) {
  const Geometry g = Mixed();
  ChunkBuilder b;
  ASSERT_TRUE(b.Init(&g, 8).ok());
  Input in(g, 0, 1, 8);
  AppendBatch wrong = in.batch;
  wrong.blocks.pop_back();
  EXPECT_EQ(b.Validate(wrong, false, 0).message(),
            "append has 3 row blocks; the geometry needs layers x streams = 4");
  wrong = in.batch;
  wrong.blocks[2].data = nullptr;
  EXPECT_EQ(b.Validate(wrong, false, 0).message(), "layer 1, stream 'k': no rows given");
  wrong = in.batch;
  wrong.blocks[1].dtype = Dtype::kE5M2;  // codes for a bf16 stream
  EXPECT_EQ(b.Validate(wrong, false, 0).code(), Status::Code::kInvalidArgument);
  wrong = in.batch;
  wrong.blocks[0].dtype = Dtype::kE4M3;  // the stream's own codes, but no scales
  EXPECT_EQ(b.Validate(wrong, false, 0).message(), "layer 0, stream 'k': codes given without scales");
}

TEST(ChunkBuilder, InitRefusesAChunkOverTheFormatLimit) {
  Geometry g;
  g.layers = 64;
  g.streams = {{"k", 8, 4096, Dtype::kF32}};
  ChunkBuilder b;
  Status st = b.Init(&g, 4096);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("exceed 1 GiB"), std::string::npos) << st.message();
}

// The default chunk-size rule (kvfile::FitChunkTokens, kvfile/writer.h):
// halve while a chunk exceeds max(64 MiB, the input's size).
TEST(ChunkSizeRule, HalvesUntilAChunkFits) {
  Geometry g;  // 4 MiB of rows per token: 64 layers x 2 streams x 8 rows x 1024 f32
  g.layers = 64;
  g.streams = {{"k", 8, 1024, Dtype::kF32}, {"v", 8, 1024, Dtype::kF32}};
  // 16 tokens are 64 MiB of rows plus the head: over 64 MiB; 8 fit.
  EXPECT_EQ(FitChunkTokens(g, 256, 0), 8u);
  EXPECT_EQ(FitChunkTokens(g, 256, uint64_t{64} << 20), 8u);
  // A larger input raises the cap: 16 tokens fit in 100 MiB, 32 do not.
  EXPECT_EQ(FitChunkTokens(g, 256, uint64_t{100} << 20), 16u);
  // A chunk over the format's 1 GiB limit is halved whatever the input.
  EXPECT_EQ(FitChunkTokens(g, 512, uint64_t{4} << 30), 128u);
  EXPECT_EQ(FitChunkTokens(g, 4, 0), 4u);  // fits: unchanged
  EXPECT_EQ(FitChunkTokens(g, 1, 0), 1u);  // never below 1
  ChunkLayout l;
  ASSERT_TRUE(ComputeChunkLayout(g, 8, &l).ok());
  EXPECT_LE(l.chunk_bytes, uint64_t{64} << 20);
  ASSERT_TRUE(ComputeChunkLayout(g, 16, &l).ok());
  EXPECT_GT(l.chunk_bytes, uint64_t{64} << 20);
}

}  // namespace
}  // namespace kvfile::internal
