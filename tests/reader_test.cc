// SPDX-License-Identifier: Apache-2.0
// Tests of the reader (src/reader/reader.cc): expectations at open, reads of a
// damaged section leave the buffer alone, LongestCommonPrefix, and ReadMany
// against ReadRows over every range, target set and thread count, its
// worker threads and file handles kept between calls; nvfp4
// streams (format 2.2) written and read back at the level of codes and bytes.

#include <atomic>

#include "support/forwarding_fs.h"
#include "support/kv_test_util.h"
#include "reader/reader_access.h"
#include "support/testing_hooks.h"

namespace kvfile {
namespace {

using namespace kvfile::test;

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
  ASSERT_OK(hooks::CreateWriter(Path("empty.kv"), g, kIdentity, Options(8), &w));
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
    if (IsFp8(g.streams[s].dtype)) pairs.push_back({layer, s});
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
    // ReadParts of an fp8 stream: its codes and row scales, the block
    // scales' pointer ignored.
    CodeDestinations parts(q_.g, pairs, end - b);
    uint8_t untouched = kFill;
    for (size_t i = 0; i < pairs.size(); ++i)
      ASSERT_OK(r->ReadParts(pairs[i].first, pairs[i].second, b, end,
                             {parts.codes[i].data(), &untouched, reinterpret_cast<float*>(parts.scales[i].data())}));
    EXPECT_TRUE(parts.codes == want.codes && parts.scales == want.scales);
    EXPECT_EQ(untouched, kFill);
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

// A version 1 file's codes are its raw rows quantized on read, one byte per
// element: a failed read zero-fills that many bytes of each destination,
// not as many as the stored bf16 rows hold.
TEST_F(ReadManyTest, CodesOfADamagedV1FileZeroFillOnlyTheCodes) {
  Geometry g = Preset("tiny", Dtype::kE4M3);
  for (StreamSpec& s : g.streams) s.dtype = Dtype::kBF16;
  Sequence q = MakeSequence(g, Dtype::kBF16, 12);
  WriterOptions o = Options(8);
  o.format_major = 1;
  WriteSequence(Path("v1.kv"), q, o, {12});
  {
    auto clean = Open(Path("v1.kv"));
    ASSERT_NE(clean, nullptr);
    DamageSection(Path("v1.kv"), *clean, 1, 1, 0, 5);  // chunk 1, layer 1 'k'
  }
  auto r = Open(Path("v1.kv"));
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(r->major_version(), 1);
  CodeDestinations got(g, {{0, 0}, {1, 0}, {1, 1}}, 12);
  Status st = r->ReadManyCodes(got.targets, 0, 12, 1, Dtype::kE5M2);
  EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
  for (size_t i = 0; i < got.codes.size(); ++i) {
    EXPECT_TRUE(std::all_of(got.codes[i].begin(), got.codes[i].end() - 1, [](uint8_t b) { return b == 0; }));
    EXPECT_TRUE(std::all_of(got.scales[i].begin(), got.scales[i].end() - 1, [](uint8_t b) { return b == 0; }));
    EXPECT_EQ(got.codes[i].back(), kFill) << i;
    EXPECT_EQ(got.scales[i].back(), kFill) << i;
  }
}

// ---- ReadMany's workers, kept between calls -----------------------------------------------

// The real file system, counting the opens of one path.
class CountingOpens : public testing::ForwardingFs {
 public:
  explicit CountingOpens(std::string watched) : watched_(std::move(watched)) {}
  Status Open(const std::string& path, OpenMode mode, std::unique_ptr<File>* out) override {
    if (path == watched_) ++opens_;
    return base_->Open(path, mode, out);
  }
  int opens() const { return opens_; }

