// SPDX-License-Identifier: Apache-2.0
// Names (issue 27, class 6), run as a user runs them: every writing verb
// on a destination whose name is 250 and 255 bytes long (its temporary
// names must still fit NAME_MAX), and pack member names that cannot all be
// unpacked.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "support/cli_run.h"
#include "support/scratch_dir.h"

namespace {

namespace fs = std::filesystem;
using kvfile::testing::CliRun;
using kvfile::testing::Kvfile;

class CliNamesTest : public kvfile::testing::ScratchDirTest {
 protected:
  // Runs with DIR as the working directory, so that the long names are the
  // whole paths and messages stay readable.
  CliRun Here(const std::string& args) { return Kvfile(args, "cd " + dir_.string() + " &&"); }
  void Ok(const std::string& args) {
    CliRun r = Here(args);
    EXPECT_EQ(r.exit_code, 0) << args.substr(0, 60) << "...: " << r.err;
    EXPECT_EQ(r.err, "") << args.substr(0, 60);
  }
  // The token count `info` shows for `name`.
  int Tokens(const std::string& name) {
    CliRun r = Here("info --json " + name);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? nlohmann::json::parse(r.out)["tokens"].get<int>() : -1;
  }
  // The names in `dir` (the scratch directory by default).
  std::set<std::string> Names(const std::string& sub = "") const {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(sub.empty() ? dir_ : dir_ / sub)) out.insert(e.path().filename());
    return out;
  }
};

// A name of exactly `len` bytes ending in `ext`.
std::string NameOf(size_t len, char fill, const std::string& ext) { return std::string(len - ext.size(), fill) + ext; }

TEST_F(CliNamesTest, EveryWritingVerbWorksOnAName250And255BytesLong) {
  for (size_t len : {size_t{250}, size_t{255}}) {
    SCOPED_TRACE(len);
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "in");
    const std::string a = NameOf(len, 'a', ".kv"), b = NameOf(len, 'b', ".kv"), c = NameOf(len, 'c', ".kv");
    const std::string st = NameOf(len, 's', ".safetensors"), v1 = NameOf(len, 'v', ".kv");
    const std::string pk = NameOf(len, 'p', ".kvpack"), mc = NameOf(len, 'm', "");
    // synth: new, then replacing it.
    Ok("synth " + a + " --preset tiny --tokens 100 --seed 1 --chunk-tokens 64");
    Ok("synth " + a + " --preset tiny --tokens 100 --seed 1 --chunk-tokens 64 --force");
    // convert: .kv -> .safetensors, .safetensors -> .kv, .kv -> v1 .kv,
    // .kv -> a Mooncake directory.
    Ok("convert " + a + " " + st + " --dtype f32");
    Ok("convert " + st + " " + b);
    Ok("convert " + a + " " + v1 + " --format v1");
    Ok("convert " + a + " " + mc + " --format mooncake");
    Ok("convert " + a + " " + mc + " --format mooncake --force");
    // append: to an existing file, to a new one, to a v1 file (which it
    // upgrades through a temporary file first).
    Ok("append " + a + " " + st);
    Ok("append " + c + " " + st);
    CliRun up = Here("append " + v1 + " " + st);
    EXPECT_EQ(up.exit_code, 0) << up.err;
    EXPECT_EQ(up.err, "kvfile: note: " + v1 + ": upgraded from format 1.0 (k bf16, v bf16) to format 2 (k e4m3, v e4m3)\n");
    // rewind and repair, in place.
    Ok("rewind " + a + " --to 150");
    Ok("repair " + a);
    // pack, unpack, index and find of a directory holding the long name.
    fs::copy_file(dir_ / b, dir_ / "in" / b);
    Ok("pack in -o " + pk);
    Ok("unpack " + pk + " -o out");
    EXPECT_EQ(Tokens("out/" + b), 100);
    Ok("index in");
    // find writes the index again (removed here) and finds the long name.
    fs::remove(dir_ / "in" / ".kvfile-index");
    auto tokens = nlohmann::json::parse(Here("dump --tokens --json " + b).out)["tokens"];
    std::string query;
    for (int t = 0; t < 10; ++t) query += std::to_string(tokens[t].get<uint32_t>()) + " ";
    std::ofstream(P("q.txt")) << query;
    CliRun f = Here("find in --tokens q.txt");
    EXPECT_EQ(f.exit_code, 0) << f.err;
    EXPECT_TRUE(f.out.starts_with("in/" + b + ": 10 of 10 tokens match")) << f.out.substr(0, 80);
    // Everything is where it should be; no temporary file is left.
    EXPECT_EQ(Names(), (std::set<std::string>{a, b, c, st, v1, pk, mc, "in", "out", "q.txt"}));
    EXPECT_EQ(Names("in"), (std::set<std::string>{b, ".kvfile-index"}));
    EXPECT_EQ(Names("out"), (std::set<std::string>{b}));
    EXPECT_EQ(Tokens(a), 150);
    EXPECT_EQ(Tokens(b), 100);
    EXPECT_EQ(Tokens(c), 100);
    EXPECT_EQ(Tokens(v1), 200);
  }
}

