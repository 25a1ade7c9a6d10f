// Tests of the container layer end to end: Writer -> file -> Reader, with
// every stored byte compared against the codec's own block functions, plus
// the failure paths (non-finite input, damaged and truncated files, existing
// paths, concurrent writers) and the sync modes.
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

#include "kvfile/codec.h"
#include "format/chunk_layout.h"
#include "format/endian.h"
#include "format/header.h"
#include "kvfile/presets.h"
#include "kvfile/reader.h"
#include "kvfile/verify.h"
#include "kvfile/writer.h"
#include "testing_hooks.h"

namespace kvfile {
namespace {

using format::ChunkLayout;
using format::ComputeChunkLayout;
using Code = Status::Code;
using Bytes = std::vector<uint8_t>;

constexpr uint64_t kSalt = 0x5EED5EED12345678ull;

// ---- small helpers ------------------------------------------------------------

testing::AssertionResult HasCode(const Status& st, Code code,
                                 std::initializer_list<std::string> needles = {}) {
  if (st.code() != code)
    return testing::AssertionFailure() << "expected code " << static_cast<int>(code) << ", got "
                                       << st.ToString();
  for (const std::string& n : needles)
    if (st.message().find(n) == std::string::npos)
      return testing::AssertionFailure() << "message '" << st.message() << "' lacks '" << n << "'";
  return testing::AssertionSuccess();
}

#define ASSERT_OK(expr)                                   \
  do {                                                    \
    ::kvfile::Status _st = (expr);                        \
    ASSERT_TRUE(_st.ok()) << #expr << ": " << _st.ToString(); \
  } while (0)

Bytes ReadFileBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

uint64_t FileSize(const std::string& path) { return std::filesystem::file_size(path); }

void PokeBytes(const std::string& path, uint64_t offset, const void* data, size_t n) {
  int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::pwrite(fd, data, n, static_cast<off_t>(offset)), static_cast<ssize_t>(n));
  ::close(fd);
}

uint8_t PeekByte(const std::string& path, uint64_t offset) {
  Bytes b = ReadFileBytes(path);
  return offset < b.size() ? b[offset] : 0;
}

void XorByte(const std::string& path, uint64_t offset, uint8_t mask) {
  uint8_t v = static_cast<uint8_t>(PeekByte(path, offset) ^ mask);
  PokeBytes(path, offset, &v, 1);
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

size_t InputSize(Dtype d) { return d == Dtype::kF32 ? 4 : IsFp8(d) ? 1 : 2; }

uint64_t SplitMix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Geometry Preset(const std::string& name, Dtype fp8 = Dtype::kE4M3) {
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

void StoreValue(Dtype d, uint8_t* p, float v) {
  if (d == Dtype::kF32) {
    std::memcpy(p, &v, 4);
  } else {
    uint16_t h = d == Dtype::kBF16 ? codec::F32ToBf16(v) : codec::F32ToF16(v);
    std::memcpy(p, &h, 2);
  }
}

// Deterministic rows with a different magnitude per row, zero rows, signed
// zeros, tiny values (subnormal in f16/fp8) and an outlier now and then.
Sequence MakeSequence(const Geometry& g, Dtype in_dtype, uint64_t n, uint64_t seed = 1) {
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

Expected ComputeExpected(const Sequence& q) {
  Expected e;
  e.codes.resize(q.blocks.size());
  e.scales.resize(q.blocks.size());
  for (uint32_t layer = 0; layer < q.g.layers; ++layer) {
    for (uint32_t s = 0; s < q.S(); ++s) {
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
Bytes ExpectedRows(const Sequence& q, const Expected& e, uint32_t layer, uint32_t s,
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
AppendBatch Batch(const Sequence& q, uint64_t from, uint64_t count) {
  AppendBatch b;
  b.tokens = std::span<const uint32_t>(q.tokens).subspan(from, count);
  for (uint32_t layer = 0; layer < q.g.layers; ++layer)
    for (uint32_t s = 0; s < q.S(); ++s)
      b.blocks.push_back({q.in_dtype,
                          q.blocks[q.Index(layer, s)].data() +
                              from * q.ElemsPerToken(s) * InputSize(q.in_dtype),
                          nullptr});
  return b;
}

// Append sizes: one token at a time, or a mix of single tokens and appends
// spanning several chunks.
enum class Schedule { kOneByOne, kMixed, kAllAtOnce };
std::vector<uint64_t> Sizes(Schedule sched, uint64_t n, uint32_t chunk) {
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

WriterOptions Options(uint32_t chunk, SyncMode sync = SyncMode::kClose) {
  WriterOptions o;
  o.chunk_tokens = chunk;
  o.sync = sync;
  hooks::SetWriterSalt(kSalt);
  return o;
}

const ModelIdentity kIdentity{"org/test-model", 0x0F1E2D3C4B5A6978ull};

// Writes a whole sequence with the given append sizes and closes the file.
void WriteSequence(const std::string& path, const Sequence& q, const WriterOptions& o,
                   const std::vector<uint64_t>& sizes) {
  std::unique_ptr<Writer> w;
  ASSERT_OK(Writer::Create(path, q.g, kIdentity, o, &w));
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
void CheckRange(Reader& r, const Sequence& q, const Expected& e, uint32_t layer, uint32_t s,
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
void CheckFile(const std::string& path, const Sequence& q, const Expected& e, uint32_t chunk,
               bool committed, bool all_layers_subranges = false) {
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(path, {}, &r));
  EXPECT_EQ(r->major_version(), 2);
  EXPECT_EQ(r->minor_version(), 1);
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
      CheckRange(*r, q, e, layer, s, 0, q.n, outs[(layer + s) % 3]);
      if (testing::Test::HasFatalFailure()) return;
      if (all_layers_subranges || layer == 0 || layer + 1 == q.g.layers) {
        for (auto [b, end] : ranges) {
          CheckRange(*r, q, e, layer, s, b, end, outs[(layer + s + b) % 3]);
          if (testing::Test::HasFatalFailure()) return;
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

class KvFileTest : public testing::Test {
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

// ---- round trips over presets x dtypes x chunkings x append schedules --------------

struct RoundTripCase {
  std::string preset;
  Dtype fp8;
  Dtype input;
  uint32_t tokens;
  uint32_t chunk;
  Schedule schedule;
  SyncMode sync;  // kNone: the file is read back through the uncommitted path
};

std::string CaseName(const RoundTripCase& c) {
  std::string name = c.preset + "_" + DtypeName(c.fp8) + "_from_" +
                     DtypeName(c.input) + "_n" + std::to_string(c.tokens) + "_chunk" +
                     std::to_string(c.chunk) +
                     (c.schedule == Schedule::kOneByOne ? "_one_by_one" : "_mixed") +
                     (c.sync == SyncMode::kNone ? "_uncommitted" : "");
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
}

void PrintTo(const RoundTripCase& c, std::ostream* os) { *os << CaseName(c); }

std::vector<RoundTripCase> AllRoundTripCases() {
  std::vector<RoundTripCase> cases;
  for (const std::string& preset : PresetNames()) {
    bool tiny = preset == "tiny";
    // Big presets keep to few tokens so the suite stays fast.
    std::vector<std::pair<uint32_t, uint32_t>> shapes =
        tiny ? std::vector<std::pair<uint32_t, uint32_t>>{{37, 8}, {37, 37}, {37, 64}, {40, 8}, {9, 1}}
             : std::vector<std::pair<uint32_t, uint32_t>>{{9, 3}, {9, 4}, {9, 16}};
    // Every shape with mixed appends (committed by Close); one token at a
    // time (with sync mode none, so read back uncommitted) for every tiny
    // shape and, for the big presets, the shape whose chunk does not divide
    // the token count.
    for (Dtype fp8 : {Dtype::kE4M3, Dtype::kE5M2})
      for (Dtype input : {Dtype::kBF16, Dtype::kF16, Dtype::kF32})
        for (auto [n, chunk] : shapes) {
          if (tiny || chunk == 4)
            cases.push_back({preset, fp8, input, n, chunk, Schedule::kOneByOne, SyncMode::kNone});
          else
            cases.push_back({preset, fp8, input, n, chunk, Schedule::kMixed, SyncMode::kClose});
          if (tiny) cases.push_back({preset, fp8, input, n, chunk, Schedule::kMixed, SyncMode::kClose});
        }
  }
  return cases;
}

class RoundTrip : public KvFileTest, public testing::WithParamInterface<RoundTripCase> {};

TEST_P(RoundTrip, EveryByteMatchesTheCodec) {
  const RoundTripCase& c = GetParam();
  Geometry g = Preset(c.preset, c.fp8);
  Sequence q = MakeSequence(g, c.input, c.tokens, c.tokens * 31 + c.chunk);
  Expected e = ComputeExpected(q);
  WriteSequence(Path(), q, Options(c.chunk, c.sync), Sizes(c.schedule, q.n, c.chunk));
  if (HasFatalFailure()) return;
  CheckFile(Path(), q, e, c.chunk, /*committed=*/c.sync != SyncMode::kNone,
            /*all_layers_subranges=*/c.preset == "tiny");
}

INSTANTIATE_TEST_SUITE_P(Presets, RoundTrip, testing::ValuesIn(AllRoundTripCases()),
                         [](const testing::TestParamInfo<RoundTripCase>& p) {
                           return CaseName(p.param);
                         });

// Geometries no preset has: odd widths, several rows per token, raw f16 and
// f32 streams beside both fp8 kinds, and the largest nominal chunk.
TEST_F(KvFileTest, UnusualGeometriesRoundTrip) {
  Geometry odd;
  odd.layers = 3;
  odd.streams = {{"a", 3, 7, Dtype::kE4M3}, {"b", 1, 5, Dtype::kF16}, {"c", 2, 3, Dtype::kF32},
                 {"d", 1, 1, Dtype::kE5M2}, {"e.x-1_", 4, 33, Dtype::kBF16}};
  for (Dtype in : {Dtype::kBF16, Dtype::kF16, Dtype::kF32}) {
    SCOPED_TRACE(DtypeName(in));
    Sequence q = MakeSequence(odd, in, 10, 11);
    Expected e = ComputeExpected(q);
    WriteSequence(Path(), q, Options(3), Sizes(Schedule::kMixed, q.n, 3));
    CheckFile(Path(), q, e, 3, true, true);
    if (HasFatalFailure()) return;
    std::filesystem::remove(Path());
  }
  // chunk_tokens at its limit: the staging buffer holds 65536 tokens, the
  // file gets one short chunk.
  Geometry tiny = Preset("tiny", Dtype::kE5M2);
  Sequence q = MakeSequence(tiny, Dtype::kBF16, 5);
  WriteSequence(Path(), q, Options(65536), {2, 3});
  CheckFile(Path(), q, ComputeExpected(q), 65536, true, true);
}

TEST(Presets, AreTheDocumentedShapes) {
  std::vector<std::string> names = PresetNames();
  EXPECT_EQ(names, (std::vector<std::string>{"llama-3.1-8b", "qwen2.5-7b", "deepseek-v3",
                                             "dsa-mixed", "tiny"}));
  Geometry g = Preset("dsa-mixed", Dtype::kE5M2);
  ASSERT_EQ(g.streams.size(), 3u);
  EXPECT_EQ(g.layers, 61u);
  EXPECT_EQ(g.streams[0], (StreamSpec{"latent", 1, 512, Dtype::kE5M2}));
  EXPECT_EQ(g.streams[1], (StreamSpec{"rope", 1, 64, Dtype::kE5M2}));
  EXPECT_EQ(g.streams[2], (StreamSpec{"indexer", 1, 128, Dtype::kBF16}));
  g = Preset("tiny");
  EXPECT_EQ(g.layers, 2u);
  EXPECT_EQ(g.streams[0], (StreamSpec{"k", 2, 16, Dtype::kE4M3}));
  Geometry unused;
  EXPECT_TRUE(HasCode(GetPreset("nope", Dtype::kE4M3, &unused), Code::kInvalidArgument, {"tiny"}));
  EXPECT_TRUE(HasCode(GetPreset("tiny", Dtype::kBF16, &unused), Code::kInvalidArgument));
}

// The bytes of a file with every chunk head's append end and head checksum
// (which covers it) zeroed: what does not depend on where appends ended.
Bytes WithoutAppendEnds(const std::string& path, const Geometry& g) {
  Bytes b = ReadFileBytes(path);
  std::unique_ptr<Reader> r;
  EXPECT_TRUE(Reader::Open(path, {}, &r).ok());
  if (!r) return b;
  for (const ChunkInfo& c : r->chunks()) {
    std::memset(b.data() + c.offset + format::ch::kAppendEnd, 0, 4);
    std::memset(b.data() + c.offset + format::HeadBytes(g, c.stored_tokens) - 8, 0, 8);
  }
  return b;
}

// Writing one token at a time, in one append, or in mixed appends gives the
// same bytes but for the append ends in the chunk heads (and the head
// checksums over them); writing twice the same way gives the same bytes.
TEST_F(KvFileTest, DeterministicAndIndependentOfAppendSizes) {
  Geometry g = Preset("dsa-mixed", Dtype::kE4M3);
  Sequence q = MakeSequence(g, Dtype::kF32, 11);
  WriteSequence(Path("one.kv"), q, Options(4), Sizes(Schedule::kOneByOne, q.n, 4));
  WriteSequence(Path("mixed.kv"), q, Options(4), Sizes(Schedule::kMixed, q.n, 4));
  WriteSequence(Path("all.kv"), q, Options(4), Sizes(Schedule::kAllAtOnce, q.n, 4));
  WriteSequence(Path("again.kv"), q, Options(4), Sizes(Schedule::kAllAtOnce, q.n, 4));
  Bytes one = WithoutAppendEnds(Path("one.kv"), g);
  ASSERT_GT(one.size(), format::kDataOffset);
  EXPECT_TRUE(one == WithoutAppendEnds(Path("mixed.kv"), g));
  EXPECT_TRUE(one == WithoutAppendEnds(Path("all.kv"), g));
  EXPECT_FALSE(ReadFileBytes(Path("one.kv")) == ReadFileBytes(Path("all.kv"))) << "append ends are not recorded";
  EXPECT_TRUE(ReadFileBytes(Path("all.kv")) == ReadFileBytes(Path("again.kv")));
  // Another salt changes the file (salt fields and checksums), not the data.
  WriterOptions o = Options(4);
  hooks::SetWriterSalt(kSalt + 1);
  WriteSequence(Path("salt.kv"), q, o, {q.n});
  EXPECT_FALSE(ReadFileBytes(Path("all.kv")) == ReadFileBytes(Path("salt.kv")));
  // A random salt is nonzero and differs between files.
  hooks::SetWriterSalt(0);
  WriteSequence(Path("r1.kv"), q, o, {q.n});
  WriteSequence(Path("r2.kv"), q, o, {q.n});
  std::unique_ptr<Reader> r1, r2;
  ASSERT_OK(Reader::Open(Path("r1.kv"), {}, &r1));
  ASSERT_OK(Reader::Open(Path("r2.kv"), {}, &r2));
  EXPECT_NE(r1->salt(), 0u);
  EXPECT_NE(r1->salt(), r2->salt());
}

// ---- pre-quantized appends -------------------------------------------------------

// Batch whose fp8 streams carry codes and scales (from `e`) instead of rows;
// raw streams keep their input rows. With `only_layer0`, later layers keep
// their input rows too.
AppendBatch QuantizedBatch(const Sequence& q, const Expected& e, uint64_t from, uint64_t count,
                           bool only_layer0 = false) {
  AppendBatch b = Batch(q, from, count);
  for (uint32_t layer = 0; layer < q.g.layers; ++layer) {
    if (only_layer0 && layer > 0) break;
    for (uint32_t s = 0; s < q.S(); ++s) {
      const StreamSpec& spec = q.g.streams[s];
      if (!IsFp8(spec.dtype)) continue;
      size_t i = q.Index(layer, s);
      b.blocks[i] = {spec.dtype, e.codes[i].data() + from * q.ElemsPerToken(s),
                     e.scales[i].data() + from * spec.rows_per_token};
    }
  }
  return b;
}

TEST_F(KvFileTest, PrequantizedAppendsGiveIdenticalFiles) {
  for (const char* preset : {"tiny", "dsa-mixed"}) {
    for (Dtype fp8 : {Dtype::kE4M3, Dtype::kE5M2}) {
      SCOPED_TRACE(std::string(preset) + " " + DtypeName(fp8));
      Geometry g = Preset(preset, fp8);
      Sequence q = MakeSequence(g, Dtype::kBF16, 13);
      Expected e = ComputeExpected(q);
      std::vector<uint64_t> sizes = Sizes(Schedule::kMixed, q.n, 4);
      WriteSequence(Path("quantize.kv"), q, Options(4), sizes);
      for (bool only_layer0 : {false, true}) {
        std::unique_ptr<Writer> w;
        ASSERT_OK(Writer::Create(Path("pre.kv"), g, kIdentity, Options(4), &w));
        uint64_t done = 0;
        for (uint64_t k : sizes) {
          ASSERT_OK(w->Append(QuantizedBatch(q, e, done, k, only_layer0)));
          done += k;
        }
        ASSERT_OK(w->Close());
        EXPECT_TRUE(ReadFileBytes(Path("quantize.kv")) == ReadFileBytes(Path("pre.kv")))
            << "only_layer0=" << only_layer0;
        std::filesystem::remove(Path("pre.kv"));
      }
      std::filesystem::remove(Path("quantize.kv"));
    }
  }
}

TEST_F(KvFileTest, PrequantizedBlocksMustMatchTheStream) {
  Geometry g = Preset("tiny", Dtype::kE4M3);
  Sequence q = MakeSequence(g, Dtype::kBF16, 4);
  Expected e = ComputeExpected(q);
  std::unique_ptr<Writer> w;
  ASSERT_OK(Writer::Create(Path(), g, kIdentity, Options(8), &w));
  AppendBatch b = QuantizedBatch(q, e, 0, 2);
  b.blocks[3].dtype = Dtype::kE5M2;  // layer 1, stream 'v' stores e4m3
  EXPECT_TRUE(HasCode(w->Append(b), Code::kInvalidArgument, {"layer 1", "stream 'v'", "e5m2"}));
  b = QuantizedBatch(q, e, 0, 2);
  b.blocks[2].scales = nullptr;
  EXPECT_TRUE(HasCode(w->Append(b), Code::kInvalidArgument, {"layer 1", "stream 'k'", "scales"}));
  b = Batch(q, 0, 2);
  b.blocks[1].data = nullptr;
  EXPECT_TRUE(HasCode(w->Append(b), Code::kInvalidArgument, {"layer 0", "stream 'v'"}));
  b = Batch(q, 0, 2);
  b.blocks.pop_back();
  EXPECT_TRUE(HasCode(w->Append(b), Code::kInvalidArgument, {"row blocks"}));
  b = Batch(q, 0, 2);
  b.blocks[0].dtype = static_cast<Dtype>(9);
  EXPECT_TRUE(HasCode(w->Append(b), Code::kInvalidArgument, {"dtype"}));
  EXPECT_EQ(w->token_count(), 0u);
  ASSERT_OK(w->Append(Batch(q, 0, 4)));  // still usable
  ASSERT_OK(w->Close());
  CheckFile(Path(), q, e, 8, true);
}

TEST_F(KvFileTest, PrequantizedRawStreamIsRefused) {
  // dsa-mixed 'indexer' is stored bf16: fp8 codes for it are a caller error.
  Geometry g = Preset("dsa-mixed", Dtype::kE4M3);
  Sequence q = MakeSequence(g, Dtype::kBF16, 2);
  std::unique_ptr<Writer> w;
  ASSERT_OK(Writer::Create(Path(), g, kIdentity, Options(8), &w));
  AppendBatch b = Batch(q, 0, 2);
  std::vector<float> scales(2, 1.0f);
  Bytes codes(2 * 128, 0x10);
  b.blocks[2] = {Dtype::kE4M3, codes.data(), scales.data()};
  EXPECT_TRUE(HasCode(w->Append(b), Code::kInvalidArgument, {"layer 0", "stream 'indexer'"}));
  EXPECT_EQ(w->token_count(), 0u);
}

// Pre-quantized codes the reader would refuse (NaN codes, zero/negative/NaN
// scales) must be refused by Append with kNonFinite and leave no trace,
// whatever the size of the append.
void CheckInvalidPrequantized(const std::string& dir, uint64_t first, uint64_t count,
                              uint32_t chunk) {
  Geometry g = Preset("tiny", Dtype::kE4M3);
  Sequence q = MakeSequence(g, Dtype::kBF16, first + count);
  Expected e = ComputeExpected(q);
  struct Damage {
    const char* what;
    bool code;  // a code, else a scale
    float scale;
  };
  const Damage damages[] = {{"nan code", true, 0},
                            {"zero scale", false, 0.0f},
                            {"negative scale", false, -1.0f},
                            {"nan scale", false, std::numeric_limits<float>::quiet_NaN()},
                            {"inf scale", false, std::numeric_limits<float>::infinity()}};
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.what);
    std::string path = dir + "/bad.kv";
    Expected bad = e;
    // layer 1, stream 'v' (index 3), last token of the append, row 1.
    uint64_t token = first + count - 1;
    if (d.code) {
      bad.codes[3][(token * 2 + 1) * 16 + 4] = 0x7F;  // e4m3 NaN
    } else {
      bad.scales[3][token * 2 + 1] = d.scale;
    }
    std::unique_ptr<Writer> w;
    ASSERT_OK(Writer::Create(path, g, kIdentity, Options(chunk), &w));
    if (first > 0) ASSERT_OK(w->Append(QuantizedBatch(q, e, 0, first)));
    Status st = w->Append(QuantizedBatch(q, bad, first, count));
    EXPECT_TRUE(HasCode(st, Code::kNonFinite,
                        {"layer 1", "stream 'v'", "token " + std::to_string(token), "row 1"}));
    EXPECT_EQ(w->token_count(), first);
    ASSERT_OK(w->Close());
    std::unique_ptr<Reader> r;
    ASSERT_OK(Reader::Open(path, {}, &r));
    EXPECT_EQ(r->token_count(), first);
    r.reset();
    std::filesystem::remove(path);
  }
}

TEST_F(KvFileTest, InvalidPrequantizedCodesInAMultiChunkAppendAreRefused) {
  CheckInvalidPrequantized(dir_, 1, 10, 4);
}

TEST_F(KvFileTest, InvalidPrequantizedCodesInASmallAppendAreRefused) {
  // An append that fits in the staging buffer (3 tokens, chunk of 8).
  CheckInvalidPrequantized(dir_, 2, 3, 8);
}

// ---- non-finite input ---------------------------------------------------------------

struct NonFiniteCase {
  Dtype input;
  uint32_t chunk;
  uint64_t before;   // good tokens appended first
  uint64_t count;    // tokens of the bad append
  uint32_t layer;
  uint32_t stream;
  uint64_t token;    // global index of the bad token
  uint32_t row;
  uint32_t elem;
  const char* preset;
};

void StoreNonFinite(Dtype d, uint8_t* p, bool nan, bool negative) {
  if (d == Dtype::kF32) {
    float v = nan ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
    if (negative) v = -v;
    std::memcpy(p, &v, 4);
  } else {
    uint16_t h = d == Dtype::kBF16 ? (nan ? 0x7FC1 : 0x7F80) : (nan ? 0x7E01 : 0x7C00);
    if (negative) h |= 0x8000;
    std::memcpy(p, &h, 2);
  }
}

void RunNonFinite(const std::string& dir, const NonFiniteCase& c, bool nan, bool negative) {
  SCOPED_TRACE(std::string(c.preset) + " " + DtypeName(c.input) + (nan ? " nan" : " inf") +
               (negative ? " negative" : ""));
  Geometry g = Preset(c.preset, Dtype::kE4M3);
  Sequence good = MakeSequence(g, c.input, c.before + c.count, 7);
  Sequence bad = good;
  const StreamSpec& spec = g.streams[c.stream];
  uint64_t index = (c.token * spec.rows_per_token + c.row) * spec.row_width + c.elem;
  ASSERT_LT(index, bad.Elems(c.stream));
  StoreNonFinite(c.input, bad.Elem(c.layer, c.stream, index), nan, negative);

  std::string path = dir + "/nf.kv";
  std::string ref_path = dir + "/ref.kv";
  std::unique_ptr<Writer> w;
  ASSERT_OK(Writer::Create(path, g, kIdentity, Options(c.chunk), &w));
  if (c.before > 0) ASSERT_OK(w->Append(Batch(good, 0, c.before)));
  Status st = w->Append(Batch(bad, c.before, c.count));
  EXPECT_TRUE(HasCode(st, Code::kNonFinite,
                      {"layer " + std::to_string(c.layer), "stream '" + spec.name + "'",
                       "token " + std::to_string(c.token), "row " + std::to_string(c.row)}));
  EXPECT_EQ(w->token_count(), c.before);
  // Every case has before < chunk: no chunk may have reached the disk.
  EXPECT_EQ(FileSize(path), format::kDataOffset);
  ASSERT_OK(w->Close());

  // The file holds exactly the earlier tokens: byte for byte the file
  // written without the failed append.
  Sequence earlier = MakeSequence(g, c.input, c.before, 7);
  earlier.tokens.assign(good.tokens.begin(), good.tokens.begin() + c.before);
  for (size_t i = 0; i < earlier.blocks.size(); ++i)
    earlier.blocks[i].assign(good.blocks[i].begin(),
                             good.blocks[i].begin() + earlier.blocks[i].size());
  if (c.before > 0) {
    WriteSequence(ref_path, earlier, Options(c.chunk), {c.before});
    EXPECT_TRUE(ReadFileBytes(path) == ReadFileBytes(ref_path));
    CheckFile(path, earlier, ComputeExpected(earlier), c.chunk, true);
  } else {
    std::unique_ptr<Reader> r;
    ASSERT_OK(Reader::Open(path, {}, &r));
    EXPECT_EQ(r->token_count(), 0u);
    EXPECT_EQ(FileSize(path), format::kDataOffset);
  }
  std::filesystem::remove(path);
  std::filesystem::remove(ref_path);
}

TEST_F(KvFileTest, NonFiniteAppendThatFitsTheStagingBuffer) {
  // chunk 8; 3 good tokens, then 2 tokens with a bad value in layer 1
  // stream 'v', token 4 (the second of the append), row 1.
  for (Dtype in : {Dtype::kBF16, Dtype::kF16, Dtype::kF32})
    for (bool nan : {true, false})
      RunNonFinite(dir_, {in, 8, 3, 2, 1, 1, 4, 1, 5, "tiny"}, nan, !nan);
  // The bad value in the very first element of the first row of the file.
  RunNonFinite(dir_, {Dtype::kF32, 8, 0, 1, 0, 0, 0, 0, 0, "tiny"}, true, false);
  // A raw (bf16-stored) stream: dsa-mixed 'indexer' of layer 60.
  RunNonFinite(dir_, {Dtype::kBF16, 4, 1, 2, 60, 2, 2, 0, 127, "dsa-mixed"}, true, false);
}

TEST_F(KvFileTest, NonFiniteAppendSpanningSeveralChunks) {
  // chunk 4; 1 good token, then 10 tokens (filling three chunks) with the
  // bad value in the last token of the append: nothing may reach the disk.
  for (Dtype in : {Dtype::kBF16, Dtype::kF16, Dtype::kF32})
    for (bool nan : {true, false})
      RunNonFinite(dir_, {in, 4, 1, 10, 0, 1, 10, 1, 15, "tiny"}, nan, nan);
  RunNonFinite(dir_, {Dtype::kF16, 4, 1, 10, 1, 0, 9, 0, 0, "tiny"}, false, false);
  RunNonFinite(dir_, {Dtype::kBF16, 2, 1, 7, 30, 2, 5, 0, 64, "dsa-mixed"}, false, true);
  RunNonFinite(dir_, {Dtype::kF32, 2, 0, 7, 17, 0, 6, 0, 511, "dsa-mixed"}, true, false);
}

TEST_F(KvFileTest, FailedAppendLeavesNoTraceInLaterChunks) {
  // After a refused append (part of which was already staged), later
  // appends produce exactly the file that never saw it (written with the
  // same appends: chunk heads record where appends end).
  for (Dtype in : {Dtype::kBF16, Dtype::kF32}) {
    Geometry g = Preset("tiny", Dtype::kE5M2);
    Sequence q = MakeSequence(g, in, 20, 3);
    Sequence bad = MakeSequence(g, in, 20, 99);  // other values, one of them NaN
    StoreNonFinite(in, bad.Elem(1, 1, bad.Elems(1) - 1), true, false);
    std::unique_ptr<Writer> w;
    ASSERT_OK(Writer::Create(Path("x.kv"), g, kIdentity, Options(8), &w));
    ASSERT_OK(w->Append(Batch(q, 0, 5)));
    // Tokens 5..7 of `bad` (fits the buffer), NaN in the last row of layer 1 'v'.
    AppendBatch b = Batch(bad, 17, 3);
    EXPECT_TRUE(HasCode(w->Append(b), Code::kNonFinite, {"layer 1", "stream 'v'", "token 7", "row 1"}));
    ASSERT_OK(w->Append(Batch(q, 5, 1)));
    EXPECT_TRUE(HasCode(w->Append(Batch(bad, 12, 8)), Code::kNonFinite));  // spans a chunk
    ASSERT_OK(w->Append(Batch(q, 6, 14)));
    ASSERT_OK(w->Close());
    WriteSequence(Path("ref.kv"), q, Options(8), {5, 1, 14});
    EXPECT_TRUE(ReadFileBytes(Path("x.kv")) == ReadFileBytes(Path("ref.kv")));
    CheckFile(Path("x.kv"), q, ComputeExpected(q), 8, true);
    std::filesystem::remove(Path("x.kv"));
    std::filesystem::remove(Path("ref.kv"));
  }
}

// ---- expectations at open ----------------------------------------------------------------

TEST_F(KvFileTest, ReaderExpectationsNameTheFirstDifference) {
  Geometry g = Preset("tiny", Dtype::kE4M3);
  Sequence q = MakeSequence(g, Dtype::kBF16, 3);
  WriteSequence(Path(), q, Options(8), {3});
  auto open = [&](std::optional<ModelIdentity> id, std::optional<Geometry> geo) {
    ReaderOptions o;
    o.expect_identity = std::move(id);
    o.expect_geometry = std::move(geo);
    std::unique_ptr<Reader> r;
    Status st = Reader::Open(Path(), o, &r);
    EXPECT_EQ(st.ok(), r != nullptr);
    return st;
  };
  ASSERT_OK(open(kIdentity, g));
  ASSERT_OK(open(kIdentity, std::nullopt));
  ASSERT_OK(open(std::nullopt, g));

  ModelIdentity id = kIdentity;
  id.model_id = "org/other";
  EXPECT_TRUE(HasCode(open(id, g), Code::kMismatch,
                      {Path(), "model id: file has 'org/test-model', expected 'org/other'"}));
  id = kIdentity;
  id.fingerprint ^= 1;
  EXPECT_TRUE(HasCode(open(id, std::nullopt), Code::kMismatch, {"model fingerprint"}));
  Geometry e = g;
  e.layers = 32;
  EXPECT_TRUE(HasCode(open(std::nullopt, e), Code::kMismatch, {"layer count: file has 2, expected 32"}));
  e = g;
  e.streams[0].row_width = 128;
  EXPECT_TRUE(HasCode(open(kIdentity, e), Code::kMismatch, {"stream 'k' row width: file has 16, expected 128"}));
  e = g;
  e.streams[1].dtype = Dtype::kE5M2;
  EXPECT_TRUE(HasCode(open(kIdentity, e), Code::kMismatch, {"stream 'v' dtype: file has e4m3, expected e5m2"}));
  // The preset of another model: the layer count differs first.
  EXPECT_TRUE(HasCode(open(kIdentity, Preset("llama-3.1-8b")), Code::kMismatch, {"layer count"}));
  // Several differences: the identity is named first.
  id = kIdentity;
  id.model_id = "x";
  EXPECT_TRUE(HasCode(open(id, e), Code::kMismatch, {"model id"}));
}

// ---- damaged files -------------------------------------------------------------------------

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

TEST_F(DamageTest, DamagedSectionFailsReadsAndLeavesTheBufferAlone) {
  ASSERT_NO_FATAL_FAILURE(Write());
  // A code byte of chunk 1, layer 1, stream 'k'.
  const auto& sec = layout8_.section(1, 0);
  XorByte(Path(), ChunkOffset(1) + sec.offset + 37, 0x01);
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(Path(), {}, &r));  // payloads are checked on read
  ASSERT_EQ(r->token_count(), 20u);

  const size_t row_bytes = 2 * 16;  // per token of one stream: 2 rows of 16
  auto sentinel = [](size_t n) {
    Bytes b(n);
    for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(0xA5 ^ (i * 7));
    return b;
  };
  for (auto [b, end] : std::vector<std::pair<uint64_t, uint64_t>>{{0, 20}, {8, 16}, {7, 9}, {15, 17}, {10, 11}}) {
    SCOPED_TRACE(std::to_string(b) + ".." + std::to_string(end));
    for (Dtype out : {Dtype::kF32, Dtype::kBF16}) {
      Bytes dst = sentinel(20 * row_bytes * 4);
      Bytes before = dst;
      EXPECT_TRUE(HasCode(r->ReadRows(1, 0, b, end, out, dst.data()), Code::kCorruption,
                          {Path(), "chunk 1 at offset 16384", "layer 1", "stream 'k'", "checksum"}));
      EXPECT_TRUE(dst == before);
    }
    Bytes codes = sentinel(20 * row_bytes);
    Bytes codes_before = codes;
    Bytes scales = sentinel(20 * 2 * 4);
    Bytes scales_before = scales;
    EXPECT_TRUE(HasCode(r->ReadCodes(1, 0, b, end, codes.data(), reinterpret_cast<float*>(scales.data())),
                        Code::kCorruption, {"chunk 1"}));
    EXPECT_TRUE(codes == codes_before);
    EXPECT_TRUE(scales == scales_before);
  }
  // Everything not touching the damaged section still reads correctly.
  CheckRange(*r, q_, e_, 1, 0, 0, 8, Dtype::kF32);
  CheckRange(*r, q_, e_, 1, 0, 16, 20, Dtype::kBF16);
  for (uint32_t s = 0; s < 2; ++s) CheckRange(*r, q_, e_, 0, s, 0, 20, Dtype::kF32);
  CheckRange(*r, q_, e_, 1, 1, 0, 20, Dtype::kF16);
  EXPECT_TRUE(HasCode(hooks::ReaderAccess::VerifyChunk(*r, 1), Code::kCorruption, {"chunk 1", "layer 1", "stream 'k'"}));
  ASSERT_OK(hooks::ReaderAccess::VerifyChunk(*r, 0));
  ASSERT_OK(hooks::ReaderAccess::VerifyChunk(*r, 2));
}

TEST_F(DamageTest, DamagedScalesAndPaddingAreCaught) {
  ASSERT_NO_FATAL_FAILURE(Write());
  // A scale byte of chunk 0 layer 0 'v', and the zero padding at the end of
  // chunk 2 (part of the last section, layer 1 'v').
  XorByte(Path(), ChunkOffset(0) + layout8_.section(0, 1).scales_offset + 5, 0x10);
  ChunkLayout layout4;
  ASSERT_OK(ComputeChunkLayout(g_, 4, &layout4));
  ASSERT_GT(layout4.chunk_bytes, layout4.sections.back().scales_offset + layout4.sections.back().scales_bytes);
  XorByte(Path(), ChunkOffset(2) + 4000, 0x80);
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(Path(), {}, &r));
  std::vector<float> scales(40, 3.0f);
  Bytes codes(20 * 32, 0x33);
  EXPECT_TRUE(HasCode(r->ReadCodes(0, 1, 0, 1, codes.data(), scales.data()), Code::kCorruption, {"chunk 0"}));
  EXPECT_TRUE(std::all_of(scales.begin(), scales.end(), [](float f) { return f == 3.0f; }));
  EXPECT_TRUE(std::all_of(codes.begin(), codes.end(), [](uint8_t c) { return c == 0x33; }));
  EXPECT_TRUE(HasCode(r->ReadRows(1, 1, 19, 20, Dtype::kF32, codes.data()), Code::kCorruption, {"chunk 2"}));
  EXPECT_TRUE(std::all_of(codes.begin(), codes.end(), [](uint8_t c) { return c == 0x33; }));
  CheckRange(*r, q_, e_, 1, 1, 0, 16, Dtype::kF32);
  CheckRange(*r, q_, e_, 0, 0, 0, 20, Dtype::kF32);
}

// Rewrites a chunk's section and head checksums after a change to its payload.
void Reseal(const std::string& path, uint64_t chunk_offset, const ChunkLayout& l) {
  Bytes f = ReadFileBytes(path);
  uint8_t* p = f.data() + chunk_offset;
  for (size_t i = 0; i < l.sections.size(); ++i)
    format::StoreU64(p + l.section_checksums_offset + 8 * i,
                     format::Checksum(p + l.sections[i].offset, l.sections[i].end - l.sections[i].offset));
  format::StoreU64(p + l.head_checksum_offset, format::Checksum(p, l.head_checksum_offset));
  PokeBytes(path, chunk_offset, p, l.chunk_bytes);
}

TEST_F(DamageTest, InvalidCodesAndScalesWithValidChecksumsAreRefused) {
  ASSERT_NO_FATAL_FAILURE(Write());
  // Chunk 1, layer 0 'k': a NaN code (0x7F) in token 10; layer 1 'v': a zero
  // scale for token 13 row 0. Checksums resealed so only the values are wrong.
  uint8_t nan_code = 0x7F;
  PokeBytes(Path(), ChunkOffset(1) + layout8_.section(0, 0).offset + 2 * 32 + 3, &nan_code, 1);
  float zero = 0.0f;
  PokeBytes(Path(), ChunkOffset(1) + layout8_.section(1, 1).scales_offset + 5 * 2 * 4, &zero, 4);
  Reseal(Path(), ChunkOffset(1), layout8_);
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(Path(), {}, &r));
  Bytes dst(20 * 32 * 4, 0x5A);
  std::vector<float> scales(40, 2.0f);
  EXPECT_TRUE(HasCode(r->ReadRows(0, 0, 0, 20, Dtype::kF32, dst.data()), Code::kCorruption,
                      {"chunk 1", "non-finite code at token 10"}));
  EXPECT_TRUE(HasCode(r->ReadCodes(0, 0, 9, 11, dst.data(), scales.data()), Code::kCorruption,
                      {"non-finite code at token 10"}));
  EXPECT_TRUE(HasCode(r->ReadRows(1, 1, 12, 20, Dtype::kBF16, dst.data()), Code::kCorruption,
                      {"invalid scale at token 13"}));
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](uint8_t c) { return c == 0x5A; }));
  EXPECT_TRUE(std::all_of(scales.begin(), scales.end(), [](float f) { return f == 2.0f; }));
  EXPECT_TRUE(HasCode(hooks::ReaderAccess::VerifyChunk(*r, 1), Code::kCorruption, {"non-finite code at token 10"}));
  // Rows of the same sections outside the bad tokens still read.
  CheckRange(*r, q_, e_, 0, 0, 11, 20, Dtype::kF32);
  CheckRange(*r, q_, e_, 1, 1, 0, 13, Dtype::kF32);
}

TEST_F(DamageTest, DamagedTokenIdsOfACommittedChunkFailOpen) {
  ASSERT_NO_FATAL_FAILURE(Write());
  XorByte(Path(), ChunkOffset(1) + layout8_.tokens_offset + 4 * 3 + 1, 0x04);
  std::unique_ptr<Reader> r;
  Status st = Reader::Open(Path(), {}, &r);
  EXPECT_TRUE(HasCode(st, Code::kCorruption, {Path(), "chunk 1 at offset 16384", "checksum"}));
  EXPECT_EQ(r, nullptr);
}

TEST_F(DamageTest, EveryBitOfACommittedChunkHeadIsChecked) {
  ASSERT_NO_FATAL_FAILURE(Write());
  const uint64_t base = ChunkOffset(1);
  const Bytes original = ReadFileBytes(Path());
  for (uint64_t byte = 0; byte < layout8_.head_bytes; ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      uint8_t v = static_cast<uint8_t>(original[base + byte] ^ (1u << bit));
      PokeBytes(Path(), base + byte, &v, 1);
      std::unique_ptr<Reader> r;
      Status st = Reader::Open(Path(), {}, &r);
      ASSERT_TRUE(HasCode(st, Code::kCorruption, {"chunk 1 at offset 16384"}))
          << "byte " << byte << " bit " << bit;
      PokeBytes(Path(), base + byte, &original[base + byte], 1);
    }
  }
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(Path(), {}, &r));
}

TEST_F(DamageTest, UncommittedChunks) {
  // sync kNone: no chunk is committed. Damage in an uncommitted chunk ends
  // the valid data there (nothing acknowledged is lost), and the data before
  // it ends at the last append end (appends of 1, 10, 3 and 6 tokens: ends
  // at 1, 11, 14, 20); a valid chunk after the damage is reported in the
  // tail info.
  ASSERT_NO_FATAL_FAILURE(Write(SyncMode::kNone));
  XorByte(Path(), ChunkOffset(2) + layout8_.tokens_offset, 0x01);
  {
    std::unique_ptr<Reader> r;
    ASSERT_OK(Reader::Open(Path(), {}, &r));
    EXPECT_EQ(r->token_count(), 14u);
    EXPECT_EQ(r->chunks().size(), 2u);
    EXPECT_EQ(r->tail().valid_end, ChunkOffset(2));
    EXPECT_EQ(r->tail().torn_tail_bytes, 4096u);
    EXPECT_NE(r->tail().torn_reason.find("chunk 2 at offset 20480"), std::string::npos)
        << r->tail().torn_reason;
    EXPECT_FALSE(r->tail().valid_data_follows);
  }
  XorByte(Path(), ChunkOffset(2) + layout8_.tokens_offset, 0x01);  // repair
  // Payload damage in an uncommitted chunk is found at open too (every byte
  // of an uncommitted chunk is checked), and chunk 2 after it is valid.
  XorByte(Path(), ChunkOffset(1) + layout8_.section(1, 1).offset + 3, 0x01);
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(Path(), {}, &r));
  EXPECT_EQ(r->token_count(), 1u);
  EXPECT_EQ(r->chunks().size(), 1u);
  EXPECT_EQ(r->tail().valid_end, ChunkOffset(1));
  EXPECT_EQ(r->tail().torn_tail_bytes, 8192u);
  EXPECT_NE(r->tail().torn_reason.find("chunk 1 at offset 16384"), std::string::npos)
      << r->tail().torn_reason;
  EXPECT_NE(r->tail().torn_reason.find("layer 1 stream 'v'"), std::string::npos)
      << r->tail().torn_reason;
  EXPECT_TRUE(r->tail().valid_data_follows);
  EXPECT_EQ(r->tail().valid_data_offset, ChunkOffset(2));
  CheckRange(*r, q_, e_, 1, 1, 0, 1, Dtype::kF32);
  Bytes dst(32 * 4, 0x77);
  EXPECT_TRUE(HasCode(r->ReadRows(1, 1, 0, 2, Dtype::kF32, dst.data()), Code::kInvalidArgument));
}

// Writes a header and two empty commit slots, as Create would, for `h`.
void WriteBareFile(const std::string& path, const format::FileHeader& h) {
  Bytes f(format::kDataOffset);
  format::EncodeFileHeader(h, std::span<uint8_t, 4096>(f.data(), 4096));
  format::CommitRecord c;
  c.salt = h.salt;
  c.epoch = 1;
  for (uint64_t seq = 1; seq <= 2; ++seq) {
    c.sequence = seq;
    format::EncodeCommitRecord(c, std::span<uint8_t, 4096>(f.data() + 4096 * (1 + seq % 2), 4096));
  }
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(f.data()),
                                               static_cast<std::streamsize>(f.size()));
}

TEST_F(KvFileTest, OpenTellsUnsupportedFromDamaged) {
  format::FileHeader h;
  h.salt = 42;
  h.chunk_tokens = 8;
  h.identity = kIdentity;
  h.geometry = Preset("tiny", Dtype::kE4M3);
  WriteBareFile(Path("v2.kv"), h);
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(Path("v2.kv"), {}, &r));  // the bare file itself is valid
  EXPECT_EQ(r->token_count(), 0u);
  EXPECT_EQ(r->salt(), 42u);

  format::FileHeader v3 = h;
  v3.major = 3;
  WriteBareFile(Path("v3.kv"), v3);
  EXPECT_TRUE(HasCode(Reader::Open(Path("v3.kv"), {}, &r), Code::kUnsupported, {"version 3"}));
  format::FileHeader flags = h;
  flags.required_flags = 4;
  WriteBareFile(Path("flags.kv"), flags);
  EXPECT_TRUE(HasCode(Reader::Open(Path("flags.kv"), {}, &r), Code::kUnsupported, {"required flags"}));
  format::FileHeader v1 = h;
  v1.major = 1;
  for (auto& s : v1.geometry.streams) s.dtype = Dtype::kBF16;
  WriteBareFile(Path("v1.kv"), v1);
  ASSERT_OK(Reader::Open(Path("v1.kv"), {}, &r));  // v1 is read through the same Reader
  EXPECT_EQ(r->major_version(), 1);
  format::FileHeader v1_fp8 = h;
  v1_fp8.major = 1;  // a v1 header with an fp8 stream is invalid
  std::vector<uint8_t> raw_header(4096);
  format::EncodeFileHeader(v1_fp8, std::span<uint8_t, 4096>(raw_header.data(), 4096));
  format::FileHeader decoded;
  EXPECT_TRUE(HasCode(format::DecodeFileHeader(std::span<const uint8_t, 4096>(raw_header.data(), 4096), &decoded),
                      Code::kCorruption, {"v1 files store raw rows only"}));

  // Not kvfiles at all.
  r.reset();
  EXPECT_TRUE(HasCode(Reader::Open(Path("missing.kv"), {}, &r), Code::kNotFound));
  { std::ofstream(Path("empty.kv")); }
  EXPECT_TRUE(HasCode(Reader::Open(Path("empty.kv"), {}, &r), Code::kCorruption, {"not a kvfile"}));
  { std::ofstream(Path("text.kv")) << "just some text that is not a kvfile\n"; }
  EXPECT_TRUE(HasCode(Reader::Open(Path("text.kv"), {}, &r), Code::kCorruption, {"magic"}));
  EXPECT_EQ(r, nullptr);
  // Both commit slots damaged.
  Bytes f = ReadFileBytes(Path("v2.kv"));
  f[4096 + 100] ^= 1;
  f[8192 + 100] ^= 1;
  std::ofstream(Path("slots.kv"), std::ios::binary).write(reinterpret_cast<const char*>(f.data()),
                                                          static_cast<std::streamsize>(f.size()));
  EXPECT_TRUE(HasCode(Reader::Open(Path("slots.kv"), {}, &r), Code::kCorruption, {"commit slot"}));
  // One damaged slot is survivable: the other one is used.
  f[4096 + 100] ^= 1;
  std::ofstream(Path("slot1.kv"), std::ios::binary).write(reinterpret_cast<const char*>(f.data()),
                                                          static_cast<std::streamsize>(f.size()));
  ASSERT_OK(Reader::Open(Path("slot1.kv"), {}, &r));
}

// ---- LongestCommonPrefix ---------------------------------------------------------------------

TEST_F(KvFileTest, LongestCommonPrefix) {
  Geometry g = Preset("tiny", Dtype::kE4M3);
  Sequence q = MakeSequence(g, Dtype::kBF16, 21);
  for (uint64_t t = 0; t < q.n; ++t) q.tokens[t] = static_cast<uint32_t>(1000 + t);
  WriteSequence(Path(), q, Options(8), {21});
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(Path(), {}, &r));
  std::vector<uint32_t> prompt = q.tokens;
  EXPECT_EQ(r->LongestCommonPrefix({}), 0u);
  EXPECT_EQ(r->LongestCommonPrefix(prompt), 21u);
  prompt[10] = 7;  // diverges in the middle (inside chunk 1)
  EXPECT_EQ(r->LongestCommonPrefix(prompt), 10u);
  prompt[0] = 7;
  EXPECT_EQ(r->LongestCommonPrefix(prompt), 0u);
  prompt = q.tokens;
  prompt.insert(prompt.end(), {5, 6, 7});  // longer than the file
  EXPECT_EQ(r->LongestCommonPrefix(prompt), 21u);
  prompt.resize(8);  // a shorter prompt, ending on a chunk boundary
  EXPECT_EQ(r->LongestCommonPrefix(prompt), 8u);
  prompt.resize(1);
  EXPECT_EQ(r->LongestCommonPrefix(prompt), 1u);
  prompt = q.tokens;
  prompt[20] = 1;  // differs in the last token only
  EXPECT_EQ(r->LongestCommonPrefix(prompt), 20u);

