// SPDX-License-Identifier: Apache-2.0
// Shared by the tests of the writer, reader, scan, verify, rewind and
// recovery units (tests/<unit>_test.cc): deterministic sequences of rows,
// the bytes a file must hold for them (computed by the codec itself),
// whole-file writes and checks, byte pokes, and the test fixtures.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "codec/nvfp4.h"
#include "kvfile/codec.h"
#include "format/chunk_layout.h"
#include "format/endian.h"
#include "format/header.h"
#include "kvfile/presets.h"
#include "kvfile/reader.h"
#include "kvfile/verify.h"
#include "kvfile/writer.h"
#include "support/testing_hooks.h"

namespace kvfile::test {

using format::ChunkLayout;
using format::ComputeChunkLayout;
using Code = Status::Code;
using Bytes = std::vector<uint8_t>;

constexpr uint64_t kSalt = 0x5EED5EED12345678ull;

// ---- small helpers ------------------------------------------------------------

inline ::testing::AssertionResult HasCode(const Status& st, Code code,
                                 std::initializer_list<std::string> needles = {}) {
  if (st.code() != code)
    return ::testing::AssertionFailure() << "expected code " << static_cast<int>(code) << ", got "
                                       << st.ToString();
  for (const std::string& n : needles)
    if (st.message().find(n) == std::string::npos)
      return ::testing::AssertionFailure() << "message '" << st.message() << "' lacks '" << n << "'";
  return ::testing::AssertionSuccess();
}

#define ASSERT_OK(expr)                                   \
  do {                                                    \
    ::kvfile::Status _st = (expr);                        \
    ASSERT_TRUE(_st.ok()) << #expr << ": " << _st.ToString(); \
  } while (0)

inline Bytes ReadFileBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

inline uint64_t FileSize(const std::string& path) { return std::filesystem::file_size(path); }

inline void PokeBytes(const std::string& path, uint64_t offset, const void* data, size_t n) {
  int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::pwrite(fd, data, n, static_cast<off_t>(offset)), static_cast<ssize_t>(n));
  ::close(fd);
}

inline uint8_t PeekByte(const std::string& path, uint64_t offset) {
  Bytes b = ReadFileBytes(path);
  return offset < b.size() ? b[offset] : 0;
}

inline void XorByte(const std::string& path, uint64_t offset, uint8_t mask) {
  uint8_t v = static_cast<uint8_t>(PeekByte(path, offset) ^ mask);
  PokeBytes(path, offset, &v, 1);
}

inline std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

inline size_t InputSize(Dtype d) { return d == Dtype::kF32 ? 4 : IsFp8(d) ? 1 : 2; }

inline uint64_t SplitMix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline Geometry Preset(const std::string& name, Dtype fp8 = Dtype::kE4M3) {
  Geometry g;
  Status st = GetPreset(name, fp8, &g);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return g;
}

// ---- the input of a whole sequence and what the file must hold -----------------

// Rows for `n` tokens of every (layer, stream), in one input dtype.
struct Sequence {
  Geometry g;
  Dtype in_dtype = Dtype::kBF16;
  uint64_t n = 0;
  std::vector<uint32_t> tokens;
  std::vector<Bytes> blocks;  // [layer * S + stream]: [n][rows][width] of in_dtype

  uint32_t S() const { return static_cast<uint32_t>(g.streams.size()); }
  size_t Index(uint32_t layer, uint32_t s) const { return static_cast<size_t>(layer) * S() + s; }
  uint64_t Rows(uint32_t s) const { return n * g.streams[s].rows_per_token; }
  uint64_t Elems(uint32_t s) const { return Rows(s) * g.streams[s].row_width; }
  uint64_t ElemsPerToken(uint32_t s) const { return g.streams[s].ElementsPerToken(); }
  uint8_t* Elem(uint32_t layer, uint32_t s, uint64_t index) {
    return blocks[Index(layer, s)].data() + index * InputSize(in_dtype);
  }
};

inline void StoreValue(Dtype d, uint8_t* p, float v) {
  if (d == Dtype::kF32) {
    std::memcpy(p, &v, 4);
  } else {
    uint16_t h = d == Dtype::kBF16 ? codec::F32ToBf16(v) : codec::F32ToF16(v);
    std::memcpy(p, &h, 2);
  }
}

