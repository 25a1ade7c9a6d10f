// SPDX-License-Identifier: Apache-2.0
// `kvfile verify|info|dump --json` print one valid JSON document whatever
// the input: file names with quotes, backslashes, newlines and invalid
// UTF-8, files of garbage, truncated and damaged files, and a model id of
// invalid UTF-8 inside a valid file. Every output is parsed with
// nlohmann::json; verify's findings carry the chunk index, the file offset
// and the message, in text and in JSON.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kvfile/presets.h"
#include "kvfile/writer.h"
#include "support/cli_run.h"
#include "support/file_util.h"
#include "support/scratch_dir.h"
#include "support/sweep_fixtures.h"
#include "support/testing_hooks.h"

namespace kvfile {
namespace {

namespace fs = std::filesystem;
using testing::Kvfile;
using testing::ShellQuote;
using testing::WriteFile;

class CliJsonTest : public testing::ScratchDirTest {
 protected:
  // A file name built to break naive JSON output.
  std::string Hostile(const std::string& tag) const {
    return (dir_ / ("q\"uo'te \\back\nnew\tline \xff\xfe bad-utf8 " + tag + ".kv")).string();
  }
  // Runs `kvfile VERB --json PATH`, parses stdout and returns the document.
  nlohmann::json RunJson(const std::string& verb, const std::string& path, int* exit_code = nullptr) {
    testing::CliRun r = Kvfile(verb + " --json " + ShellQuote(path));
    if (exit_code) *exit_code = r.exit_code;
    EXPECT_NE(r.exit_code, -1) << verb << " crashed: " << r.err;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(r.out);
    } catch (const std::exception& e) {
      ADD_FAILURE() << verb << " --json printed invalid JSON (" << e.what() << "):\n" << r.out << "\nstderr: " << r.err;
    }
    return j;
  }
};

std::vector<uint8_t> Garbage(size_t n, uint64_t seed) {
  testing::SplitMix rng(seed);
  std::vector<uint8_t> b(n);
  for (uint8_t& x : b) x = static_cast<uint8_t>(rng.Next());
  return b;
}

TEST_F(CliJsonTest, ValidJsonForEveryInput) {
  const testing::SweepFixture& good = testing::SweepFixtures(true)[0];
  std::vector<std::pair<std::string, std::vector<uint8_t>>> inputs = {
      {"empty", {}},
      {"seven bytes", Garbage(7, 1)},
      {"garbage 100", Garbage(100, 2)},
      {"garbage 12288", Garbage(12288, 3)},
      {"garbage 20000", Garbage(20000, 4)},
      {"magic then garbage", [&] {
         std::vector<uint8_t> b = Garbage(16384, 5);
         std::copy(good.bytes.begin(), good.bytes.begin() + 8, b.begin());
         return b;
       }()},
      {"truncated", std::vector<uint8_t>(good.bytes.begin(), good.bytes.end() - 100)},
      {"good", good.bytes},
  };
  for (const auto& [tag, bytes] : inputs) {
    SCOPED_TRACE(tag);
    std::string path = Hostile(tag);
    WriteFile(path, bytes);
    int code = 0;
    nlohmann::json v = RunJson("verify", path, &code);
    ASSERT_TRUE(v.is_array());
    ASSERT_EQ(v.size(), 1u);
    EXPECT_TRUE(v[0]["path"].is_string());
    EXPECT_EQ(v[0]["ok"], tag == "good");
    EXPECT_EQ(code, tag == "good" ? 0 : 1);
    for (const char* verb : {"info", "dump"}) {
      nlohmann::json j = RunJson(verb, path, &code);
      ASSERT_TRUE(j.is_object()) << verb;
      EXPECT_TRUE(j["path"].is_string()) << verb;
      // A file cut inside its committed data shows its whole chunks before
      // the cut, and exits 1 for the loss (issue 33 item 6; it exited 0).
      if (tag == "good" || tag == "truncated") {
        EXPECT_EQ(code, tag == "good" ? 0 : 1) << verb;
        EXPECT_FALSE(j.contains("error")) << verb;
        const nlohmann::json& h = std::string(verb) == "info" ? j : j["header"];
        EXPECT_EQ(h["committed_data_missing"], tag == "truncated") << verb;
      } else {
        EXPECT_EQ(code, 1) << verb;
        EXPECT_EQ(j["ok"], false) << verb;
        EXPECT_TRUE(j["error"].is_string()) << verb;
      }
    }
  }
  // A missing file: an environment error (exit 2), still one document.
  int code = 0;
  nlohmann::json missing = RunJson("info", Hostile("missing"), &code);
  EXPECT_EQ(code, 2);
  EXPECT_EQ(missing["ok"], false);
}

// The model id is UTF-8 by the spec, but a file is input: info and dump
// print a model id of invalid UTF-8 with U+FFFD instead of failing.
TEST_F(CliJsonTest, ModelIdOfInvalidUtf8) {
  std::string path = (dir_ / "model.kv").string();
  Geometry g;
  ASSERT_TRUE(GetPreset("tiny", Dtype::kE4M3, &g).ok());
  std::unique_ptr<Writer> w;
  WriterOptions opt;
  hooks::SetWriterSalt(77);
  ASSERT_TRUE(hooks::CreateWriter(path, g, {"bad\xff\xc0 \"id\"\n", 1}, opt, &w).ok());
  ASSERT_TRUE(w->Close().ok());
  int code = 0;
  nlohmann::json info = RunJson("info", path, &code);
  EXPECT_EQ(code, 0);
  EXPECT_EQ(info["model"], "bad\xEF\xBF\xBD\xEF\xBF\xBD \"id\"\n");
  nlohmann::json dump = RunJson("dump", path, &code);
  EXPECT_EQ(code, 0);
  EXPECT_TRUE(dump["header"].is_object());
}

// Damage before the end: the text names chunk, offset and what failed; the
// JSON carries the same numbers in fields.
TEST_F(CliJsonTest, VerifyLocatesDamageInTextAndJson) {
  const testing::SweepFixture& f = testing::SweepFixtures(true)[1];  // several chunks
  ASSERT_GE(f.chunks.size(), 2u);
  std::vector<uint8_t> bytes = f.bytes;
  const auto& c = f.chunks[1];
  bytes[c.sections[0].first + 1] ^= 0x10;  // payload of chunk 1
  std::string path = Hostile("damaged");
  WriteFile(path, bytes);
  testing::CliRun text = Kvfile("verify " + ShellQuote(path));
  EXPECT_EQ(text.exit_code, 1);
  EXPECT_NE(text.err.find("chunk 1 at offset " + std::to_string(c.begin)), std::string::npos) << text.err;
  EXPECT_NE(text.err.find("payload checksum mismatch"), std::string::npos) << text.err;
  nlohmann::json j = RunJson("verify", path);
  ASSERT_EQ(j[0]["errors"].size(), 1u);
  EXPECT_EQ(j[0]["errors"][0]["chunk"], 1);
  EXPECT_EQ(j[0]["errors"][0]["offset"], c.begin);
  EXPECT_NE(j[0]["errors"][0]["message"].get<std::string>().find("payload checksum mismatch"), std::string::npos);

  // A truncated closed file: the offset is where the file now ends.
  bytes = f.bytes;
  bytes.resize(c.begin + 100);
  WriteFile(path, bytes);
  text = Kvfile("verify " + ShellQuote(path));
  EXPECT_NE(text.err.find("offset " + std::to_string(c.begin + 100)), std::string::npos) << text.err;
  j = RunJson("verify", path);
  EXPECT_EQ(j[0]["errors"][0]["offset"], c.begin + 100);
}

}  // namespace
}  // namespace kvfile
