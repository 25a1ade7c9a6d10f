// SPDX-License-Identifier: Apache-2.0
// kvfile::Convert and DetectFormat through the library (kvfile/convert.h):
// detection by content before name, the transaction when a conversion is
// stopped, the chunk-size rule, format 1 output, progress. The CLI's
// contract (exit codes, error lines) is tested through the binary in
// cli_convert_adversity_test and cli_verbs_test.
#include "kvfile/convert.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "kvfile/reader.h"
#include "kvfile/writer.h"
#include "support/file_util.h"
#include "support/scratch_dir.h"

namespace kvfile {
namespace {

namespace fs = std::filesystem;

class ConvertTest : public testing::ScratchDirTest {
 protected:
  // 2 layers, k and v of 2 x 16 in `dtype`, `tokens` tokens in chunks of 4.
  void WriteKv(const std::string& path, uint64_t tokens, Dtype dtype = Dtype::kE4M3) {
    Geometry g;
    g.layers = 2;
    g.streams = {{"k", 2, 16, dtype}, {"v", 2, 16, dtype}};
    WriterOptions wo;
    wo.chunk_tokens = 4;
    std::unique_ptr<Writer> w;
    ASSERT_TRUE(Writer::Create(path, g, {"test/tiny", 7}, wo, &w).ok());
    std::vector<float> rows(tokens * 32);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i % 23) / 5.0f - 2.0f;
    std::vector<uint32_t> ids(tokens);
    for (uint64_t t = 0; t < tokens; ++t) ids[t] = static_cast<uint32_t>(1000 + t);
    AppendBatch b;
    b.tokens = ids;
    for (int i = 0; i < 4; ++i) b.blocks.push_back({Dtype::kF32, rows.data(), nullptr});
    ASSERT_TRUE(w->Append(b).ok());
    ASSERT_TRUE(w->Close().ok());
  }

  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
};

TEST_F(ConvertTest, FormatNamesRoundTripAndAnUnknownNameIsRefused) {
  for (Format f : {Format::kKv, Format::kSafetensors, Format::kLlamaState, Format::kMooncake, Format::kColi}) {
    Format back{};
    ASSERT_TRUE(ParseFormat(FormatName(f), &back).ok()) << FormatName(f);
    EXPECT_EQ(back, f);
  }
  EXPECT_STREQ(FormatName(Format::kLlamaState), "llama");
  Format f{};
  Status st = ParseFormat("npz", &f);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "unknown format 'npz' (kv, safetensors, llama, mooncake or coli)");
}

// Content first, name second: a llama.cpp state file named *.kv is a llama
// file, a .kv under another name a .kv, a safetensors file named *.kv a
// safetensors file; a damaged .kv (no magic) is still a .kv by its name.
TEST_F(ConvertTest, DetectFormatReadsTheMagicBeforeTheName) {
  testing::WriteFile(P("slot.kv"), std::string("qsgg") + std::string(60, '\0'));  // 'ggsq', little-endian
  WriteKv(P("a.kv"), 8);
  fs::copy_file(P("a.kv"), P("a.bin"));
  ASSERT_TRUE(Convert(P("a.kv"), P("t.safetensors"), {}, nullptr).ok());
  fs::copy_file(P("t.safetensors"), P("t.kv"));
  testing::WriteFile(P("junk.kv"), std::string(100, 'x'));
  testing::WriteFile(P("junk.txt"), std::string(100, 'x'));
  auto detect = [&](const std::string& name, bool out) {
    Format f{};
    Status st = DetectFormat(P(name), out, nullptr, &f);
    return st.ok() ? std::string(FormatName(f)) : st.message();
  };
  EXPECT_EQ(detect("slot.kv", false), "llama");
  EXPECT_EQ(detect("a.bin", false), "kv");
  EXPECT_EQ(detect("t.kv", false), "safetensors");
  EXPECT_EQ(detect("junk.kv", false), "kv");
  EXPECT_EQ(detect("junk.txt", false), P("junk.txt") + ": cannot tell the format: the name must end in .kv or .safetensors");
  EXPECT_EQ(detect("new.safetensors", true), "safetensors");
  EXPECT_EQ(detect("new.coli_kv", true), "coli");
  EXPECT_EQ(detect("new.npz", true), P("new.npz") + ": cannot tell the format: the name must end in .kv, .safetensors "
                                                    "or .coli_kv, or give --format llama-seq|llama-session|mooncake|coli-v2");
  Format f{};
  EXPECT_EQ(DetectFormat(P("none.kv"), false, nullptr, &f).code(), Status::Code::kNotFound);
}