 private:
  std::string watched_;
  std::atomic<int> opens_{0};
};

TEST_F(ReadManyTest, WorkerThreadsAndFilesAreMadeOnceAndKept) {
  ASSERT_NO_FATAL_FAILURE(Write());
  CountingOpens fs(Path());
  ReaderOptions options;
  options.fs = &fs;
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(Path(), options, &r));
  ASSERT_EQ(r->chunks().size(), 5u);
  EXPECT_EQ(fs.opens(), 1);
  EXPECT_EQ(internal::ReaderAccess::WorkerThreadsStarted(*r), 0u);
  const std::vector<Pair> pairs = Fp8Pairs(q_.g);
  CodeDestinations want(q_.g, pairs, 37);
  for (size_t i = 0; i < pairs.size(); ++i)
    ASSERT_OK(r->ReadCodes(pairs[i].first, pairs[i].second, 0, 37, want.codes[i].data(),
                           reinterpret_cast<float*>(want.scales[i].data())));
  // 4 workers: the calling thread and 3 of the reader's, each with a file of its own.
  for (int call = 0; call < 6; ++call) {
    CodeDestinations got(q_.g, pairs, 37);
    ASSERT_OK(r->ReadManyCodes(got.targets, 0, 37, call % 2 == 0 ? 4 : 2));
    ASSERT_TRUE(got.codes == want.codes && got.scales == want.scales) << "call " << call;
    Destinations rows(q_.g, AllPairs(q_.g), 8, Dtype::kF32);
    ASSERT_OK(r->ReadMany(rows.targets, 8, 16, Dtype::kF32, 4));  // one chunk: the calling thread
    ASSERT_OK(r->ReadMany(rows.targets, 0, 8, Dtype::kF32, 3));
    EXPECT_EQ(fs.opens(), 4) << "call " << call;
    EXPECT_EQ(internal::ReaderAccess::WorkerThreadsStarted(*r), 3u) << "call " << call;
  }
  // More workers (5 chunks: 5 at most): one more thread and file.
  CodeDestinations got(q_.g, pairs, 37);
  ASSERT_OK(r->ReadManyCodes(got.targets, 0, 37, 8));
  ASSERT_TRUE(got.codes == want.codes && got.scales == want.scales);
  EXPECT_EQ(fs.opens(), 5);
  EXPECT_EQ(internal::ReaderAccess::WorkerThreadsStarted(*r), 4u);
}

// A worker's file is checked once, when it is opened: a file renamed over
// the path before the workers' first call is refused as before, one renamed
// after it is not seen (the kept handles read the file the reader opened).
TEST_F(ReadManyTest, AFileReplacedAfterTheWorkersOpenedItStillReadsTheOpenedFile) {
  ASSERT_NO_FATAL_FAILURE(Write());
  const std::string other = Path("other.kv");
  std::ofstream(other) << "not the file the reader opened";
  auto early = Open(Path());
  auto r = Open(Path());
  ASSERT_NE(r, nullptr);
  const std::vector<Pair> pairs = Fp8Pairs(q_.g);
  CodeDestinations want(q_.g, pairs, 37);
  ASSERT_OK(r->ReadManyCodes(want.targets, 0, 37, 3));
  std::filesystem::rename(other, Path());
  CodeDestinations got(q_.g, pairs, 37);
  ASSERT_OK(r->ReadManyCodes(got.targets, 0, 37, 3));
  EXPECT_TRUE(got.codes == want.codes && got.scales == want.scales);
  CodeDestinations refused(q_.g, pairs, 37);
  Status st = early->ReadManyCodes(refused.targets, 0, 37, 3);
  EXPECT_EQ(st.code(), Status::Code::kFailed);
  EXPECT_EQ(st.message(), Path() + ": the file was replaced since it was opened");
}

// ---- nvfp4 streams (format 2.2) --------------------------------------------------------------

// 10 tokens in chunks of 4 (4, 4, 2: the last chunk short), appends of 3.
class Nvfp4FileTest : public KvFileTest {
 protected:
  static constexpr uint64_t kN = 10;
  static constexpr size_t kW = Nvfp4Rows::kWidth;
  Nvfp4FileTest() : rows_(kN) {}
  Nvfp4Rows rows_;
};

TEST_F(Nvfp4FileTest, HeaderIs22WithTheFlag) {
  ASSERT_NO_FATAL_FAILURE(WriteNvfp4(Path(), rows_, 4, 3, false));
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(Path(), {}, &r));
  EXPECT_EQ(r->major_version(), 2);
  EXPECT_EQ(r->minor_version(), 2);
  EXPECT_EQ(r->required_flags(), 3u);  // APPEND_ENDS | NVFP4
  EXPECT_EQ(r->geometry(), Nvfp4Geometry());
  EXPECT_EQ(r->token_count(), kN);
  Bytes f = ReadFileBytes(Path());
  EXPECT_EQ(format::LoadU16(f.data() + 10), 2u);
  EXPECT_EQ(format::LoadU64(f.data() + 16), 3u);
  EXPECT_EQ(f[384 + 32], 6);  // stream "k": dtype byte 6
}

