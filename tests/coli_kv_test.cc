// SPDX-License-Identifier: Apache-2.0
// colibri .coli_kv sessions (kvfile/formats/coli_kv.h): the fixtures of
// tests/fixtures/seeds/ (written from the layout by make_fixtures.py, whose
// formulas are repeated here) imported with their exact codes, scales and
// rows, exported back byte for byte, every truncation and every bit flip of
// the importer, the layouts it refuses, and the geometries export refuses.

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "kvfile/codec.h"
#include "kvfile/formats/coli_kv.h"
#include "kvfile/reader.h"
#include "kvfile/writer.h"
#include "support/fault_fs.h"
#include "support/file_util.h"
#include "support/scratch_dir.h"

namespace kvfile::coli {
namespace {

namespace fs = std::filesystem;
using kvfile::testing::ReadFileBytes;

constexpr uint32_t kLayers = 2, kLora = 4, kRope = 2, kIhd = 3, kVocab = 100;
const uint32_t kIds[3] = {5, 17, 99};
constexpr uint64_t kRecV2 = 4 + kLayers * (kLora + kRope + 8) + kLayers * kIhd * 4;  // 56
constexpr uint64_t kRecV1 = 4 + kLayers * (kLora + kRope) * 4 + kLayers * kIhd * 4;   // 76

uint8_t LatentCode(int t, int l, int j) { return static_cast<uint8_t>((0x10 * t + 4 * l + j) | (j % 2 ? 0x80 : 0)); }
uint8_t RopeCode(int t, int l, int j) { return static_cast<uint8_t>(0x30 + t + l + j); }
float LatentScale(int t, int l) { return std::ldexp(1.0f, -(t + l + 1)); }
float RopeScale(int t, int) { return 0.25f * static_cast<float>(t + 1); }
float Indexer(int t, int l, int j) { return static_cast<float>(t * 10.0 + l + j * 0.5); }
float LatentF32(int t, int l, int j) {
  return static_cast<float>((t + 1) * 0.75 - l * 0.125 + j * 0.0625 * (j % 2 ? -1 : 1));
}
float RopeF32(int t, int l, int j) { return static_cast<float>(-(t + 2) * 1.5 + l + j * 0.25); }

std::string Fixture(const char* name) { return std::string(KVFILE_TEST_DATA "/fixtures/seeds/").append(name); }

class ColiKv : public kvfile::testing::ScratchDirTest {
 protected:
  // Imports `bytes` in a memory file system (mem_), to "out.kv" there.
  Status ImportBytes(const std::vector<uint8_t>& bytes, ImportResult* res) {
    kvfile::testing::DiskImage image;
    image["in.coli_kv"].assign(bytes.begin(), bytes.end());
    mem_ = std::make_unique<kvfile::testing::FaultFs>(image);
    return Import("in.coli_kv", "out.kv", mem_.get(), res);
  }
  // The Reader of what ImportBytes wrote.
  std::unique_ptr<Reader> OpenImported() {
    ReaderOptions ro;
    ro.fs = mem_.get();
    std::unique_ptr<Reader> r;
    EXPECT_TRUE(Reader::Open("out.kv", ro, &r).ok());
    return r;
  }
  std::unique_ptr<kvfile::testing::FaultFs> mem_;
};

TEST_F(ColiKv, ImportV2HasTheExactCodesScalesAndRows) {
  ImportResult res;
  ASSERT_TRUE(Import(Fixture("coli_v2.coli_kv"), P("a.kv"), nullptr, &res).ok());
  EXPECT_EQ(res.header.version, 2);
  EXPECT_EQ(res.header.records, 3u);
  EXPECT_EQ(res.header.record_bytes, kRecV2);
  EXPECT_EQ(res.ignored_bytes, 7u);
  std::unique_ptr<Reader> r;
  ASSERT_TRUE(Reader::Open(P("a.kv"), {}, &r).ok());
  EXPECT_EQ(r->identity().model_id, "coli_kv:vocab=100");
  ASSERT_EQ(r->token_count(), 3u);
  EXPECT_EQ(std::vector<uint32_t>(r->tokens().begin(), r->tokens().end()), std::vector<uint32_t>(kIds, kIds + 3));
  const Geometry& g = r->geometry();
  ASSERT_EQ(g.layers, kLayers);
  ASSERT_EQ(g.streams.size(), 3u);
  EXPECT_EQ(g.streams[0], (StreamSpec{"latent", 1, kLora, Dtype::kE4M3}));
  EXPECT_EQ(g.streams[1], (StreamSpec{"rope", 1, kRope, Dtype::kE4M3}));
  EXPECT_EQ(g.streams[2], (StreamSpec{"indexer", 1, kIhd, Dtype::kF32}));
  for (uint32_t l = 0; l < kLayers; ++l) {
    uint8_t lc[3 * kLora], rc[3 * kRope];
    float ls[3], rs[3], ix[3 * kIhd];
    ASSERT_TRUE(r->ReadCodes(l, 0, 0, 3, lc, ls).ok());
    ASSERT_TRUE(r->ReadCodes(l, 1, 0, 3, rc, rs).ok());
    ASSERT_TRUE(r->ReadRows(l, 2, 0, 3, Dtype::kF32, ix).ok());
    for (int t = 0; t < 3; ++t) {
      EXPECT_EQ(ls[t], LatentScale(t, static_cast<int>(l)));
      EXPECT_EQ(rs[t], RopeScale(t, static_cast<int>(l)));
      for (uint32_t j = 0; j < kLora; ++j) EXPECT_EQ(lc[t * kLora + j], LatentCode(t, static_cast<int>(l), static_cast<int>(j)));
      for (uint32_t j = 0; j < kRope; ++j) EXPECT_EQ(rc[t * kRope + j], RopeCode(t, static_cast<int>(l), static_cast<int>(j)));
      for (uint32_t j = 0; j < kIhd; ++j) EXPECT_EQ(ix[t * kIhd + j], Indexer(t, static_cast<int>(l), static_cast<int>(j)));
    }
  }
}

TEST_F(ColiKv, ImportV1QuantizesLatentAndRopeWithTheRowRule) {
  ImportResult res;
  ASSERT_TRUE(Import(Fixture("coli_v1.coli_kv"), P("a.kv"), nullptr, &res).ok());
  EXPECT_EQ(res.header.version, 1);
  EXPECT_EQ(res.header.record_bytes, kRecV1);
  EXPECT_EQ(res.ignored_bytes, 0u);
  std::unique_ptr<Reader> r;
  ASSERT_TRUE(Reader::Open(P("a.kv"), {}, &r).ok());
  ASSERT_EQ(r->token_count(), 2u);
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (uint32_t s = 0; s < 2; ++s) {
      uint32_t w = s == 0 ? kLora : kRope;
      std::vector<float> rows(2 * w);
      for (int t = 0; t < 2; ++t)
        for (uint32_t j = 0; j < w; ++j)
          rows[t * w + j] = s == 0 ? LatentF32(t, static_cast<int>(l), static_cast<int>(j))
                                   : RopeF32(t, static_cast<int>(l), static_cast<int>(j));
      std::vector<uint8_t> want_codes(2 * w), codes(2 * w);
      float want_scales[2], scales[2];
      size_t bad = 0;
      ASSERT_TRUE(codec::QuantizeRows(Dtype::kE4M3, Dtype::kF32, rows.data(), 2, w, want_codes.data(),
                                      want_scales, &bad));
      ASSERT_TRUE(r->ReadCodes(l, s, 0, 2, codes.data(), scales).ok());
      EXPECT_EQ(codes, want_codes);
      EXPECT_EQ(scales[0], want_scales[0]);
      EXPECT_EQ(scales[1], want_scales[1]);
    }
    float ix[2 * kIhd];
    ASSERT_TRUE(r->ReadRows(l, 2, 0, 2, Dtype::kF32, ix).ok());
    for (int t = 0; t < 2; ++t)
      for (uint32_t j = 0; j < kIhd; ++j) EXPECT_EQ(ix[t * kIhd + j], Indexer(t, static_cast<int>(l), static_cast<int>(j)));
  }
}

TEST_F(ColiKv, ExportOfTheImportIsTheFixtureByteForByte) {
  ImportResult res;
  ASSERT_TRUE(Import(Fixture("coli_v2.coli_kv"), P("a.kv"), nullptr, &res).ok());
  uint64_t tokens = 0;
  ASSERT_TRUE(Export(P("a.kv"), P("b.coli_kv"), {}, &tokens).ok());
  EXPECT_EQ(tokens, 3u);
  // The fixture without its 7 torn bytes, which are not part of the session.
  const std::vector<uint8_t> fixture = ReadFileBytes(Fixture("coli_v2.coli_kv"));
  const std::vector<uint8_t> got = ReadFileBytes(P("b.coli_kv"));
  ASSERT_GE(fixture.size(), 7u);
  ASSERT_EQ(got.size(), fixture.size() - 7);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), fixture.begin()));
  // An explicit vocabulary goes into h[5].
  ExportOptions o;
  o.vocab = 1000;
  ASSERT_TRUE(Export(P("a.kv"), P("c.coli_kv"), o, &tokens).ok());
  std::vector<uint8_t> want(got);
  want[28] = 0xE8;
  want[29] = 0x03;
  EXPECT_EQ(ReadFileBytes(P("c.coli_kv")), want);
}

