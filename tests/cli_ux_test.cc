// SPDX-License-Identifier: Apache-2.0
// The command line as users of git, sqlite3 or zstd expect it (issue 16):
// did-you-mean for verbs, --version/-V/version, global flags after the verb,
// several FILEs, `-` for standard input, signed numbers refused, verify of
// many files (one line each, summary, natural order, --errors-only), batch
// convert both ways, damage reports that say what is intact and how to keep
// it, short error lines, and the generated man page and completions.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "support/cli_run.h"
#include "support/file_util.h"
#include "support/scratch_dir.h"

namespace {

namespace fs = std::filesystem;
using kvfile::testing::CliRun;
using kvfile::testing::FlipBit;
using kvfile::testing::Kvfile;
using kvfile::testing::Lines;
using kvfile::testing::ReadFile;
using kvfile::testing::SplitLines;

class CliUxTest : public kvfile::testing::ScratchDirTest {
 protected:
  // Runs with DIR as the working directory, so that paths in messages are short.
  CliRun Here(const std::string& args) { return Kvfile(args, "cd " + dir_.string() + " &&"); }
  void Synth(const std::string& name, int tokens, int seed, int chunk = 64) {
    ASSERT_EQ(Kvfile("synth " + P(name) + " --preset tiny --tokens " + std::to_string(tokens) + " --seed " +
                     std::to_string(seed) + " --chunk-tokens " + std::to_string(chunk))
                  .exit_code,
              0);
  }
};

TEST_F(CliUxTest, UnknownVerbSuggestsTheNearest) {
  CliRun r = Kvfile("verfy x.kv");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: unknown command 'verfy'; did you mean 'verify'?\n");
  EXPECT_EQ(r.out, "");
  r = Kvfile("-q rewnid x.kv --to 3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: unknown command 'rewnid'; did you mean 'rewind'?\n");
  r = Kvfile("conv a b");  // a prefix of one verb
  EXPECT_EQ(r.err, "kvfile: error: unknown command 'conv'; did you mean 'convert'?\n");
  r = Kvfile("frobnicate");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(Lines(r.err), 1u);
  EXPECT_TRUE(r.err.starts_with("kvfile: error: unknown command 'frobnicate' (commands: synth, info, verify,")) << r.err;
  EXPECT_EQ(r.err.find("manpage"), std::string::npos) << "hidden verbs are not offered";
}

TEST_F(CliUxTest, VersionThreeWays) {
  for (const char* args : {"--version", "-V", "version"}) {
    CliRun r = Kvfile(args);
    SCOPED_TRACE(args);
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_EQ(r.out, std::string("kvfile ") + KVFILE_VERSION + "\n");
    EXPECT_EQ(r.err, "");
  }
}

TEST_F(CliUxTest, GlobalFlagsAfterTheVerb) {
  Synth("a.kv", 100, 1);
  for (const std::string& args : {"verify -q " + P("a.kv"), "verify " + P("a.kv") + " --quiet", "-q verify " + P("a.kv")}) {
    CliRun r = Kvfile(args);
    EXPECT_EQ(r.exit_code, 0) << args << ": " << r.err;
    EXPECT_EQ(r.err, "") << args;
    EXPECT_TRUE(r.out.starts_with(P("a.kv") + ": ok: 100 tokens")) << r.out;
  }
}

TEST_F(CliUxTest, UnknownIoBackendIsRefused) {
  Synth("a.kv", 10, 1);
  CliRun r = Kvfile("info " + P("a.kv"), "KVFILE_IO=bogus");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: KVFILE_IO=bogus: unknown I/O backend (posix or uring)\n");
  EXPECT_EQ(r.out, "");
  r = Kvfile("info --json " + P("a.kv"), "KVFILE_IO=posix");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["io_backend"], "posix");
}

TEST_F(CliUxTest, EveryVerbHelpHasAnExample) {
  for (const char* verb : {"synth", "info", "verify", "repair", "dump", "rewind", "append", "convert", "bench",
                           "completion"}) {
    CliRun r = Kvfile(std::string(verb) + " --help");
    EXPECT_EQ(r.exit_code, 0) << verb;
    EXPECT_NE(r.out.find("Example: kvfile " + std::string(verb) + " "), std::string::npos) << verb << ": " << r.out;
  }
}