// The stored bytes of every chunk are exactly the codec's codes, block
// scales and row scales of the rows given, at the places of FORMAT.md 5.2.
TEST_F(Nvfp4FileTest, StoredBytesAreTheCodecsCodes) {
  ASSERT_NO_FATAL_FAILURE(WriteNvfp4(Path(), rows_, 4, 3, false));
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(Path(), {}, &r));
  Bytes f = ReadFileBytes(Path());
  ASSERT_EQ(r->chunks().size(), 3u);
  for (const ChunkInfo& c : r->chunks()) {
    ChunkLayout l;
    ASSERT_OK(ComputeChunkLayout(r->geometry(), c.stored_tokens, &l));
    for (uint32_t layer = 0; layer < 2; ++layer) {
      SCOPED_TRACE("chunk at " + std::to_string(c.offset) + " layer " + std::to_string(layer));
      const format::SectionLayout& sec = l.section(layer, 0);
      const uint8_t* p = f.data() + c.offset;
      const uint64_t t0 = c.first_token, n = c.stored_tokens;
      ASSERT_EQ(sec.data_bytes, n * kW / 2);
      EXPECT_EQ(Bytes(p + sec.offset, p + sec.offset + sec.data_bytes),
                Bytes(rows_.codes[layer].begin() + t0 * kW / 2, rows_.codes[layer].begin() + (t0 + n) * kW / 2));
      EXPECT_EQ(Bytes(p + sec.block_scales_offset, p + sec.block_scales_offset + sec.block_scales_bytes),
                Bytes(rows_.blocks[layer].begin() + t0 * kW / 16, rows_.blocks[layer].begin() + (t0 + n) * kW / 16));
      EXPECT_EQ(std::memcmp(p + sec.scales_offset, rows_.scales[layer].data() + t0, n * 4), 0);
    }
  }
}

// Codes given pre-quantized give the same file, byte for byte, as the
// rows they came from.
TEST_F(Nvfp4FileTest, CodesGivenGiveTheSameFileAsRows) {
  ASSERT_NO_FATAL_FAILURE(WriteNvfp4(Path("rows.kv"), rows_, 4, 3, false));
  ASSERT_NO_FATAL_FAILURE(WriteNvfp4(Path("codes.kv"), rows_, 4, 3, true));
  EXPECT_EQ(ReadFileBytes(Path("rows.kv")), ReadFileBytes(Path("codes.kv")));
}

TEST_F(Nvfp4FileTest, ReadCodesAndDecodedReadsEqualTheCodec) {
  ASSERT_NO_FATAL_FAILURE(WriteNvfp4(Path(), rows_, 4, 3, false));
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(Path(), {}, &r));
  for (uint32_t layer = 0; layer < 2; ++layer) {
    for (auto [b, e] : std::vector<std::pair<uint64_t, uint64_t>>{{0, kN}, {3, 7}, {4, 8}, {9, 10}}) {
      SCOPED_TRACE("layer " + std::to_string(layer) + " [" + std::to_string(b) + ", " + std::to_string(e) + ")");
      const uint64_t n = e - b;
      Bytes codes(n * kW / 2 + 1, kFill), blocks(n * kW / 16 + 1, kFill);
      std::vector<float> scales(n + 1, -1.0f);
      ASSERT_OK(r->ReadCodes(layer, 0, b, e, codes.data(), blocks.data(), scales.data()));
      EXPECT_EQ(Bytes(codes.begin(), codes.end() - 1),
                Bytes(rows_.codes[layer].begin() + b * kW / 2, rows_.codes[layer].begin() + e * kW / 2));
      EXPECT_EQ(Bytes(blocks.begin(), blocks.end() - 1),
                Bytes(rows_.blocks[layer].begin() + b * kW / 16, rows_.blocks[layer].begin() + e * kW / 16));
      EXPECT_EQ(std::memcmp(scales.data(), rows_.scales[layer].data() + b, n * 4), 0);
      EXPECT_EQ(codes.back(), kFill);  // nothing written past the end
      EXPECT_EQ(blocks.back(), kFill);
      EXPECT_EQ(scales.back(), -1.0f);
      for (Dtype out : kOutDtypes) {
        Bytes want(n * kW * ElementSize(out)), got(want.size() + 1, kFill);
        codec::nvfp4::DequantizeRows(rows_.codes[layer].data() + b * kW / 2, rows_.blocks[layer].data() + b * kW / 16,
                                     rows_.scales[layer].data() + b, n, kW, out, want.data());
        ASSERT_OK(r->ReadRows(layer, 0, b, e, out, got.data()));
        EXPECT_EQ(Bytes(got.begin(), got.end() - 1), want) << DtypeName(out);
        Bytes many(want.size(), kFill);
        RowsTarget t{layer, 0, many.data()};
        ASSERT_OK(r->ReadMany(std::span<const RowsTarget>(&t, 1), b, e, out, 2));
        EXPECT_EQ(many, want) << DtypeName(out);
      }
      // ReadParts, the dtype-blind read of the stored parts: the same bytes.
      Bytes pc(n * kW / 2, kFill), pb(n * kW / 16, kFill);
      std::vector<float> ps(n, -1.0f);
      ASSERT_OK(r->ReadParts(layer, 0, b, e, {pc.data(), pb.data(), ps.data()}));
      EXPECT_EQ(pc, Bytes(codes.begin(), codes.end() - 1));
      EXPECT_EQ(pb, Bytes(blocks.begin(), blocks.end() - 1));
      EXPECT_EQ(std::memcmp(ps.data(), scales.data(), n * 4), 0);
      Bytes mc(n * kW / 2, kFill), mb(n * kW / 16, kFill);
      std::vector<float> ms(n, -1.0f);
      CodesTarget ct{layer, 0, mc.data(), ms.data(), mb.data()};
      ASSERT_OK(r->ReadManyCodes(std::span<const CodesTarget>(&ct, 1), b, e, 2));
      EXPECT_EQ(mc, Bytes(codes.begin(), codes.end() - 1));
      EXPECT_EQ(mb, Bytes(blocks.begin(), blocks.end() - 1));
      EXPECT_EQ(std::memcmp(ms.data(), scales.data(), n * 4), 0);
    }
  }
  // The raw stream beside it reads as written.
  std::vector<uint16_t> v(kN * 8);
  ASSERT_OK(r->ReadRows(1, 1, 0, kN, Dtype::kBF16, v.data()));
  EXPECT_EQ(v, rows_.v[1]);
}

