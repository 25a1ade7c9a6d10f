// SPDX-License-Identifier: Apache-2.0
// The pack verbs of the CLI: kvfile pack, unpack, ls, and verify of a pack;
// exit statuses, the one error line, and files left untouched on failure.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "kvfile/reader.h"
#include "kvfile/writer.h"
#include "support/cli_run.h"

namespace kvfile {
namespace {

namespace fs = std::filesystem;
using testing::Kvfile;
using testing::ReadFile;

class PackCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("pack_cli_" + std::to_string(::getpid()) + "_" +
                                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "corpus/sub");
    // Same seed: the rows and token ids of a position are the same, so the
    // two sessions share their first 32 tokens (two pack chunks of 16).
    Synth("corpus/a.kv", 40);
    Synth("corpus/sub/b.kv", 60);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Synth(const std::string& name, int tokens) {
    auto r = Kvfile("synth " + P(name) + " --preset tiny --tokens " + std::to_string(tokens) + " --seed 3 --chunk-tokens 8");
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  std::string P(const std::string& rel) const { return (dir_ / rel).string(); }
  fs::path dir_;
};

// Token ids, model id, stream dtypes, and every code and scale (nvfp4: block
// scales too) as a reader returns them, or with `decoded` every row decoded
// to f32.
std::string Contents(const std::string& path, bool decoded = false) {
  std::unique_ptr<Reader> r;
  Status st = Reader::Open(path, {}, &r);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (!st.ok()) return "";
  std::string out(reinterpret_cast<const char*>(r->tokens().data()), r->tokens().size() * 4);
  out += r->identity().model_id;
  const Geometry& g = r->geometry();
  for (const StreamSpec& s : g.streams) out += std::string(";") + DtypeName(s.dtype);
  uint64_t n = r->token_count();
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t s = 0; s < g.streams.size(); ++s) {
      uint64_t rows = n * g.streams[s].rows_per_token;
      if (decoded) {
        std::vector<float> values(rows * g.streams[s].row_width);
        EXPECT_TRUE(r->ReadRows(l, s, 0, n, Dtype::kF32, values.data()).ok());
        out.append(reinterpret_cast<const char*>(values.data()), values.size() * 4);
        continue;
      }
      std::string codes(rows * g.streams[s].row_width, '\0');
      std::vector<float> scales(rows);
      if (IsNvfp4(g.streams[s].dtype)) {
        // Packed codes, then block scales; one row scale per token.
        codes.resize(codes.size() / 2 + codes.size() / 16);
        scales.resize(n);
        EXPECT_TRUE(r->ReadCodes(l, s, 0, n, reinterpret_cast<uint8_t*>(codes.data()),
                                 reinterpret_cast<uint8_t*>(codes.data()) + rows * g.streams[s].row_width / 2,
                                 scales.data())
                        .ok());
      } else {
        EXPECT_TRUE(r->ReadCodes(l, s, 0, n, reinterpret_cast<uint8_t*>(codes.data()), scales.data()).ok());
      }
      out += codes;
      out.append(reinterpret_cast<const char*>(scales.data()), scales.size() * 4);
    }
  return out;
}
std::string Decoded(const std::string& path) { return Contents(path, true); }

bool OneErrorLine(const std::string& err, const std::string& path) {
  return err.starts_with("kvfile: error: " + path + ": ") && err.find('\n') == err.size() - 1;
}

TEST_F(PackCliTest, PackLsVerifyUnpackRoundTrip) {
  auto r = Kvfile("pack " + P("corpus") + " -o " + P("c.kvpack") + " --chunk-tokens 16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_NE(r.out.find("2 members, 100 tokens"), std::string::npos) << r.out;

  r = Kvfile("ls " + P("c.kvpack") + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["members"].size(), 2u);
  EXPECT_EQ(j["members"][0]["name"], "a.kv");
  EXPECT_EQ(j["members"][0]["tokens"], 40);
  EXPECT_EQ(j["members"][1]["name"], "sub/b.kv");
  EXPECT_EQ(j["members"][1]["tokens"], 60);
  // Both members hold the same two shared 16-token chunks.
  uint64_t shared = j["members"][0]["shared_bytes"];
  EXPECT_GT(shared, 0u);
  EXPECT_EQ(j["members"][1]["shared_bytes"], shared);
  EXPECT_EQ(j["chunks"], 2 + 1 + 2);  // shared [0,32); a: [32,40); b: [32,48), [48,60)
  EXPECT_EQ(j["file_bytes"], fs::file_size(P("c.kvpack")));

  r = Kvfile("verify " + P("c.kvpack"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, P("c.kvpack") + ": ok: 2 members, 5 chunks, " + std::to_string(fs::file_size(P("c.kvpack"))) +
                       " bytes\n");

  r = Kvfile("unpack " + P("c.kvpack") + " -o " + P("out"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Contents(P("out/a.kv")), Contents(P("corpus/a.kv")));
  EXPECT_EQ(Contents(P("out/sub/b.kv")), Contents(P("corpus/sub/b.kv")));
  EXPECT_EQ(Kvfile("verify " + P("out/sub/b.kv")).exit_code, 0);

  // One member only; an existing output needs --force.
  r = Kvfile("unpack " + P("c.kvpack") + " -o " + P("one") + " sub/b.kv");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(P("one/sub/b.kv")));
  EXPECT_FALSE(fs::exists(P("one/a.kv")));
  r = Kvfile("unpack " + P("c.kvpack") + " -o " + P("one") + " sub/b.kv");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(OneErrorLine(r.err, P("one/sub/b.kv"))) << r.err;
  EXPECT_EQ(Kvfile("unpack " + P("c.kvpack") + " -o " + P("one") + " sub/b.kv --force").exit_code, 0);
  r = Kvfile("unpack " + P("c.kvpack") + " -o " + P("none") + " nosuch.kv");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(OneErrorLine(r.err, P("c.kvpack"))) << r.err;
  EXPECT_FALSE(fs::exists(P("none")));
}

TEST_F(PackCliTest, DamagedPackExitsOneAndWritesNothing) {
  ASSERT_EQ(Kvfile("pack " + P("corpus") + " -o " + P("c.kvpack")).exit_code, 0);
  std::string bytes = ReadFile(P("c.kvpack"));
  // A byte in the first chunk's payload (the data region starts at 128).
  bytes[200] ^= 0x10;
  std::ofstream(P("bad.kvpack"), std::ios::binary) << bytes;
  auto r = Kvfile("verify " + P("bad.kvpack"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(OneErrorLine(r.err, P("bad.kvpack"))) << r.err;
  EXPECT_NE(r.err.find("checksum mismatch"), std::string::npos) << r.err;
  r = Kvfile("unpack " + P("bad.kvpack") + " -o " + P("out"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(OneErrorLine(r.err, P("bad.kvpack"))) << r.err;
  EXPECT_FALSE(fs::exists(P("out")));
  // Truncated: every verb refuses it at open.
  std::ofstream(P("cut.kvpack"), std::ios::binary) << bytes.substr(0, bytes.size() - 1);
  for (std::string verb : {"verify ", "ls "}) {
    r = Kvfile(verb + P("cut.kvpack"));
    EXPECT_EQ(r.exit_code, 1) << verb;
    EXPECT_TRUE(OneErrorLine(r.err, P("cut.kvpack"))) << r.err;
  }
}

TEST_F(PackCliTest, FailedPackLeavesOutputUntouched) {
  ASSERT_EQ(Kvfile("pack " + P("corpus/a.kv") + " -o " + P("c.kvpack")).exit_code, 0);
  std::string before = ReadFile(P("c.kvpack"));
  // Existing output without --force.
  auto r = Kvfile("pack " + P("corpus") + " -o " + P("c.kvpack") + " --chunk-tokens 16");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(OneErrorLine(r.err, P("c.kvpack"))) << r.err;
  // A missing input, and a damaged input, with --force.
  r = Kvfile("pack " + P("corpus") + " " + P("nosuch.kv") + " -o " + P("c.kvpack") + " --force");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(OneErrorLine(r.err, P("nosuch.kv"))) << r.err;
  std::string kv = ReadFile(P("corpus/sub/b.kv"));
  kv[kv.size() - 2000] ^= 1;
  std::ofstream(P("corpus/sub/b.kv"), std::ios::binary) << kv;
  r = Kvfile("pack " + P("corpus") + " -o " + P("c.kvpack") + " --force");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(OneErrorLine(r.err, P("corpus/sub/b.kv"))) << r.err;
  EXPECT_EQ(ReadFile(P("c.kvpack")), before);
  // No temporary file is left next to it.
  size_t files = 0;
  for (auto& e : fs::directory_iterator(dir_)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u);
  // Two inputs with the same member name.
  r = Kvfile("pack " + P("corpus/a.kv") + " " + P("corpus/a.kv") + " -o " + P("d.kvpack"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_FALSE(fs::exists(P("d.kvpack")));
}


// PACK:MEMBER wherever a read-only verb takes a .kv file: the member's
// contents, its name in the output, one error line for a missing member or
// a damaged pack, and no temporary file left in $TMPDIR.
TEST_F(PackCliTest, PackMemberForReadOnlyVerbs) {
  ASSERT_EQ(Kvfile("pack " + P("corpus") + " -o " + P("c.kvpack") + " --chunk-tokens 16").exit_code, 0);
  fs::create_directories(P("tmp"));
  const std::string env = "TMPDIR=" + P("tmp") + " ";
  const std::string member = P("c.kvpack") + ":sub/b.kv";
  auto r = Kvfile("info " + member + " --json", env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["path"], member);
  EXPECT_EQ(j["tokens"], 60);

  r = Kvfile("dump " + member + " --tokens --json", env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::unique_ptr<Reader> src;
  ASSERT_TRUE(Reader::Open(P("corpus/sub/b.kv"), {}, &src).ok());
  EXPECT_EQ(nlohmann::json::parse(r.out)["tokens"].get<std::vector<uint32_t>>(),
            std::vector<uint32_t>(src->tokens().begin(), src->tokens().end()));

  // convert: the member's contents, as from the source file.
  r = Kvfile("convert " + member + " " + P("b.kv"), env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.out.starts_with(member + " -> " + P("b.kv") + ": 60 tokens")) << r.out;
  EXPECT_EQ(Contents(P("b.kv")), Contents(P("corpus/sub/b.kv")));

  // verify: packs, members and .kv files mixed.
  r = Kvfile("verify " + member + " " + P("c.kvpack") + " " + P("corpus/a.kv"), env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(member + ": ok: 60 tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(P("c.kvpack") + ": ok: 2 members, 5 chunks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("0 of 3 files damaged"), std::string::npos) << r.out;

  // A missing member: exit 2, one line naming the pack.
  for (std::string verb : {"info ", "dump ", "verify "}) {
    r = Kvfile(verb + P("c.kvpack") + ":nosuch.kv", env);
    EXPECT_EQ(r.exit_code, 2) << verb;
    EXPECT_EQ(r.err, "kvfile: error: " + P("c.kvpack") + ": no member 'nosuch.kv'\n") << verb;
  }
  r = Kvfile("convert " + P("c.kvpack") + ":nosuch.kv " + P("x.kv"), env);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_FALSE(fs::exists(P("x.kv")));

  // A damaged chunk of the member: exit 1, one line naming the pack.
  std::string bytes = ReadFile(P("c.kvpack"));
  bytes[200] ^= 0x10;  // the first (shared) chunk's payload
  std::ofstream(P("bad.kvpack"), std::ios::binary) << bytes;
  for (std::string verb : {"info ", "dump "}) {
    r = Kvfile(verb + P("bad.kvpack") + ":a.kv", env);
    EXPECT_EQ(r.exit_code, 1) << verb;
    EXPECT_TRUE(OneErrorLine(r.err, P("bad.kvpack"))) << r.err;
    EXPECT_NE(r.err.find("checksum mismatch"), std::string::npos) << r.err;
  }
  r = Kvfile("convert " + P("bad.kvpack") + ":a.kv " + P("x.kv"), env);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(OneErrorLine(r.err, P("bad.kvpack"))) << r.err;
  EXPECT_FALSE(fs::exists(P("x.kv")));
  // verify of several: the damaged pack and member fail, the file passes.
  r = Kvfile("verify " + P("bad.kvpack") + ":a.kv " + P("bad.kvpack") + " " + P("corpus/a.kv"), env);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find(P("bad.kvpack") + ": FAILED: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 of 3 files damaged"), std::string::npos) << r.out;
  EXPECT_TRUE(r.err.starts_with("kvfile: error: 2 of 3 files failed; first: " + P("bad.kvpack") + ": ")) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1);

  // An existing path wins over PACK:MEMBER; nothing is left in $TMPDIR.
  std::ofstream(P("c.kvpack") + ":a.kv", std::ios::binary) << "not a kv file";
  r = Kvfile("info " + P("c.kvpack") + ":a.kv", env);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(OneErrorLine(r.err, P("c.kvpack") + ":a.kv")) << r.err;
  EXPECT_TRUE(fs::is_empty(P("tmp")));
}

// synth --prefix-tokens/--prefix-seed: sessions of other seeds share that
// prefix (ids and rows, and the fingerprint) and nothing after it.
TEST_F(PackCliTest, SynthSharedPrefixIsStoredOnce) {
  fs::create_directories(P("px"));
  for (std::string seed : {"1", "2"}) {
    auto r = Kvfile("synth " + P("px/s" + seed + ".kv") + " --preset tiny --tokens 48 --seed " + seed +
                    " --prefix-tokens 32 --prefix-seed 9 --chunk-tokens 8");
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  auto r = Kvfile("pack " + P("px") + " -o " + P("px.kvpack") + " --chunk-tokens 16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // [0, 16) and [16, 32) once; [32, 48) once per member.
  EXPECT_NE(r.out.find("2 members, 96 tokens, 4 chunks stored of 6 used"), std::string::npos) << r.out;
  std::unique_ptr<Reader> a, b;
  ASSERT_TRUE(Reader::Open(P("px/s1.kv"), {}, &a).ok());
  ASSERT_TRUE(Reader::Open(P("px/s2.kv"), {}, &b).ok());
  EXPECT_EQ(a->identity(), b->identity());
  EXPECT_EQ(a->identity().fingerprint, 9u);
  EXPECT_TRUE(std::equal(a->tokens().begin(), a->tokens().begin() + 32, b->tokens().begin()));
  EXPECT_NE(a->tokens()[32], b->tokens()[32]);
}

// pack --dtype: each member holds what kvfile convert --dtype makes of its
// source (decoded values and dtypes equal).
TEST_F(PackCliTest, PackDtypeRequantizesAsConvert) {
  for (std::string dtype : {"e5m2", "bf16"}) {
    auto r = Kvfile("pack " + P("corpus") + " -o " + P(dtype + ".kvpack") + " --chunk-tokens 16 --dtype " + dtype);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_EQ(Kvfile("unpack " + P(dtype + ".kvpack") + " -o " + P(dtype)).exit_code, 0);
    for (std::string m : {"a.kv", "sub/b.kv"}) {
      r = Kvfile("convert " + P("corpus/" + m) + " " + P(dtype + "-" + fs::path(m).filename().string()) +
                 " --dtype " + dtype);
      ASSERT_EQ(r.exit_code, 0) << r.err;
      std::string want = Decoded(P(dtype + "-" + fs::path(m).filename().string()));
      EXPECT_NE(want.find(";" + dtype), std::string::npos);
      EXPECT_EQ(Decoded(P(dtype + "/" + m)), want) << dtype << " " << m;
    }
  }
  // Requantized, the source's codes are not kept: e5m2 differs from e4m3.
  EXPECT_NE(Decoded(P("e5m2/a.kv")), Decoded(P("corpus/a.kv")));
}

// --dtype nvfp4 requantizes as convert --dtype nvfp4 does: each member
// unpacks with the very codes, block scales and row scales of the converted
// file, and the pack is 1.2. An nvfp4 corpus packs, verifies and unpacks
// with its own codes; --dtype e4m3 turns it to e4m3 as convert does.
TEST_F(PackCliTest, PackDtypeNvfp4AsConvert) {
  auto r = Kvfile("pack " + P("corpus") + " -o " + P("nv.kvpack") + " --chunk-tokens 16 --dtype nvfp4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ReadFile(P("nv.kvpack"))[10], 2);  // minor version 2
  ASSERT_EQ(Kvfile("unpack " + P("nv.kvpack") + " -o " + P("nv")).exit_code, 0);
  fs::create_directories(P("ncorpus/sub"));
  for (std::string m : {"a.kv", "sub/b.kv"}) {
    r = Kvfile("convert " + P("corpus/" + m) + " " + P("ncorpus/" + m) + " --dtype nvfp4");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string want = Contents(P("ncorpus/" + m));
    EXPECT_NE(want.find(";nvfp4;nvfp4"), std::string::npos);
    EXPECT_EQ(Contents(P("nv/" + m)), want) << m;
  }
  // The nvfp4 corpus itself: stored as it is.
  r = Kvfile("pack " + P("ncorpus") + " -o " + P("n.kvpack") + " --chunk-tokens 16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Kvfile("verify " + P("n.kvpack"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, P("n.kvpack") + ": ok: 2 members, 5 chunks, " + std::to_string(fs::file_size(P("n.kvpack"))) +
                       " bytes\n");
  ASSERT_EQ(Kvfile("unpack " + P("n.kvpack") + " -o " + P("n")).exit_code, 0);
  r = Kvfile("pack " + P("ncorpus") + " -o " + P("e.kvpack") + " --chunk-tokens 16 --dtype e4m3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(Kvfile("unpack " + P("e.kvpack") + " -o " + P("e")).exit_code, 0);
  for (std::string m : {"a.kv", "sub/b.kv"}) {
    EXPECT_EQ(Contents(P("n/" + m)), Contents(P("ncorpus/" + m))) << m;
    const std::string e = P("e-" + fs::path(m).filename().string());
    r = Kvfile("convert " + P("ncorpus/" + m) + " " + e + " --dtype e4m3");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(Contents(e).find(";e4m3;e4m3"), std::string::npos);
    EXPECT_EQ(Contents(P("e/" + m)), Contents(e)) << m;
  }
}

// pack --dtype nvfp4 of a file with an fp8 stream of 1 x 4 per token (no
// multiple of 16) is refused as convert --dtype nvfp4 refuses it: exit 2,
// one line naming the file, OUT as it was and no temporary file left.
TEST_F(PackCliTest, PackDtypeNvfp4RefusesRowsNotInBlocksOf16) {
  Geometry g;
  g.layers = 1;
  g.streams = {{"k", 1, 4, Dtype::kE4M3}};
  fs::create_directories(P("odd"));
  std::unique_ptr<Writer> w;
  ASSERT_TRUE(Writer::Create(P("odd/x.kv"), g, {"m", 1}, {}, &w).ok());
  const std::vector<uint32_t> tokens = {1, 2};
  const std::vector<float> rows = {1, 2, 3, 4, 5, 6, 7, 8};
  AppendBatch b;
  b.tokens = tokens;
  b.blocks = {{Dtype::kF32, rows.data(), nullptr}};
  ASSERT_TRUE(w->Append(b).ok());
  ASSERT_TRUE(w->Close().ok());
  std::ofstream(P("old.kvpack")) << "old";
  const std::string want = "kvfile: error: " + P("odd/x.kv") +
                           ": stream 'k': nvfp4 needs rows x width (4) to be a multiple of 16 (one block scale "
                           "per 16 elements)\n";
  auto r = Kvfile("pack " + P("odd") + " -o " + P("old.kvpack") + " --dtype nvfp4 --force");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, want);
  EXPECT_EQ(ReadFile(P("old.kvpack")), "old");
  r = Kvfile("convert " + P("odd/x.kv") + " " + P("x4.kv") + " --dtype nvfp4");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_FALSE(fs::exists(P("x4.kv")));
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find("kvtmp"), std::string::npos) << e.path();
}

// pack --jobs: the same pack bytes for any number of reading threads.
TEST_F(PackCliTest, PackJobsWritesTheSameBytes) {
  ASSERT_EQ(Kvfile("pack " + P("corpus") + " -o " + P("j1.kvpack") + " --chunk-tokens 16").exit_code, 0);
  for (std::string jobs : {"2", "3", "7"}) {
    auto r = Kvfile("pack " + P("corpus") + " -o " + P("j" + jobs + ".kvpack") + " --chunk-tokens 16 --jobs " + jobs);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(ReadFile(P("j" + jobs + ".kvpack")), ReadFile(P("j1.kvpack"))) << jobs;
  }
  // A damaged input fails the same way with threads.
  std::string kv = ReadFile(P("corpus/sub/b.kv"));
  kv[kv.size() - 2000] ^= 1;
  std::ofstream(P("corpus/sub/b.kv"), std::ios::binary) << kv;
  auto r = Kvfile("pack " + P("corpus") + " -o " + P("bad.kvpack") + " --jobs 3");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(OneErrorLine(r.err, P("corpus/sub/b.kv"))) << r.err;
  EXPECT_FALSE(fs::exists(P("bad.kvpack")));
}

}  // namespace
}  // namespace kvfile
