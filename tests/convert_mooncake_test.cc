// SPDX-License-Identifier: Apache-2.0
// The Mooncake driver through the library (kvfile/convert.h, driver.h):
// .kv -> a directory of Mooncake FP8 codec records and back, the golden
// record of Mooncake's encoder, damage refused with one line, the
// directory output's transaction, a verified prefix, interrupts, progress
// and the one chunk-size rule. The CLI's contract is in convert_seeds_test.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "convert/driver.h"
#include "kvfile/convert.h"
#include "kvfile/formats/mooncake.h"
#include "kvfile/reader.h"
#include "kvfile/writer.h"
#include "support/file_util.h"
#include "support/scratch_dir.h"

namespace kvfile {
namespace {

namespace fs = std::filesystem;
using testing::ReadFile;
using testing::WriteFile;

class ConvertMooncake : public testing::ScratchDirTest {};

// A .kv file of `layers` layers, streams k and v (e4m3, `heads` x `width`)
// and a raw stream "r" (bf16, 1 x 4), `tokens` tokens in chunks of `chunk`.
void WriteKv(const std::string& path, uint32_t layers, uint32_t heads, uint32_t tokens, uint32_t chunk,
             uint32_t width = 16) {
  Geometry g;
  g.layers = layers;
  g.streams = {{"k", heads, width, Dtype::kE4M3}, {"v", heads, width, Dtype::kE4M3}, {"r", 1, 4, Dtype::kBF16}};
  WriterOptions wo;
  wo.chunk_tokens = chunk;
  std::unique_ptr<Writer> w;
  ASSERT_TRUE(Writer::Create(path, g, {"org/model", 0xabcdef}, wo, &w).ok());
  std::vector<uint32_t> ids(tokens);
  std::vector<std::vector<float>> data(layers * 3);
  for (uint32_t t = 0; t < tokens; ++t) ids[t] = 1000 + t;
  AppendBatch b;
  b.tokens = ids;
  for (uint32_t l = 0; l < layers; ++l)
    for (uint32_t s = 0; s < 3; ++s) {
      std::vector<float>& d = data[l * 3 + s];
      d.resize(uint64_t{tokens} * g.streams[s].ElementsPerToken());
      for (size_t i = 0; i < d.size(); ++i) d[i] = std::sin(0.37f * static_cast<float>(i + 97 * l + 13 * s));
      b.blocks.push_back({Dtype::kF32, d.data(), nullptr});
    }
  ASSERT_TRUE(w->Append(b).ok());
  ASSERT_TRUE(w->Close().ok());
}

ConvertOptions To(Format f) {
  ConvertOptions o;
  o.to = f;
  return o;
}

TEST_F(ConvertMooncake, RoundTripKeepsCodesAndSaysWhatItDid) {
  WriteKv(P("a.kv"), 2, 2, 40, 16);
  ConvertReport rep;
  ASSERT_TRUE(Convert(P("a.kv"), P("mc"), To(Format::kMooncake), &rep).ok());
  EXPECT_EQ(rep.from, Format::kKv);
  EXPECT_EQ(rep.to, Format::kMooncake);
  EXPECT_EQ(rep.tokens, 40u);
  // 3 chunks x 2 layers x 2 fp8 streams; "r" is raw and stays behind.
  EXPECT_EQ(rep.summary, "12 Mooncake records (12 with codes and scales as stored, 0 requantized), 40 tokens");
  EXPECT_EQ(rep.notes, std::vector<std::string>{P("mc") + ": raw streams not exported (Mooncake records are fp8): "
                                                          "[\"r\"]"});
  EXPECT_TRUE(rep.warnings.empty());
  nlohmann::json m = nlohmann::json::parse(ReadFile(fs::path(P("mc")) / "manifest.json"));
  EXPECT_EQ(m["format"], "kvfile-mooncake");
  EXPECT_EQ(m["records"].size(), 12u);
  EXPECT_EQ(m["records"][11]["begin"], 32);
  EXPECT_EQ(m["records"][11]["end"], 40);

  Format f;
  ASSERT_TRUE(DetectFormat(P("mc"), false, nullptr, &f).ok());
  EXPECT_EQ(f, Format::kMooncake);
  ConvertReport back;
  ASSERT_TRUE(Convert(P("mc"), P("b.kv"), To(Format::kKv), &back).ok());
  EXPECT_EQ(back.summary, "12 Mooncake records (12 with codes and scales as stored, 0 requantized), 40 tokens");
  EXPECT_TRUE(back.notes.empty());
  std::unique_ptr<Reader> ra, rb;
  ASSERT_TRUE(Reader::Open(P("a.kv"), {}, &ra).ok());
  ASSERT_TRUE(Reader::Open(P("b.kv"), {}, &rb).ok());
  ASSERT_EQ(rb->token_count(), 40u);
  EXPECT_EQ(rb->identity(), ra->identity());
  EXPECT_TRUE(std::equal(ra->tokens().begin(), ra->tokens().end(), rb->tokens().begin()));
  for (uint32_t l = 0; l < 2; ++l)
    for (uint32_t s = 0; s < 2; ++s) {
      std::vector<uint8_t> ca(40 * 2 * 16), cb(ca.size());
      std::vector<float> sa(80), sb(80);
      ASSERT_TRUE(ra->ReadCodes(l, s, 0, 40, ca.data(), sa.data()).ok());
      ASSERT_TRUE(rb->ReadCodes(l, s, 0, 40, cb.data(), sb.data()).ok());
      EXPECT_EQ(ca, cb);
      EXPECT_EQ(0, std::memcmp(sa.data(), sb.data(), sa.size() * 4));
    }
}

// A one-token file holding Mooncake's golden row [448, -448, 1, -0.0]: the
// record written is the one Mooncake's encoder makes of those bf16 values.
TEST_F(ConvertMooncake, GoldenRecordIsMooncakesEncoding) {
  Geometry g;
  g.layers = 1;
  g.streams = {{"s", 1, 4, Dtype::kE4M3}};
  std::unique_ptr<Writer> w;
  ASSERT_TRUE(Writer::Create(P("g.kv"), g, {"golden", 0x1234}, {}, &w).ok());
  const uint32_t token = 7;
  const float row[4] = {448.0f, -448.0f, 1.0f, -0.0f};
  AppendBatch b;
  b.tokens = std::span<const uint32_t>(&token, 1);
  b.blocks.push_back({Dtype::kF32, row, nullptr});
  ASSERT_TRUE(w->Append(b).ok());
  ASSERT_TRUE(w->Close().ok());
  ASSERT_TRUE(Convert(P("g.kv"), P("mc"), To(Format::kMooncake), nullptr).ok());
  std::string key = "kvfile/0000000000001234/s/L0/T0-1";
  mooncake::RecordDesc d;
  d.dtype = mooncake::SourceDtype::kBF16;
  d.group_size = 4;
  d.shape = {1, 1, 4};
  const uint16_t bf16[4] = {0x43E0, 0xC3E0, 0x3F80, 0x8000};
  std::vector<uint8_t> want;
  ASSERT_TRUE(mooncake::EncodeValues(d, bf16, &want).ok());
  EXPECT_EQ(ReadFile(fs::path(P("mc")) / mooncake::FileNameForKey(mooncake::RepresentationKey(4, key))),
            std::string(want.begin(), want.end()));
}

// A damaged record: one line naming it, kCorruption, and no OUT.
TEST_F(ConvertMooncake, DamageIsRefusedWithOneLineAndNothingWritten) {
  WriteKv(P("a.kv"), 1, 1, 8, 8);
  ASSERT_TRUE(Convert(P("a.kv"), P("mc"), To(Format::kMooncake), nullptr).ok());
  nlohmann::json m = nlohmann::json::parse(ReadFile(fs::path(P("mc")) / "manifest.json"));
  fs::path victim = fs::path(P("mc")) / m["records"][1]["file"].get<std::string>();
  std::string bytes = ReadFile(victim);
  bytes[60] = static_cast<char>(bytes[60] ^ 4);
  WriteFile(victim, bytes);
  Status st = Convert(P("mc"), P("b.kv"), To(Format::kKv), nullptr);
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_EQ(st.message(), victim.string() + ": CRC32 mismatch");
  EXPECT_FALSE(fs::exists(P("b.kv")));
  // Options that cannot apply to codes imported as stored are refused.
  ConvertOptions o = To(Format::kKv);
  o.dtype = Dtype::kBF16;
  st = Convert(P("mc"), P("b.kv"), o, nullptr);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(st.message(), P("mc") + ": a Mooncake directory is imported as its e4m3 codes into a format 2 .kv file: "
                                    "a dtype, raw streams or format 1 do not apply");
  EXPECT_FALSE(fs::exists(P("b.kv")));
}

// The directory output: an existing OUT is kept without force, replaced
// whole with it (its mode carried over), and never when it is a directory
// this driver did not write; no temporary directory stays behind.
TEST_F(ConvertMooncake, DirectoryOutputIsOneTransaction) {
  WriteKv(P("a.kv"), 1, 1, 8, 8);
  ASSERT_TRUE(Convert(P("a.kv"), P("mc"), To(Format::kMooncake), nullptr).ok());
  fs::permissions(P("mc"), fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec);
  std::string before = ReadFile(fs::path(P("mc")) / "manifest.json");
  ConvertOptions o = To(Format::kMooncake);
  o.mooncake.group_size = 8;
  Status st = Convert(P("a.kv"), P("mc"), o, nullptr);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(st.message(), P("mc") + ": exists; use --force to replace it");
  EXPECT_EQ(ReadFile(fs::path(P("mc")) / "manifest.json"), before);
  o.force = true;
  ConvertReport rep;
  ASSERT_TRUE(Convert(P("a.kv"), P("mc"), o, &rep).ok());
  EXPECT_NE(ReadFile(fs::path(P("mc")) / "manifest.json"), before);
  EXPECT_EQ(rep.notes[0], P("mc") + ": 2 records decoded and requantized (lossy: --group-size 8 is not the row "
                                    "width, or a stream is not e4m3); raw streams not exported (Mooncake records "
                                    "are fp8): [\"r\"]");
  EXPECT_EQ(fs::status(P("mc")).permissions() & fs::perms::all,
            fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec);
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".kvtmp"), std::string::npos) << e.path();
  fs::create_directories(P("other"));
  WriteFile(fs::path(P("other")) / "keep.txt", std::string("mine"));
  st = Convert(P("a.kv"), P("other"), o, nullptr);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(st.message(), P("other") + ": exists and is not a Mooncake directory written by kvfile convert; not "
                                       "replaced");
  EXPECT_EQ(ReadFile(fs::path(P("other")) / "keep.txt"), "mine");
}