TEST_F(Nvfp4FileTest, WrongReadsAreRefusedAndLeaveBuffersAlone) {
  ASSERT_NO_FATAL_FAILURE(WriteNvfp4(Path(), rows_, 4, 3, false));
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(Path(), {}, &r));
  Bytes codes(kN * kW, kFill), blocks(kN * kW, kFill);
  std::vector<float> scales(kN * 2, -1.0f);
  EXPECT_TRUE(HasCode(r->ReadCodes(0, 0, 0, kN, codes.data(), scales.data()), Code::kInvalidArgument,
                      {"stream 'k' is nvfp4; its codes come with block scales"}));
  EXPECT_TRUE(HasCode(r->ReadCodes(0, 1, 0, kN, codes.data(), blocks.data(), scales.data()), Code::kInvalidArgument,
                      {"stream 'v' is stored raw (bf16)"}));
  EXPECT_TRUE(HasCode(r->ReadCodes(0, 0, 0, kN, codes.data(), nullptr, scales.data()), Code::kInvalidArgument));
  EXPECT_TRUE(HasCode(r->ReadParts(0, 0, 0, kN, {codes.data(), nullptr, scales.data()}), Code::kInvalidArgument,
                      {"ReadCodes without a destination"}));
  EXPECT_TRUE(HasCode(r->ReadParts(0, 1, 0, kN, {codes.data(), blocks.data(), scales.data()}), Code::kInvalidArgument,
                      {"stream 'v' is stored raw (bf16)"}));
  EXPECT_TRUE(HasCode(r->ReadRows(0, 0, 0, kN, Dtype::kNvfp4, codes.data()), Code::kInvalidArgument,
                      {"decoded reads produce bf16, f16 or f32"}));
  CodesTarget no_blocks{0, 0, codes.data(), scales.data(), nullptr};
  EXPECT_TRUE(HasCode(r->ReadManyCodes(std::span<const CodesTarget>(&no_blocks, 1), 0, kN), Code::kInvalidArgument,
                      {"nvfp4 needs block_scales too"}));
  EXPECT_EQ(codes, Bytes(kN * kW, kFill));
  EXPECT_EQ(blocks, Bytes(kN * kW, kFill));
  EXPECT_EQ(scales, std::vector<float>(kN * 2, -1.0f));
}

