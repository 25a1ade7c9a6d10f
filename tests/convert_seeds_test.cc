// SPDX-License-Identifier: Apache-2.0
// kvfile convert to and from the seeds' formats: a directory of Mooncake
// FP8 codec records (--format mooncake) and colibri .coli_kv sessions
// (--format coli-v2): exit statuses, the one stderr line, what is written,
// lossless round trips, and that a failed conversion leaves OUT as it was.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "kvfile/formats/mooncake.h"
#include "kvfile/reader.h"
#include "kvfile/writer.h"
#include "support/cli_run.h"
#include "support/scratch_dir.h"

namespace kvfile {
namespace {

namespace fs = std::filesystem;
using testing::CliRun;
using testing::Kvfile;
using testing::ReadFile;

class ConvertSeeds : public testing::ScratchDirTest {
 protected:
  static std::string Fixture(const char* name) { return std::string(KVFILE_TEST_DATA "/fixtures/seeds/").append(name); }
};

// Every fp8 stream of a and b holds the same codes and scales, and the
// files have the same tokens and identity.
void ExpectSameCodes(const std::string& a, const std::string& b) {
  std::unique_ptr<Reader> ra, rb;
  ASSERT_TRUE(Reader::Open(a, {}, &ra).ok());
  ASSERT_TRUE(Reader::Open(b, {}, &rb).ok());
  ASSERT_EQ(ra->token_count(), rb->token_count());
  EXPECT_TRUE(std::equal(ra->tokens().begin(), ra->tokens().end(), rb->tokens().begin()));
  EXPECT_EQ(ra->identity(), rb->identity());
  const Geometry& g = ra->geometry();
  uint64_t T = ra->token_count();
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t s = 0; s < g.streams.size(); ++s) {
      if (!IsFp8(g.streams[s].dtype)) continue;
      uint64_t rows = T * g.streams[s].rows_per_token;
      std::vector<uint8_t> ca(rows * g.streams[s].row_width), cb(ca.size());
      std::vector<float> sa(rows), sb(rows);
      ASSERT_TRUE(ra->ReadCodes(l, s, 0, T, ca.data(), sa.data()).ok());
      ASSERT_TRUE(rb->ReadCodes(l, s, 0, T, cb.data(), sb.data()).ok());
      ASSERT_EQ(ca, cb) << "layer " << l << " stream " << s;
      ASSERT_EQ(0, std::memcmp(sa.data(), sb.data(), rows * 4)) << "layer " << l << " stream " << s;
    }
}

// A one-token .kv file of one layer and one e4m3 stream "s" of width 4
// holding `row` (token id 7).
void WriteOneRow(const std::string& path, const ModelIdentity& id, const float (&row)[4]) {
  Geometry g;
  g.layers = 1;
  g.streams = {{"s", 1, 4, Dtype::kE4M3}};
  std::unique_ptr<Writer> w;
  ASSERT_TRUE(Writer::Create(path, g, id, {}, &w).ok());
  const uint32_t token = 7;
  AppendBatch b;
  b.tokens = std::span<const uint32_t>(&token, 1);
  b.blocks.push_back({Dtype::kF32, row, nullptr});
  ASSERT_TRUE(w->Append(b).ok());
  ASSERT_TRUE(w->Close().ok());
}

TEST_F(ConvertSeeds, MooncakeRoundTripIsLossless) {
  ASSERT_EQ(Kvfile("synth " + P("a.kv") + " --preset tiny --tokens 300 --chunk-tokens 128 --seed 3").exit_code, 0);
  CliRun e = Kvfile("convert " + P("a.kv") + " " + P("mc") + " --format mooncake");
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_EQ(e.err, "");
  // 3 chunks x 2 layers x 2 streams.
  EXPECT_EQ(e.out, P("a.kv") + " -> " + P("mc") + ": 12 Mooncake records (12 with codes and scales as stored, 0 "
                                                   "requantized), 300 tokens\n");
  nlohmann::json m = nlohmann::json::parse(ReadFile(fs::path(P("mc")) / "manifest.json"));
  EXPECT_EQ(m["format"], "kvfile-mooncake");
  EXPECT_EQ(m["tokens"], 300);
  ASSERT_EQ(m["records"].size(), 12u);
  const nlohmann::json& r0 = m["records"][0];
  EXPECT_EQ(r0["layer"], 0);
  EXPECT_EQ(r0["stream"], "k");
  EXPECT_EQ(r0["begin"], 0);
  EXPECT_EQ(r0["end"], 128);
  EXPECT_EQ(r0["group_size"], 16);
  std::string key = r0["key"].get<std::string>();
  EXPECT_EQ(r0["file"], mooncake::FileNameForKey(mooncake::RepresentationKey(16, key)));
  std::string rec = ReadFile(fs::path(P("mc")) / r0["file"].get<std::string>());
  EXPECT_EQ(rec.size(), 32u + 24 + 128 * 2 * 4 + 128 * 2 * 16);
  EXPECT_EQ(fs::directory_iterator(P("mc")) == fs::directory_iterator(), false);
  size_t files = 0;
  for (auto it = fs::directory_iterator(P("mc")); it != fs::directory_iterator(); ++it) ++files;
  EXPECT_EQ(files, 13u);
  CliRun i = Kvfile("convert " + P("mc") + " " + P("b.kv"));
  ASSERT_EQ(i.exit_code, 0) << i.err;
  EXPECT_EQ(i.err, "");
  ExpectSameCodes(P("a.kv"), P("b.kv"));
}

TEST_F(ConvertSeeds, MooncakeOtherGroupSizeRequantizesAndSaysSo) {
  ASSERT_EQ(Kvfile("synth " + P("a.kv") + " --preset tiny --tokens 40 --seed 4").exit_code, 0);
  CliRun e = Kvfile("convert " + P("a.kv") + " " + P("mc") + " --format mooncake --group-size 24");
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_EQ(e.err, "kvfile: note: " + P("mc") +
                       ": 4 records decoded and requantized (lossy: --group-size 24 is not the row width, or a "
                       "stream is not e4m3)\n");
  CliRun i = Kvfile("convert " + P("mc") + " " + P("b.kv"));
  ASSERT_EQ(i.exit_code, 0) << i.err;
  EXPECT_EQ(i.err, "kvfile: note: " + P("mc") +
                       ": 4 records decoded and requantized with kvfile's row rule (lossy: groups are not rows, or a "
                       "scale is below FLT_MIN)\n");
  std::unique_ptr<Reader> r;
  ASSERT_TRUE(Reader::Open(P("b.kv"), {}, &r).ok());
  EXPECT_EQ(r->token_count(), 40u);
}

// A one-token session holding the golden row [448, -448, 1, -0.0]: export
// writes the record Mooncake's encoder makes of those values (bf16), and
// the import of a directory holding the fp16 golden payload gives the same
// codes and scale once the manifest says fp16 too (under its bf16 it is
// refused, as Mooncake's decoder refuses a record of another dtype).
TEST_F(ConvertSeeds, MooncakeGoldenBothWays) {
  WriteOneRow(P("g.kv"), {"golden", 0x1234}, {448.0f, -448.0f, 1.0f, -0.0f});
  CliRun e = Kvfile("convert " + P("g.kv") + " " + P("mc") + " --format mooncake");
  ASSERT_EQ(e.exit_code, 0) << e.err;
  std::string key = "kvfile/0000000000001234/s/L0/T0-1";
  std::string file = mooncake::FileNameForKey(mooncake::RepresentationKey(4, key));
  std::string rec = ReadFile(fs::path(P("mc")) / file);
  mooncake::RecordDesc d;
  d.dtype = mooncake::SourceDtype::kBF16;
  d.group_size = 4;
  d.shape = {1, 1, 4};
  const uint16_t bf16[4] = {0x43E0, 0xC3E0, 0x3F80, 0x8000};
  std::vector<uint8_t> want;
  ASSERT_TRUE(mooncake::EncodeValues(d, bf16, &want).ok());
  EXPECT_EQ(rec, std::string(want.begin(), want.end()));
  EXPECT_EQ(rec.substr(rec.size() - 8), std::string("\x00\x00\x80\x3F\x7E\xFE\x38\x80", 8));
  // The fp16 golden payload under the same manifest.
  d.dtype = mooncake::SourceDtype::kF16;
  const uint16_t f16[4] = {0x5F00, 0xDF00, 0x3C00, 0x8000};
  ASSERT_TRUE(mooncake::EncodeValues(d, f16, &want).ok());
  {
    std::ofstream out(fs::path(P("mc")) / file, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(want.data()), static_cast<std::streamsize>(want.size()));
  }
  CliRun i = Kvfile("convert " + P("mc") + " " + P("h.kv"));
  EXPECT_EQ(i.exit_code, 1);
  EXPECT_EQ(i.err, "kvfile: error: " + (fs::path(P("mc")) / file).string() +
                       ": the record's source dtype is fp16 (1), the manifest's source_dtype is bf16 (2)\n");
  EXPECT_FALSE(fs::exists(P("h.kv")));
  const fs::path manifest = fs::path(P("mc")) / "manifest.json";
  nlohmann::json m = nlohmann::json::parse(ReadFile(manifest));
  EXPECT_EQ(m["source_dtype"], "bf16");
  m["source_dtype"] = "fp16";
  { std::ofstream(manifest, std::ios::trunc) << m.dump(); }
  i = Kvfile("convert " + P("mc") + " " + P("h.kv"));
  ASSERT_EQ(i.exit_code, 0) << i.err;
  std::unique_ptr<Reader> r;
  ASSERT_TRUE(Reader::Open(P("h.kv"), {}, &r).ok());
  uint8_t codes[4];
  float scale = 0;
  ASSERT_TRUE(r->ReadCodes(0, 0, 0, 1, codes, &scale).ok());
  EXPECT_EQ(std::string(reinterpret_cast<char*>(codes), 4), "\x7E\xFE\x38\x80");
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(r->tokens()[0], 7u);
  EXPECT_EQ(r->identity(), (ModelIdentity{"golden", 0x1234}));
}

// The manifest's source_dtype must be fp16 or bf16, and a record's values
// must be ones its dtype holds: a group Mooncake's encoder could not have
// written (448 x 146.25 = 65520 rounds to infinity in fp16) is refused;
// the encoder's own record of fp16's largest value imports.
TEST_F(ConvertSeeds, MooncakeSourceDtypeIsChecked) {
  WriteOneRow(P("g.kv"), {"m", 0x1234}, {1, 2, 3, 4});
  ASSERT_EQ(Kvfile("convert " + P("g.kv") + " " + P("mc") + " --format mooncake").exit_code, 0);
  const fs::path manifest = fs::path(P("mc")) / "manifest.json";
  const std::string mbad = "kvfile: error: " + manifest.string() + ": \"source_dtype\" is not \"fp16\" or \"bf16\"\n";
  nlohmann::json m = nlohmann::json::parse(ReadFile(manifest));
  for (nlohmann::json v : {nlohmann::json("f16"), nlohmann::json(1), nlohmann::json()}) {
    SCOPED_TRACE(v.dump());
    if (v.is_null()) m.erase("source_dtype");
    else m["source_dtype"] = v;
    { std::ofstream(manifest, std::ios::trunc) << m.dump(); }
    CliRun i = Kvfile("convert " + P("mc") + " " + P("h.kv"));
    EXPECT_EQ(i.exit_code, 1);
    EXPECT_EQ(i.err, mbad);
    EXPECT_FALSE(fs::exists(P("h.kv")));
  }
  m["source_dtype"] = "fp16";
  { std::ofstream(manifest, std::ios::trunc) << m.dump(); }
  const fs::path rec = fs::path(P("mc")) / mooncake::FileNameForKey(
                                               mooncake::RepresentationKey(4, "kvfile/0000000000001234/s/L0/T0-1"));
  auto write = [&rec](const std::vector<uint8_t>& bytes) {
    std::ofstream out(rec, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  };
  mooncake::RecordDesc d;
  d.dtype = mooncake::SourceDtype::kF16;
  d.group_size = 4;
  d.shape = {1, 1, 4};
  std::vector<uint8_t> bytes;
  const uint8_t codes[4] = {0x7E, 0x38, 0x00, 0x80};
  const float over = 146.25f;
  ASSERT_TRUE(mooncake::EncodeCodes(d, &over, codes, &bytes).ok());
  write(bytes);
  CliRun i = Kvfile("convert " + P("mc") + " " + P("h.kv"));
  EXPECT_EQ(i.exit_code, 1);
  EXPECT_EQ(i.err, "kvfile: error: " + rec.string() +
                       ": group 0 holds a value beyond the range of its source dtype fp16 (1)\n");
  EXPECT_FALSE(fs::exists(P("h.kv")));
  const uint16_t largest[4] = {0x7BFF, 0xFBFF, 0x3C00, 0};  // 65504, -65504, 1, 0
  ASSERT_TRUE(mooncake::EncodeValues(d, largest, &bytes).ok());
  write(bytes);
  i = Kvfile("convert " + P("mc") + " " + P("h.kv"));
  EXPECT_EQ(i.exit_code, 0) << i.err;
}

TEST_F(ConvertSeeds, MooncakeDamageIsExitOneAndWritesNothing) {
  ASSERT_EQ(Kvfile("synth " + P("a.kv") + " --preset tiny --tokens 20 --seed 5").exit_code, 0);
  ASSERT_EQ(Kvfile("convert " + P("a.kv") + " " + P("mc") + " --format mooncake").exit_code, 0);
  nlohmann::json m = nlohmann::json::parse(ReadFile(fs::path(P("mc")) / "manifest.json"));
  fs::path victim = fs::path(P("mc")) / m["records"][1]["file"].get<std::string>();
  std::string bytes = ReadFile(victim);
  std::string flipped = bytes;
  flipped[60] = static_cast<char>(flipped[60] ^ 4);
  { std::ofstream(victim, std::ios::binary | std::ios::trunc) << flipped; }
  CliRun i = Kvfile("convert " + P("mc") + " " + P("b.kv"));
  EXPECT_EQ(i.exit_code, 1);
  EXPECT_EQ(i.err, "kvfile: error: " + victim.string() + ": CRC32 mismatch\n");
  EXPECT_FALSE(fs::exists(P("b.kv")));
  fs::remove(victim);
  i = Kvfile("convert " + P("mc") + " " + P("b.kv"));
  EXPECT_EQ(i.exit_code, 1);  // the directory is incomplete: its data is at fault
  EXPECT_EQ(i.err, "kvfile: error: " + victim.string() + ": missing (the manifest lists it)\n");
  EXPECT_FALSE(fs::exists(P("b.kv")));
  { std::ofstream(victim, std::ios::binary | std::ios::trunc) << bytes; }
  // A manifest whose records do not tile the tokens.
  std::string manifest = ReadFile(fs::path(P("mc")) / "manifest.json");
  m["records"].erase(m["records"].begin());
  { std::ofstream(fs::path(P("mc")) / "manifest.json", std::ios::trunc) << m.dump(); }
  i = Kvfile("convert " + P("mc") + " " + P("b.kv"));
  EXPECT_EQ(i.exit_code, 1);
  EXPECT_NE(i.err.find("kvfile: error: " + P("mc") + "/manifest.json: tokens [0, 20) have 3 records"),
            std::string::npos)
      << i.err;
  EXPECT_FALSE(fs::exists(P("b.kv")));
}

// A 24 MB manifest, valid, whose bulk is a key the import does not use
// (8,000,000 empty objects): it is skipped unread, and the import
// succeeds with memory about the manifest's own size. Read as a DOM it
// took 854 MiB (an object per "{}"). And 120,000 record entries after the
// real ones, the first naming a stream the manifest does not list: refused
// with the line that names the record's fault, memory again bounded.
TEST_F(ConvertSeeds, BigManifestIsReadWithBoundedMemory) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  constexpr long kPeakMib = 400;
#else
  constexpr long kPeakMib = 160;  // the text and the fields kept, once each
#endif
  ASSERT_EQ(Kvfile("synth " + P("a.kv") + " --preset tiny --tokens 20 --seed 5").exit_code, 0);
  ASSERT_EQ(Kvfile("convert " + P("a.kv") + " " + P("mc") + " --format mooncake").exit_code, 0);
  const fs::path manifest = fs::path(P("mc")) / "manifest.json";
  const std::string text = ReadFile(manifest);
  ASSERT_EQ(text[0], '{');
  {
    std::ofstream out(manifest, std::ios::trunc);
    out << "{\"padding\": [{}";
    for (int i = 1; i < 8000000; ++i) out << ",{}";
    out << "]," << text.substr(1);
  }
  ASSERT_GT(fs::file_size(manifest), uint64_t{22} << 20);
  testing::MeasuredRun r = testing::KvfileMeasuringPeak({"convert", P("mc"), P("b.kv")});
  std::printf("24 MB manifest of empty objects: peak %ld MiB\n", r.peak_mib);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_LT(r.peak_mib, kPeakMib);
  ExpectSameCodes(P("a.kv"), P("b.kv"));

  nlohmann::json m = nlohmann::json::parse(text);
  nlohmann::json extra = m["records"][0];
  extra["stream"] = "zz";
  for (int i = 0; i < 120000; ++i) {
    extra["key"] = "padding/" + std::to_string(i);
    m["records"].push_back(extra);
  }
  { std::ofstream(manifest, std::ios::trunc) << m.dump(1); }
  ASSERT_GT(fs::file_size(manifest), uint64_t{20} << 20);
  r = testing::KvfileMeasuringPeak({"convert", P("mc"), P("c.kv")});
  std::printf("24 MB manifest of records: peak %ld MiB\n", r.peak_mib);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "kvfile: error: " + manifest.string() + ": a record of stream 'zz', which \"streams\" does not list\n");
  EXPECT_LT(r.peak_mib, kPeakMib);
  EXPECT_FALSE(fs::exists(P("c.kv")));
}