// The driver exports the `tokens` it is given (a salvaged prefix), cutting
// the chunk the prefix ends in.
TEST_F(ConvertMooncake, ExportsTheTokensItIsGiven) {
  WriteKv(P("a.kv"), 1, 1, 40, 16);
  std::unique_ptr<Reader> r;
  ASSERT_TRUE(Reader::Open(P("a.kv"), {}, &r).ok());
  ConvertOptions o = To(Format::kMooncake);
  ConvertReport rep;
  rep.out_name = P("mc");
  ASSERT_TRUE(convert::kMooncakeDriver.export_kv(*r, P("a.kv"), 20, o, P("mc"), &rep).ok());
  EXPECT_EQ(rep.summary, "4 Mooncake records (4 with codes and scales as stored, 0 requantized), 20 tokens");
  nlohmann::json m = nlohmann::json::parse(ReadFile(fs::path(P("mc")) / "manifest.json"));
  EXPECT_EQ(m["tokens"], 20);
  EXPECT_EQ(m["token_ids"].size(), 20u);
  EXPECT_EQ(m["records"][2]["begin"], 16);
  EXPECT_EQ(m["records"][2]["end"], 20);
  ASSERT_TRUE(Convert(P("mc"), P("b.kv"), To(Format::kKv), nullptr).ok());
  std::unique_ptr<Reader> b;
  ASSERT_TRUE(Reader::Open(P("b.kv"), {}, &b).ok());
  EXPECT_EQ(b->token_count(), 20u);
}