// --format coli-v1: the same session as COLIKV1 (h[7] = 0), each latent
// and rope row decoded to f32, the indexer as it is: byte for byte the file
// make_fixtures.py writes from colibri's v1 record layout.
TEST_F(ColiKv, ExportV1IsTheV1LayoutOfTheDecodedRows) {
  ImportResult res;
  ASSERT_TRUE(Import(Fixture("coli_v2.coli_kv"), P("a.kv"), nullptr, &res).ok());
  ExportOptions o;
  o.version = 1;
  uint64_t tokens = 0;
  ASSERT_TRUE(Export(P("a.kv"), P("v1.coli_kv"), o, &tokens).ok());
  EXPECT_EQ(tokens, 3u);
  const std::vector<uint8_t> got = ReadFileBytes(P("v1.coli_kv"));
  ASSERT_EQ(got.size(), 40 + 3 * kRecV1);
  EXPECT_EQ(got, ReadFileBytes(Fixture("coli_v2_as_v1.coli_kv")));
  // Record 1, layer 0, latent element 1: code 0x91 (-2^-5 x 1.125) x scale 2^-2.
  float v = 0;
  std::memcpy(&v, got.data() + 40 + kRecV1 + 4 + 4, 4);
  EXPECT_EQ(v, -0.03515625f * 0.25f);
  o.version = 3;
  Status st = Export(P("a.kv"), P("v3.coli_kv"), o, &tokens);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "COLIKV3 is not written; only 1 and 2");
  EXPECT_FALSE(fs::exists(P("v3.coli_kv")));
}