  // An empty file.
  std::unique_ptr<Writer> w;
  ASSERT_OK(Writer::Create(Path("empty.kv"), g, kIdentity, Options(8), &w));
  ASSERT_OK(w->Close());
  ASSERT_OK(Reader::Open(Path("empty.kv"), {}, &r));
  EXPECT_EQ(r->token_count(), 0u);
  EXPECT_TRUE(r->chunks().empty());
  EXPECT_EQ(r->LongestCommonPrefix(q.tokens), 0u);
  EXPECT_EQ(r->LongestCommonPrefix({}), 0u);
  EXPECT_EQ(FileSize(Path("empty.kv")), format::kDataOffset);
  Bytes out(16, 0x11);
  ASSERT_OK(r->ReadRows(0, 0, 0, 0, Dtype::kF32, out.data()));
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](uint8_t c) { return c == 0x11; }));
  EXPECT_TRUE(HasCode(r->ReadRows(0, 0, 0, 1, Dtype::kF32, out.data()), Code::kInvalidArgument));
}

// ---- Create ----------------------------------------------------------------------------------

TEST_F(KvFileTest, CreateRefusesAnExistingPathUnlessOverwrite) {
  Geometry g = Preset("tiny", Dtype::kE4M3);
  Sequence q = MakeSequence(g, Dtype::kBF16, 5);
  WriteSequence(Path(), q, Options(8), {5});
  const Bytes original = ReadFileBytes(Path());
  std::unique_ptr<Writer> w;
  EXPECT_TRUE(HasCode(Writer::Create(Path(), g, kIdentity, Options(8), &w), Code::kInvalidArgument,
                      {Path(), "exists"}));
  EXPECT_EQ(w, nullptr);
  EXPECT_TRUE(ReadFileBytes(Path()) == original);
  EXPECT_EQ(ListDir(dir_), (std::vector<std::string>{"a.kv"}));

  // Not a kvfile at all: still refused, still untouched.
  { std::ofstream(Path("notes.txt")) << "hello"; }
  EXPECT_TRUE(HasCode(Writer::Create(Path("notes.txt"), g, kIdentity, Options(8), &w),
                      Code::kInvalidArgument));
  EXPECT_EQ(ReadFileBytes(Path("notes.txt")), (Bytes{'h', 'e', 'l', 'l', 'o'}));

  // overwrite: replaced by a new, empty file.
  WriterOptions o = Options(4);
  o.overwrite = true;
  ASSERT_OK(Writer::Create(Path("fresh.kv"), g, kIdentity, o, &w));  // nothing to replace
  ASSERT_OK(w->Close());
  std::filesystem::remove(Path("fresh.kv"));
  hooks::SetWriterSalt(77);
  ASSERT_OK(Writer::Create(Path(), g, kIdentity, o, &w));
  EXPECT_EQ(ListDir(dir_), (std::vector<std::string>{"a.kv", "notes.txt"}));
  ASSERT_OK(w->Append(Batch(q, 0, 2)));
  ASSERT_OK(w->Close());
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(Path(), {}, &r));
  EXPECT_EQ(r->token_count(), 2u);
  EXPECT_EQ(r->salt(), 77u);
  EXPECT_EQ(r->nominal_chunk_tokens(), 4u);
}