// Stopped between batches: kFailed "OUT: interrupted", the existing OUT
// byte for byte as it was, no temporary file left.
TEST_F(ConvertTest, AnInterruptedConversionLeavesTheOutputAsItWas) {
  WriteKv(P("a.kv"), 40);
  testing::WriteFile(P("o.safetensors"), std::string("old bytes"));
  ConvertOptions o;
  o.force = true;
  int polls = 0;
  o.interrupted = [&polls] { return ++polls >= 1; };
  Status st = Convert(P("a.kv"), P("o.safetensors"), o, nullptr);
  EXPECT_EQ(st.code(), Status::Code::kFailed);
  EXPECT_EQ(st.message(), P("o.safetensors") + ": interrupted");
  EXPECT_GE(polls, 1);
  EXPECT_EQ(testing::ReadFile(P("o.safetensors")), "old bytes");
  EXPECT_EQ(Names(), (std::vector<std::string>{"a.kv", "o.safetensors"}));
  // Not stopped: the whole result replaces it.
  o.interrupted = [] { return false; };
  ConvertReport r;
  ASSERT_TRUE(Convert(P("a.kv"), P("o.safetensors"), o, &r).ok());
  EXPECT_EQ(r.tokens, 40u);
  EXPECT_EQ(r.from, Format::kKv);
  EXPECT_EQ(r.to, Format::kSafetensors);
  EXPECT_EQ(r.out_name, P("o.safetensors"));
}

// The chunk size of a .kv output: chunk_tokens if given, else the input's
// (FitChunkTokens); format 1 decodes the fp8 streams to bf16.
TEST_F(ConvertTest, ChunkSizeRuleAndFormatOneOutput) {
  WriteKv(P("a.kv"), 12);
  ASSERT_TRUE(Convert(P("a.kv"), P("same.kv"), {}, nullptr).ok());
  ConvertOptions o;
  o.chunk_tokens = 3;
  o.kv_major = 1;
  ConvertReport r;
  ASSERT_TRUE(Convert(P("a.kv"), P("v1.kv"), o, &r).ok());
  std::unique_ptr<Reader> same, v1;
  ASSERT_TRUE(Reader::Open(P("same.kv"), {}, &same).ok());
  ASSERT_TRUE(Reader::Open(P("v1.kv"), {}, &v1).ok());
  EXPECT_EQ(same->nominal_chunk_tokens(), 4u);
  EXPECT_EQ(v1->nominal_chunk_tokens(), 3u);
  EXPECT_EQ(v1->major_version(), 1);
  EXPECT_EQ(v1->geometry().streams[0].dtype, Dtype::kBF16);
  EXPECT_TRUE(r.summary.starts_with("12 tokens; k bf16, v bf16; 3 tokens per chunk; ")) << r.summary;
  o.dtype = Dtype::kE4M3;
  Status st = Convert(P("a.kv"), P("bad.kv"), o, nullptr);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "a format 1 .kv stores raw rows: the dtype must be bf16, f16 or f32");
  EXPECT_FALSE(fs::exists(P("bad.kv")));
}

TEST_F(ConvertTest, ProgressEndsWithTheWholeStep) {
  WriteKv(P("a.kv"), 20);
  std::vector<std::string> labels;
  uint64_t last_done = 0, last_total = 0;
  ConvertOptions o;
  o.progress = [&](const std::string& label, uint64_t done, uint64_t total) {
    if (labels.empty() || labels.back() != label) labels.push_back(label);
    last_done = done;
    last_total = total;
  };
  ASSERT_TRUE(Convert(P("a.kv"), P("b.safetensors"), o, nullptr).ok());
  ASSERT_TRUE(Convert(P("b.safetensors"), P("c.kv"), o, nullptr).ok());
  EXPECT_EQ(labels, (std::vector<std::string>{"export " + P("a.kv"), "import " + P("b.safetensors")}));
  EXPECT_EQ(last_done, 20u);
  EXPECT_EQ(last_total, 20u);
}