// A scale just below colibri's 3.4e38f, and 1e36 over codes whose product
// stays finite, import (BadRecordsAreCorruption has the rows refused).
TEST_F(ColiKv, ImportTakesRowsColibriHoldsAsTheyAre) {
  const std::vector<uint8_t> good = ReadFileBytes(Fixture("coli_v2.coli_kv"));
  const uint64_t scale = 40 + kRecV2 + 4 + kLora;  // record 1, layer 0 latent scale
  for (float f : {std::bit_cast<float>(0x7F7FC99Du), 1e36f}) {
    SCOPED_TRACE(f);
    std::vector<uint8_t> b = good;
    std::memcpy(b.data() + scale, &f, 4);
    ImportResult res;
    Status st = ImportBytes(b, &res);
    ASSERT_TRUE(st.ok()) << st.ToString();
    std::unique_ptr<Reader> r = OpenImported();
    ASSERT_TRUE(r);
    uint8_t codes[2 * kLora];
    float scales[2];
    ASSERT_TRUE(r->ReadCodes(0, 0, 0, 2, codes, scales).ok());
    EXPECT_EQ(scales[1], f);
  }
}

// A .kv file whose rows colibri would not hold as kvfile decodes them: the
// COLIKV2 export refuses (nothing exported), the COLIKV1 export writes
// kvfile's clamped decode.
TEST_F(ColiKv, ExportNeverWritesAScaleColibriZeroesOrDecodesToInfinity) {
  Geometry g;
  g.layers = 1;
  g.streams = {{"latent", 1, 2, Dtype::kE4M3}, {"rope", 1, 2, Dtype::kE4M3}};
  auto make = [&](const std::string& name, float latent_scale, float rope_scale) {
    std::unique_ptr<Writer> w;
    ASSERT_TRUE(Writer::Create(P(name), g, {"coli_kv:vocab=10", 0}, {}, &w).ok());
    const uint8_t latent[4] = {0x38, 0x00, 0x7E, 0x01};  // token 0: 1, 0; token 1: 448, 2^-9
    const uint8_t rope[4] = {0x38, 0x38, 0x38, 0x38};
    const float ls[2] = {1.0f, latent_scale}, rs[2] = {1.0f, rope_scale};
    const uint32_t ids[2] = {1, 2};
    AppendBatch b;
    b.tokens = ids;
    b.blocks.push_back({Dtype::kE4M3, latent, ls});
    b.blocks.push_back({Dtype::kE4M3, rope, rs});
    ASSERT_TRUE(w->Append(b).ok());
    ASSERT_TRUE(w->Close().ok());
  };
  make("inf.kv", 1e36f, 1.0f);
  make("zeroed.kv", 1.0f, 3.4e38f);
  make("fine.kv", 7.5e35f, 1.0f);  // 448 x 7.5e35 = 3.36e38: finite
  uint64_t tokens = 0;
  Status st = Export(P("inf.kv"), P("inf.coli_kv"), {}, &tokens);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(st.message(), P("inf.kv") + ": token 1: layer 0 latent row: code 448 x scale 9.99999962e+35 is infinite "
                                        "in colibri's f32 decode; not exported");
  st = Export(P("zeroed.kv"), P("zeroed.coli_kv"), {}, &tokens);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(st.message(), P("zeroed.kv") + ": token 1: layer 0 rope row: scale 3.39999995e+38 is at least 3.4e38, "
                                           "a row colibri's loader zeroes; not exported");
  ASSERT_TRUE(Export(P("fine.kv"), P("fine.coli_kv"), {}, &tokens).ok());
  // COLIKV1 of inf.kv: token 1's latent row is 448 x 1e36 clamped to FLT_MAX, and 2^-9 x 1e36.
  ExportOptions o;
  o.version = 1;
  ASSERT_TRUE(Export(P("inf.kv"), P("inf1.coli_kv"), o, &tokens).ok());
  std::vector<uint8_t> v1 = ReadFileBytes(P("inf1.coli_kv"));
  const uint64_t rec = 4 + (2 + 2) * 4;
  ASSERT_EQ(v1.size(), 40 + 2 * rec);
  float row[2];
  std::memcpy(row, v1.data() + 40 + rec + 4, 8);
  EXPECT_EQ(std::bit_cast<uint32_t>(row[0]), 0x7F7FFFFFu);
  EXPECT_EQ(row[1], 1e36f / 512);
}