TEST_F(CliUxTest, NegativeNumbersAreRefusedClearly) {
  Synth("a.kv", 100, 1);
  std::string before = ReadFile(P("a.kv"));
  CliRun r = Kvfile("rewind " + P("a.kv") + " --to -3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(Lines(r.err), 1u);
  EXPECT_TRUE(r.err.starts_with("kvfile: error: --to: expected a non-negative number, got '-3'")) << r.err;
  EXPECT_EQ(ReadFile(P("a.kv")), before);
}

TEST_F(CliUxTest, InfoOfSeveralFilesAndOfStandardInput) {
  Synth("a.kv", 100, 1);
  Synth("b.kv", 70, 2);
  CliRun r = Kvfile("info " + P("a.kv") + " " + P("b.kv"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("file:            " + P("a.kv") + "\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("file:            " + P("b.kv") + "\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokens:          100\n"), std::string::npos);
  EXPECT_NE(r.out.find("tokens:          70\n"), std::string::npos);
  auto j = nlohmann::json::parse(Kvfile("info --json " + P("a.kv") + " " + P("b.kv")).out);
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["tokens"], 100);
  EXPECT_EQ(j[1]["tokens"], 70);
  // A missing one among them: shown as an error entry, one stderr line, exit 2.
  r = Kvfile("info --json " + P("a.kv") + " " + P("missing.kv") + " " + P("b.kv"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(Lines(r.err), 1u) << r.err;
  j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[1]["ok"], false);
  EXPECT_EQ(j[2]["tokens"], 70);
  // Standard input, through a temporary copy that is removed again.
  r = Kvfile("info --json - < " + P("b.kv"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["path"], "-");
  EXPECT_EQ(j["tokens"], 70);
  r = Kvfile("verify - < " + P("a.kv"), "TMPDIR=" + P("") + " ");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.out.starts_with("-: ok: 100 tokens")) << r.out;
  size_t left = 0;
  for (const auto& e : fs::directory_iterator(dir_)) left += e.path().filename().string().starts_with("kvfile-stdin");
  EXPECT_EQ(left, 0u) << "the temporary copy is removed";
  // Not a .kv file on standard input: the error names "-", not the copy.
  r = Kvfile("info - < /dev/null");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(r.err.starts_with("kvfile: error: -: ")) << r.err;
  EXPECT_EQ(r.err.find("kvfile-stdin"), std::string::npos) << r.err;
}

// "-" is standard input even where a file or directory named "-" exists;
// "./-" names that file.
TEST_F(CliUxTest, DashIsStandardInputEvenWhenAFileIsNamedDash) {
  Synth("a.kv", 100, 1);
  Synth("b.kv", 70, 2);
  ASSERT_EQ(Here("pack b.kv -o -").exit_code, 0);  // a pack named "-"
  CliRun r = Here("verify - < a.kv");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.out.starts_with("-: ok: 100 tokens")) << r.out;
  r = Here("verify ./-");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.out.starts_with("./-: ok: 1 members, ")) << r.out;
  r = Here("info --json - < a.kv");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["tokens"], 100);
  fs::remove(P("-"));
  fs::create_directories(P("-"));  // a directory named "-" holding b.kv
  fs::copy_file(P("b.kv"), P("-/b.kv"));
  r = Here("verify - < a.kv");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.out.starts_with("-: ok: 100 tokens")) << r.out;
  r = Here("verify ./-");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("./-/b.kv: ok: 70 tokens"), std::string::npos) << r.out;
}