// interrupted() stops an import and an export between records; OUT stays
// absent. progress() hears every record range, the last at done == total.
TEST_F(ConvertMooncake, InterruptAndProgress) {
  WriteKv(P("a.kv"), 1, 1, 40, 16);
  ASSERT_TRUE(Convert(P("a.kv"), P("mc"), To(Format::kMooncake), nullptr).ok());
  for (Format to : {Format::kKv, Format::kMooncake}) {
    ConvertOptions o = To(to);
    int polls = 0;
    o.interrupted = [&polls] { return ++polls >= 2; };
    std::string out = to == Format::kKv ? P("b.kv") : P("mc2");
    Status st = Convert(to == Format::kKv ? P("mc") : P("a.kv"), out, o, nullptr);
    EXPECT_EQ(st.code(), Status::Code::kFailed) << FormatName(to);
    EXPECT_EQ(st.message(), out + ": interrupted");
    EXPECT_FALSE(fs::exists(out));
  }
  ConvertOptions o = To(Format::kKv);
  std::vector<uint64_t> done;
  o.progress = [&](const std::string& label, uint64_t d, uint64_t total) {
    EXPECT_EQ(label, "import " + P("mc"));
    EXPECT_EQ(total, 40u);
    done.push_back(d);
  };
  ASSERT_TRUE(Convert(P("mc"), P("b.kv"), o, nullptr).ok());
  EXPECT_EQ(done, (std::vector<uint64_t>{16, 32, 40}));
}

// The import's default chunk size is the one rule (FitChunkTokens: 256
// halved while a chunk passes 64 MiB: 128 here, where the clamp it
// replaces gave 64 MiB / 270336 bytes = 248), and o.chunk_tokens is honoured.
TEST_F(ConvertMooncake, ChunkSizeIsTheOneRule) {
  // 64 layers x 2 streams x 16 x 128: (2048 + 64) x 128 = 270336 bytes a token.
  WriteKv(P("a.kv"), 64, 16, 3, 256, 128);
  ASSERT_TRUE(Convert(P("a.kv"), P("mc"), To(Format::kMooncake), nullptr).ok());
  ASSERT_TRUE(Convert(P("mc"), P("b.kv"), To(Format::kKv), nullptr).ok());
  std::unique_ptr<Reader> r;
  ASSERT_TRUE(Reader::Open(P("b.kv"), {}, &r).ok());
  EXPECT_EQ(r->nominal_chunk_tokens(), 128u);
  EXPECT_EQ(r->nominal_chunk_tokens(), FitChunkTokens(r->geometry(), 256, 0));
  ConvertOptions o = To(Format::kKv);
  o.chunk_tokens = 2;
  ASSERT_TRUE(Convert(P("mc"), P("c.kv"), o, nullptr).ok());
  ASSERT_TRUE(Reader::Open(P("c.kv"), {}, &r).ok());
  EXPECT_EQ(r->nominal_chunk_tokens(), 2u);
  EXPECT_EQ(r->chunks().size(), 2u);
}

}  // namespace
}  // namespace kvfile