TEST_F(KvFileTest, CreateLeavesNoTemporaryFile) {
  Geometry g = Preset("tiny", Dtype::kE4M3);
  Sequence q = MakeSequence(g, Dtype::kBF16, 9);
  std::unique_ptr<Writer> w;
  ASSERT_OK(Writer::Create(Path(), g, kIdentity, Options(4), &w));
  EXPECT_EQ(ListDir(dir_), (std::vector<std::string>{"a.kv"}));
  EXPECT_EQ(FileSize(Path()), format::kDataOffset);  // header and commit slots are in place
  {
    std::unique_ptr<Reader> r;  // a new file is valid (and empty) from the start
    ASSERT_OK(Reader::Open(Path(), {}, &r));
    EXPECT_EQ(r->token_count(), 0u);
  }
  ASSERT_OK(w->Append(Batch(q, 0, 9)));
  ASSERT_OK(w->Close());
  EXPECT_EQ(ListDir(dir_), (std::vector<std::string>{"a.kv"}));

  // A leftover of a crashed create is removed and does not block.
  { std::ofstream(Path("b.kv.kvnew")) << "partial header"; }
  ASSERT_OK(Writer::Create(Path("b.kv"), g, kIdentity, Options(4), &w));
  ASSERT_OK(w->Close());
  EXPECT_EQ(ListDir(dir_), (std::vector<std::string>{"a.kv", "b.kv"}));

  // Refused creates leave nothing behind either.
  Geometry bad = g;
  bad.layers = 0;
  EXPECT_TRUE(HasCode(Writer::Create(Path("c.kv"), bad, kIdentity, Options(4), &w), Code::kInvalidArgument,
                      {"layer count"}));
  EXPECT_TRUE(HasCode(Writer::Create(Path("c.kv"), g, kIdentity, Options(0), &w), Code::kInvalidArgument,
                      {"chunk tokens"}));
  ModelIdentity long_id{std::string(256, 'x'), 1};
  EXPECT_TRUE(HasCode(Writer::Create(Path("c.kv"), g, long_id, Options(4), &w), Code::kInvalidArgument,
                      {"model id"}));
  EXPECT_TRUE(HasCode(Writer::Create(dir_ + "/no/such/dir/c.kv", g, kIdentity, Options(4), &w),
                      Code::kNotFound));
  // A chunk of 65536 llama tokens would exceed 1 GiB.
  EXPECT_TRUE(HasCode(Writer::Create(Path("c.kv"), Preset("llama-3.1-8b"), kIdentity, Options(65536), &w),
                      Code::kInvalidArgument, {"1 GiB"}));
  EXPECT_EQ(ListDir(dir_), (std::vector<std::string>{"a.kv", "b.kv"}));
}