// Deterministic rows with a different magnitude per row, zero rows, signed
// zeros, tiny values (subnormal in f16/fp8) and an outlier now and then.
inline Sequence MakeSequence(const Geometry& g, Dtype in_dtype, uint64_t n, uint64_t seed = 1) {
  Sequence q;
  q.g = g;
  q.in_dtype = in_dtype;
  q.n = n;
  uint64_t rs = seed * 0x1234567ull + 99;
  for (uint64_t t = 0; t < n; ++t) {
    uint32_t id = static_cast<uint32_t>(SplitMix(rs) % 128000);
    if (t % 11 == 5) id = 0xFFFFFFFFu;  // the whole u32 range is valid
    q.tokens.push_back(id);
  }
  q.blocks.resize(static_cast<size_t>(g.layers) * g.streams.size());
  for (uint32_t layer = 0; layer < g.layers; ++layer) {
    for (uint32_t s = 0; s < q.S(); ++s) {
      if (!g.InLayer(layer, s)) continue;  // no rows where the stream is absent
      uint64_t st = seed ^ (uint64_t{layer} << 32) ^ (uint64_t{s} << 16) ^ 0xABCDEFull;
      const StreamSpec& spec = g.streams[s];
      Bytes& b = q.blocks[q.Index(layer, s)];
      b.resize(q.Elems(s) * InputSize(in_dtype));
      for (uint64_t row = 0; row < q.Rows(s); ++row) {
        uint64_t r = SplitMix(st);
        int kind = static_cast<int>(r % 16);
        float mag = std::ldexp(1.0f, static_cast<int>((r >> 8) % 17) - 8);  // 2^-8 .. 2^8
        if (kind == 1) mag = std::ldexp(1.0f, -20);                          // tiny row
        for (uint32_t i = 0; i < spec.row_width; ++i) {
          uint64_t e = SplitMix(st);
          float u = static_cast<float>(e >> 40) / static_cast<float>(1ull << 24) * 2.0f - 1.0f;
          float v = u * mag;
          if (kind == 0) v = (e & 1) ? -0.0f : 0.0f;           // zero row, signed zeros
          if (kind == 2 && i == spec.row_width / 2) v = mag * 100.0f;  // an outlier
          StoreValue(in_dtype, b.data() + (row * spec.row_width + i) * InputSize(in_dtype), v);
        }
      }
    }
  }
  return q;
}

// What the file must hold for a sequence: codes and scales of fp8 streams,
// converted rows of raw streams; both computed by the codec itself.
struct Expected {
  std::vector<Bytes> codes;                // fp8: [rows][width]; raw: stored rows
  std::vector<std::vector<float>> scales;  // fp8 only
};

inline Expected ComputeExpected(const Sequence& q) {
  Expected e;
  e.codes.resize(q.blocks.size());
  e.scales.resize(q.blocks.size());
  for (uint32_t layer = 0; layer < q.g.layers; ++layer) {
    for (uint32_t s = 0; s < q.S(); ++s) {
      if (!q.g.InLayer(layer, s)) continue;
      const StreamSpec& spec = q.g.streams[s];
      size_t i = q.Index(layer, s);
      if (IsFp8(spec.dtype)) {
        e.codes[i].resize(q.Elems(s));
        e.scales[i].resize(q.Rows(s));
        size_t bad = 0;
        bool ok = codec::QuantizeRows(spec.dtype, q.in_dtype, q.blocks[i].data(), q.Rows(s),
                                      spec.row_width, e.codes[i].data(), e.scales[i].data(), &bad);
        EXPECT_TRUE(ok) << "bad row " << bad;
      } else {
        e.codes[i].resize(q.Elems(s) * ElementSize(spec.dtype));
        codec::ConvertRaw(q.in_dtype, q.blocks[i].data(), q.Elems(s), spec.dtype, e.codes[i].data());
      }
    }
  }
  return e;
}