// coli_glm_partial.coli_kv (make_fixtures.py): GLM-5.2's depth, the indexer in
// 21 of 78 layers (h[4] = 21), which colibri's header counts but does not name.
constexpr uint32_t kGlmLayers = 78;
const uint32_t kGlmIds[2] = {7, 42};
std::vector<uint32_t> GlmIndexerLayers() {
  std::vector<uint32_t> l;
  for (uint32_t i = 0; i < kGlmLayers; i += 4) l.push_back(i);
  l.push_back(77);
  return l;
}
uint8_t GlmCode(int t, int l, int j) { return static_cast<uint8_t>(((t + l + j) % 0x70) | (j % 2 ? 0x80 : 0)); }
float GlmScale(int t, int l) { return std::ldexp(1.0f, -(t + l % 8 + 1)); }

TEST_F(ColiKv, AnIndexerInSomeLayersNeedsThemNamed) {
  ImportResult res;
  Status st = Import(Fixture("coli_glm_partial.coli_kv"), P("a.kv"), nullptr, &res);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(st.message(), Fixture("coli_glm_partial.coli_kv") +
                              ": the indexer is in 21 of 78 layers and a colibri header does not say which: give "
                              "them (--indexer-layers, e.g. 0..20 or 0,4,8)");
  EXPECT_FALSE(fs::exists(P("a.kv")));
  ImportOptions o;
  o.indexer_layers = std::vector<uint32_t>{0, 4, 8};
  st = Import(Fixture("coli_glm_partial.coli_kv"), P("a.kv"), o, &res);
  EXPECT_EQ(st.message(), Fixture("coli_glm_partial.coli_kv") +
                              ": --indexer-layers names 3 layers; the header's h[4] says the indexer is in 21 of 78 "
                              "layers");
  std::vector<uint32_t> past = GlmIndexerLayers();
  past.back() = 78;
  o.indexer_layers = past;
  st = Import(Fixture("coli_glm_partial.coli_kv"), P("a.kv"), o, &res);
  EXPECT_EQ(st.message(), Fixture("coli_glm_partial.coli_kv") +
                              ": --indexer-layers names layer 78; the file has 78 layers");
  // 21 entries, but not 21 layers each once.
  std::vector<uint32_t> repeated = GlmIndexerLayers();
  repeated[1] = repeated[0];
  o.indexer_layers = repeated;
  st = Import(Fixture("coli_glm_partial.coli_kv"), P("a.kv"), o, &res);
  EXPECT_EQ(st.message(), Fixture("coli_glm_partial.coli_kv") +
                              ": --indexer-layers: the layers are not ascending without repeats");
  EXPECT_FALSE(fs::exists(P("a.kv")));
  o.indexer_layers = std::vector<uint32_t>{0};
  st = Import(Fixture("coli_v2.coli_kv"), P("a.kv"), o, &res);
  EXPECT_EQ(st.message(), Fixture("coli_v2.coli_kv") + ": --indexer-layers names 1 layers; the header's h[4] says "
                                                       "the indexer is in 2 of 2 layers");
}

