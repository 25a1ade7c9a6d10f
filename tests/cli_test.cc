// SPDX-License-Identifier: Apache-2.0
// The kvfile binary, run as a user runs it: exit status, stdout, the one
// stderr line, and files left as they were.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/cli_run.h"
#include "support/file_util.h"
#include "support/scratch_dir.h"
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace {

namespace fs = std::filesystem;

using kvfile::testing::CliRun;
using kvfile::testing::FlipBit;
using kvfile::testing::Kvfile;
using kvfile::testing::ReadFile;

class CliTest : public kvfile::testing::ScratchDirTest {};

TEST_F(CliTest, SynthInfoAndCheck) {
  CliRun w = Kvfile("synth " + P("a.kv") + " --preset tiny --tokens 300 --chunk-tokens 64 --seed 7");
  ASSERT_EQ(w.exit_code, 0) << w.err;
  EXPECT_EQ(w.err, "");
  CliRun info = Kvfile("info --json " + P("a.kv"));
  ASSERT_EQ(info.exit_code, 0) << info.err;
  auto j = nlohmann::json::parse(info.out);
  EXPECT_EQ(j["version"], "2.1");
  EXPECT_EQ(j["model"], "synthetic/tiny");
  EXPECT_EQ(j["fingerprint"], "0000000000000007");
  EXPECT_EQ(j["layers"], 2);
  ASSERT_EQ(j["streams"].size(), 2u);
  EXPECT_EQ(j["streams"][0]["name"], "k");
  EXPECT_EQ(j["streams"][0]["rows_per_token"], 2);
  EXPECT_EQ(j["streams"][0]["row_width"], 16);
  EXPECT_EQ(j["streams"][0]["dtype"], "e4m3");
  EXPECT_EQ(j["tokens"], 300);
  EXPECT_EQ(j["chunks"], 5);  // 4 x 64 + 44
  EXPECT_EQ(j["bytes"], fs::file_size(P("a.kv")));
  EXPECT_EQ(j["torn_tail_bytes"], 0);
  // io_uring where the kernel allows it, else posix; KVFILE_IO forces one.
  EXPECT_TRUE(j["io_backend"] == "io_uring" || j["io_backend"] == "posix") << j["io_backend"];
  CliRun posix = Kvfile("info --json " + P("a.kv"));
  setenv("KVFILE_IO", "posix", 1);
  posix = Kvfile("info --json " + P("a.kv"));
  unsetenv("KVFILE_IO");
  EXPECT_EQ(nlohmann::json::parse(posix.out)["io_backend"], "posix");
  CliRun check = Kvfile("synth --check " + P("a.kv"));
  EXPECT_EQ(check.exit_code, 0) << check.err;
  EXPECT_NE(check.out.find("ok, all 300 tokens match"), std::string::npos) << check.out;
  CliRun text = Kvfile("info " + P("a.kv"));
  EXPECT_EQ(text.exit_code, 0);
  EXPECT_NE(text.out.find("tokens:          300"), std::string::npos) << text.out;
}

TEST_F(CliTest, E5m2AndOtherPresets) {
  for (const char* preset : {"dsa-mixed", "deepseek-v3", "qwen2.5-7b"}) {
    std::string f = P(std::string(preset) + ".kv");
    CliRun w = Kvfile("synth " + f + " --preset " + preset + " --tokens 20 --dtype e5m2 --chunk-tokens 8");
    ASSERT_EQ(w.exit_code, 0) << w.err;
    CliRun check = Kvfile("synth --check " + f);
    EXPECT_EQ(check.exit_code, 0) << preset << ": " << check.err;
  }
}

TEST_F(CliTest, CheckDetectsAlteredPayload) {
  ASSERT_EQ(Kvfile("synth " + P("a.kv") + " --preset tiny --tokens 10").exit_code, 0);
  // Flip one bit in the first section of the first chunk (chunk at 12288,
  // head of 10 tokens: align(64 + 32 + 40 + 8, 64) = 192).
  {
    std::fstream f(P("a.kv"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(12288 + 192 + 5);
    char c;
    f.get(c);
    f.seekp(12288 + 192 + 5);
    f.put(static_cast<char>(c ^ 0x10));
  }
  CliRun check = Kvfile("synth --check " + P("a.kv"));
  EXPECT_EQ(check.exit_code, 1);
  EXPECT_EQ(check.err.rfind("kvfile: error: " + P("a.kv") + ": chunk 0 at offset 12288", 0), 0u) << check.err;
  EXPECT_NE(check.err.find("checksum mismatch"), std::string::npos) << check.err;
  EXPECT_EQ(std::count(check.err.begin(), check.err.end(), '\n'), 1) << check.err;
}

TEST_F(CliTest, UsageAndEnvironmentErrorsExit2) {
  CliRun missing = Kvfile("info " + P("nope.kv"));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_EQ(missing.err, "kvfile: error: " + P("nope.kv") + ": No such file or directory\n");
  CliRun bad_flag = Kvfile("synth " + P("x.kv") + " --tokens 0");
  EXPECT_EQ(bad_flag.exit_code, 2);
  EXPECT_EQ(bad_flag.err.rfind("kvfile: error: ", 0), 0u) << bad_flag.err;
  EXPECT_FALSE(fs::exists(P("x.kv")));
  CliRun bad_preset = Kvfile("synth " + P("x.kv") + " --preset gpt-9");
  EXPECT_EQ(bad_preset.exit_code, 2);
  CliRun no_verb = Kvfile("");
  EXPECT_EQ(no_verb.exit_code, 2);
}

TEST_F(CliTest, ExistingOutputNeedsForce) {
  ASSERT_EQ(Kvfile("synth " + P("a.kv") + " --preset tiny --tokens 5 --seed 1").exit_code, 0);
  std::string before = ReadFile(P("a.kv"));
  CliRun again = Kvfile("synth " + P("a.kv") + " --preset tiny --tokens 9 --seed 2");
  EXPECT_EQ(again.exit_code, 2);
  EXPECT_EQ(again.err, "kvfile: error: " + P("a.kv") + ": file exists; use --force to replace it\n");
  EXPECT_EQ(ReadFile(P("a.kv")), before);
  CliRun forced = Kvfile("synth " + P("a.kv") + " --preset tiny --tokens 9 --seed 2 --force");
  EXPECT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_NE(ReadFile(P("a.kv")), before);
  EXPECT_FALSE(fs::exists(P("a.kv") + ".kvnew"));
}

TEST_F(CliTest, NotAKvfileIsDataError) {
  std::ofstream(P("junk.kv")) << std::string(20000, 'x');
  CliRun info = Kvfile("info " + P("junk.kv"));
  EXPECT_EQ(info.exit_code, 1);
  EXPECT_EQ(info.err, "kvfile: error: " + P("junk.kv") + ": not a kvfile: bad magic at offset 0\n");
}

// Appends `n` bytes of garbage: what a crash leaves after the last chunk.
void AppendGarbage(const std::string& path, size_t n) {
  std::ofstream f(path, std::ios::binary | std::ios::app);
  for (size_t i = 0; i < n; ++i) f.put(static_cast<char>(i * 37 + 11));
}

TEST_F(CliTest, VerifyTellsTornTailFromDamage) {
  ASSERT_EQ(Kvfile("synth " + P("a.kv") + " --preset tiny --tokens 100 --chunk-tokens 16").exit_code, 0);
  CliRun ok = Kvfile("verify " + P("a.kv"));
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(ok.out, P("a.kv") + ": ok: 100 tokens in 7 chunks, 40960 bytes\n");
  AppendGarbage(P("a.kv"), 5000);
  std::string torn = ReadFile(P("a.kv"));
  CliRun warn = Kvfile("verify " + P("a.kv"));
  EXPECT_EQ(warn.exit_code, 0);
  EXPECT_EQ(warn.err, "");
  EXPECT_NE(warn.out.find("warning: torn tail: 5000 bytes after the last valid chunk"), std::string::npos) << warn.out;
  CliRun strict = Kvfile("verify --strict " + P("a.kv"));
  EXPECT_EQ(strict.exit_code, 1);
  EXPECT_EQ(strict.err.rfind("kvfile: error: " + P("a.kv") + ": torn tail", 0), 0u) << strict.err;
  auto j = nlohmann::json::parse(Kvfile("verify --json " + P("a.kv")).out);
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["ok"], true);
  EXPECT_EQ(j[0]["torn_tail_bytes"], 5000);
  EXPECT_EQ(j[0]["warnings"][0]["offset"], 40960);
  EXPECT_EQ(j[0]["warnings"][0]["chunk"], 7);
  auto info = nlohmann::json::parse(Kvfile("info --json " + P("a.kv")).out);
  EXPECT_EQ(info["torn_tail_bytes"], 5000);
  EXPECT_EQ(info["tokens"], 100);
  EXPECT_EQ(ReadFile(P("a.kv")), torn) << "verify and info must not modify the file";

  // Damage before the end: one flipped bit in a committed chunk's payload.
  ASSERT_EQ(Kvfile("synth " + P("b.kv") + " --preset tiny --tokens 100 --chunk-tokens 16").exit_code, 0);
  FlipBit(P("b.kv"), 12288 + 4096 + 300, 0);
  CliRun bad = Kvfile("verify " + P("b.kv"));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_EQ(bad.err, "kvfile: error: " + P("b.kv") +
                         ": chunk 1 at offset 16384: payload checksum mismatch in layer 0 stream 'k' "
                         "(section at offset 16576); tokens 0-15 are intact; keep them: kvfile rewind " +
                         P("b.kv") + " --to 16\n");
  auto jb = nlohmann::json::parse(Kvfile("verify --json " + P("b.kv")).out);
  EXPECT_EQ(jb[0]["ok"], false);
  EXPECT_EQ(jb[0]["errors"][0]["chunk"], 1);
  EXPECT_EQ(jb[0]["errors"][0]["offset"], 16384);
}

TEST_F(CliTest, RepairCutsTornTailAndRefusesDamage) {
  ASSERT_EQ(Kvfile("synth " + P("a.kv") + " --preset tiny --tokens 50 --chunk-tokens 16").exit_code, 0);
  std::string healthy = ReadFile(P("a.kv"));
  CliRun noop = Kvfile("repair " + P("a.kv"));
  EXPECT_EQ(noop.exit_code, 0) << noop.err;
  EXPECT_EQ(noop.out, P("a.kv") + ": healthy, nothing to repair (50 tokens)\n");
  EXPECT_EQ(ReadFile(P("a.kv")), healthy);
  AppendGarbage(P("a.kv"), 3000);
  std::string torn = ReadFile(P("a.kv"));
  CliRun dry = Kvfile("repair --dry-run " + P("a.kv"));
  EXPECT_EQ(dry.exit_code, 0);
  EXPECT_NE(dry.out.find("would cut 3000 bytes at offset " + std::to_string(healthy.size())), std::string::npos) << dry.out;
  EXPECT_EQ(ReadFile(P("a.kv")), torn);
  CliRun fix = Kvfile("repair " + P("a.kv"));
  EXPECT_EQ(fix.exit_code, 0) << fix.err;
  EXPECT_NE(fix.out.find("cut a torn tail of 3000 bytes"), std::string::npos) << fix.out;
  EXPECT_EQ(ReadFile(P("a.kv")), healthy) << "repair must leave exactly the valid file";
  EXPECT_EQ(Kvfile("synth --check " + P("a.kv")).exit_code, 0);
  // Damage in committed data: refused, file untouched.
  FlipBit(P("a.kv"), 12288 + 200, 0);
  std::string damaged = ReadFile(P("a.kv"));
  CliRun refuse = Kvfile("repair " + P("a.kv"));
  EXPECT_EQ(refuse.exit_code, 1);
  EXPECT_NE(refuse.err.find("not repaired"), std::string::npos) << refuse.err;
  EXPECT_EQ(ReadFile(P("a.kv")), damaged);
}

// A file cut inside committed data: verify fails naming the cut, repair
// refuses without --force (file untouched), --force cuts it to its prefix.
TEST_F(CliTest, RepairForceCutsAFileTruncatedInsideCommittedData) {
  ASSERT_EQ(Kvfile("synth " + P("a.kv") + " --preset tiny --tokens 50 --chunk-tokens 16").exit_code, 0);
  std::string healthy = ReadFile(P("a.kv"));
  uint64_t prefix_end = 12288 + 2 * 4096;
  fs::resize_file(P("a.kv"), prefix_end + 1000);
  std::string cut = ReadFile(P("a.kv"));
  CliRun verify = Kvfile("verify " + P("a.kv"));
  EXPECT_EQ(verify.exit_code, 1);
  EXPECT_NE(verify.err.find("file truncated: committed data missing: the file ends at offset " +
                            std::to_string(prefix_end + 1000)), std::string::npos) << verify.err;
  EXPECT_NE(verify.err.find("chunk 2 at offset " + std::to_string(prefix_end)), std::string::npos) << verify.err;
  EXPECT_NE(verify.err.find("18 committed tokens"), std::string::npos) << verify.err;
  // info and dump show the readable prefix, say what is gone, and fail
  // with the cut (exit 1; issue 33 item 6: they exited 0).
  const std::string gone = "the file ends inside its committed data: 2 chunk(s), 18 token(s), ";
  const std::string cut_line = "kvfile: error: " + P("a.kv") + ": file truncated: committed data missing: the file "
                               "ends at offset " + std::to_string(prefix_end + 1000) + " (chunk 2 at offset " +
                               std::to_string(prefix_end) + "); 18 committed tokens gone; repair --force keeps the "
                               "32 before it\n";
  CliRun info_text = Kvfile("info " + P("a.kv"));
  EXPECT_EQ(info_text.exit_code, 1);
  EXPECT_EQ(info_text.err, cut_line);
  for (const std::string& args : std::vector<std::string>{"info --json ", "dump ", "dump --header --json ",
                                                          "dump --tokens ", "dump --header " + P("a.kv") + " "}) {
    CliRun r = Kvfile(args + P("a.kv"));
    EXPECT_EQ(r.exit_code, 1) << args;
    EXPECT_EQ(r.err, cut_line) << args;
    EXPECT_NE(r.out, "") << args;
  }
  EXPECT_NE(info_text.out.find("tokens:          32\n"), std::string::npos) << info_text.out;
  EXPECT_NE(info_text.out.find("missing data:    " + gone), std::string::npos) << info_text.out;
  auto cut_info = nlohmann::json::parse(Kvfile("info --json " + P("a.kv")).out);
  EXPECT_EQ(cut_info["tokens"], 32);
  EXPECT_EQ(cut_info["committed_data_missing"], true);
  EXPECT_EQ(cut_info["committed_tokens_missing"], 18);
  EXPECT_GT(cut_info["committed_bytes_missing"].get<uint64_t>(), 0u);
  CliRun dump_text = Kvfile("dump --header " + P("a.kv"));
  EXPECT_NE(dump_text.out.find("  missing           " + gone), std::string::npos) << dump_text.out;
  auto cut_dump = nlohmann::json::parse(Kvfile("dump --header --json " + P("a.kv")).out);
  EXPECT_EQ(cut_dump["header"]["committed_data_missing"], true);
  EXPECT_NE(cut_dump["header"]["missing"].get<std::string>().find(gone), std::string::npos);
  EXPECT_EQ(ReadFile(P("a.kv")), cut);
  CliRun refuse = Kvfile("repair " + P("a.kv"));
  EXPECT_EQ(refuse.exit_code, 1);
  EXPECT_NE(refuse.err.find("repair --force keeps the"), std::string::npos) << refuse.err;
  EXPECT_EQ(ReadFile(P("a.kv")), cut);
  CliRun fix = Kvfile("repair --force " + P("a.kv"));
  EXPECT_EQ(fix.exit_code, 0) << fix.err;
  EXPECT_NE(fix.out.find("committed the 32 tokens before the cut; 18 committed tokens were lost"), std::string::npos)
      << fix.out;
  EXPECT_EQ(fs::file_size(P("a.kv")), prefix_end);
  CliRun clean = Kvfile("verify " + P("a.kv"));
  EXPECT_EQ(clean.exit_code, 0) << clean.err;
  EXPECT_EQ(clean.err, "");
  auto info = nlohmann::json::parse(Kvfile("info --json " + P("a.kv")).out);
  EXPECT_EQ(info["tokens"], 32);
  EXPECT_EQ(info["committed_data_missing"], false);
  EXPECT_EQ(Kvfile("info " + P("a.kv")).out.find("missing"), std::string::npos);
  // The prefix holds the original's bytes: the chunks are untouched.
  EXPECT_EQ(ReadFile(P("a.kv")).substr(12288), healthy.substr(12288, prefix_end - 12288));
}

TEST_F(CliTest, VerifySnapshotDirectoryReportsExactlyTheDamagedFile) {
  fs::create_directories(P("snap/sub"));
  for (int i = 0; i < 12; ++i) {
    std::string f = P("snap/" + std::string(i % 2 ? "sub/" : "") + "doc" + std::to_string(i) + ".kv");
    ASSERT_EQ(Kvfile("synth " + f + " --preset tiny --tokens " + std::to_string(5 + i) + " --seed " + std::to_string(i)).exit_code, 0);
  }
  std::ofstream(P("snap/readme.txt")) << "not a kv file";
  FlipBit(P("snap/sub/doc7.kv"), 12288 + 130, 0);
  CliRun r = Kvfile("verify --jobs 2 " + P("snap"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("doc7.kv"), std::string::npos) << r.err;
  // One line per file (the damaged one too) and the summary.
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 13) << r.out;
  EXPECT_NE(r.out.find("1 of 12 files damaged\n"), std::string::npos) << r.out;
  auto j = nlohmann::json::parse(Kvfile("verify --json --jobs 2 " + P("snap")).out);
  ASSERT_EQ(j.size(), 12u);
  int bad = 0;
  for (const auto& e : j)
    if (!e["ok"].get<bool>()) {
      ++bad;
      EXPECT_NE(e["path"].get<std::string>().find("doc7.kv"), std::string::npos);
    }
  EXPECT_EQ(bad, 1);
}

// On a terminal (a pseudo-terminal from script(1)) work over a second draws
// a progress bar on stderr, erased before the result; --quiet turns it off.
TEST_F(CliTest, ProgressBarOnlyOnATerminal) {
  if (std::system("command -v script >/dev/null 2>&1") != 0) GTEST_SKIP() << "script(1) is not installed";
  std::string cmd = std::string(KVFILE_BINARY) + " synth " + P("p.kv") + " --tokens 12000 --force";
  std::string log = P("typescript");
  ASSERT_EQ(std::system(("script -qec '" + cmd + "' " + log + " >/dev/null 2>&1").c_str()), 0);
  std::string shown = ReadFile(log);
  EXPECT_NE(shown.find("\rsynth " + P("p.kv") + " ["), std::string::npos) << shown;
  EXPECT_NE(shown.find("\r\033[Kwrote "), std::string::npos) << "the bar is erased before the result";
  ASSERT_EQ(std::system(("script -qec '" + std::string(KVFILE_BINARY) + " -q synth " + P("p.kv") +
                         " --tokens 12000 --force' " + log + " >/dev/null 2>&1").c_str()), 0);
  EXPECT_EQ(ReadFile(log).find("\rsynth "), std::string::npos) << "--quiet draws nothing";
}

TEST_F(CliTest, VersionAndHelp) {
  CliRun v = Kvfile("--version");
  EXPECT_EQ(v.exit_code, 0);
  EXPECT_EQ(v.out.rfind("kvfile ", 0), 0u);
  CliRun h = Kvfile("synth --help");
  EXPECT_EQ(h.exit_code, 0);
  EXPECT_NE(h.out.find("Example: kvfile synth"), std::string::npos);
}

}  // namespace
