// SPDX-License-Identifier: Apache-2.0
// `kvfile bench` on a small session: it runs every path, prints its table
// and a JSON document with every row, and fails cleanly on bad arguments.
// Timings are not asserted (CI machines are noisy); shapes and sanity are.
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/cli_run.h"

namespace kvfile::testing {
namespace {

// Every path the performance table of docs/performance.md lists.
const std::set<std::string> kPaths = {
    "limit: memcpy",
    "codec: encode bf16->e4m3 (scalar)",
    "codec: decode e4m3->bf16 (scalar)",
    "codec: encode bf16->nvfp4 (scalar)",
    "codec: decode nvfp4->bf16 (scalar)",
    "limit: raw write + fdatasync",
    "append (durable at close)",
    "instead: raw bf16 write + fdatasync",
    "append vs raw bf16 write",
    "limit: raw read, hot",
    "instead: raw bf16 read, hot",
    "resume whole session, hot",
    "resume layer by layer, hot",
    "verify",
    "kvfile verify FILE (command)",
    "limit: copy of the bf16 KV + fsync (cp)",
    "kvfile convert FILE OUT.safetensors (bf16)",
    "limit: dd of the safetensors, fsync",
    "kvfile convert (import), durable",
    "limit: cp of the bf16 KV into tmpfs",
    "kvfile convert (export) into tmpfs",
    "limit: raw read, cold",
    "instead: raw bf16 read, cold",
    "resume whole session, cold",
    "limit: raw copy + fdatasync",
    "upgrade v1 -> v2 (open)",
    "open, 300 chunks",
    "open, the session file",
};

std::string ScratchDir(const char* name) {
  auto dir = std::filesystem::path(::testing::TempDir()) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

TEST(BenchSmoke, JsonHasEveryPathWithSaneFigures) {
  std::string dir = ScratchDir("kvfile_bench_json");
  // The bench names its /dev/shm files after its pid; the shell records the
  // pid before it execs kvfile, so that the check below looks at this run's
  // files only (the table test's bench may be running beside it).
  std::string pid_path = dir + ".pid";
  CliRun r = Kvfile("bench --preset tiny --tokens 700 --reps 1 --open-chunks 300 --json --dir " + dir,
                    "sh -c 'echo $$ > " + pid_path + "; exec \"$0\" \"$@\"'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string bench_pid;
  std::ifstream(pid_path) >> bench_pid;
  ASSERT_FALSE(bench_pid.empty());
  nlohmann::json doc = nlohmann::json::parse(r.out);
  EXPECT_EQ(doc["config"]["preset"], "tiny");
  EXPECT_EQ(doc["config"]["tokens"], 700);
  EXPECT_GT(doc["config"]["kv_file_bytes"].get<double>(), 0);
  std::set<std::string> seen;
  for (const auto& row : doc["rows"]) {
    std::string path = row["path"];
    seen.insert(path);
    EXPECT_GT(row["bytes"].get<double>(), 0) << path;
    double median = row["seconds"]["median"];
    EXPECT_GT(median, 0) << path;
    EXPECT_LE(row["seconds"]["min"].get<double>(), median) << path;
    EXPECT_GE(row["seconds"]["max"].get<double>(), median) << path;
    if (row.contains("ratio")) {
      EXPECT_GT(row["ratio"]["value"].get<double>(), 0) << path;
      EXPECT_TRUE(row["ratio"]["vs"].is_string()) << path;
    }
    if (row.contains("target")) {
      EXPECT_TRUE(row["target"]["met"].is_boolean()) << path;
    }
  }
  for (const std::string& p : kPaths) EXPECT_TRUE(seen.count(p)) << "missing row: " << p;
  // The files it wrote are gone, in --dir and in /dev/shm.
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
    EXPECT_FALSE(e.path().filename().string().starts_with("kvbench-" + bench_pid + "-")) << e.path();
}

TEST(BenchSmoke, TablePrintsEveryPath) {
  std::string dir = ScratchDir("kvfile_bench_table");
  CliRun r = Kvfile("bench --preset tiny --tokens 300 --reps 1 --open-chunks 300 --dir " + dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("ratio"), std::string::npos);
  for (const std::string& p : kPaths) EXPECT_NE(r.out.find(p), std::string::npos) << p;
}

TEST(BenchSmoke, BadArgumentsFailWithOneLine) {
  CliRun r = Kvfile("bench --preset no-such-model --tokens 10 --dir " + ::testing::TempDir());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no-such-model"), std::string::npos) << r.err;
  r = Kvfile("bench --dir /nonexistent/kvfile-bench");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("not a directory"), std::string::npos) << r.err;
  r = Kvfile("bench --reps 0 --dir " + ::testing::TempDir());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--reps"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace kvfile::testing