TEST_F(ColiKv, AnIndexerIn21Of78LayersImportsAndExportsByteForByte) {
  ImportOptions o;
  o.indexer_layers = GlmIndexerLayers();
  ImportResult res;
  ASSERT_TRUE(Import(Fixture("coli_glm_partial.coli_kv"), P("a.kv"), o, &res).ok());
  EXPECT_EQ(res.header.indexer_layers, 21u);
  EXPECT_EQ(res.header.record_bytes, 4u + kGlmLayers * (kLora + kRope + 8) + 21 * kIhd * 4);
  std::unique_ptr<Reader> r;
  ASSERT_TRUE(Reader::Open(P("a.kv"), {}, &r).ok());
  EXPECT_EQ(r->minor_version(), 3);  // 2.3: a stream in some layers only
  const Geometry& g = r->geometry();
  ASSERT_EQ(g.layers, kGlmLayers);
  ASSERT_EQ(g.streams.size(), 3u);
  EXPECT_EQ(g.streams[2], (StreamSpec{"indexer", 1, kIhd, Dtype::kF32, GlmIndexerLayers()}));
  EXPECT_TRUE(g.streams[0].layers.empty());
  ASSERT_EQ(r->token_count(), 2u);
  EXPECT_EQ(std::vector<uint32_t>(r->tokens().begin(), r->tokens().end()),
            std::vector<uint32_t>(kGlmIds, kGlmIds + 2));
  for (uint32_t l = 0; l < kGlmLayers; ++l) {
    uint8_t lc[2 * kLora], rc[2 * kRope];
    float ls[2], rs[2];
    ASSERT_TRUE(r->ReadCodes(l, 0, 0, 2, lc, ls).ok());
    ASSERT_TRUE(r->ReadCodes(l, 1, 0, 2, rc, rs).ok());
    const int li = static_cast<int>(l);
    for (int t = 0; t < 2; ++t) {
      EXPECT_EQ(ls[t], GlmScale(t, li));
      EXPECT_EQ(rs[t], GlmScale(t, li + 1));
      for (uint32_t j = 0; j < kLora; ++j) EXPECT_EQ(lc[t * kLora + j], GlmCode(t, li, static_cast<int>(j)));
      for (uint32_t j = 0; j < kRope; ++j) EXPECT_EQ(rc[t * kRope + j], GlmCode(t, li + 1, static_cast<int>(j)));
    }
    float ix[2 * kIhd];
    Status st = r->ReadRows(l, 2, 0, 2, Dtype::kF32, ix);
    if (!g.InLayer(l, 2)) {
      EXPECT_EQ(st.message(), P("a.kv") + ": stream 'indexer' is not in layer " + std::to_string(l) +
                                  " (it is in layers 0,4,8,12,16,20,24,28,32,36,40,44,48,52,56,60,64,68,72,76,77)");
      continue;
    }
    ASSERT_TRUE(st.ok()) << st.message();
    for (int t = 0; t < 2; ++t)
      for (uint32_t j = 0; j < kIhd; ++j) EXPECT_EQ(ix[t * kIhd + j], Indexer(t, li, static_cast<int>(j)));
  }
  // Back to colibri: h[4] = 21 and the rows of those layers, as the fixture has them.
  uint64_t tokens = 0;
  ASSERT_TRUE(Export(P("a.kv"), P("b.coli_kv"), {}, &tokens).ok());
  EXPECT_EQ(tokens, 2u);
  EXPECT_EQ(ReadFileBytes(P("b.coli_kv")), ReadFileBytes(Fixture("coli_glm_partial.coli_kv")));
}