TEST_F(ConvertSeeds, MooncakeOutputRules) {
  ASSERT_EQ(Kvfile("synth " + P("a.kv") + " --preset tiny --tokens 20 --seed 5").exit_code, 0);
  ASSERT_EQ(Kvfile("convert " + P("a.kv") + " " + P("mc") + " --format mooncake").exit_code, 0);
  std::string before = ReadFile(fs::path(P("mc")) / "manifest.json");
  CliRun r = Kvfile("convert " + P("a.kv") + " " + P("mc") + " --format mooncake --group-size 8");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + P("mc") + ": exists; use --force to replace it\n");
  EXPECT_EQ(ReadFile(fs::path(P("mc")) / "manifest.json"), before);
  r = Kvfile("convert " + P("a.kv") + " " + P("mc") + " --format mooncake --group-size 8 --force");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(ReadFile(fs::path(P("mc")) / "manifest.json"), before);
  for (auto it = fs::directory_iterator(dir_); it != fs::directory_iterator(); ++it)
    EXPECT_EQ(it->path().filename().string().find(".kv"  "tmp"), std::string::npos) << it->path();
  fs::create_directories(P("other"));
  r = Kvfile("convert " + P("a.kv") + " " + P("other") + " --format mooncake --force");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + P("other") +
                       ": exists and is not a Mooncake directory written by kvfile convert; not replaced\n");
  r = Kvfile("convert " + P("a.kv") + " " + P("b.kv") + " --group-size 8");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: --group-size applies to --format mooncake\n");
  r = Kvfile("convert " + P("mc") + " " + P("b.safetensors"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1);
}