TEST_F(CliUxTest, VerifyOfManyFilesOneLineEachNaturalOrderAndSummary) {
  fs::create_directories(P("snap"));
  for (int i : {1, 2, 10, 11})
    Synth("snap/doc" + std::to_string(i) + ".kv", 50 + i, i);
  FlipBit(P("snap/doc10.kv"), 12288 + 130, 0);
  CliRun r = Here("verify snap");
  EXPECT_EQ(r.exit_code, 1);
  std::vector<std::string> lines = SplitLines(r.out);
  ASSERT_EQ(lines.size(), 5u) << r.out;
  EXPECT_TRUE(lines[0].starts_with("snap/doc1.kv: ok: 51 tokens")) << lines[0];
  EXPECT_TRUE(lines[1].starts_with("snap/doc2.kv: ok: 52 tokens")) << lines[1];
  EXPECT_TRUE(lines[2].starts_with("snap/doc10.kv: FAILED: chunk 0 at offset 12288")) << lines[2];
  EXPECT_TRUE(lines[3].starts_with("snap/doc11.kv: ok: 61 tokens")) << lines[3];
  EXPECT_EQ(lines[4], "1 of 4 files damaged");
  EXPECT_EQ(Lines(r.err), 1u) << r.err;
  EXPECT_TRUE(r.err.starts_with("kvfile: error: 1 of 4 files failed; first: snap/doc10.kv: chunk 0")) << r.err;
  r = Here("verify --errors-only snap");
  EXPECT_EQ(r.exit_code, 1);
  lines = SplitLines(r.out);
  ASSERT_EQ(lines.size(), 2u) << r.out;
  EXPECT_TRUE(lines[0].starts_with("snap/doc10.kv: FAILED: ")) << lines[0];
  EXPECT_EQ(lines[1], "1 of 4 files damaged");
  auto j = nlohmann::json::parse(Here("verify --json --errors-only snap").out);
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["path"], "snap/doc10.kv");
  EXPECT_EQ(j[0]["ok"], false);
  j = nlohmann::json::parse(Here("verify --json snap").out);
  ASSERT_EQ(j.size(), 4u);
  EXPECT_EQ(j[2]["path"], "snap/doc10.kv");
  // All healthy: exit 0, and the summary says none is damaged.
  fs::remove(P("snap/doc10.kv"));
  r = Here("verify --errors-only snap snap/doc1.kv");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "0 of 4 files damaged\n");
  EXPECT_EQ(r.err, "");
  // An empty selection is a usage error.
  fs::create_directories(P("empty"));
  std::ofstream(P("empty/notes.txt")) << "x";
  r = Here("verify empty");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: empty: no .kv files in this directory\n");
  EXPECT_EQ(r.out, "");
}

// .kv directory -> .safetensors directory (by OUT's suffix, or --to) and back:
// with --codes every code and scale comes back exactly (synth --check).
TEST_F(CliUxTest, BatchConvertBothWays) {
  fs::create_directories(P("kv/sub"));
  Synth("kv/s2.kv", 40, 2);
  Synth("kv/sub/s10.kv", 90, 10);
  CliRun r = Here("convert kv out.safetensors --codes");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::is_regular_file(P("out.safetensors/s2.safetensors")));
  EXPECT_TRUE(fs::is_regular_file(P("out.safetensors/sub/s10.safetensors")));
  std::vector<std::string> lines = SplitLines(r.out);
  ASSERT_EQ(lines.size(), 3u) << r.out;
  EXPECT_TRUE(lines[0].starts_with("kv/s2.kv -> out.safetensors/s2.safetensors: 40 tokens")) << lines[0];
  EXPECT_EQ(lines[2], "converted 2 of 2 files from kv to out.safetensors");
  r = Here("convert kv st --to safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::is_regular_file(P("st/sub/s10.safetensors")));
  // Back: a directory of only .safetensors files is imported.
  r = Here("convert out.safetensors back");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(SplitLines(r.out).back(), "converted 2 of 2 files from out.safetensors to back");
  EXPECT_EQ(Kvfile("synth --check " + P("back/s2.kv")).exit_code, 0);
  EXPECT_EQ(Kvfile("synth --check " + P("back/sub/s10.kv")).exit_code, 0);
  auto j = nlohmann::json::parse(Kvfile("info --json " + P("back/sub/s10.kv")).out);
  EXPECT_EQ(j["tokens"], 90);
  // Nothing to convert is a usage error; so is --to on a file.
  fs::create_directories(P("none"));
  r = Here("convert none out2");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: none: no .kv or .safetensors files in this directory\n");
  EXPECT_FALSE(fs::exists(P("out2")));
  r = Here("convert kv/s2.kv x.kv --to kv");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(Lines(r.err), 1u);
}