TEST_F(KvFileTest, SecondCreateWhileTheFirstWriterIsOpenIsBusy) {
  Geometry g = Preset("tiny", Dtype::kE4M3);
  Sequence q = MakeSequence(g, Dtype::kBF16, 6);
  std::unique_ptr<Writer> first;
  ASSERT_OK(Writer::Create(Path(), g, kIdentity, Options(4), &first));
  ASSERT_OK(first->Append(Batch(q, 0, 5)));
  WriterOptions o = Options(4);
  o.overwrite = true;
  std::unique_ptr<Writer> second;
  EXPECT_TRUE(HasCode(Writer::Create(Path(), g, kIdentity, o, &second), Code::kBusy));
  EXPECT_EQ(second, nullptr);
  EXPECT_EQ(ListDir(dir_), (std::vector<std::string>{"a.kv"}));
  // The first writer is unaffected.
  ASSERT_OK(first->Append(Batch(q, 5, 1)));
  ASSERT_OK(first->Close());
  CheckFile(Path(), q, ComputeExpected(q), 4, true);
  // Once it is closed the path can be replaced.
  ASSERT_OK(Writer::Create(Path(), g, kIdentity, o, &second));
  ASSERT_OK(second->Close());
}

TEST_F(KvFileTest, WriterLifecycle) {
  Geometry g = Preset("tiny", Dtype::kE4M3);
  Sequence q = MakeSequence(g, Dtype::kBF16, 6);
  {
    std::unique_ptr<Writer> w;
    ASSERT_OK(Writer::Create(Path(), g, kIdentity, Options(4), &w));
    EXPECT_EQ(w->path(), Path());
    EXPECT_EQ(w->geometry(), g);
    ASSERT_OK(w->Append(AppendBatch{{}, {}}));  // no tokens: nothing to do
    EXPECT_EQ(w->token_count(), 0u);
    ASSERT_OK(w->Append(Batch(q, 0, 6)));
    // Destroyed without Close(): closes with Close()'s durability.
  }
  CheckFile(Path(), q, ComputeExpected(q), 4, true);
  std::unique_ptr<Writer> w;
  WriterOptions o = Options(4);
  o.overwrite = true;
  ASSERT_OK(Writer::Create(Path(), g, kIdentity, o, &w));
  ASSERT_OK(w->Close());
  ASSERT_OK(w->Close());  // a second Close is harmless
  EXPECT_TRUE(HasCode(w->Append(Batch(q, 0, 1)), Code::kFailed, {"closed"}));
  EXPECT_TRUE(HasCode(w->Flush(), Code::kFailed));
  EXPECT_TRUE(HasCode(w->Sync(), Code::kFailed));
}