// A foreign format's options where neither IN nor OUT is in that format
// are refused (kInvalidArgument, nothing written), not ignored; where one
// is, they are taken.
TEST_F(ConvertTest, AForeignFormatsOptionsAreRefusedWhereTheyDoNotApply) {
  WriteKv(P("a.kv"), 8);
  struct Case {
    const char* out;
    void (*set)(ConvertOptions&);
    const char* message;
  };
  const Case cases[] = {
      {"b.kv", [](ConvertOptions& o) { o.llama.head_size = 64; },
       "head_size, model and unrotate apply to a llama input"},
      {"b.kv", [](ConvertOptions& o) { o.llama.model = "m.gguf"; },
       "head_size, model and unrotate apply to a llama input"},
      {"b.kv", [](ConvertOptions& o) { o.llama.unrotate = true; },
       "head_size, model and unrotate apply to a llama input"},
      {"b.safetensors", [](ConvertOptions& o) { o.llama.rotated = false; },
       "rotated applies to a llama input or output"},
      {"b.kv", [](ConvertOptions& o) { o.llama.session = true; },
       "session, type, v_trans, arch and n_stream apply to a llama output"},
      {"b.kv", [](ConvertOptions& o) { o.llama.type = "f16"; },
       "session, type, v_trans, arch and n_stream apply to a llama output"},
      {"b.safetensors", [](ConvertOptions& o) { o.llama.v_trans = 1; },
       "session, type, v_trans, arch and n_stream apply to a llama output"},
      {"b.kv", [](ConvertOptions& o) { o.llama.arch = "llama"; },
       "session, type, v_trans, arch and n_stream apply to a llama output"},
      {"b.kv", [](ConvertOptions& o) { o.llama.n_stream = 2; },
       "session, type, v_trans, arch and n_stream apply to a llama output"},
      {"b.kv", [](ConvertOptions& o) { o.mooncake.group_size = 8; }, "group_size applies to a mooncake output"},
      {"b.coli_kv", [](ConvertOptions& o) { o.mooncake.group_size = 8; }, "group_size applies to a mooncake output"},
      {"b.kv", [](ConvertOptions& o) { o.coli.vocab = 100; }, "vocab and v1 apply to a coli output"},
      {"b.safetensors", [](ConvertOptions& o) { o.coli.v1 = true; }, "vocab and v1 apply to a coli output"},
      {"b.coli_kv", [](ConvertOptions& o) { o.coli.indexer_layers = "0"; },
       "indexer_layers applies to a coli input"},
  };
  for (const Case& c : cases) {
    ConvertOptions o;
    c.set(o);
    Status st = Convert(P("a.kv"), P(c.out), o, nullptr);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << c.message;
    EXPECT_EQ(st.message(), c.message);
  }
  EXPECT_EQ(Names(), (std::vector<std::string>{"a.kv"}));
  // Where they apply: a Mooncake OUT's group size, a llama.cpp OUT's options.
  ConvertOptions o;
  o.to = Format::kMooncake;
  o.mooncake.group_size = 16;
  EXPECT_TRUE(Convert(P("a.kv"), P("mc"), o, nullptr).ok());
  o = {};
  o.to = Format::kLlamaState;
  o.llama.session = true;
  o.llama.type = "f16";
  o.llama.v_trans = 1;
  o.llama.arch = "llama";
  o.llama.n_stream = 2;
  o.llama.rotated = false;
  Status st = Convert(P("a.kv"), P("b.bin"), o, nullptr);
  EXPECT_TRUE(st.ok()) << st.message();
}

// A directory format (Mooncake) into an object store: refused before
// anything is asked of the store (it holds objects, not directories).
TEST_F(ConvertTest, ADirectoryOutputIsRefusedOnAnObjectStore) {
  WriteKv(P("a.kv"), 8);
  ConvertOptions o;
  o.to = Format::kMooncake;
  Status st = Convert(P("a.kv"), "s3://kvtest/o", o, nullptr);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "s3://kvtest/o: a mooncake output is a directory, written to a local path; an object "
                          "store takes one file per convert");
  EXPECT_EQ(Names(), std::vector<std::string>({"a.kv"}));
}

}  // namespace
}  // namespace kvfile