// A flipped bit in a chunk's salt is damage of this file, not "another
// file" (the chunk table cannot be followed past it, so no command is
// offered); damage in a chunk's payload is reported with the tokens that
// are intact and the command that keeps them, and that command works.
TEST_F(CliUxTest, DamageReportsSayWhatIsIntactAndHowToKeepIt) {
  Synth("a.kv", 300, 5, 64);
  std::string healthy = ReadFile(P("a.kv"));
  auto j = nlohmann::json::parse(Kvfile("dump --chunks --json " + P("a.kv")).out);
  ASSERT_TRUE(j.contains("chunks")) << j.dump();
  uint64_t third = j["chunks"][2]["offset"].get<uint64_t>();
  ASSERT_EQ(j["chunks"][2]["first_token"], 128);
  FlipBit(P("a.kv"), static_cast<std::streamoff>(third + 8), 3);  // the chunk header's salt
  CliRun v = Here("verify a.kv");
  EXPECT_EQ(v.exit_code, 1);
  EXPECT_EQ(v.err, "kvfile: error: a.kv: chunk 2 at offset " + std::to_string(third) +
                       ": chunk head damaged (its salt does not match the file's, and its checksum fails)\n");

  std::ofstream(P("a.kv"), std::ios::binary) << healthy;
  FlipBit(P("a.kv"), static_cast<std::streamoff>(third + 3000), 3);  // inside its payload
  std::string damaged = ReadFile(P("a.kv"));
  v = Here("verify a.kv");
  EXPECT_EQ(v.exit_code, 1);
  EXPECT_EQ(Lines(v.err), 1u) << v.err;
  EXPECT_NE(v.err.find("; tokens 0-127 are intact; keep them: kvfile rewind a.kv --to 128\n"), std::string::npos)
      << v.err;
  CliRun rep = Here("repair a.kv");
  EXPECT_EQ(rep.exit_code, 1);
  EXPECT_EQ(Lines(rep.err), 1u) << rep.err;
  EXPECT_NE(rep.err.find("not repaired (damage, not a crash's leftovers); tokens 0-127 are intact; keep them: "
                         "kvfile rewind a.kv --to 128\n"),
            std::string::npos)
      << rep.err;
  EXPECT_EQ(ReadFile(P("a.kv")), damaged) << "repair refuses and leaves the file";
  CliRun rw = Here("rewind a.kv --to 128");
  EXPECT_EQ(rw.exit_code, 0) << rw.err;
  EXPECT_EQ(Here("verify a.kv").exit_code, 0);
  EXPECT_EQ(Kvfile("synth --check " + P("a.kv")).exit_code, 0);
}

// A chunk spliced in from another file of the same geometry is still
// reported as such.
TEST_F(CliUxTest, ChunkOfAnotherFileIsStillNamedSo) {
  Synth("a.kv", 128, 5, 64);
  Synth("b.kv", 128, 6, 64);
  std::string a = ReadFile(P("a.kv")), b = ReadFile(P("b.kv"));
  ASSERT_EQ(a.size(), b.size());
  auto j = nlohmann::json::parse(Kvfile("dump --chunks --json " + P("a.kv")).out);
  uint64_t second = j["chunks"][1]["offset"].get<uint64_t>();
  std::ofstream(P("a.kv"), std::ios::binary) << a.substr(0, second) << b.substr(second);
  CliRun v = Here("verify a.kv");
  EXPECT_EQ(v.exit_code, 1);
  EXPECT_NE(v.err.find("chunk belongs to another file"), std::string::npos) << v.err;
}

// Every error line of the verbs over damaged, cut and foreign inputs stays
// one line under 200 characters (the details are in --json).
TEST_F(CliUxTest, ErrorLinesAreShort) {
  Synth("a.kv", 300, 5, 64);
  std::string healthy = ReadFile(P("a.kv"));
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(P(name), std::ios::binary) << bytes;
  };
  write("cut.kv", healthy.substr(0, healthy.size() - 1000));
  write("cut_head.kv", healthy.substr(0, 12288 + 10));
  write("header.kv", std::string(100, 'x') + healthy.substr(100));
  std::string flipped = healthy;
  flipped[12288 + 300] ^= 1;
  write("flip.kv", flipped);
  std::string slots = healthy;
  slots[4096 + 40] ^= 1;
  slots[8192 + 40] ^= 1;
  write("slots.kv", slots);
  write("empty.kv", "");
  write("junk.safetensors", "12345678{not json");
  std::vector<std::string> commands;
  for (const char* f : {"cut.kv", "cut_head.kv", "header.kv", "flip.kv", "slots.kv", "empty.kv", "missing.kv"})
    for (std::string verb : std::vector<std::string>{"info", "verify", "verify --strict", "repair --dry-run",
                                                     "dump --header", "dump --chunks", "rewind --to 10",
                                                     "synth --check", "convert", "repair"}) {
      std::string args = verb == "convert" ? "convert " + std::string(f) + " o.safetensors --force"
                                           : verb + " " + f;
      commands.push_back(args);
    }
  commands.push_back("append a.kv junk.safetensors");
  commands.push_back("convert junk.safetensors o.kv");
  commands.push_back("rewind a.kv --to 100000");
  commands.push_back("verify a.kv --jobs 0");
  commands.push_back("info");
  size_t failures = 0;
  for (const std::string& c : commands) {
    CliRun r = Here(c);
    SCOPED_TRACE(c);
    if (r.exit_code == 0) continue;
    ++failures;
    EXPECT_TRUE(r.exit_code == 1 || r.exit_code == 2) << r.exit_code;
    EXPECT_EQ(Lines(r.err), 1u) << r.err;
    EXPECT_LT(r.err.size(), 200u) << r.err;
  }
  EXPECT_GT(failures, 50u);
}