TEST_F(ColiKv, RefusedLayouts) {
  std::vector<uint8_t> good = ReadFileBytes(Fixture("coli_v2.coli_kv"));
  struct Case {
    const char* what;
    size_t offset;
    uint8_t value;
    Status::Code code;
  };
  const Case cases[] = {
      {"COLIKV3", 6, '3', Status::Code::kUnsupported},
      {"COLIKV9", 6, '9', Status::Code::kCorruption},
      {"COLIKV2 whose h[7] is a watermark", 36, 3, Status::Code::kUnsupported},
      {"COLIKV1 magic on v2 data (tag 1)", 6, '1', Status::Code::kUnsupported},
      // Which layer the header does not say: the import asks for it (ImportOptions).
      {"indexer in 1 of 2 layers", 24, 1, Status::Code::kInvalidArgument},
      {"3 indexer layers of 2", 24, 3, Status::Code::kCorruption},
      {"layers 0", 8, 0, Status::Code::kCorruption},
      {"negative vocab", 31, 0x80, Status::Code::kCorruption},
      {"record count 4 (only 3 present)", 32, 4, Status::Code::kCorruption},
      {"negative record count", 35, 0xFF, Status::Code::kCorruption},
      {"layers 1794 (beyond kvfile's 1024)", 9, 0x07, Status::Code::kUnsupported},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<uint8_t> b = good;
    b[c.offset] = c.value;
    ImportResult res;
    Status st = ImportBytes(b, &res);
    EXPECT_EQ(st.code(), c.code) << st.message();
  }
}