// The decoded rows [begin, end) of (layer, stream) as the reader must produce them.
inline Bytes ExpectedRows(const Sequence& q, const Expected& e, uint32_t layer, uint32_t s,
                   uint64_t begin, uint64_t end, Dtype out) {
  const StreamSpec& spec = q.g.streams[s];
  size_t i = q.Index(layer, s);
  uint64_t row0 = begin * spec.rows_per_token;
  uint64_t rows = (end - begin) * spec.rows_per_token;
  Bytes dst(rows * spec.row_width * ElementSize(out));
  if (rows == 0) return dst;
  if (IsFp8(spec.dtype)) {
    codec::DequantizeRows(spec.dtype, e.codes[i].data() + row0 * spec.row_width,
                          e.scales[i].data() + row0, rows, spec.row_width, out, dst.data());
  } else {
    codec::ConvertRaw(spec.dtype, e.codes[i].data() + row0 * spec.row_width * ElementSize(spec.dtype),
                      rows * spec.row_width, out, dst.data());
  }
  return dst;
}

// The batch for tokens [from, from + count) of a sequence.
inline AppendBatch Batch(const Sequence& q, uint64_t from, uint64_t count) {
  AppendBatch b;
  b.tokens = std::span<const uint32_t>(q.tokens).subspan(from, count);
  for (uint32_t layer = 0; layer < q.g.layers; ++layer)
    for (uint32_t s = 0; s < q.S(); ++s)
      b.blocks.push_back(!q.g.InLayer(layer, s)
                             ? RowBlock{}  // absent: no rows
                             : RowBlock{q.in_dtype,
                                        q.blocks[q.Index(layer, s)].data() +
                                            from * q.ElemsPerToken(s) * InputSize(q.in_dtype),
                                        nullptr});
  return b;
}

// Append sizes: one token at a time, or a mix of single tokens and appends
// spanning several chunks.
enum class Schedule { kOneByOne, kMixed, kAllAtOnce };
inline std::vector<uint64_t> Sizes(Schedule sched, uint64_t n, uint32_t chunk) {
  std::vector<uint64_t> sizes;
  if (sched == Schedule::kAllAtOnce) return {n};
  if (sched == Schedule::kOneByOne) return std::vector<uint64_t>(n, 1);
  const uint64_t pattern[] = {1, uint64_t{chunk} + 2, 3, 2 * uint64_t{chunk} + 1, 1, 2};
  uint64_t done = 0;
  for (size_t i = 0; done < n; ++i) {
    uint64_t k = std::min(pattern[i % 6], n - done);
    sizes.push_back(k);
    done += k;
  }
  return sizes;
}

inline WriterOptions Options(uint32_t chunk, SyncMode sync = SyncMode::kClose) {
  WriterOptions o;
  o.chunk_tokens = chunk;
  o.sync = sync;
  hooks::SetWriterSalt(kSalt);
  return o;
}

inline const ModelIdentity kIdentity{"org/test-model", 0x0F1E2D3C4B5A6978ull};

// Writes a whole sequence with the given append sizes and closes the file.
inline void WriteSequence(const std::string& path, const Sequence& q, const WriterOptions& o,
                   const std::vector<uint64_t>& sizes) {
  std::unique_ptr<Writer> w;
  ASSERT_OK(hooks::CreateWriter(path, q.g, kIdentity, o, &w));
  uint64_t done = 0;
  for (uint64_t k : sizes) {
    ASSERT_OK(w->Append(Batch(q, done, k)));
    done += k;
    ASSERT_EQ(w->token_count(), done);
  }
  ASSERT_EQ(done, q.n);
  ASSERT_OK(w->Close());
}

