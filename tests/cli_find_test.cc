// SPDX-License-Identifier: Apache-2.0
// Tests of `kvfile index` and `kvfile find` (tools/kvfile/cmd_find.cc):
// output, exit codes and the one stderr line.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "kvfile/pack.h"
#include "kvfile/prefix_index.h"
#include "support/cli_run.h"
#include "support/kv_test_util.h"
#include "support/scratch_dir.h"
#include "support/tiny_kv.h"

namespace kvfile {
namespace {

using testing::Kvfile;
using testing::WriteTinyKv;
using test::Code;
using test::HasCode;

class CliFindTest : public testing::ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    std::filesystem::create_directories(dir_ / "corpus" / "sub");
    WriteTinyKv(P("corpus/a.kv"), {10, 20, 30}, {"org/llama", 0xaa});
    WriteTinyKv(P("corpus/sub/b.kv"), {10, 20, 31, 40}, {"org/llama", 0xaa});
    WriteTinyKv(P("corpus/c.kv"), {10, 20, 31}, {"org/qwen", 0xbb});
    Tokens("q.txt", "10 20\n31\t40 50\n");
  }
  void Tokens(const std::string& name, const std::string& text) { std::ofstream(P(name)) << text; }
  std::string Corpus() const { return P("corpus"); }
};

TEST_F(CliFindTest, FindPrintsTheLongestMatch) {
  auto r = Kvfile("find " + Corpus() + " --tokens " + P("q.txt"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Corpus() + "/sub/b.kv: 4 of 5 tokens match (4 tokens, model org/llama, fingerprint 00000000000000aa)\n");
  EXPECT_EQ(r.err, "");
  EXPECT_TRUE(std::filesystem::exists(P("corpus/.kvfile-index")));  // written on the way
  // Restricted to a fingerprint; hex with or without 0x, short or long.
  r = Kvfile("find " + Corpus() + " --tokens " + P("q.txt") + " --model-fingerprint 0xBB");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Corpus() + "/c.kv: 3 of 5 tokens match (3 tokens, model org/qwen, fingerprint 00000000000000bb)\n");
}

TEST_F(CliFindTest, NoWriteLeavesTheDirectoryAlone) {
  auto r = Kvfile("find " + Corpus() + " --tokens " + P("q.txt") + " --no-write");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Corpus() + "/sub/b.kv: 4 of 5 tokens match (4 tokens, model org/llama, fingerprint 00000000000000aa)\n");
  EXPECT_EQ(r.err, "");
  EXPECT_FALSE(std::filesystem::exists(P("corpus/.kvfile-index")));
}

TEST_F(CliFindTest, JsonAndStdin) {
  auto r = Kvfile("find " + Corpus() + " --tokens - --json", "echo 10 20 30 |");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["path"], Corpus() + "/a.kv");
  EXPECT_TRUE(j["member"].is_null());
  EXPECT_EQ(j["tokens"], 3);
  EXPECT_EQ(j["matched"], 3);
  EXPECT_EQ(j["model"], "org/llama");
  EXPECT_EQ(j["fingerprint"], "00000000000000aa");
}

TEST_F(CliFindTest, NoMatchIsExitOneWithOneLine) {
  Tokens("miss.txt", "99 10");
  auto r = Kvfile("find " + Corpus() + " --tokens " + P("miss.txt"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "kvfile: error: " + Corpus() + ": no file shares the first token of the query (3 searched)\n");
  r = Kvfile("find " + Corpus() + " --tokens " + P("q.txt") + " --model-fingerprint cc --json");
  EXPECT_EQ(r.exit_code, 1);
  auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["path"].is_null());
  EXPECT_EQ(j["matched"], 0);
  EXPECT_EQ(r.err, "kvfile: error: " + Corpus() + ": no file shares the first token of the query (3 searched with that fingerprint)\n");
}