TEST_F(ColiKv, BadRecordsAreCorruption) {
  std::vector<uint8_t> good = ReadFileBytes(Fixture("coli_v2.coli_kv"));
  const uint64_t r1 = 40 + kRecV2;  // record 1
  struct Case {
    const char* what;
    uint64_t offset;
    std::vector<uint8_t> bytes;
    const char* message_part;
  };
  const Case cases[] = {
      {"token id = vocab", r1, {100, 0, 0, 0}, "record 1: token id 100 is outside the vocabulary [0, 100)"},
      {"negative token id", r1, {0, 0, 0, 0x80}, "record 1: token id -2147483648 is outside"},
      {"NaN code", r1 + 4 + 2, {0x7F}, "record 1: layer 0 latent row: NaN code"},
      {"zero scale", r1 + 4 + kLora, {0, 0, 0, 0}, "record 1: layer 0 latent row: scale is not a finite number"},
      {"subnormal scale", r1 + 4 + kLora, {1, 0, 0, 0}, "scale is not a finite number >= FLT_MIN"},
      {"NaN indexer", r1 + 4 + kLayers * 14, {0, 0, 0xC0, 0x7F}, "record 1: layer 0 indexer row: NaN or infinity"},
      {"NaN scale", r1 + 4 + kLora, {0, 0, 0xC0, 0x7F}, "record 1: layer 0 latent row: scale is not a finite number"},
      {"negative scale", r1 + 4 + kLora, {0, 0, 0x80, 0xBF}, "record 1: layer 0 latent row: scale is not a finite number"},
      // The rows colibri's loader zeroes though kvfile could hold them
      // (scale at least 3.4e38f), and those its unclamped f32 decode makes
      // infinite (code 448 x 1e36).
      {"scale 3.4e38f", r1 + 4 + kLora, {0x9E, 0xC9, 0x7F, 0x7F},
       "in.coli_kv: record 1: layer 0 latent row: scale 3.39999995e+38 is at least 3.4e38, a row colibri's loader "
       "zeroes"},
      {"scale FLT_MAX", r1 + 4 + kLora, {0xFF, 0xFF, 0x7F, 0x7F},
       "in.coli_kv: record 1: layer 0 latent row: scale 3.40282347e+38 is at least 3.4e38, a row colibri's loader "
       "zeroes"},
      {"rope scale 3.4e38f", r1 + 4 + kLora + 4 + kRope, {0x9E, 0xC9, 0x7F, 0x7F},
       "in.coli_kv: record 1: layer 0 rope row: scale 3.39999995e+38 is at least 3.4e38"},
      {"code 448 x 1e36", r1 + 4 + 2, {0x7E, 0x93, 0xCE, 0x97, 0x40, 0x7B},
       "in.coli_kv: record 1: layer 0 latent row: code 448 x scale 9.99999962e+35 is infinite in colibri's f32 "
       "decode"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<uint8_t> b = good;
    std::memcpy(b.data() + c.offset, c.bytes.data(), c.bytes.size());
    ImportResult res;
    Status st = ImportBytes(b, &res);
    EXPECT_EQ(st.code(), Status::Code::kCorruption);
    EXPECT_NE(st.message().find(c.message_part), std::string::npos) << st.message();
  }
}

// Every length from 0 to the whole file: shorter than the committed records
// is an error (kCorruption), anything from the last committed byte on
// imports the three records and ignores the rest.
TEST_F(ColiKv, EveryTruncation) {
  std::vector<uint8_t> full = ReadFileBytes(Fixture("coli_v2.coli_kv"));
  const uint64_t committed = 40 + 3 * kRecV2;
  for (uint64_t n = 0; n <= full.size(); ++n) {
    SCOPED_TRACE(n);
    std::vector<uint8_t> b(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    ImportResult res;
    Status st = ImportBytes(b, &res);
    if (n < committed) {
      EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.message();
    } else {
      ASSERT_TRUE(st.ok()) << st.message();
      EXPECT_EQ(res.ignored_bytes, n - committed);
      std::unique_ptr<Reader> r = OpenImported();
      ASSERT_TRUE(r);
      EXPECT_EQ(r->token_count(), 3u);
    }
  }
}

// Every single-bit flip: never a crash; an error is a data error (exit 1 in
// the CLI); an import that succeeds holds exactly what the flipped bytes
// say (checked for flips inside codes and scales of record 0).
TEST_F(ColiKv, EveryBitFlip) {
  std::vector<uint8_t> full = ReadFileBytes(Fixture("coli_v2.coli_kv"));
  size_t ok = 0, refused = 0;
  for (size_t bit = 0; bit < full.size() * 8; ++bit) {
    std::vector<uint8_t> b = full;
    b[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    ImportResult res;
    Status st = ImportBytes(b, &res);
    if (!st.ok()) {
      ++refused;
      EXPECT_TRUE(st.IsDataError()) << bit << ": " << st.ToString();
      continue;
    }
    ++ok;
    size_t byte = bit / 8;
    if (byte >= 44 && byte < 44 + kLora) {  // layer 0 latent codes of record 0
      std::unique_ptr<Reader> r = OpenImported();
      ASSERT_TRUE(r);
      uint8_t codes[kLora];
      float scale;
      ASSERT_TRUE(r->ReadCodes(0, 0, 0, 1, codes, &scale).ok());
      EXPECT_EQ(std::memcmp(codes, b.data() + 44, kLora), 0) << bit;
    }
  }
  EXPECT_GT(ok, 0u);
  EXPECT_GT(refused, 0u);
}

TEST_F(ColiKv, ExportRefusesOtherGeometries) {
  auto make = [this](const std::string& name, Geometry g, const std::string& model) {
    std::unique_ptr<Writer> w;
    EXPECT_TRUE(Writer::Create(P(name), g, {model, 0}, {}, &w).ok());
    EXPECT_TRUE(w->Close().ok());
  };
  Geometry base;
  base.layers = 1;
  base.streams = {{"latent", 1, 4, Dtype::kE4M3}, {"rope", 1, 2, Dtype::kE4M3}};
  struct Case {
    const char* what;
    Geometry g;
    std::string model;
    const char* message_part;
  };
  Geometry e5 = base;
  e5.streams[0].dtype = Dtype::kE5M2;
  Geometry rows2 = base;
  rows2.streams[1].rows_per_token = 2;
  Geometry extra = base;
  extra.streams.push_back({"k", 1, 4, Dtype::kE4M3});
  Geometry no_rope = base;
  no_rope.streams.pop_back();
  Geometry fp8_index = base;
  fp8_index.streams.push_back({"indexer", 1, 4, Dtype::kE4M3});
  const Case cases[] = {
      {"e5m2", e5, "coli_kv:vocab=9", "stream 'latent' is e5m2, not e4m3"},
      {"2 rows", rows2, "coli_kv:vocab=9", "stream 'rope' has 2 rows per token, not 1"},
      {"extra stream", extra, "coli_kv:vocab=9", "streams other than latent, rope and indexer"},
      {"no rope", no_rope, "coli_kv:vocab=9", "streams 'latent' and 'rope' are needed"},
      {"fp8 indexer", fp8_index, "coli_kv:vocab=9", "stream 'indexer' is fp8"},
      {"no vocabulary", base, "my-model", "the vocabulary size colibri's header needs is unknown"},
  };
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::string name = "g" + std::to_string(i++) + ".kv";
    make(name, c.g, c.model);
    uint64_t tokens = 0;
    Status st = Export(P(name), P("x.coli_kv"), {}, &tokens);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
    EXPECT_NE(st.message().find(c.message_part), std::string::npos) << st.message();
    EXPECT_FALSE(fs::exists(P("x.coli_kv")));
  }
}

}  // namespace
}  // namespace kvfile::coli