// Members "a.kv" (a file) and "a.kv/b.kv" (under a directory "a.kv")
// cannot both be unpacked: pack refuses them, leaving no pack and no
// temporary file.
TEST_F(CliNamesTest, PackRefusesAFileThatIsAlsoADirectoryOfAnotherMember) {
  fs::create_directories(P("tree/a.kv"));
  ASSERT_EQ(Here("synth a.kv --preset tiny --tokens 20 --seed 1").exit_code, 0);
  ASSERT_EQ(Here("synth tree/a.kv/b.kv --preset tiny --tokens 20 --seed 2").exit_code, 0);
  ASSERT_EQ(Here("synth tree/a.kv-c.kv --preset tiny --tokens 20 --seed 3").exit_code, 0);
  CliRun r = Here("pack a.kv tree -o x.kvpack");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: x.kvpack: member 'a.kv' is a file and also the directory of member 'a.kv/b.kv'; "
                   "not written\n");
  EXPECT_EQ(Names(), (std::set<std::string>{"a.kv", "tree"}));
}

// The walk of a directory meets an unreadable subdirectory and an
// unreadable file. Root reads anything, so the kvfile child runs without
// CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (setpriv drops them from its
// bounding and inheritable sets): mode 000 then stops it as it stops a user.
TEST_F(CliNamesTest, UnreadableSubdirectoryIsTreatedAsAnUnreadableFileAndNamed) {
  if (std::system("setpriv --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no setpriv";
  const std::string drop =
      "cd " + dir_.string() +
      " && setpriv --bounding-set -dac_override,-dac_read_search --inh-caps -dac_override,-dac_read_search";
  auto run = [&](const std::string& args) { return Kvfile(args, drop); };
  fs::create_directories(P("in/sub"));
  ASSERT_EQ(Here("synth in/a.kv --preset tiny --tokens 20 --seed 1").exit_code, 0);
  ASSERT_EQ(Here("synth in/sub/b.kv --preset tiny --tokens 20 --seed 2").exit_code, 0);
  fs::permissions(P("in/sub"), fs::perms::none);
  ASSERT_NE(run("info in/sub/b.kv").exit_code, 0) << "the child still reads a mode 000 directory";
  // verify: the subdirectory fails as a file would, the rest is checked.
  CliRun r = run("verify in");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("in/a.kv: ok: 20 tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("in/sub: FAILED: in/sub: open directory: Permission denied\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.err, "kvfile: error: 1 of 2 files failed; first: in/sub: open directory: Permission denied\n");
  // pack and convert: refused before writing, naming the subdirectory.
  for (const auto& [args, output] : {std::pair<std::string, std::string>{"pack in -o x.kvpack", "x.kvpack"},
                                     std::pair<std::string, std::string>{"convert in out", "out"}}) {
    r = run(args);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_EQ(r.err, "kvfile: error: in/sub: open directory: Permission denied\n") << args;
    EXPECT_FALSE(fs::exists(P(output))) << args;
  }
  // index: left out with the warning that names it, the rest indexed.
  r = run("index in");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "kvfile: warning: in: 1 unreadable .kv file(s) or directories left out of the index (first: "
                   "in/sub: open directory: Permission denied)\n");
  EXPECT_EQ(r.out, "in/.kvfile-index: 1 files indexed (1 read, 0 unchanged)\n");
  fs::permissions(P("in/sub"), fs::perms::owner_all);
  // An unreadable file next to it: the same treatment, by its own path.
  fs::permissions(P("in/a.kv"), fs::perms::none);
  r = run("pack in -o x.kvpack");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(r.err.starts_with("kvfile: error: in/a.kv: ")) << r.err;
  EXPECT_NE(r.err.find("Permission denied"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(P("x.kvpack")));
  fs::permissions(P("in/a.kv"), fs::perms::owner_read | fs::perms::owner_write);
}

}  // namespace