TEST_F(CliFindTest, UsageErrorsAreExitTwo) {
  Tokens("bad.txt", "1 2 x3");
  auto r = Kvfile("find " + Corpus() + " --tokens " + P("bad.txt"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + P("bad.txt") + ": token 3 ('x3') is not a token id (0 to 4294967295)\n");
  Tokens("empty.txt", " \n");
  r = Kvfile("find " + Corpus() + " --tokens " + P("empty.txt"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + P("empty.txt") + ": no token ids\n");
  r = Kvfile("find " + Corpus() + " --tokens " + P("nope.txt"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + P("nope.txt") + ": No such file or directory\n");
  r = Kvfile("find " + Corpus() + " --tokens " + P("q.txt") + " --model-fingerprint 12345678901234567");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: --model-fingerprint: '12345678901234567' is not 1 to 16 hex digits\n");
  r = Kvfile("find " + P("missing") + " --tokens " + P("q.txt"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_TRUE(r.err.starts_with("kvfile: error: " + P("missing") + ": ")) << r.err;
  r = Kvfile("index " + P("corpus/a.kv"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + P("corpus/a.kv") + ": not a directory\n");
}

TEST_F(CliFindTest, IndexWritesThenReportsUpToDate) {
  auto r = Kvfile("index " + Corpus());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Corpus() + "/.kvfile-index: 3 files indexed (3 read, 0 unchanged)\n");
  r = Kvfile("index " + Corpus());
  EXPECT_EQ(r.out, Corpus() + "/.kvfile-index: up to date (3 files)\n");
  WriteTinyKv(P("corpus/d.kv"), {7}, {"org/llama", 0xaa});
  r = Kvfile("index " + Corpus() + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["indexed"], 4);
  EXPECT_EQ(j["read"], 1);
  EXPECT_EQ(j["kept"], 3);
  EXPECT_EQ(j["written"], true);
}

TEST_F(CliFindTest, DamagedIndexAndUnreadableFile) {
  ASSERT_EQ(Kvfile("index " + Corpus()).exit_code, 0);
  test::XorByte(P("corpus/.kvfile-index"), 140, 0x01);
  auto r = Kvfile("index " + Corpus());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Corpus() + "/.kvfile-index: 3 files indexed (3 read, 0 unchanged); the old index was damaged and is replaced\n");
  std::ofstream(P("corpus/junk.kv")) << "not a kv file";
  r = Kvfile("find " + Corpus() + " --tokens " + P("q.txt"));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(r.out.starts_with(Corpus() + "/sub/b.kv: 4 of 5")) << r.out;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_TRUE(r.err.starts_with("kvfile: warning: " + Corpus() + ": 1 unreadable .kv file(s) or directories left out of the index (first: " +
                                Corpus() + "/junk.kv: "))
      << r.err;
}

TEST_F(CliFindTest, FindInAPack) {
  std::unique_ptr<PackWriter> w;
  ASSERT_TRUE(PackWriter::Begin(P("c.kvpack"), {}, &w).ok());
  ASSERT_TRUE(w->AddFile("a.kv", P("corpus/a.kv")).ok());
  ASSERT_TRUE(w->AddFile("sub/b.kv", P("corpus/sub/b.kv")).ok());
  ASSERT_TRUE(w->Finish().ok());
  auto r = Kvfile("find " + P("c.kvpack") + " --tokens " + P("q.txt"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, P("c.kvpack") + ":sub/b.kv: 4 of 5 tokens match (4 tokens, model org/llama, fingerprint 00000000000000aa)\n");
  r = Kvfile("find " + P("c.kvpack") + " --tokens " + P("q.txt") + " --json");
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["path"], P("c.kvpack"));
  EXPECT_EQ(j["member"], "sub/b.kv");
  EXPECT_EQ(j["matched"], 4);
  r = Kvfile("find " + P("corpus/a.kv") + " --tokens " + P("q.txt"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("not a kvfile pack"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace kvfile