TEST_F(ConvertSeeds, ColiImportAndExportByteExact) {
  CliRun i = Kvfile("convert " + Fixture("coli_v2.coli_kv") + " " + P("a.kv"));
  ASSERT_EQ(i.exit_code, 0) << i.err;
  EXPECT_EQ(i.out, Fixture("coli_v2.coli_kv") + " -> " + P("a.kv") +
                       ": COLIKV2, 3 tokens, 2 layers (latent 4, rope 2, indexer 3), vocab 100\n");
  EXPECT_EQ(i.err, "kvfile: note: " + Fixture("coli_v2.coli_kv") +
                       ": 7 bytes past the record count ignored (an uncommitted append, as colibri ignores it)\n");
  CliRun e = Kvfile("convert " + P("a.kv") + " " + P("b.coli_kv") + " --format coli-v2");
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_EQ(e.err, "");
  std::string want = ReadFile(Fixture("coli_v2.coli_kv"));
  EXPECT_EQ(ReadFile(P("b.coli_kv")), want.substr(0, want.size() - 7));
  // And back again: the same codes.
  ASSERT_EQ(Kvfile("convert " + P("b.coli_kv") + " " + P("c.kv")).exit_code, 0);
  ExpectSameCodes(P("a.kv"), P("c.kv"));
}

