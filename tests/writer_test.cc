// SPDX-License-Identifier: Apache-2.0
// Tests of the writer (src/writer/writer.cc) end to end through the reader: every
// stored byte against the codec's own block functions over presets, dtypes,
// chunk sizes and append schedules; pre-quantized appends; non-finite input;
// Create and the writer's lifecycle; the sync modes.

#include "kvfile/verify.h"
#include "support/kv_test_util.h"
#include "support/testing_hooks.h"

namespace kvfile {
namespace {

using namespace kvfile::test;

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

// A stream in some layers only (spec/FORMAT.md 3.2, version 2.3): the header
// records its layers, chunks hold its sections in those layers alone, every
// read of it and of the other streams is exact, a read where it is absent
// and rows given there are refused, and verify finds damage in its sections.
TEST_F(KvFileTest, AStreamInSomeLayersRoundTripsAndVerifyFindsDamageInIt) {
  Geometry g;
  g.layers = 4;
  g.streams = {{"k", 2, 16, Dtype::kE4M3}, {"idx", 1, 8, Dtype::kBF16, {1, 3}}};
  Sequence q = MakeSequence(g, Dtype::kF32, 37, 5);
  Expected e = ComputeExpected(q);
  WriteSequence(Path(), q, Options(8), Sizes(Schedule::kMixed, q.n, 8));
  CheckFile(Path(), q, e, 8, true, true);
  if (HasFatalFailure()) return;
  const Bytes file = ReadFileBytes(Path());
  EXPECT_EQ(file[10], 3);     // minor version 3
  EXPECT_EQ(file[16], 0x05);  // required flags APPEND_ENDS | LAYER_SETS
  EXPECT_EQ(file[1408], 0x0F);        // "k": layers 0..3
  EXPECT_EQ(file[1408 + 128], 0x0A);  // "idx": layers 1 and 3
  // 4 + 2 sections a chunk, not 8: a chunk of 8 tokens is its head (64 +
  // 6 checksums + 32 token bytes + 8, to 192) and 4 x (256 codes + 64
  // scales) + 2 x 128 bf16 bytes, in one block.
  format::ChunkLayout layout;
  ASSERT_OK(format::ComputeChunkLayout(g, 8, &layout));
  EXPECT_EQ(layout.sections.size(), 6u);
  EXPECT_EQ(layout.head_bytes, 192u);
  EXPECT_FALSE(layout.present(0, 1));
  EXPECT_EQ(layout.section(3, 1).offset, 192u + 4 * 320 + 128);
  std::unique_ptr<Reader> r;
  ASSERT_OK(Reader::Open(Path(), {}, &r));
  Bytes buf(1024);
  EXPECT_EQ(r->ReadRows(2, 1, 0, 1, Dtype::kF32, buf.data()).message(),
            Path() + ": stream 'idx' is not in layer 2 (it is in layers 1,3)");
  r.reset();
  {
    // Rows for (layer 0, "idx"): refused, naming where.
    std::unique_ptr<Writer> w;
    ASSERT_OK(Writer::Open(Path(), {}, &w));
    AppendBatch b = Batch(q, 0, 1);
    b.blocks[1] = b.blocks[3];
    EXPECT_EQ(w->Append(b).message(), "layer 0, stream 'idx': rows given, but the stream is not in this layer");
    ASSERT_OK(w->Close());
  }
  // One flipped byte in (layer 3, "idx") of chunk 0.
  XorByte(Path(), format::kDataOffset + layout.section(3, 1).offset + 5, 0x40);
  VerifyReport rep;
  ASSERT_OK(VerifyFile(Path(), {}, &rep));
  ASSERT_TRUE(rep.HasErrors());
  EXPECT_EQ(rep.findings[0].chunk, 0);
  EXPECT_EQ(rep.findings[0].message, "chunk 0 at offset 12288: payload checksum mismatch in layer 3 stream 'idx' "
                                     "(section at offset " +
                                         std::to_string(format::kDataOffset + layout.section(3, 1).offset) + ")");
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
        ASSERT_OK(hooks::CreateWriter(Path("pre.kv"), g, kIdentity, Options(4), &w));
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
  ASSERT_OK(hooks::CreateWriter(Path(), g, kIdentity, Options(8), &w));
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
  ASSERT_OK(hooks::CreateWriter(Path(), g, kIdentity, Options(8), &w));
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
    ASSERT_OK(hooks::CreateWriter(path, g, kIdentity, Options(chunk), &w));
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
  ASSERT_OK(hooks::CreateWriter(path, g, kIdentity, Options(c.chunk), &w));
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
    ASSERT_OK(hooks::CreateWriter(Path("x.kv"), g, kIdentity, Options(8), &w));
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

// ---- Create ----------------------------------------------------------------------------------

TEST_F(KvFileTest, CreateRefusesAnExistingPathUnlessOverwrite) {
  Geometry g = Preset("tiny", Dtype::kE4M3);
  Sequence q = MakeSequence(g, Dtype::kBF16, 5);
  WriteSequence(Path(), q, Options(8), {5});
  const Bytes original = ReadFileBytes(Path());
  std::unique_ptr<Writer> w;
  EXPECT_TRUE(HasCode(hooks::CreateWriter(Path(), g, kIdentity, Options(8), &w), Code::kInvalidArgument,
                      {Path(), "exists"}));
  EXPECT_EQ(w, nullptr);
  EXPECT_TRUE(ReadFileBytes(Path()) == original);
  EXPECT_EQ(ListDir(dir_), (std::vector<std::string>{"a.kv"}));

  // Not a kvfile at all: still refused, still untouched.
  { std::ofstream(Path("notes.txt")) << "hello"; }
  EXPECT_TRUE(HasCode(hooks::CreateWriter(Path("notes.txt"), g, kIdentity, Options(8), &w),
                      Code::kInvalidArgument));
  EXPECT_EQ(ReadFileBytes(Path("notes.txt")), (Bytes{'h', 'e', 'l', 'l', 'o'}));

  // overwrite: replaced by a new, empty file.
  WriterOptions o = Options(4);
  o.overwrite = true;
  ASSERT_OK(hooks::CreateWriter(Path("fresh.kv"), g, kIdentity, o, &w));  // nothing to replace
  ASSERT_OK(w->Close());
  std::filesystem::remove(Path("fresh.kv"));
  hooks::SetWriterSalt(77);
  ASSERT_OK(hooks::CreateWriter(Path(), g, kIdentity, o, &w));
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
  ASSERT_OK(hooks::CreateWriter(Path(), g, kIdentity, Options(4), &w));
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
  ASSERT_OK(hooks::CreateWriter(Path("b.kv"), g, kIdentity, Options(4), &w));
  ASSERT_OK(w->Close());
  EXPECT_EQ(ListDir(dir_), (std::vector<std::string>{"a.kv", "b.kv"}));

  // Refused creates leave nothing behind either.
  Geometry bad = g;
  bad.layers = 0;
  EXPECT_TRUE(HasCode(hooks::CreateWriter(Path("c.kv"), bad, kIdentity, Options(4), &w), Code::kInvalidArgument,
                      {"layer count"}));
  EXPECT_TRUE(HasCode(hooks::CreateWriter(Path("c.kv"), g, kIdentity, Options(0), &w), Code::kInvalidArgument,
                      {"chunk tokens"}));
  ModelIdentity long_id{std::string(256, 'x'), 1};
  EXPECT_TRUE(HasCode(hooks::CreateWriter(Path("c.kv"), g, long_id, Options(4), &w), Code::kInvalidArgument,
                      {"model id"}));
  EXPECT_TRUE(HasCode(hooks::CreateWriter(dir_ + "/no/such/dir/c.kv", g, kIdentity, Options(4), &w),
                      Code::kNotFound));
  // A chunk of 65536 llama tokens would exceed 1 GiB.
  EXPECT_TRUE(HasCode(hooks::CreateWriter(Path("c.kv"), Preset("llama-3.1-8b"), kIdentity, Options(65536), &w),
                      Code::kInvalidArgument, {"1 GiB"}));
  EXPECT_EQ(ListDir(dir_), (std::vector<std::string>{"a.kv", "b.kv"}));
}

TEST_F(KvFileTest, SecondCreateWhileTheFirstWriterIsOpenIsBusy) {
  Geometry g = Preset("tiny", Dtype::kE4M3);
  Sequence q = MakeSequence(g, Dtype::kBF16, 6);
  std::unique_ptr<Writer> first;
  ASSERT_OK(hooks::CreateWriter(Path(), g, kIdentity, Options(4), &first));
  ASSERT_OK(first->Append(Batch(q, 0, 5)));
  WriterOptions o = Options(4);
  o.overwrite = true;
  std::unique_ptr<Writer> second;
  EXPECT_TRUE(HasCode(hooks::CreateWriter(Path(), g, kIdentity, o, &second), Code::kBusy));
  EXPECT_EQ(second, nullptr);
  EXPECT_EQ(ListDir(dir_), (std::vector<std::string>{"a.kv"}));
  // The first writer is unaffected.
  ASSERT_OK(first->Append(Batch(q, 5, 1)));
  ASSERT_OK(first->Close());
  CheckFile(Path(), q, ComputeExpected(q), 4, true);
  // Once it is closed the path can be replaced.
  ASSERT_OK(hooks::CreateWriter(Path(), g, kIdentity, o, &second));
  ASSERT_OK(second->Close());
}

TEST_F(KvFileTest, WriterLifecycle) {
  Geometry g = Preset("tiny", Dtype::kE4M3);
  Sequence q = MakeSequence(g, Dtype::kBF16, 6);
  {
    std::unique_ptr<Writer> w;
    ASSERT_OK(hooks::CreateWriter(Path(), g, kIdentity, Options(4), &w));
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
  ASSERT_OK(hooks::CreateWriter(Path(), g, kIdentity, o, &w));
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
  ASSERT_OK(hooks::CreateWriter(Path(), g, kIdentity, Options(8, SyncMode::kNone), &w));
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
  ASSERT_OK(hooks::CreateWriter(Path(), g, kIdentity, Options(8, SyncMode::kNone), &w));
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
  ASSERT_OK(hooks::CreateWriter(Path(), g, kIdentity, Options(8, SyncMode::kChunk), &w));
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
  ASSERT_OK(hooks::CreateWriter(Path(), g, kIdentity, Options(4, SyncMode::kClose), &w));
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

}  // namespace
}  // namespace kvfile