// Compares everything a reader exposes for (layer, stream) over [begin, end).
inline void CheckRange(Reader& r, const Sequence& q, const Expected& e, uint32_t layer, uint32_t s,
                uint64_t begin, uint64_t end, Dtype out) {
  SCOPED_TRACE("layer " + std::to_string(layer) + " stream " + std::to_string(s) + " [" +
               std::to_string(begin) + ", " + std::to_string(end) + ") as " + DtypeName(out));
  const StreamSpec& spec = q.g.streams[s];
  size_t i = q.Index(layer, s);
  uint64_t row0 = begin * spec.rows_per_token;
  uint64_t rows = (end - begin) * spec.rows_per_token;
  if (IsFp8(spec.dtype)) {
    Bytes codes(rows * spec.row_width + 1, 0xEE);
    std::vector<float> scales(rows + 1, -7.0f);
    ASSERT_OK(r.ReadCodes(layer, s, begin, end, codes.data(), scales.data()));
    ASSERT_EQ(std::memcmp(codes.data(), e.codes[i].data() + row0 * spec.row_width, rows * spec.row_width), 0);
    ASSERT_EQ(std::memcmp(scales.data(), e.scales[i].data() + row0, rows * 4), 0);
    ASSERT_EQ(codes.back(), 0xEE);  // nothing written past the range
    ASSERT_EQ(scales.back(), -7.0f);
  } else {
    Bytes unused(8);
    float unused_scales[2];
    ASSERT_TRUE(HasCode(r.ReadCodes(layer, s, begin, end, unused.data(), unused_scales),
                        Code::kInvalidArgument, {"read it with ReadRows"}));
    // Reading in the stored dtype returns the stored bytes.
    size_t es = ElementSize(spec.dtype);
    Bytes raw(rows * spec.row_width * es + 1, 0xEE);
    ASSERT_OK(r.ReadRows(layer, s, begin, end, spec.dtype, raw.data()));
    ASSERT_EQ(std::memcmp(raw.data(), e.codes[i].data() + row0 * spec.row_width * es, rows * spec.row_width * es), 0);
    ASSERT_EQ(raw.back(), 0xEE);
  }
  Bytes want = ExpectedRows(q, e, layer, s, begin, end, out);
  Bytes got(want.size() + 1, 0xEE);
  ASSERT_OK(r.ReadRows(layer, s, begin, end, out, got.data()));
  ASSERT_TRUE(std::equal(want.begin(), want.end(), got.begin()));
  ASSERT_EQ(got.back(), 0xEE);
}