// Issue 33 item 1: PACK:MEMBER in a verb that writes FILE is refused (a
// pack is never changed in place), with the command that makes a writable
// copy; no file of that name is created to shadow the member, the pack is
// unchanged. synth --check reads the member as info does.
TEST_F(CliUxTest, PackMemberIsRefusedByTheWritingVerbs) {
  fs::create_directories(P("d"));
  Synth("d/doc1.kv", 100, 1);
  Synth("d/doc2.kv", 50, 2);
  ASSERT_EQ(Here("pack d -o c.kvpack").exit_code, 0);
  ASSERT_EQ(Here("convert d/doc1.kv t.safetensors").exit_code, 0);
  const std::string pack = ReadFile(P("c.kvpack"));
  const std::string refused =
      "kvfile: error: c.kvpack:doc1.kv: a pack member cannot be written in place; write a copy with: "
      "kvfile unpack c.kvpack -o DIR doc1.kv\n";
  for (const char* args : {"append c.kvpack:doc1.kv t.safetensors", "synth c.kvpack:doc1.kv --preset tiny",
                           "synth c.kvpack:doc1.kv --preset tiny --force", "rewind c.kvpack:doc1.kv --to 3",
                           "repair c.kvpack:doc1.kv", "repair --dry-run c.kvpack:doc1.kv",
                           "convert t.safetensors c.kvpack:doc1.kv", "convert d/doc2.kv c.kvpack:doc1.kv --force"}) {
    SCOPED_TRACE(args);
    CliRun r = Here(args);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(r.err, refused);
    EXPECT_EQ(r.out, "");
    EXPECT_FALSE(fs::exists(P("c.kvpack:doc1.kv")));
    EXPECT_EQ(ReadFile(P("c.kvpack")), pack);
  }
  CliRun r = Here("synth --check c.kvpack:doc2.kv");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "c.kvpack:doc2.kv: ok, all 50 tokens match the synthetic data of seed 2\n");
  EXPECT_EQ(r.err, "");
  r = Here("info --json c.kvpack:doc1.kv");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["tokens"], 100) << "the member, not a stray file";
}

// Issue 33 item 2: synth --check compares the geometry with the preset the
// model id names, not only the data of the streams the file still has: a
// dsa-mixed session through a Mooncake round trip has lost its raw indexer
// stream (it said "ok, all 32 tokens match").
TEST_F(CliUxTest, SynthCheckComparesTheGeometryWithThePreset) {
  ASSERT_EQ(Here("synth s.kv --preset dsa-mixed --tokens 32 --chunk-tokens 16").exit_code, 0);
  ASSERT_EQ(Here("convert s.kv mc --format mooncake").exit_code, 0);
  ASSERT_EQ(Here("convert mc back.kv").exit_code, 0);
  const std::string back = ReadFile(P("back.kv"));
  CliRun r = Here("synth --check back.kv");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err,
            "kvfile: error: back.kv: not the geometry of preset dsa-mixed: stream count: file has 2, expected 3 "
            "(61 layers; streams latent, rope, indexer)\n");
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(ReadFile(P("back.kv")), back);
  r = Here("synth --check s.kv");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // A model id that names no preset: nothing to check against.
  Synth("t.kv", 10, 1);
  ASSERT_EQ(Here("convert t.kv t.safetensors").exit_code, 0);
  ASSERT_EQ(Here("append u.kv t.safetensors --model other").exit_code, 0);
  r = Here("synth --check u.kv");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err,
            "kvfile: error: u.kv: model 'other' names no synth preset (synth writes 'synthetic/PRESET'), so there "
            "is nothing to check against\n");
}