// ---- sync modes and durability -----------------------------------------------------------------

TEST_F(KvFileTest, SyncNoneFileReadsBackUncommitted) {
  Geometry g = Preset("tiny", Dtype::kE5M2);
  Sequence q = MakeSequence(g, Dtype::kF16, 20);
  std::unique_ptr<Writer> w;
  ASSERT_OK(Writer::Create(Path(), g, kIdentity, Options(8, SyncMode::kNone), &w));
  for (uint64_t t = 0; t < q.n; ++t) {
    ASSERT_OK(w->Append(Batch(q, t, 1)));
    EXPECT_EQ(w->durable_tokens(), 0u);
  }
  ASSERT_OK(w->Close());
  EXPECT_EQ(w->durable_tokens(), 0u);
  // The commit record still describes the empty file.
  Bytes f = ReadFileBytes(Path());
  for (int slot = 0; slot < 2; ++slot) {
    format::CommitRecord c;
    ASSERT_OK(format::DecodeCommitRecord(
        std::span<const uint8_t, 4096>(f.data() + 4096 * (slot + 1), 4096), &c));
    EXPECT_EQ(c.tokens, 0u);
    EXPECT_EQ(c.chunks, 0u);
    EXPECT_EQ(c.end, format::kDataOffset);
  }
  CheckFile(Path(), q, ComputeExpected(q), 8, /*committed=*/false);
}