TEST_F(Nvfp4FileTest, CreateRefusesAWidthThatIsNotBlocks) {
  Geometry g = Nvfp4Geometry();
  g.streams[0] = {"k", 3, 8, Dtype::kNvfp4};
  std::unique_ptr<Writer> w;
  Status st = hooks::CreateWriter(Path(), g, kIdentity, Options(4), &w);
  EXPECT_TRUE(HasCode(st, Code::kInvalidArgument, {"stream 'k': nvfp4 needs rows x width (24) to be a multiple of 16"}));
  EXPECT_FALSE(std::filesystem::exists(Path()));
  WriterOptions v1 = Options(4);
  v1.format_major = 1;
  EXPECT_TRUE(HasCode(hooks::CreateWriter(Path(), Nvfp4Geometry(), kIdentity, v1, &w), Code::kInvalidArgument,
                      {"v1 files store raw rows only"}));
}

TEST_F(Nvfp4FileTest, BadRowsAndCodesFailTheAppendNamingTokenAndRow) {
  std::unique_ptr<Writer> w;
  ASSERT_OK(hooks::CreateWriter(Path(), Nvfp4Geometry(), kIdentity, Options(4), &w));
  ASSERT_OK(w->Append(rows_.Batch(0, 4, false)));
  // A NaN in layer 1, token 5 (of the sequence), element 20: row 1.
  Nvfp4Rows bad = rows_;
  bad.k[1][5 * kW + 20] = std::numeric_limits<float>::quiet_NaN();
  // Found while staging (the append fits the chunk) and by the check
  // before an append that spans chunks: the same place named.
  EXPECT_TRUE(HasCode(w->Append(bad.Batch(4, 3, false)), Code::kNonFinite,
                      {"non-finite value in layer 1, stream 'k', token 5, row 1"}));
  EXPECT_TRUE(HasCode(w->Append(bad.Batch(4, 6, false)), Code::kNonFinite,
                      {"non-finite value in layer 1, stream 'k', token 5, row 1"}));
  bad = rows_;
  bad.blocks[0][4 * kW / 16 + 1] = 0x80;  // bit 7
  EXPECT_TRUE(HasCode(w->Append(bad.Batch(4, 3, true)), Code::kNonFinite,
                      {"invalid block scale in layer 0, stream 'k', token 4"}));
  bad.blocks[0][4 * kW / 16 + 1] = 0x7F;
  EXPECT_TRUE(HasCode(w->Append(bad.Batch(4, 6, true)), Code::kNonFinite,
                      {"invalid block scale in layer 0, stream 'k', token 4"}));
  bad = rows_;
  bad.scales[1][6] = 0.0f;
  EXPECT_TRUE(HasCode(w->Append(bad.Batch(4, 3, true)), Code::kNonFinite, {"invalid scale in layer 1, stream 'k', token 6"}));
  AppendBatch no_blocks = rows_.Batch(4, 3, true);
  no_blocks.blocks[0].block_scales = nullptr;
  EXPECT_TRUE(HasCode(w->Append(no_blocks), Code::kInvalidArgument, {"nvfp4 codes given without block scales"}));
  AppendBatch fp8 = rows_.Batch(4, 3, true);
  fp8.blocks[0].dtype = Dtype::kE4M3;
  EXPECT_TRUE(HasCode(w->Append(fp8), Code::kInvalidArgument, {"codes are e4m3 but the stream stores nvfp4"}));
  // Nothing of the failed appends was kept: the rest appends and the file
  // equals one written in one go.
  EXPECT_EQ(w->token_count(), 4u);
  ASSERT_OK(w->Append(rows_.Batch(4, 6, false)));
  ASSERT_OK(w->Close());
  ASSERT_NO_FATAL_FAILURE(WriteNvfp4(Path("b.kv"), rows_, 4, 10, false));
  std::unique_ptr<Reader> a, b;
  ASSERT_OK(Reader::Open(Path(), {}, &a));
  ASSERT_OK(Reader::Open(Path("b.kv"), {}, &b));
  Bytes ca(kN * kW / 2), cb(ca.size()), ba(kN * 2), bb(ba.size());
  std::vector<float> sa(kN), sb(kN);
  for (uint32_t layer = 0; layer < 2; ++layer) {
    ASSERT_OK(a->ReadCodes(layer, 0, 0, kN, ca.data(), ba.data(), sa.data()));
    ASSERT_OK(b->ReadCodes(layer, 0, 0, kN, cb.data(), bb.data(), sb.data()));
    EXPECT_EQ(ca, cb);
    EXPECT_EQ(ba, bb);
    EXPECT_EQ(sa, sb);
  }
}

}  // namespace
}  // namespace kvfile