// Issue 33 item 6: a mistyped flag is named as typed, with the nearest flag
// of that verb and that verb's help (CLI11 listed the extras reversed and
// pointed at the top-level help).
TEST_F(CliUxTest, UnknownFlagSuggestsTheNearestOfTheVerb) {
  Synth("s.kv", 10, 1);
  auto expect = [&](const std::string& args, const std::string& line) {
    SCOPED_TRACE(args);
    CliRun r = Here(args);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(r.err, "kvfile: error: " + line + "\n");
    EXPECT_EQ(r.out, "");
  };
  expect("info s.kv --jsn", "info: unknown flag '--jsn'; did you mean '--json'? (see kvfile info --help)");
  expect("-q info --jsn=1 s.kv", "info: unknown flag '--jsn'; did you mean '--json'? (see kvfile info --help)");
  expect("synth x.kv --tokns 5", "synth: unknown flag '--tokns'; did you mean '--tokens'? (see kvfile synth --help)");
  expect("verify s.kv --erors-only --jsn",
         "verify: unknown flag '--erors-only'; did you mean '--errors-only'? (see kvfile verify --help)");
  expect("rewind s.kv --to 3 --chunk-tokens 4", "rewind: unknown flag '--chunk-tokens' (see kvfile rewind --help)");
  expect("info s.kv -z", "info: unknown flag '-z' (see kvfile info --help)");
  expect("synth a.kv b.kv c.kv", "synth: unexpected arguments 'b.kv' 'c.kv' (see kvfile synth --help)");
  expect("rewind s.kv --to x", "--to: must be an integer, not 'x' (see kvfile rewind --help)");
  EXPECT_FALSE(fs::exists(P("x.kv")));
  EXPECT_FALSE(fs::exists(P("a.kv")));
}

