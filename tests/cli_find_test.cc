// SPDX-License-Identifier: Apache-2.0
// Tests of `kvfile index` and `kvfile find` (tools/kvfile/cmd_find.cc):
// output, exit codes and the one stderr line.
#include <sys/stat.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
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

// A pack with the index of its directory beside it: find answers from the
// index while the index lists the pack as it is (its size, times, device
// and inode), never reading the pack's members; a pack changed since, or a
// damaged index, is searched member by member, with nothing else to say.
TEST_F(CliFindTest, FindInAPackUsesACurrentIndexBesideItAndIgnoresAStaleOne) {
  std::filesystem::create_directories(P("packs"));
  std::unique_ptr<PackWriter> w;
  ASSERT_TRUE(PackWriter::Begin(P("packs/c.kvpack"), {}, &w).ok());
  ASSERT_TRUE(w->AddFile("a.kv", P("corpus/a.kv")).ok());
  ASSERT_TRUE(w->AddFile("sub/b.kv", P("corpus/sub/b.kv")).ok());
  ASSERT_TRUE(w->Finish().ok());
  // An index naming a member the pack does not have, with the pack's
  // change record: an answer naming it came from the index.
  struct stat st;
  ASSERT_EQ(::stat(P("packs/c.kvpack").c_str(), &st), 0);
  PrefixEntry e{"c.kvpack:forged.kv", "org/forged", 0xaa, {10, 20, 31, 40, 50}};
  e.size = static_cast<uint64_t>(st.st_size);
  e.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  e.ctime_ns = int64_t{st.st_ctim.tv_sec} * 1000000000 + st.st_ctim.tv_nsec;
  e.device = st.st_dev;
  e.inode = st.st_ino;
  std::unique_ptr<PrefixIndexWriter> iw;
  ASSERT_TRUE(PrefixIndexWriter::Begin(P("packs/.kvfile-index"), nullptr, &iw).ok());
  ASSERT_TRUE(iw->Add(e).ok());
  ASSERT_TRUE(iw->Finish(0).ok());
  auto r = Kvfile("find " + P("packs/c.kvpack") + " --tokens " + P("q.txt"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, P("packs/c.kvpack") + ":forged.kv: 5 of 5 tokens match (5 tokens, model org/forged, fingerprint 00000000000000aa)\n");
  EXPECT_EQ(r.err, "");
  Tokens("miss.txt", "99 10");
  r = Kvfile("find " + P("packs/c.kvpack") + " --tokens " + P("miss.txt"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "kvfile: error: " + P("packs/c.kvpack") + ": no member shares the first token of the query (1 searched)\n");
  // The pack's modification time changed: the index no longer lists it as
  // it is, and its members are read.
  std::filesystem::last_write_time(P("packs/c.kvpack"), std::filesystem::last_write_time(P("packs/c.kvpack")) +
                                                            std::chrono::seconds(10));
  const std::string scanned =
      P("packs/c.kvpack") + ":sub/b.kv: 4 of 5 tokens match (4 tokens, model org/llama, fingerprint 00000000000000aa)\n";
  r = Kvfile("find " + P("packs/c.kvpack") + " --tokens " + P("q.txt"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, scanned);
  EXPECT_EQ(r.err, "");
  r = Kvfile("find " + P("packs/c.kvpack") + " --tokens " + P("miss.txt"));
  EXPECT_EQ(r.err, "kvfile: error: " + P("packs/c.kvpack") + ": no member shares the first token of the query (2 searched)\n");
  // Indexed again it answers, as the scan does; damaged, it is passed over.
  ASSERT_EQ(Kvfile("index " + P("packs")).exit_code, 0);
  r = Kvfile("find " + P("packs/c.kvpack") + " --tokens " + P("q.txt"));
  EXPECT_EQ(r.out, scanned);
  std::filesystem::resize_file(P("packs/.kvfile-index"), std::filesystem::file_size(P("packs/.kvfile-index")) - 1);
  r = Kvfile("find " + P("packs/c.kvpack") + " --tokens " + P("q.txt"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, scanned);
  EXPECT_EQ(r.err, "");
}

// The index of a directory covers the members of its packs, as
// PACK:MEMBER, the name the other verbs read.
TEST_F(CliFindTest, FindInADirectoryAnswersMembersOfItsPacks) {
  WriteTinyKv(P("long.kv"), {10, 20, 31, 40, 50, 60}, {"org/llama", 0xaa});
  auto pack = [&](const std::string& name) {
    std::filesystem::remove(P("corpus/p.kvpack"));
    std::unique_ptr<PackWriter> w;
    ASSERT_TRUE(PackWriter::Begin(P("corpus/p.kvpack"), {}, &w).ok());
    ASSERT_TRUE(w->AddFile(name, P("long.kv")).ok());
    ASSERT_TRUE(w->Finish().ok());
  };
  pack("x/long.kv");
  auto r = Kvfile("index " + Corpus());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Corpus() + "/.kvfile-index: 4 files indexed (4 read, 0 unchanged)\n");
  r = Kvfile("find " + Corpus() + " --tokens " + P("q.txt"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Corpus() + "/p.kvpack:x/long.kv: 5 of 5 tokens match (6 tokens, model org/llama, fingerprint 00000000000000aa)\n");
  r = Kvfile("info " + Corpus() + "/p.kvpack:x/long.kv");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("tokens:          6\n"), std::string::npos) << r.out;
  // The pack replaced: only it is read again.
  pack("y/long.kv");
  r = Kvfile("find " + Corpus() + " --tokens " + P("q.txt"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Corpus() + "/p.kvpack:y/long.kv: 5 of 5 tokens match (6 tokens, model org/llama, fingerprint 00000000000000aa)\n");
  pack("z/long.kv");
  r = Kvfile("index " + Corpus());
  EXPECT_EQ(r.out, Corpus() + "/.kvfile-index: 4 files indexed (1 read, 3 unchanged)\n");
}

}  // namespace
}  // namespace kvfile