// Checks a closed file holds exactly the sequence, written with `chunk`
// tokens per chunk (every chunk full but the last).
inline void CheckFile(const std::string& path, const Sequence& q, const Expected& e, uint32_t chunk,
               bool committed, bool all_layers_subranges = false) {
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(path, {}, &r));
  EXPECT_EQ(r->major_version(), 2);
  EXPECT_EQ(r->minor_version(), q.g.HasLayerSets() ? 3 : 1);  // 2.3: a stream absent from some layer
  EXPECT_EQ(r->geometry(), q.g);
  EXPECT_EQ(r->identity(), kIdentity);
  EXPECT_EQ(r->salt(), kSalt);
  EXPECT_EQ(r->nominal_chunk_tokens(), chunk);
  EXPECT_EQ(r->epoch(), 1u);
  EXPECT_TRUE(std::string(r->io_backend()) == "posix" || std::string(r->io_backend()) == "io_uring")
      << r->io_backend();
  EXPECT_EQ(r->path(), path);
  ASSERT_EQ(r->token_count(), q.n);
  ASSERT_TRUE(std::equal(r->tokens().begin(), r->tokens().end(), q.tokens.begin(), q.tokens.end()));
  const auto& chunks = r->chunks();
  ASSERT_EQ(chunks.size(), (q.n + chunk - 1) / chunk);
  uint64_t offset = format::kDataOffset;
  for (size_t c = 0; c < chunks.size(); ++c) {
    uint32_t stored = static_cast<uint32_t>(std::min<uint64_t>(chunk, q.n - c * chunk));
    ChunkLayout layout;
    ASSERT_OK(ComputeChunkLayout(q.g, stored, &layout));
    EXPECT_EQ(chunks[c].offset, offset) << c;
    EXPECT_EQ(chunks[c].bytes, layout.chunk_bytes) << c;
    EXPECT_EQ(chunks[c].first_token, c * chunk) << c;
    EXPECT_EQ(chunks[c].stored_tokens, stored) << c;
    EXPECT_EQ(chunks[c].live_tokens, stored) << c;
    EXPECT_EQ(chunks[c].epoch, 1u) << c;
    EXPECT_EQ(chunks[c].committed, committed) << c;
    ASSERT_OK(hooks::ReaderAccess::VerifyChunk(*r, c));
    offset += layout.chunk_bytes;
  }
  EXPECT_EQ(FileSize(path), offset);
  EXPECT_EQ(r->tail().valid_end, offset);
  EXPECT_EQ(r->tail().file_size, offset);
  EXPECT_EQ(r->tail().torn_tail_bytes, 0u);

  // Sub-ranges: across every chunk boundary, inside one chunk, empty.
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (uint64_t b = chunk; b < q.n; b += chunk) {
    ranges.push_back({b - 1, b + 1});
    ranges.push_back({b - 1, std::min(q.n, b + chunk + 1)});  // spans a whole chunk
  }
  if (q.n > 2) ranges.push_back({1, q.n - 1});
  ranges.push_back({q.n / 2, q.n / 2 + 1});
  ranges.push_back({q.n, q.n});
  ranges.push_back({0, 0});
  const Dtype outs[] = {Dtype::kF32, Dtype::kBF16, Dtype::kF16};
  for (uint32_t layer = 0; layer < q.g.layers; ++layer) {
    for (uint32_t s = 0; s < q.S(); ++s) {
      if (!q.g.InLayer(layer, s)) {
        Bytes none(1 << 16);
        EXPECT_TRUE(HasCode(r->ReadRows(layer, s, 0, q.n, Dtype::kF32, none.data()), Code::kInvalidArgument));
        continue;
      }
      CheckRange(*r, q, e, layer, s, 0, q.n, outs[(layer + s) % 3]);
      if (::testing::Test::HasFatalFailure()) return;
      if (all_layers_subranges || layer == 0 || layer + 1 == q.g.layers) {
        for (auto [b, end] : ranges) {
          CheckRange(*r, q, e, layer, s, b, end, outs[(layer + s + b) % 3]);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
  // Out-of-range requests.
  Bytes buf(1 << 16);
  float scales[64];
  EXPECT_TRUE(HasCode(r->ReadRows(q.g.layers, 0, 0, 1, Dtype::kF32, buf.data()), Code::kInvalidArgument));
  EXPECT_TRUE(HasCode(r->ReadRows(0, q.S(), 0, 1, Dtype::kF32, buf.data()), Code::kInvalidArgument));
  EXPECT_TRUE(HasCode(r->ReadRows(0, 0, 0, q.n + 1, Dtype::kF32, buf.data()), Code::kInvalidArgument));
  if (q.n >= 2) {
    EXPECT_TRUE(HasCode(r->ReadRows(0, 0, 2, 1, Dtype::kF32, buf.data()), Code::kInvalidArgument));
  }
  EXPECT_TRUE(HasCode(r->ReadRows(0, 0, 0, 1, Dtype::kE4M3, buf.data()), Code::kInvalidArgument));
  EXPECT_TRUE(HasCode(r->ReadCodes(q.g.layers, 0, 0, 1, buf.data(), scales), Code::kInvalidArgument));
  EXPECT_TRUE(HasCode(hooks::ReaderAccess::VerifyChunk(*r, chunks.size()), Code::kInvalidArgument));
}

// ---- fixture: one temporary directory per test -----------------------------------

class KvFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvfile_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string Path(const std::string& name = "a.kv") const { return dir_ + "/" + name; }
  std::string dir_;
};

// ---- fixture: a small tiny-preset file to damage ----------------------------------

class DamageTest : public KvFileTest {
 protected:
  // tiny, e4m3, 20 tokens in chunks of 8: [0,8) [8,16) [16,20), each 4096 bytes.
  void Write(SyncMode sync = SyncMode::kClose) {
    g_ = Preset("tiny", Dtype::kE4M3);
    q_ = MakeSequence(g_, Dtype::kF32, 20, 5);
    e_ = ComputeExpected(q_);
    WriteSequence(Path(), q_, Options(8, sync), Sizes(Schedule::kMixed, 20, 8));
    ASSERT_OK(ComputeChunkLayout(g_, 8, &layout8_));
    ASSERT_EQ(layout8_.chunk_bytes, 4096u);
    ASSERT_EQ(FileSize(Path()), format::kDataOffset + 3 * 4096);
  }
  uint64_t ChunkOffset(size_t c) const { return format::kDataOffset + 4096 * c; }

  Geometry g_;
  Sequence q_;
  Expected e_;
  ChunkLayout layout8_;
};

// Rewrites a chunk's section and head checksums after a change to its payload.
inline void Reseal(const std::string& path, uint64_t chunk_offset, const ChunkLayout& l) {
  Bytes f = ReadFileBytes(path);
  uint8_t* p = f.data() + chunk_offset;
  for (size_t i = 0; i < l.sections.size(); ++i)
    format::StoreU64(p + l.section_checksums_offset + 8 * i,
                     format::Checksum(p + l.sections[i].offset, l.sections[i].end - l.sections[i].offset));
  format::StoreU64(p + l.head_checksum_offset, format::Checksum(p, l.head_checksum_offset));
  PokeBytes(path, chunk_offset, p, l.chunk_bytes);
}

// ---- Reader::ReadMany --------------------------------------------------------------------

using Pair = std::pair<uint32_t, uint32_t>;  // (layer, stream)

inline std::vector<Pair> AllPairs(const Geometry& g) {
  std::vector<Pair> pairs;
  for (uint32_t layer = 0; layer < g.layers; ++layer)
    for (uint32_t s = 0; s < g.streams.size(); ++s) pairs.push_back({layer, s});
  return pairs;
}

// Every kind a stream can be stored as, several rows per token, odd widths.
inline Geometry MixedGeometry() {
  Geometry g;
  g.layers = 4;
  g.streams = {{"k", 2, 16, Dtype::kE4M3}, {"v", 1, 8, Dtype::kE5M2}, {"idx", 1, 12, Dtype::kBF16},
               {"h", 1, 5, Dtype::kF16}, {"f", 3, 3, Dtype::kF32}};
  return g;
}

inline const Dtype kOutDtypes[] = {Dtype::kBF16, Dtype::kF16, Dtype::kF32};
inline const unsigned kThreadCounts[] = {1, 2, 3, 8};
constexpr uint8_t kFill = 0xEE;

// One destination per pair for `tokens` tokens as `out`, filled with kFill,
// with one spare byte past the end that no read may touch.
struct Destinations {
  std::vector<Bytes> bufs;
  std::vector<RowsTarget> targets;
  Destinations(const Geometry& g, const std::vector<Pair>& pairs, uint64_t tokens, Dtype out) {
    for (auto [layer, s] : pairs)
      bufs.emplace_back(tokens * g.streams[s].ElementsPerToken() * ElementSize(out) + 1, kFill);
    for (size_t i = 0; i < pairs.size(); ++i) targets.push_back({pairs[i].first, pairs[i].second, bufs[i].data()});
  }
};

// ReadMany of `pairs` over [begin, end) as `out` gives exactly what ReadRows
// gives for each pair, with every thread count, and writes nothing past a
// destination's end.
inline void ExpectReadManyMatchesReadRows(Reader& r, const std::vector<Pair>& pairs, uint64_t begin, uint64_t end,
                                   Dtype out) {
  SCOPED_TRACE(std::to_string(pairs.size()) + " targets, [" + std::to_string(begin) + ", " +
               std::to_string(end) + ") as " + DtypeName(out));
  Destinations want(r.geometry(), pairs, end - begin, out);
  for (size_t i = 0; i < pairs.size(); ++i)
    ASSERT_OK(r.ReadRows(pairs[i].first, pairs[i].second, begin, end, out, want.bufs[i].data()));
  for (unsigned threads : kThreadCounts) {
    Destinations got(r.geometry(), pairs, end - begin, out);
    ASSERT_OK(r.ReadMany(got.targets, begin, end, out, threads));
    for (size_t i = 0; i < pairs.size(); ++i)
      ASSERT_TRUE(got.bufs[i] == want.bufs[i])
          << "threads " << threads << ", layer " << pairs[i].first << " stream " << pairs[i].second;
  }
}

// Ranges over a file's chunks: the whole file; across each boundary by one
// token; exactly one chunk; from mid-chunk to mid-chunk over a boundary;
// inside one chunk; from mid-chunk to the end.
inline std::vector<std::pair<uint64_t, uint64_t>> RangesOverChunks(const Reader& r) {
  const uint64_t n = r.token_count();
  std::vector<std::pair<uint64_t, uint64_t>> ranges = {{0, n}, {1, n - 1}};
  for (const ChunkInfo& c : r.chunks()) {
    uint64_t b = c.first_token, e = c.first_token + c.live_tokens;
    if (b > 0) ranges.push_back({b - 1, b + 1});
    ranges.push_back({b, e});
    if (e < n) ranges.push_back({b + c.live_tokens / 2, std::min(n, e + 1 + c.live_tokens / 2)});
    if (c.live_tokens >= 3) ranges.push_back({b + 1, e - 1});
  }
  ranges.push_back({r.chunks().back().first_token + 1, n});
  return ranges;
}

// Checks ReadRows against the sequence for every pair and the whole file,
// then ReadMany against ReadRows for every pair and every range.
inline void CheckReadManyOverChunks(Reader& r, const Sequence& q, const Expected& e) {
  ASSERT_EQ(r.token_count(), q.n);
  for (auto [layer, s] : AllPairs(q.g)) {
    Bytes want = ExpectedRows(q, e, layer, s, 0, q.n, Dtype::kF32);
    Bytes got(want.size());
    ASSERT_OK(r.ReadRows(layer, s, 0, q.n, Dtype::kF32, got.data()));
    ASSERT_TRUE(got == want) << "layer " << layer << " stream " << s;
  }
  for (Dtype out : kOutDtypes) ASSERT_NO_FATAL_FAILURE(ExpectReadManyMatchesReadRows(r, AllPairs(q.g), 0, q.n, out));
  auto ranges = RangesOverChunks(r);
  for (size_t i = 0; i < ranges.size(); ++i)
    ASSERT_NO_FATAL_FAILURE(
        ExpectReadManyMatchesReadRows(r, AllPairs(q.g), ranges[i].first, ranges[i].second, kOutDtypes[i % 3]));
}

class ReadManyTest : public KvFileTest {
 protected:
  // The mixed geometry, 37 tokens in chunks of 8: the last chunk holds 5.
  void Write() {
    q_ = MakeSequence(MixedGeometry(), Dtype::kBF16, 37, 3);
    e_ = ComputeExpected(q_);
    WriteSequence(Path(), q_, Options(8), Sizes(Schedule::kMixed, q_.n, 8));
  }
  std::unique_ptr<Reader> Open(const std::string& path) {
    std::unique_ptr<Reader> r;
    Status st = Reader::Open(path, {}, &r);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return r;
  }
  Sequence q_;
  Expected e_;
};

// `a` with tokens and rows from `at` on replaced by those of `b`.
inline Sequence Splice(const Sequence& a, const Sequence& b, uint64_t at) {
  Sequence out = a;
  std::copy(b.tokens.begin() + at, b.tokens.end(), out.tokens.begin() + at);
  for (uint32_t layer = 0; layer < a.g.layers; ++layer)
    for (uint32_t s = 0; s < a.S(); ++s) {
      size_t from = at * a.ElemsPerToken(s) * InputSize(a.in_dtype);
      size_t i = a.Index(layer, s);
      std::copy(b.blocks[i].begin() + from, b.blocks[i].end(), out.blocks[i].begin() + from);
    }
  return out;
}

// Flips one byte of (layer, stream)'s section in chunk `chunk` of `path`.
inline void DamageSection(const std::string& path, const Reader& r, size_t chunk, uint32_t layer, uint32_t stream,
                   uint64_t byte) {
  const ChunkInfo& c = r.chunks()[chunk];
  ChunkLayout layout;
  ASSERT_OK(ComputeChunkLayout(r.geometry(), c.stored_tokens, &layout));
  ASSERT_LT(byte, layout.section(layer, stream).data_bytes);
  XorByte(path, c.offset + layout.section(layer, stream).offset + byte, 0x20);
}

// ---- nvfp4 streams (format 2.2) ----------------------------------------------------

// Two layers: "k" 2 x 16 nvfp4 (one nvfp4 row of 32 elements per token),
// "v" 1 x 8 bf16 beside it.
inline Geometry Nvfp4Geometry() {
  Geometry g;
  g.layers = 2;
  g.streams = {{"k", 2, 16, Dtype::kNvfp4}, {"v", 1, 8, Dtype::kBF16}};
  return g;
}

// Rows for an Nvfp4Geometry file of n tokens: f32 rows of "k" (magnitudes
// over several octaves, token 1 all zero), bf16 rows of "v", and the codes,
// block scales and row scales the codec gives for "k".
struct Nvfp4Rows {
  static constexpr size_t kWidth = 32;  // elements of "k" per token
  std::vector<uint32_t> tokens;
  std::vector<std::vector<float>> k;      // per layer, [n][32]
  std::vector<std::vector<uint16_t>> v;   // per layer, [n][8]
  std::vector<Bytes> codes, blocks;       // per layer, [n][16] and [n][2]
  std::vector<std::vector<float>> scales;  // per layer, [n]

  explicit Nvfp4Rows(uint64_t n, uint64_t seed = 7) {
    for (uint64_t t = 0; t < n; ++t) tokens.push_back(static_cast<uint32_t>(500 + t));
    for (uint32_t l = 0; l < 2; ++l) {
      std::vector<float> kl(n * kWidth);
      std::vector<uint16_t> vl(n * 8);
      for (size_t i = 0; i < kl.size(); ++i) {
        uint64_t r = SplitMix(seed);
        float mag = std::ldexp(static_cast<float>(r % 1000) / 1000.0f, static_cast<int>((r >> 10) % 12) - 6);
        kl[i] = i / kWidth == 1 ? 0.0f : ((r >> 20) & 1) ? -mag : mag;
      }
      for (size_t i = 0; i < vl.size(); ++i) vl[i] = static_cast<uint16_t>(0x3f00 + SplitMix(seed) % 200);
      Bytes c(n * kWidth / 2), b(n * kWidth / 16);
      std::vector<float> sc(n);
      size_t bad = 0;
      EXPECT_TRUE(codec::nvfp4::QuantizeRows(Dtype::kF32, kl.data(), n, kWidth, c.data(), b.data(), sc.data(),
                                             &bad));
      k.push_back(std::move(kl));
      v.push_back(std::move(vl));
      codes.push_back(std::move(c));
      blocks.push_back(std::move(b));
      scales.push_back(std::move(sc));
    }
  }
  // Tokens [from, from + count): "k" as f32 rows, or as its codes.
  AppendBatch Batch(uint64_t from, uint64_t count, bool as_codes) const {
    AppendBatch b;
    b.tokens = std::span<const uint32_t>(tokens).subspan(from, count);
    for (uint32_t l = 0; l < 2; ++l) {
      if (as_codes)
        b.blocks.push_back({Dtype::kNvfp4, codes[l].data() + from * kWidth / 2, scales[l].data() + from,
                            blocks[l].data() + from * kWidth / 16});
      else
        b.blocks.push_back({Dtype::kF32, k[l].data() + from * kWidth, nullptr});
      b.blocks.push_back({Dtype::kBF16, v[l].data() + from * 8, nullptr});
    }
    return b;
  }
};

// Writes an Nvfp4Geometry file of rows.tokens in appends of `append`
// tokens, chunks of `chunk`.
inline void WriteNvfp4(const std::string& path, const Nvfp4Rows& rows, uint32_t chunk, uint64_t append,
                       bool as_codes) {
  std::unique_ptr<Writer> w;
  ASSERT_OK(hooks::CreateWriter(path, Nvfp4Geometry(), kIdentity, Options(chunk), &w));
  for (uint64_t t = 0; t < rows.tokens.size(); t += append)
    ASSERT_OK(w->Append(rows.Batch(t, std::min<uint64_t>(append, rows.tokens.size() - t), as_codes)));
  ASSERT_OK(w->Close());
}

}  // namespace kvfile::test