TEST_F(KvFileTest, SyncNoneWithExplicitSync) {
  Geometry g = Preset("tiny", Dtype::kE4M3);
  Sequence q = MakeSequence(g, Dtype::kBF16, 15);
  std::unique_ptr<Writer> w;
  ASSERT_OK(Writer::Create(Path(), g, kIdentity, Options(8, SyncMode::kNone), &w));
  ASSERT_OK(w->Append(Batch(q, 0, 10)));
  EXPECT_EQ(w->durable_tokens(), 0u);
  ASSERT_OK(w->Sync());  // flushes the 2 staged tokens as a short chunk
  EXPECT_EQ(w->durable_tokens(), 10u);
  EXPECT_EQ(w->token_count(), 10u);
  ASSERT_OK(w->Append(Batch(q, 10, 5)));
  EXPECT_EQ(w->durable_tokens(), 10u);
  ASSERT_OK(w->Close());
  EXPECT_EQ(w->durable_tokens(), 10u);
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(Path(), {}, &r));
  ASSERT_EQ(r->token_count(), 15u);
  ASSERT_EQ(r->chunks().size(), 3u);
  EXPECT_EQ(r->chunks()[0].stored_tokens, 8u);
  EXPECT_EQ(r->chunks()[1].stored_tokens, 2u);
  EXPECT_EQ(r->chunks()[2].stored_tokens, 5u);
  EXPECT_TRUE(r->chunks()[0].committed);
  EXPECT_TRUE(r->chunks()[1].committed);
  EXPECT_FALSE(r->chunks()[2].committed);
  EXPECT_EQ(r->chunks()[2].first_token, 10u);
  Expected e = ComputeExpected(q);
  for (uint32_t layer = 0; layer < 2; ++layer)
    for (uint32_t s = 0; s < 2; ++s) {
      CheckRange(*r, q, e, layer, s, 0, 15, Dtype::kF32);
      CheckRange(*r, q, e, layer, s, 7, 11, Dtype::kBF16);  // across both short-chunk edges
    }
}

TEST_F(KvFileTest, SyncChunkMakesEveryFullChunkDurable) {
  Geometry g = Preset("tiny", Dtype::kE4M3);
  Sequence q = MakeSequence(g, Dtype::kBF16, 21);
  std::unique_ptr<Writer> w;
  ASSERT_OK(Writer::Create(Path(), g, kIdentity, Options(8, SyncMode::kChunk), &w));
  for (uint64_t t = 0; t < 12; ++t) {
    ASSERT_OK(w->Append(Batch(q, t, 1)));
    // An append is durable once a chunk holding its end is written.
    EXPECT_EQ(w->durable_tokens(), (t + 1) / 8 * 8) << t;
  }
  ASSERT_OK(w->Sync());  // the 4 staged tokens become a short, durable chunk
  EXPECT_EQ(w->durable_tokens(), 12u);
  ASSERT_OK(w->Append(Batch(q, 12, 9)));  // one full chunk (8) + 1 staged: no append ends in it
  EXPECT_EQ(w->durable_tokens(), 12u);
  ASSERT_OK(w->Append(Batch(q, 21, 0)));  // an empty append commits nothing either
  EXPECT_EQ(w->durable_tokens(), 12u);
  ASSERT_OK(w->Close());
  EXPECT_EQ(w->durable_tokens(), 21u);
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(Path(), {}, &r));
  ASSERT_EQ(r->token_count(), 21u);
  std::vector<uint32_t> stored;
  for (const ChunkInfo& c : r->chunks()) {
    stored.push_back(c.stored_tokens);
    EXPECT_TRUE(c.committed);
  }
  EXPECT_EQ(stored, (std::vector<uint32_t>{8, 4, 8, 1}));
  Expected e = ComputeExpected(q);
  for (uint32_t layer = 0; layer < 2; ++layer)
    for (uint32_t s = 0; s < 2; ++s) CheckRange(*r, q, e, layer, s, 0, 21, Dtype::kF32);
}

TEST_F(KvFileTest, SyncCloseIsDurableOnlyAfterClose) {
  Geometry g = Preset("tiny", Dtype::kE4M3);
  Sequence q = MakeSequence(g, Dtype::kBF16, 10);
  std::unique_ptr<Writer> w;
  ASSERT_OK(Writer::Create(Path(), g, kIdentity, Options(4, SyncMode::kClose), &w));
  ASSERT_OK(w->Append(Batch(q, 0, 10)));
  EXPECT_EQ(w->durable_tokens(), 0u);
  ASSERT_OK(w->Flush());  // writes the staged tokens, does not commit
  EXPECT_EQ(w->durable_tokens(), 0u);
  EXPECT_EQ(w->token_count(), 10u);
  ASSERT_OK(w->Flush());  // nothing staged: no empty chunk
  {
    std::unique_ptr<Reader> r;  // the flushed chunks are readable, not committed
    ASSERT_OK(Reader::Open(Path(), {}, &r));
    EXPECT_EQ(r->token_count(), 10u);
    EXPECT_EQ(r->chunks().size(), 3u);
    for (const ChunkInfo& c : r->chunks()) EXPECT_FALSE(c.committed);
  }
  ASSERT_OK(w->Close());
  EXPECT_EQ(w->durable_tokens(), 10u);
  CheckFile(Path(), q, ComputeExpected(q), 4, true);
}

// ---- truncation ---------------------------------------------------------------------------------

TEST_F(DamageTest, TruncatedUncommittedTailIsDropped) {
  ASSERT_NO_FATAL_FAILURE(Write(SyncMode::kNone));
  for (uint64_t cut : {uint64_t{2048}, uint64_t{10}, uint64_t{64}, uint64_t{4095}}) {
    SCOPED_TRACE(cut);
    std::filesystem::copy_file(Path(), Path("t.kv"), std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(Path("t.kv"), ChunkOffset(2) + cut);
    std::unique_ptr<Reader> r;
    ASSERT_OK(Reader::Open(Path("t.kv"), {}, &r));
    EXPECT_EQ(r->token_count(), 14u);  // the last append end in chunks 0-1
    EXPECT_EQ(r->chunks().size(), 2u);
    EXPECT_EQ(r->tail().valid_end, ChunkOffset(2));
    EXPECT_EQ(r->tail().file_size, ChunkOffset(2) + cut);
    EXPECT_EQ(r->tail().torn_tail_bytes, cut);
    EXPECT_FALSE(r->tail().torn_reason.empty());
    for (uint32_t s = 0; s < 2; ++s) CheckRange(*r, q_, e_, 1, s, 0, 14, Dtype::kF32);
  }
  // Cut exactly at a chunk boundary: nothing torn.
  std::filesystem::resize_file(Path(), ChunkOffset(2));
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(Path(), {}, &r));
  EXPECT_EQ(r->token_count(), 14u);
  EXPECT_EQ(r->tail().torn_tail_bytes, 0u);
}

