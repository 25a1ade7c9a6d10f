// SPDX-License-Identifier: Apache-2.0
// Every kvfile command on damaged files: info, dump, verify, convert (to
// .kv and to .safetensors, and back from a damaged .safetensors) and
// repair either succeed or fail with one "kvfile: error:" line and exit
// status 1 (the data) or 2 (the environment); none crashes. What they
// produce from a damaged file passes `kvfile verify`.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/cli_run.h"
#include "support/file_util.h"
#include "support/scratch_dir.h"
#include "support/sweep_fixtures.h"

namespace kvfile {
namespace {

namespace fs = std::filesystem;
using testing::CliRun;
using testing::Kvfile;
using testing::SweepFixture;
using testing::WriteFile;

class CliDamageTest : public testing::ScratchDirTest {
 protected:
  // Runs `args` and checks the exit status and the error line; returns the run.
  CliRun Run(const std::string& args) {
    CliRun r = Kvfile(args);
    EXPECT_TRUE(r.exit_code == 0 || r.exit_code == 1 || r.exit_code == 2)
        << "kvfile " << args << " exited with " << r.exit_code << " (killed by a signal?)\n" << r.err;
    if (r.exit_code != 0) {
      EXPECT_EQ(r.err.rfind("kvfile: error: ", 0), 0u) << "kvfile " << args << ":\n" << r.err;
    }
    return r;
  }
};

// Damaged copies of a fixture: what the commands are run on.
std::vector<std::pair<std::string, std::vector<uint8_t>>> Damaged(const SweepFixture& f) {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> out;
  auto with = [&](const std::string& name, auto edit) {
    std::vector<uint8_t> b = f.bytes;
    edit(b);
    out.emplace_back(name, std::move(b));
  };
  const auto& last = f.chunks.back();
  with("cut-mid-chunk", [&](auto& b) { b.resize(last.begin + 100); });
  with("cut-in-header", [&](auto& b) { b.resize(5000); });
  with("payload-bit", [&](auto& b) { b[last.sections[0].first + 3] ^= 0x04; });
  with("head-bit", [&](auto& b) { b[last.begin + 70] ^= 0x80; });
  with("header-bit", [&](auto& b) { b[60] ^= 0x01; });
  with("slot-bit", [&](auto& b) { b[8192 + 40] ^= 0x01; });
  with("zero-block", [&](auto& b) { std::fill(b.begin() + 12288, b.begin() + 16384, 0); });
  with("garbage-tail", [&](auto& b) {
    testing::SplitMix rng(9);
    for (int i = 0; i < 5000; ++i) b.push_back(static_cast<uint8_t>(rng.Next()));
  });
  return out;
}

TEST_F(CliDamageTest, NoCommandCrashesOnDamagedFiles) {
  size_t runs = 0;
  for (bool committed : {true, false}) {
    const SweepFixture& f = testing::SweepFixtures(committed)[1];  // several chunks, v2
    for (const auto& [name, bytes] : Damaged(f)) {
      SCOPED_TRACE(f.name + " " + name);
      std::string in = P(name + ".kv");
      WriteFile(in, bytes);
      Run("info " + in);
      Run("dump " + in);
      Run("dump --tokens --rows --layer 0 --stream k " + in);
      Run("verify " + in);
      CliRun to_kv = Run("convert " + in + " " + P(name + "-out.kv"));
      if (to_kv.exit_code == 0) {
        EXPECT_EQ(Run("verify --strict " + P(name + "-out.kv")).exit_code, 0);
      }
      Run("convert " + in + " " + P(name + "-out.safetensors"));
      Run("repair --dry-run " + in);
      Run("repair " + in);
      Run("repair --force " + in);
      Run("verify " + in);
      runs += 11;
    }
  }
  std::printf("%zu kvfile runs on damaged files\n", runs);
}

// The safetensors importer: a valid export, then damaged copies of it.
TEST_F(CliDamageTest, ImportOfDamagedSafetensors) {
  const SweepFixture& f = testing::SweepFixtures(true)[1];
  std::string kv = P("good.kv");
  WriteFile(kv, f.bytes);
  ASSERT_EQ(Run("convert " + kv + " " + P("good.safetensors")).exit_code, 0);
  std::string text = testing::ReadFile(P("good.safetensors"));
  std::vector<uint8_t> st(text.begin(), text.end());
  ASSERT_GT(st.size(), 64u);
  std::vector<std::pair<std::string, std::vector<uint8_t>>> cases;
  cases.emplace_back("cut-in-length", std::vector<uint8_t>(st.begin(), st.begin() + 5));
  cases.emplace_back("cut-in-header", std::vector<uint8_t>(st.begin(), st.begin() + 40));
  cases.emplace_back("cut-in-data", std::vector<uint8_t>(st.begin(), st.end() - 7));
  for (uint64_t length : {uint64_t{1} << 63, uint64_t{st.size()} - 7, uint64_t{0}}) {
    std::vector<uint8_t> b = st;
    for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(length >> (8 * i));
    cases.emplace_back("length-" + std::to_string(length), b);
  }
  testing::SplitMix rng(11);
  for (int n = 0; n < 6; ++n) {
    std::vector<uint8_t> b = st;
    uint64_t at = 8 + rng.Below(b.size() - 8);
    for (uint64_t i = at; i < at + 1 + rng.Below(16) && i < b.size(); ++i) b[i] = static_cast<uint8_t>(rng.Next());
    cases.emplace_back("garbage-" + std::to_string(n), b);
  }
  for (const auto& [name, bytes] : cases) {
    SCOPED_TRACE(name);
    std::string in = P(name + ".safetensors");
    WriteFile(in, bytes);
    CliRun r = Run("convert " + in + " " + P(name + ".kv"));
    if (r.exit_code == 0) {
      EXPECT_EQ(Run("verify --strict " + P(name + ".kv")).exit_code, 0);
    }
  }
}

}  // namespace
}  // namespace kvfile