// Issue 33 item 6: synth --check refuses the flags that choose what synth
// writes (they were ignored: --tokens 5 checked all 10 tokens and said ok).
TEST_F(CliUxTest, SynthCheckRefusesTheFlagsOfWriting) {
  Synth("s.kv", 10, 1);
  for (const char* flag : {"--tokens 5", "--seed 3", "--preset tiny", "--dtype e5m2", "--chunk-tokens 4", "--force",
                           "--prefix-tokens 2", "--prefix-seed 2"}) {
    SCOPED_TRACE(flag);
    CliRun r = Here(std::string("synth --check s.kv ") + flag);
    EXPECT_EQ(r.exit_code, 2);
    std::string name = std::string(flag).substr(0, std::string(flag).find(' '));
    EXPECT_EQ(r.err, "kvfile: error: " + name +
                         " does not apply to synth --check (it reads the preset, seed and tokens from FILE)\n");
    EXPECT_EQ(r.out, "");
  }
  CliRun r = Here("synth --check s.kv -q");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// Issue 33 item 6: a file that is no safetensors file is named so (its
// first 8 bytes were read as a header length: "header length
// 8031924123371070824 exceeds the limit"); nothing is created.
TEST_F(CliUxTest, AppendOfATextFileSaysItIsNoSafetensorsFile) {
  std::ofstream(P("notes.txt")) << "hello world this is text\n";
  std::ofstream(P("notes.safetensors")) << "hello world this is text\n";
  for (const std::string& in : {std::string("notes.txt"), std::string("notes.safetensors")}) {
    for (const std::string& args : {"append new.kv " + in, std::string("convert notes.safetensors new.kv")}) {
      if (args.starts_with("convert") && in != "notes.safetensors") continue;
      SCOPED_TRACE(args);
      CliRun r = Here(args);
      EXPECT_EQ(r.exit_code, 1);
      EXPECT_EQ(r.err, "kvfile: error: " + in + ": not a safetensors file (no JSON header after the 8-byte header length)\n");
      EXPECT_FALSE(fs::exists(P("new.kv")));
    }
  }
}

// Issue 33 item 6: a safetensors input without kvfile.model and
// kvfile.fingerprint matches any file of its geometry; the append says so
// (it was silent), and --model or the metadata silence the note.
TEST_F(CliUxTest, AppendOfAnInputWithoutIdentitySaysSo) {
  Synth("a.kv", 20, 1);
  ASSERT_EQ(Here("convert a.kv t.safetensors").exit_code, 0);
  std::string st = ReadFile(P("t.safetensors"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(st[static_cast<size_t>(i)]);
  auto header = nlohmann::json::parse(st.substr(8, n));
  ASSERT_TRUE(header.erase("__metadata__"));
  std::string h = header.dump();
  std::string len(8, '\0');
  for (size_t i = 0; i < 8; ++i) len[i] = static_cast<char>(h.size() >> (8 * i) & 0xff);
  std::ofstream(P("anon.safetensors"), std::ios::binary) << len << h << st.substr(8 + n);
  CliRun r = Here("append a.kv anon.safetensors");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "kvfile: note: a.kv: anon.safetensors names no model (no kvfile.model or kvfile.fingerprint "
                   "metadata, no --model): appended to model 'synthetic/tiny' on its geometry alone\n");
  EXPECT_EQ(r.out, "a.kv: appended 20 tokens from anon.safetensors (40 in total)\n");
  r = Here("append a.kv anon.safetensors --model synthetic/tiny");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  r = Here("append a.kv t.safetensors");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
}

// Issue 33 item 6: rewind keeps only whole tokens; a damaged chunk below
// --to is refused with the rewind that keeps what is intact (it was kept
// without a word). Above --to it is dropped as before.
TEST_F(CliUxTest, RewindRefusesToKeepADamagedChunk) {
  Synth("a.kv", 300, 5, 64);
  auto j = nlohmann::json::parse(Kvfile("dump --chunks --json " + P("a.kv")).out);
  uint64_t third = j["chunks"][2]["offset"].get<uint64_t>();
  ASSERT_EQ(j["chunks"][2]["first_token"], 128);
  FlipBit(P("a.kv"), static_cast<std::streamoff>(third + 3000), 3);
  const std::string damaged = ReadFile(P("a.kv"));
  for (const char* to : {"129", "200", "300"}) {
    SCOPED_TRACE(to);
    CliRun r = Here(std::string("rewind a.kv --to ") + to);
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(r.err, "kvfile: error: a.kv: chunk 2 at offset " + std::to_string(third) +
                         " is damaged (kvfile verify a.kv says how); not rewound; tokens 0-127 are intact; keep them: "
                         "kvfile rewind a.kv --to 128\n");
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(ReadFile(P("a.kv")), damaged);
  }
  CliRun r = Here("rewind a.kv --to 128");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "a.kv: kept 128 tokens, dropped 172\n");
  EXPECT_EQ(Here("verify a.kv").exit_code, 0);
}

// Issue 33 item 5: one form for one thing. The fingerprint is a hex string
// in ls --json as in info, dump and find (ls gave a number); index --json
// says up to date where the text does; synth's "file exists" names --force
// as convert, pack and unpack do.
TEST_F(CliUxTest, OneFormForOneThing) {
  fs::create_directories(P("d"));
  Synth("d/a.kv", 20, 7);
  ASSERT_EQ(Here("pack d -o c.kvpack").exit_code, 0);
  auto ls = nlohmann::json::parse(Here("ls c.kvpack --json").out);
  EXPECT_EQ(ls["members"][0]["fingerprint"], "0000000000000007");
  EXPECT_EQ(nlohmann::json::parse(Here("info --json d/a.kv").out)["fingerprint"], ls["members"][0]["fingerprint"]);

  auto first = nlohmann::json::parse(Here("index d --json").out);
  EXPECT_EQ(first["up_to_date"], false);
  EXPECT_EQ(first["written"], true);
  EXPECT_EQ(first["rebuilt"], false);
  CliRun r = Here("index d");
  EXPECT_EQ(r.out, "d/.kvfile-index: up to date (1 files)\n");
  auto again = nlohmann::json::parse(Here("index d --json").out);
  EXPECT_EQ(again["up_to_date"], true);
  EXPECT_EQ(again["written"], false);
  EXPECT_EQ(again["indexed"], 1);

  const std::string before = ReadFile(P("d/a.kv"));
  r = Here("synth d/a.kv --preset tiny --tokens 5");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: d/a.kv: file exists; use --force to replace it\n");
  EXPECT_EQ(ReadFile(P("d/a.kv")), before);
}

// Issue 33 item 5: repair --dry-run names every step repair then takes:
// the upgrade of a v1 file and, with --force on a file cut inside its
// committed data, the recommit of the prefix (both were left out).
TEST_F(CliUxTest, RepairDryRunNamesEveryStep) {
  Synth("a.kv", 50, 1, 16);
  ASSERT_EQ(Here("convert a.kv v1.kv --format v1").exit_code, 0);
  std::ofstream(P("v1.kv"), std::ios::app | std::ios::binary) << std::string(100, 'x');  // a torn tail
  const std::string v1 = ReadFile(P("v1.kv"));
  const uint64_t v1_end = v1.size() - 100;
  CliRun r = Here("repair --dry-run v1.kv");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> lines = SplitLines(r.out);
  ASSERT_EQ(lines.size(), 2u) << r.out;
  EXPECT_EQ(lines[0], "v1.kv: would be upgraded from format 1.0 (k bf16, v bf16) to format 2 (k e4m3, v e4m3)");
  EXPECT_TRUE(lines[1].starts_with("v1.kv: would cut 100 bytes at offset " + std::to_string(v1_end) + " ("))
      << lines[1];
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(ReadFile(P("v1.kv")), v1);
  r = Here("repair v1.kv");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "kvfile: note: v1.kv: upgraded from format 1.0 (k bf16, v bf16) to format 2 (k e4m3, v e4m3)\n");

  uint64_t prefix_end = 12288 + 2 * 4096;
  fs::resize_file(P("a.kv"), prefix_end + 1000);
  const std::string cut = ReadFile(P("a.kv"));
  r = Here("repair --dry-run --force a.kv");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  lines = SplitLines(r.out);
  ASSERT_EQ(lines.size(), 2u) << r.out;
  EXPECT_TRUE(lines[0].starts_with("a.kv: would cut 1000 bytes at offset " + std::to_string(prefix_end))) << lines[0];
  EXPECT_EQ(lines[1], "a.kv: would commit the 32 tokens before the cut; 18 committed tokens would be lost");
  EXPECT_EQ(ReadFile(P("a.kv")), cut);
  r = Here("repair --force a.kv");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("a.kv: committed the 32 tokens before the cut; 18 committed tokens were lost\n"),
            std::string::npos)
      << r.out;
}