TEST_F(DamageTest, TruncatedFixedRegionFailsOpen) {
  ASSERT_NO_FATAL_FAILURE(Write(SyncMode::kClose));
  for (uint64_t size : {uint64_t{12287}, uint64_t{5000}}) {
    SCOPED_TRACE(size);
    std::filesystem::copy_file(Path(), Path("t.kv"), std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(Path("t.kv"), size);
    std::unique_ptr<Reader> r;
    EXPECT_TRUE(HasCode(Reader::Open(Path("t.kv"), {}, &r), Code::kCorruption, {"truncated"}));
  }
}

// Cut inside the committed region: the reader returns the whole chunks
// before the cut and records what the commit record vouched for.
TEST_F(DamageTest, TruncatedCommittedRegionReadsAsTheWholeChunksBefore) {
  ASSERT_NO_FATAL_FAILURE(Write(SyncMode::kClose));
  std::unique_ptr<Reader> whole;
  ASSERT_OK(Reader::Open(Path(), {}, &whole));
  uint64_t committed_end = whole->tail().file_size;
  struct Case { uint64_t size, tokens, valid_end; };
  for (Case c : {Case{ChunkOffset(2) + 2048, 16, ChunkOffset(2)}, Case{ChunkOffset(1) + 100, 8, ChunkOffset(1)},
                 Case{ChunkOffset(2), 16, ChunkOffset(2)}, Case{ChunkOffset(0), 0, ChunkOffset(0)}}) {
    SCOPED_TRACE(c.size);
    std::filesystem::copy_file(Path(), Path("t.kv"), std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(Path("t.kv"), c.size);
    std::unique_ptr<Reader> r;
    ASSERT_OK(Reader::Open(Path("t.kv"), {}, &r));
    EXPECT_EQ(r->token_count(), c.tokens);
    EXPECT_TRUE(std::equal(r->tokens().begin(), r->tokens().end(), whole->tokens().begin()));
    EXPECT_TRUE(r->tail().committed_data_missing);
    EXPECT_EQ(r->tail().valid_end, c.valid_end);
    EXPECT_EQ(r->tail().torn_tail_bytes, c.size - c.valid_end);
    EXPECT_EQ(r->tail().committed_tokens_missing, whole->token_count() - c.tokens);
    EXPECT_EQ(r->tail().committed_bytes_missing, committed_end - c.size);
    if (c.tokens > 0) CheckRange(*r, q_, e_, 1, 0, 0, c.tokens, Dtype::kF32);
    VerifyReport rep;
    ASSERT_OK(VerifyFile(Path("t.kv"), {}, &rep));
    ASSERT_EQ(rep.findings.size(), 1u);
    EXPECT_TRUE(rep.findings[0].error);
    EXPECT_EQ(rep.findings[0].offset, static_cast<int64_t>(c.size));
    EXPECT_NE(rep.findings[0].message.find("file truncated: committed data missing"), std::string::npos)
        << rep.findings[0].message;
  }
}

// A writer must not drop acknowledged tokens behind the caller's back.
TEST_F(DamageTest, WriterRefusesAFileCutInsideCommittedData) {
  ASSERT_NO_FATAL_FAILURE(Write(SyncMode::kClose));
  std::filesystem::resize_file(Path(), ChunkOffset(1) + 100);
  Bytes before = ReadFileBytes(Path());
  std::unique_ptr<Writer> w;
  EXPECT_TRUE(HasCode(Writer::Open(Path(), {}, &w), Code::kCorruption,
                      {"file truncated", "kvfile repair --force"}));
  EXPECT_EQ(ReadFileBytes(Path()), before);
  // With the explicit option the file is cut to its prefix and recommitted.
  WriterOptions o;
  o.drop_missing_committed = true;
  ASSERT_OK(Writer::Open(Path(), o, &w));
  EXPECT_EQ(w->token_count(), 8u);
  ASSERT_OK(w->Close());
  EXPECT_EQ(std::filesystem::file_size(Path()), ChunkOffset(1));
  VerifyReport rep;
  ASSERT_OK(VerifyFile(Path(), {}, &rep));
  EXPECT_TRUE(rep.findings.empty()) << rep.findings[0].message;
  EXPECT_EQ(rep.tokens, 8u);
}

TEST_F(DamageTest, GarbageAfterTheLastChunkIsATornTail) {
  ASSERT_NO_FATAL_FAILURE(Write(SyncMode::kClose));
  Bytes zeros(5000, 0);
  PokeBytes(Path(), ChunkOffset(3), zeros.data(), zeros.size());
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(Path(), {}, &r));
  EXPECT_EQ(r->token_count(), 20u);
  EXPECT_EQ(r->tail().torn_tail_bytes, 5000u);
  EXPECT_EQ(r->tail().valid_end, ChunkOffset(3));
}


// ---- Reader::ReadMany --------------------------------------------------------------------

using Pair = std::pair<uint32_t, uint32_t>;  // (layer, stream)

std::vector<Pair> AllPairs(const Geometry& g) {
  std::vector<Pair> pairs;
  for (uint32_t layer = 0; layer < g.layers; ++layer)
    for (uint32_t s = 0; s < g.streams.size(); ++s) pairs.push_back({layer, s});
  return pairs;
}

// Every kind a stream can be stored as, several rows per token, odd widths.
Geometry MixedGeometry() {
  Geometry g;
  g.layers = 4;
  g.streams = {{"k", 2, 16, Dtype::kE4M3}, {"v", 1, 8, Dtype::kE5M2}, {"idx", 1, 12, Dtype::kBF16},
               {"h", 1, 5, Dtype::kF16}, {"f", 3, 3, Dtype::kF32}};
  return g;
}

const Dtype kOutDtypes[] = {Dtype::kBF16, Dtype::kF16, Dtype::kF32};
const unsigned kThreadCounts[] = {1, 2, 3, 8};
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
void ExpectReadManyMatchesReadRows(Reader& r, const std::vector<Pair>& pairs, uint64_t begin, uint64_t end,
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
std::vector<std::pair<uint64_t, uint64_t>> RangesOverChunks(const Reader& r) {
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
void CheckReadManyOverChunks(Reader& r, const Sequence& q, const Expected& e) {
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

TEST_F(ReadManyTest, EqualsReadRowsOverEveryRangeAndThreadCount) {
  ASSERT_NO_FATAL_FAILURE(Write());
  auto r = Open(Path());
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(r->chunks().size(), 5u);
  ASSERT_EQ(r->chunks().back().stored_tokens, 5u);
  CheckReadManyOverChunks(*r, q_, e_);
}

// The big mixed preset: fp8 latent and rope beside the raw bf16 indexer.
TEST_F(ReadManyTest, DsaMixedPreset) {
  for (Dtype fp8 : {Dtype::kE4M3, Dtype::kE5M2}) {
    SCOPED_TRACE(DtypeName(fp8));
    Sequence q = MakeSequence(Preset("dsa-mixed", fp8), Dtype::kF32, 11, 4);
    Expected e = ComputeExpected(q);
    WriteSequence(Path(), q, Options(4, SyncMode::kNone), Sizes(Schedule::kMixed, q.n, 4));
    auto r = Open(Path());
    ASSERT_NE(r, nullptr);
    for (auto [b, end] : std::vector<std::pair<uint64_t, uint64_t>>{{0, 11}, {3, 9}, {4, 8}, {9, 11}})
      ASSERT_NO_FATAL_FAILURE(ExpectReadManyMatchesReadRows(*r, AllPairs(q.g), b, end, kOutDtypes[(b + end) % 3]));
    // One independent check that the reference is right.
    Bytes want = ExpectedRows(q, e, 60, 2, 0, 11, Dtype::kBF16);
    Bytes got(want.size());
    ASSERT_OK(r->ReadRows(60, 2, 0, 11, Dtype::kBF16, got.data()));
    ASSERT_TRUE(got == want);
    r.reset();
    std::filesystem::remove(Path());
  }
}

// `a` with tokens and rows from `at` on replaced by those of `b`.
Sequence Splice(const Sequence& a, const Sequence& b, uint64_t at) {
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

// Rewinds cut chunks on disk: their dead tokens (still stored, replaced by
// later appends) must never be read.
TEST_F(ReadManyTest, RewoundFileWithDeadTokens) {
  const Geometry g = MixedGeometry();
  Sequence q1 = MakeSequence(g, Dtype::kF16, 35, 1);
  Sequence q2 = Splice(q1, MakeSequence(g, Dtype::kF16, 35, 2), 13);
  Sequence q3 = Splice(q2, MakeSequence(g, Dtype::kF16, 35, 3), 25);
  {
    std::unique_ptr<Writer> w;
    ASSERT_OK(Writer::Create(Path(), g, kIdentity, Options(8), &w));
    ASSERT_OK(w->Append(Batch(q1, 0, 30)));  // chunks [0,8) [8,16) [16,24) on disk
    ASSERT_OK(w->Rewind(13));
    ASSERT_OK(w->Append(Batch(q2, 13, 17)));  // [13,21) [21,29) on disk
    ASSERT_OK(w->Rewind(25));
    ASSERT_OK(w->Append(Batch(q3, 25, 10)));
    ASSERT_OK(w->Close());
  }
  auto r = Open(Path());
  ASSERT_NE(r, nullptr);
  ASSERT_TRUE(std::equal(r->tokens().begin(), r->tokens().end(), q3.tokens.begin(), q3.tokens.end()));
  std::vector<std::pair<uint32_t, uint32_t>> shape;  // (stored, live) per chunk
  for (const ChunkInfo& c : r->chunks()) shape.push_back({c.stored_tokens, c.live_tokens});
  const std::vector<std::pair<uint32_t, uint32_t>> want_shape = {{8, 8}, {8, 5}, {8, 8}, {8, 4}, {8, 8}, {2, 2}};
  ASSERT_EQ(shape, want_shape);
  CheckReadManyOverChunks(*r, q3, ComputeExpected(q3));
}

TEST_F(ReadManyTest, SubsetsOfTargetsInAnyOrder) {
  ASSERT_NO_FATAL_FAILURE(Write());
  auto r = Open(Path());
  ASSERT_NE(r, nullptr);
  std::vector<Pair> all = AllPairs(q_.g);
  std::vector<Pair> reversed(all.rbegin(), all.rend());
  const std::vector<std::vector<Pair>> subsets = {
      {{2, 0}, {2, 1}, {2, 2}, {2, 3}, {2, 4}},  // one layer
      {{0, 1}, {3, 1}},                          // non-adjacent layers, one stream
      {{3, 4}, {0, 2}, {1, 0}},                  // scattered, out of order
      {{1, 3}},
      reversed,
  };
  for (const auto& pairs : subsets)
    for (auto [b, end] : std::vector<std::pair<uint64_t, uint64_t>>{{0, 37}, {3, 30}, {16, 17}})
      ASSERT_NO_FATAL_FAILURE(ExpectReadManyMatchesReadRows(*r, pairs, b, end, kOutDtypes[b % 3]));
}

TEST_F(ReadManyTest, EmptyRangeAndNoTargets) {
  ASSERT_NO_FATAL_FAILURE(Write());
  auto r = Open(Path());
  ASSERT_NE(r, nullptr);
  for (unsigned threads : kThreadCounts) {
    for (uint64_t at : {uint64_t{0}, uint64_t{8}, uint64_t{20}, uint64_t{37}}) {
      Destinations d(q_.g, AllPairs(q_.g), 1, Dtype::kF32);  // room for a token, none read
      ASSERT_OK(r->ReadMany(d.targets, at, at, Dtype::kF32, threads));
      for (const Bytes& b : d.bufs)
        ASSERT_TRUE(std::all_of(b.begin(), b.end(), [](uint8_t c) { return c == kFill; })) << at;
    }
    ASSERT_OK(r->ReadMany({}, 0, 37, Dtype::kBF16, threads));
    ASSERT_OK(r->ReadMany({}, 5, 5, Dtype::kF16, threads));
    // No target does not make a bad argument good.
    EXPECT_TRUE(HasCode(r->ReadMany({}, 30, 38, Dtype::kF32, threads), Code::kInvalidArgument,
                        {Path(), "token range [30, 38)"}));
    EXPECT_TRUE(HasCode(r->ReadMany({}, 9, 8, Dtype::kF32, threads), Code::kInvalidArgument,
                        {Path(), "token range [9, 8)"}));
    EXPECT_TRUE(HasCode(r->ReadMany({}, 0, 37, Dtype::kE4M3, threads), Code::kInvalidArgument,
                        {Path(), "decoded reads produce"}));
  }
}

TEST_F(ReadManyTest, InvalidArgumentsLeaveEveryDestinationAlone) {
  ASSERT_NO_FATAL_FAILURE(Write());
  auto r = Open(Path());
  ASSERT_NE(r, nullptr);
  struct Case {
    const char* what;
    uint32_t layer, stream;  // of the last target
    bool null_dst;
    uint64_t begin, end;
    Dtype out;
    const char* needle;
  };
  const Case cases[] = {
      {"layer", 4, 0, false, 0, 37, Dtype::kF32, "layer 4 out of range"},
      {"stream", 1, 5, false, 0, 37, Dtype::kF32, "stream 5 out of range"},
      {"past the end", 0, 0, false, 30, 38, Dtype::kF32, "token range [30, 38)"},
      {"reversed", 0, 0, false, 9, 8, Dtype::kF32, "token range [9, 8)"},
      {"e4m3", 0, 0, false, 0, 37, Dtype::kE4M3, "decoded reads produce"},
      {"e5m2", 0, 0, false, 0, 37, Dtype::kE5M2, "decoded reads produce"},
      {"null", 2, 2, true, 0, 37, Dtype::kF32, "without a destination"},
  };
  for (const Case& c : cases) {
    for (unsigned threads : {1u, 2u}) {
      SCOPED_TRACE(std::string(c.what) + ", threads " + std::to_string(threads));
      std::vector<Pair> pairs = AllPairs(q_.g);
      pairs.push_back({c.layer, c.stream});
      // Room for the whole file as f32, whatever the case asks for.
      std::vector<Bytes> bufs;
      std::vector<RowsTarget> targets;
      for (size_t i = 0; i < pairs.size(); ++i) bufs.emplace_back(37 * 6 * 16 * 4, kFill);
      for (size_t i = 0; i < pairs.size(); ++i) targets.push_back({pairs[i].first, pairs[i].second, bufs[i].data()});
      if (c.null_dst) targets.back().dst = nullptr;
      EXPECT_TRUE(HasCode(r->ReadMany(targets, c.begin, c.end, c.out, threads), Code::kInvalidArgument,
                          {Path(), c.needle}));
      for (size_t i = 0; i < bufs.size(); ++i)
        ASSERT_TRUE(std::all_of(bufs[i].begin(), bufs[i].end(), [](uint8_t b) { return b == kFill; })) << i;
    }
  }
}

// Flips one byte of (layer, stream)'s section in chunk `chunk` of `path`.
void DamageSection(const std::string& path, const Reader& r, size_t chunk, uint32_t layer, uint32_t stream,
                   uint64_t byte) {
  const ChunkInfo& c = r.chunks()[chunk];
  ChunkLayout layout;
  ASSERT_OK(ComputeChunkLayout(r.geometry(), c.stored_tokens, &layout));
  ASSERT_LT(byte, layout.section(layer, stream).data_bytes);
  XorByte(path, c.offset + layout.section(layer, stream).offset + byte, 0x20);
}

// ReadMany of every pair over [begin, end) fails naming `chunk`, and leaves
// every destination zero (and the byte past it alone).
void ExpectReadManyFailsAndZeroes(Reader& r, uint64_t begin, uint64_t end, size_t chunk,
                                  std::initializer_list<std::string> needles) {
  std::string where = "chunk " + std::to_string(chunk) + " at offset " + std::to_string(r.chunks()[chunk].offset);
  for (unsigned threads : {1u, 2u, 8u}) {
    for (Dtype out : kOutDtypes) {
      SCOPED_TRACE("[" + std::to_string(begin) + ", " + std::to_string(end) + ") threads " +
                   std::to_string(threads) + " as " + DtypeName(out));
      Destinations d(r.geometry(), AllPairs(r.geometry()), end - begin, out);
      Status st = r.ReadMany(d.targets, begin, end, out, threads);
      EXPECT_TRUE(HasCode(st, Code::kCorruption, {r.path(), where}));
      for (const std::string& n : needles) EXPECT_NE(st.message().find(n), std::string::npos) << st.message();
      for (size_t i = 0; i < d.bufs.size(); ++i) {
        ASSERT_TRUE(std::all_of(d.bufs[i].begin(), d.bufs[i].end() - 1, [](uint8_t b) { return b == 0; }))
            << "target " << i << " not zero-filled";
        ASSERT_EQ(d.bufs[i].back(), kFill) << "target " << i;
      }
    }
  }
}

TEST_F(ReadManyTest, DamagedChunkFailsNamingItAndZeroFillsEveryDestination) {
  ASSERT_NO_FATAL_FAILURE(Write());
  const std::string bad = Path("bad.kv");
  std::filesystem::copy_file(Path(), bad);
  {
    auto clean = Open(Path());
    ASSERT_NE(clean, nullptr);
    DamageSection(bad, *clean, 2, 1, 2, 5);  // chunk 2 [16,24), layer 1, raw bf16 'idx'
  }
  auto r = Open(bad);  // payloads are checked on read
  ASSERT_NE(r, nullptr);
  ExpectReadManyFailsAndZeroes(*r, 0, 37, 2, {"layer 1", "stream 'idx'", "checksum"});
  ExpectReadManyFailsAndZeroes(*r, 15, 17, 2, {"layer 1", "stream 'idx'"});
  ExpectReadManyFailsAndZeroes(*r, 23, 37, 2, {"layer 1", "stream 'idx'"});
  // Ranges and targets that do not need the damaged section still read.
  auto clean = Open(Path());
  ASSERT_NE(clean, nullptr);
  for (auto [b, end] : std::vector<std::pair<uint64_t, uint64_t>>{{0, 16}, {24, 37}, {3, 16}}) {
    for (unsigned threads : kThreadCounts) {
      Destinations want(q_.g, AllPairs(q_.g), end - b, Dtype::kBF16);
      Destinations got(q_.g, AllPairs(q_.g), end - b, Dtype::kBF16);
      ASSERT_OK(clean->ReadMany(want.targets, b, end, Dtype::kBF16, threads));
      ASSERT_OK(r->ReadMany(got.targets, b, end, Dtype::kBF16, threads));
      ASSERT_TRUE(got.bufs == want.bufs);
    }
  }
  std::vector<Pair> others = AllPairs(q_.g);
  std::erase(others, Pair{1, 2});
  ASSERT_NO_FATAL_FAILURE(ExpectReadManyMatchesReadRows(*r, others, 0, 37, Dtype::kF32));

  // Damage in a second, later chunk (the short last one, an fp8 section):
  // the first damaged chunk is the one named, whatever the thread count.
  DamageSection(bad, *r, 4, 3, 0, 40);
  r = Open(bad);
  ASSERT_NE(r, nullptr);
  ExpectReadManyFailsAndZeroes(*r, 0, 37, 2, {"layer 1", "stream 'idx'"});
  ExpectReadManyFailsAndZeroes(*r, 20, 37, 2, {"layer 1", "stream 'idx'"});
  ExpectReadManyFailsAndZeroes(*r, 24, 37, 4, {"layer 3", "stream 'k'"});
  ExpectReadManyFailsAndZeroes(*r, 36, 37, 4, {"layer 3", "stream 'k'"});
}

// A value the checksum cannot see (resealed): the check of codes and scales
// fails the read too.
TEST_F(ReadManyTest, InvalidCodeWithValidChecksumFailsTheRead) {
  ASSERT_NO_FATAL_FAILURE(Write());
  auto r = Open(Path());
  ASSERT_NE(r, nullptr);
  const ChunkInfo c = r->chunks()[1];
  ChunkLayout layout;
  ASSERT_OK(ComputeChunkLayout(q_.g, c.stored_tokens, &layout));
  uint8_t nan_code = 0x7F;  // e4m3 NaN; token 10, row 1 of layer 0 'k'
  PokeBytes(Path(), c.offset + layout.section(0, 0).offset + (2 * 2 + 1) * 16 + 3, &nan_code, 1);
  Reseal(Path(), c.offset, layout);
  r = Open(Path());
  ASSERT_NE(r, nullptr);
  ExpectReadManyFailsAndZeroes(*r, 0, 37, 1, {"layer 0", "stream 'k'", "non-finite code at token 10"});
  ExpectReadManyFailsAndZeroes(*r, 10, 11, 1, {"non-finite code at token 10"});
}

// ---- Reader::ReadManyCodes ----------------------------------------------------------------

// The fp8 pairs of a geometry (the streams ReadManyCodes reads in a v2 file).
std::vector<Pair> Fp8Pairs(const Geometry& g) {
  std::vector<Pair> pairs;
  for (auto [layer, s] : AllPairs(g))
    if (format::IsFp8(g.streams[s].dtype)) pairs.push_back({layer, s});
  return pairs;
}

// Codes and scales of `pairs` over [begin, end), as ReadCodes gives them,
// with a spare byte past each end (kFill) that no read may touch.
struct CodeDestinations {
  std::vector<Bytes> codes, scales;
  std::vector<CodesTarget> targets;
  CodeDestinations(const Geometry& g, const std::vector<Pair>& pairs, uint64_t tokens) {
    for (auto [layer, s] : pairs) {
      codes.emplace_back(tokens * g.streams[s].ElementsPerToken() + 1, kFill);
      scales.emplace_back(tokens * g.streams[s].rows_per_token * 4 + 1, kFill);
    }
    for (size_t i = 0; i < pairs.size(); ++i)
      targets.push_back({pairs[i].first, pairs[i].second, codes[i].data(), reinterpret_cast<float*>(scales[i].data())});
  }
};

TEST_F(ReadManyTest, CodesEqualReadCodesOverEveryRangeAndThreadCount) {
  ASSERT_NO_FATAL_FAILURE(Write());
  auto r = Open(Path());
  ASSERT_NE(r, nullptr);
  const std::vector<Pair> pairs = Fp8Pairs(q_.g);
  ASSERT_EQ(pairs.size(), 8u);
  auto ranges = RangesOverChunks(*r);
  ranges.push_back({5, 5});
  for (auto [b, end] : ranges) {
    SCOPED_TRACE("[" + std::to_string(b) + ", " + std::to_string(end) + ")");
    CodeDestinations want(q_.g, pairs, end - b);
    for (size_t i = 0; i < pairs.size(); ++i)
      ASSERT_OK(r->ReadCodes(pairs[i].first, pairs[i].second, b, end, want.codes[i].data(),
                             reinterpret_cast<float*>(want.scales[i].data())));
    for (unsigned threads : kThreadCounts) {
      CodeDestinations got(q_.g, pairs, end - b);
      ASSERT_OK(r->ReadManyCodes(got.targets, b, end, threads));
      ASSERT_TRUE(got.codes == want.codes && got.scales == want.scales) << "threads " << threads;
    }
  }
  // A raw stream has no codes: refused before anything is read.
  CodeDestinations got(q_.g, {{0, 0}, {1, 2}}, 37);
  Status st = r->ReadManyCodes(got.targets, 0, 37, 2);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("stream 'idx' is stored raw (bf16)"), std::string::npos) << st.ToString();
  EXPECT_TRUE(got.codes[0] == Bytes(got.codes[0].size(), kFill));
}

TEST_F(ReadManyTest, CodesOfADamagedChunkFailNamingItAndZeroFill) {
  ASSERT_NO_FATAL_FAILURE(Write());
  {
    auto clean = Open(Path());
    ASSERT_NE(clean, nullptr);
    DamageSection(Path(), *clean, 4, 3, 0, 40);  // the short last chunk, layer 3 'k'
  }
  auto r = Open(Path());
  ASSERT_NE(r, nullptr);
  for (unsigned threads : kThreadCounts) {
    CodeDestinations got(q_.g, Fp8Pairs(q_.g), 37);
    Status st = r->ReadManyCodes(got.targets, 0, 37, threads);
    EXPECT_EQ(st.code(), Status::Code::kCorruption);
    for (const char* part : {"chunk 4", "layer 3", "stream 'k'"})
      EXPECT_NE(st.message().find(part), std::string::npos) << st.ToString();
    for (size_t i = 0; i < got.codes.size(); ++i) {
      EXPECT_TRUE(std::all_of(got.codes[i].begin(), got.codes[i].end() - 1, [](uint8_t b) { return b == 0; }));
      EXPECT_TRUE(std::all_of(got.scales[i].begin(), got.scales[i].end() - 1, [](uint8_t b) { return b == 0; }));
      EXPECT_EQ(got.codes[i].back(), kFill);
    }
  }
  CodeDestinations got(q_.g, Fp8Pairs(q_.g), 32);
  ASSERT_OK(r->ReadManyCodes(got.targets, 0, 32, 3));  // the chunks before it still read
}

// ---- VerifyFile with worker threads ------------------------------------------------------------

std::string Describe(const std::vector<VerifyFinding>& findings) {
  std::string s;
  for (const VerifyFinding& f : findings)
    s += (f.error ? "error" : "warning") + std::string(" chunk ") + std::to_string(f.chunk) + " offset " +
         std::to_string(f.offset) + ": " + f.message + "\n";
  return s;
}

VerifyReport Verify(const std::string& path, unsigned threads, bool quick = false) {
  VerifyOptions o;
  o.threads = threads;
  o.quick = quick;
  VerifyReport rep;
  Status st = VerifyFile(path, o, &rep);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(rep.opened);
  return rep;
}

class VerifyThreadsTest : public KvFileTest {
 protected:
  // tiny, 203 tokens in chunks of 4: 51 chunks of 4096 bytes, the last short.
  void Write() {
    q_ = MakeSequence(Preset("tiny"), Dtype::kBF16, 203, 8);
    WriteSequence(Path(), q_, Options(4), Sizes(Schedule::kMixed, q_.n, 4));
    ASSERT_OK(Reader::Open(Path(), {}, &r_));
    ASSERT_EQ(r_->chunks().size(), 51u);
  }
  Sequence q_;
  std::unique_ptr<Reader> r_;
};

TEST_F(VerifyThreadsTest, CleanFileHasNoFindings) {
  ASSERT_NO_FATAL_FAILURE(Write());
  for (unsigned threads : {0u, 1u, 2u, 4u, 64u}) {
    for (bool quick : {false, true}) {
      SCOPED_TRACE(std::to_string(threads) + (quick ? " quick" : ""));
      VerifyReport rep = Verify(Path(), threads, quick);
      EXPECT_EQ(rep.findings.size(), 0u) << Describe(rep.findings);
      EXPECT_EQ(rep.tokens, 203u);
      EXPECT_EQ(rep.chunks, 51u);
      EXPECT_EQ(rep.bytes, FileSize(Path()));
      EXPECT_EQ(rep.valid_end, FileSize(Path()));
    }
  }
}

TEST_F(VerifyThreadsTest, FindingsAreTheSameInChunkOrderWhateverTheThreadCount) {
  ASSERT_NO_FATAL_FAILURE(Write());
  // Checksum damage in chunks 7 and 41 (a code, a scale), an invalid code
  // under a valid checksum in chunk 23, and a torn tail.
  DamageSection(Path(), *r_, 41, 1, 1, 3);
  DamageSection(Path(), *r_, 7, 0, 0, 60);
  ChunkLayout layout;
  ASSERT_OK(ComputeChunkLayout(q_.g, 4, &layout));
  XorByte(Path(), r_->chunks()[41].offset + layout.section(0, 1).scales_offset + 1, 0x04);
  const uint64_t c23 = r_->chunks()[23].offset;
  uint8_t nan_code = 0xFF;
  PokeBytes(Path(), c23 + layout.section(1, 0).offset + 2 * 32 + 5, &nan_code, 1);  // token 94
  Reseal(Path(), c23, layout);
  Bytes garbage(100, 0x42);
  PokeBytes(Path(), FileSize(Path()), garbage.data(), garbage.size());

  VerifyReport one = Verify(Path(), 1);
  ASSERT_EQ(one.findings.size(), 4u) << Describe(one.findings);
  const int64_t want_chunks[] = {7, 23, 41, 51};
  for (size_t i = 0; i < 3; ++i) {
    const VerifyFinding& f = one.findings[i];
    EXPECT_TRUE(f.error);
    EXPECT_EQ(f.chunk, want_chunks[i]);
    EXPECT_EQ(f.offset, static_cast<int64_t>(r_->chunks()[f.chunk].offset));
    EXPECT_EQ(f.message.rfind("chunk " + std::to_string(f.chunk) + " at offset " + std::to_string(f.offset), 0), 0u)
        << f.message;
  }
  EXPECT_NE(one.findings[0].message.find("layer 0 stream 'k'"), std::string::npos) << one.findings[0].message;
  EXPECT_NE(one.findings[1].message.find("non-finite code at token 94"), std::string::npos) << one.findings[1].message;
  EXPECT_NE(one.findings[2].message.find("checksum"), std::string::npos) << one.findings[2].message;
  EXPECT_FALSE(one.findings[3].error);  // the torn tail, a warning, last
  EXPECT_EQ(one.findings[3].chunk, want_chunks[3]);
  EXPECT_EQ(one.torn_tail_bytes, 100u);

  const std::string want = Describe(one.findings);
  for (unsigned threads : {2u, 4u, 16u}) {
    for (int run = 0; run < 10; ++run) {
      VerifyReport rep = Verify(Path(), threads);
      ASSERT_EQ(Describe(rep.findings), want) << "threads " << threads << ", run " << run;
    }
  }
  // quick: structure only; payload damage is not seen, the tail is.
  for (unsigned threads : {1u, 2u, 4u}) {
    VerifyReport rep = Verify(Path(), threads, /*quick=*/true);
    ASSERT_EQ(Describe(rep.findings), Describe({one.findings[3]})) << "threads " << threads;
  }
}

}  // namespace
}  // namespace kvfile