// --format coli-v1: COLIKV1 with f32 rows, byte for byte the v1 layout of
// the fixture's decoded rows (make_fixtures.py), for a colibri without KV8=1.
TEST_F(ConvertSeeds, ColiV1Export) {
  ASSERT_EQ(Kvfile("convert " + Fixture("coli_v2.coli_kv") + " " + P("a.kv")).exit_code, 0);
  CliRun e = Kvfile("convert " + P("a.kv") + " " + P("b.coli_kv") + " --format coli-v1");
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_EQ(e.out, P("a.kv") + " -> " + P("b.coli_kv") + ": COLIKV1, 3 tokens\n");
  EXPECT_EQ(e.err, "");
  EXPECT_EQ(ReadFile(P("b.coli_kv")), ReadFile(Fixture("coli_v2_as_v1.coli_kv")));
  CliRun r = Kvfile("convert " + P("a.kv") + " " + P("m") + " --format mooncake --vocab 100");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: --vocab applies to --format coli-v2 or coli-v1\n");
}

// A row colibri's loader would zero (scale at least 3.4e38f): the import
// refuses it (exit 1) naming the row, and a .kv holding one is not exported
// as COLIKV2 (exit 2); OUT is left absent both times.
TEST_F(ConvertSeeds, ColiRowsColibriZeroesAreRefusedBothWays) {
  std::string bytes = ReadFile(Fixture("coli_v2.coli_kv"));
  bytes.replace(40 + 56 + 4 + 4, 4, std::string("\x9E\xC9\x7F\x7F", 4));  // record 1, layer 0 latent scale: 3.4e38f
  { std::ofstream(P("z.coli_kv"), std::ios::binary) << bytes; }
  CliRun r = Kvfile("convert " + P("z.coli_kv") + " " + P("z.kv"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "kvfile: error: " + P("z.coli_kv") +
                       ": record 1: layer 0 latent row: scale 3.39999995e+38 is at least 3.4e38, a row colibri's "
                       "loader zeroes\n");
  EXPECT_FALSE(fs::exists(P("z.kv")));
  Geometry g;
  g.layers = 1;
  g.streams = {{"latent", 1, 2, Dtype::kE4M3}, {"rope", 1, 2, Dtype::kE4M3}};
  {
    std::unique_ptr<Writer> w;
    ASSERT_TRUE(Writer::Create(P("z2.kv"), g, {"coli_kv:vocab=10", 0}, {}, &w).ok());
    const uint8_t codes[2] = {0x38, 0x01};
    const float big = 3.4e38f, one = 1.0f;
    const uint32_t id = 3;
    AppendBatch b;
    b.tokens = std::span<const uint32_t>(&id, 1);
    b.blocks.push_back({Dtype::kE4M3, codes, &big});
    b.blocks.push_back({Dtype::kE4M3, codes, &one});
    ASSERT_TRUE(w->Append(b).ok());
    ASSERT_TRUE(w->Close().ok());
  }
  r = Kvfile("convert " + P("z2.kv") + " " + P("z2.coli_kv"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + P("z2.kv") +
                       ": token 0: layer 0 latent row: scale 3.39999995e+38 is at least 3.4e38, a row colibri's "
                       "loader zeroes; not exported\n");
  EXPECT_FALSE(fs::exists(P("z2.coli_kv")));
  // COLIKV1 holds the decoded row: 3.4e38f and 2^-9 x 3.4e38f.
  r = Kvfile("convert " + P("z2.kv") + " " + P("z2.coli_kv") + " --format coli-v1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string v1 = ReadFile(P("z2.coli_kv"));
  ASSERT_EQ(v1.size(), 40u + 4 + 16);
  float row[2];
  std::memcpy(row, v1.data() + 44, 8);
  EXPECT_EQ(row[0], 3.4e38f);
  EXPECT_EQ(row[1], 3.4e38f / 512);
}

// GLM-5.2's depth (coli_glm_partial.coli_kv: 78 layers, the indexer in 21,
// h[4] = 21): colibri's header does not say which layers, so the import asks
// for them (exit 2, nothing written), takes them from --indexer-layers, and
// the export writes h[4] = 21 and those rows back: the fixture's bytes.
TEST_F(ConvertSeeds, ColiIndexerIn21Of78Layers) {
  const std::string in = Fixture("coli_glm_partial.coli_kv");
  CliRun r = Kvfile("convert " + in + " " + P("a.kv"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + in +
                       ": the indexer is in 21 of 78 layers and a colibri header does not say which: give them "
                       "(--indexer-layers, e.g. 0..20 or 0,4,8)\n");
  EXPECT_FALSE(fs::exists(P("a.kv")));
  r = Kvfile("convert " + in + " " + P("a.kv") + " --indexer-layers 0..19");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + in +
                       ": --indexer-layers names 20 layers; the header's h[4] says the indexer is in 21 of 78 "
                       "layers\n");
  r = Kvfile("convert " + in + " " + P("a.kv") + " --indexer-layers 4,0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: --indexer-layers: layer list '4,0': layers are not ascending without repeats\n");
  EXPECT_FALSE(fs::exists(P("a.kv")));
  const std::string layers = "0,4,8,12,16,20,24,28,32,36,40,44,48,52,56,60,64,68,72,76,77";
  r = Kvfile("convert " + in + " " + P("a.kv") + " --indexer-layers " + layers);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, in + " -> " + P("a.kv") + ": COLIKV2, 2 tokens, 78 layers (latent 4, rope 2, indexer 3 in layers " +
                       layers + "), vocab 100\n");
  CliRun e = Kvfile("convert " + P("a.kv") + " " + P("b.coli_kv"));
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_EQ(ReadFile(P("b.coli_kv")), ReadFile(in));
  // The flag belongs to a .coli_kv IN only.
  r = Kvfile("convert " + P("a.kv") + " " + P("b.safetensors") + " --indexer-layers 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: --indexer-layers applies to a .coli_kv IN\n");
  EXPECT_FALSE(fs::exists(P("b.safetensors")));
}

TEST_F(ConvertSeeds, ColiErrors) {
  // Cut inside the committed records: exit 1, nothing written.
  std::string full = ReadFile(Fixture("coli_v2.coli_kv"));
  { std::ofstream(P("cut.coli_kv"), std::ios::binary) << full.substr(0, 100); }
  CliRun r = Kvfile("convert " + P("cut.coli_kv") + " " + P("a.kv"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "kvfile: error: " + P("cut.coli_kv") +
                       ": the file ends inside record 1 of 3 (56 bytes each): the committed records are not all "
                       "there\n");
  EXPECT_FALSE(fs::exists(P("a.kv")));
  // COLIKV3: exit 1 (a format this build does not handle).
  std::string v3 = full;
  v3[6] = '3';
  { std::ofstream(P("v3.coli_kv"), std::ios::binary) << v3; }
  r = Kvfile("convert " + P("v3.coli_kv") + " " + P("a.kv"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "kvfile: error: " + P("v3.coli_kv") +
                       ": COLIKV3 (PolarQuant rows) is not supported; only COLIKV1 and COLIKV2\n");
  // A geometry colibri cannot resume: exit 2 with the reason, nothing written.
  ASSERT_EQ(Kvfile("synth " + P("t.kv") + " --preset tiny --tokens 5").exit_code, 0);
  r = Kvfile("convert " + P("t.kv") + " " + P("t.coli_kv") + " --format coli-v2 --vocab 1000");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + P("t.kv") + ": not a colibri geometry: streams 'latent' and 'rope' are needed\n");
  EXPECT_FALSE(fs::exists(P("t.coli_kv")));
  // An existing OUT is kept without --force.
  ASSERT_EQ(Kvfile("convert " + Fixture("coli_v1.coli_kv") + " " + P("v1.kv")).exit_code, 0);
  std::string before = ReadFile(P("v1.kv"));
  r = Kvfile("convert " + Fixture("coli_v2.coli_kv") + " " + P("v1.kv"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + P("v1.kv") + ": file exists; use --force to replace it\n");
  EXPECT_EQ(ReadFile(P("v1.kv")), before);
  // A .coli_kv OUT says the format (issue 33 item 6); --format naming another is refused.
  r = Kvfile("convert " + P("v1.kv") + " " + P("x.coli_kv") + " --format v1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + P("x.coli_kv") + ": a .coli_kv OUT is written by --format coli-v2 or coli-v1, not --format v1\n");
  EXPECT_FALSE(fs::exists(P("x.coli_kv")));
  r = Kvfile("convert " + P("v1.kv") + " " + P("x.coli_kv"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.out.starts_with(P("v1.kv") + " -> " + P("x.coli_kv") + ": COLIKV2, ")) << r.out;
  EXPECT_EQ(ReadFile(P("x.coli_kv")),
            [&] { EXPECT_EQ(Kvfile("convert " + P("v1.kv") + " " + P("y.coli_kv") + " --format coli-v2").exit_code, 0);
                  return ReadFile(P("y.coli_kv")); }());
}

TEST_F(ConvertSeeds, ColiExportOfASynthesizedDsaSession) {
  ASSERT_EQ(Kvfile("synth " + P("d.kv") + " --preset dsa-mixed --tokens 9 --seed 2").exit_code, 0);
  CliRun r = Kvfile("convert " + P("d.kv") + " " + P("d.coli_kv") + " --format coli-v2 --vocab 200000");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(Kvfile("convert " + P("d.coli_kv") + " " + P("e.kv")).exit_code, 0);
  std::unique_ptr<Reader> a, b;
  ASSERT_TRUE(Reader::Open(P("d.kv"), {}, &a).ok());
  ASSERT_TRUE(Reader::Open(P("e.kv"), {}, &b).ok());
  ASSERT_EQ(b->token_count(), 9u);
  EXPECT_EQ(b->identity().model_id, "coli_kv:vocab=200000");
  for (uint32_t s = 0; s < 2; ++s) {
    uint32_t w = a->geometry().streams[s].row_width;
    std::vector<uint8_t> ca(9 * w), cb(9 * w);
    std::vector<float> sa(9), sb(9);
    ASSERT_TRUE(a->ReadCodes(60, s, 0, 9, ca.data(), sa.data()).ok());
    ASSERT_TRUE(b->ReadCodes(60, s, 0, 9, cb.data(), sb.data()).ok());
    EXPECT_EQ(ca, cb);
    EXPECT_EQ(sa, sb);
  }
  std::vector<float> ia(9 * 128), ib(9 * 128);
  ASSERT_TRUE(a->ReadRows(3, 2, 0, 9, Dtype::kF32, ia.data()).ok());
  ASSERT_TRUE(b->ReadRows(3, 2, 0, 9, Dtype::kF32, ib.data()).ok());
  EXPECT_EQ(ia, ib);
}

}  // namespace
}  // namespace kvfile