TEST_F(CliUxTest, ManPageAndCompletionsListEveryVerb) {
  CliRun man = Kvfile("manpage");
  ASSERT_EQ(man.exit_code, 0);
  CliRun bash = Kvfile("completion bash");
  ASSERT_EQ(bash.exit_code, 0);
  CliRun zsh = Kvfile("completion zsh");
  ASSERT_EQ(zsh.exit_code, 0);
  EXPECT_TRUE(man.out.starts_with(".TH KVFILE 1 ")) << man.out.substr(0, 80);
  EXPECT_TRUE(zsh.out.starts_with("#compdef kvfile\n"));
  for (const char* verb : {"synth", "info", "verify", "repair", "dump", "rewind", "append", "convert", "bench",
                           "version", "completion"}) {
    SCOPED_TRACE(verb);
    EXPECT_NE(man.out.find(".SS \"kvfile " + std::string(verb)), std::string::npos);
    EXPECT_NE(bash.out.find("    " + std::string(verb) + ") opts='"), std::string::npos);
    EXPECT_NE(zsh.out.find("    '" + std::string(verb) + ":"), std::string::npos);
  }
  EXPECT_NE(man.out.find("\\fB\\-\\-errors\\-only\\fR"), std::string::npos);
  EXPECT_EQ(man.out.find(".SS \"kvfile manpage"), std::string::npos);
  // The build made the installed copies from the same binary.
  fs::path build = fs::path(KVFILE_BINARY).parent_path();
  EXPECT_EQ(ReadFile(build / "kvfile.1"), man.out);
  EXPECT_EQ(ReadFile(build / "kvfile.bash"), bash.out);
  EXPECT_EQ(ReadFile(build / "_kvfile"), zsh.out);
  // bash accepts the script and completes verbs and flags with it.
  std::ofstream(P("c.bash")) << bash.out;
  std::string script = "source " + P("c.bash") +
                       "; COMP_WORDS=(kvfile ver); COMP_CWORD=1; _kvfile; echo \"${COMPREPLY[*]}\";"
                       " COMP_WORDS=(kvfile verify --err); COMP_CWORD=2; _kvfile; echo \"${COMPREPLY[*]}\"";
  std::ofstream(P("t.sh")) << script;
  FILE* p = popen(("bash " + P("t.sh")).c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[256];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  ASSERT_EQ(pclose(p), 0);
  EXPECT_EQ(out, "verify version\n--errors-only\n");
}

}  // namespace
