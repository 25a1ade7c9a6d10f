// SPDX-License-Identifier: Apache-2.0
// The object store the S3 tests run against (tests/support/swift_store.h,
// OpenStack Swift with s3api): it starts, answers S3 requests with the
// credentials it states, creates buckets, and leaves nothing behind, also
// when the harness itself is killed.
#include "support/swift_store.h"

#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "support/file_util.h"
#include "support/scratch_dir.h"

namespace kvfile::testing {
namespace {

class SwiftStoreTest : public ScratchDirTest {};

// The HTTP status of `curl ARGS` (curl's own --aws-sigv4 signing: a client
// independent of kvfile's).
int CurlStatus(const std::string& args) {
  std::string cmd = "curl -s -o /dev/null -w '%{http_code}' " + args;
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) return -1;
  char buf[16] = {};
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  ::pclose(f);
  return n ? std::stoi(std::string(buf, n)) : -1;
}

// Running: there and not a zombie (one whose parent died waits for init).
bool Alive(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

TEST_F(SwiftStoreTest, AnswersSignedRequestsAndStopsLeavingNothing) {
  SwiftStore store(dir_);
  ASSERT_TRUE(store.ok());
  std::printf("swift harness ready in %.2f s\n", store.ready_seconds());
  EXPECT_EQ(store.access_key(), "test:tester");
  EXPECT_EQ(store.secret_key(), "testing");
  ASSERT_TRUE(store.CreateBucket("kvtest"));
  const std::string sign = store.CurlArgs() + " ";
  const std::string url = store.endpoint() + "/kvtest/a/b.bin";
  WriteFile(P("b.bin"), std::string(100000, 'x'));
  EXPECT_EQ(CurlStatus(sign + "-T " + P("b.bin") + " " + url), 200);
  EXPECT_EQ(CurlStatus(sign + "-r 10-19 " + url), 206);
  // Counted at the store: the PUT and the ranged GET above (not the
  // harness's own bucket creation).
  EXPECT_EQ(store.Requests(), (std::map<std::string, long>{{"GET", 1}, {"PUT", 1}, {"total", 2}}));
  // A wrong secret, a bucket that is not there.
  WriteFile(P("wrong.netrc"), "machine 127.0.0.1\nlogin test:tester\npassword wrong\n");
  EXPECT_EQ(CurlStatus("--aws-sigv4 aws:amz:us-east-1:s3 --netrc-file " + P("wrong.netrc") +
                       " -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' " + url), 403);
  EXPECT_EQ(CurlStatus(sign + store.endpoint() + "/nobucket/k"), 404);
  pid_t proxy = store.proxy_pid();
  EXPECT_TRUE(Alive(proxy));
  const std::string harness_dir = store.dir();
  EXPECT_EQ(harness_dir.rfind(dir_.string() + "/kvfile-swift-", 0), 0u) << harness_dir;
  EXPECT_TRUE(std::filesystem::is_directory(harness_dir + "/srv/d0"));
  store.Stop();
  EXPECT_FALSE(Alive(proxy));
  EXPECT_FALSE(std::filesystem::exists(harness_dir));
}

TEST_F(SwiftStoreTest, KilledHarnessTakesItsServersWithIt) {
  SwiftStore store(dir_);
  ASSERT_TRUE(store.ok());
  pid_t proxy = store.proxy_pid();
  ASSERT_TRUE(Alive(proxy));
  ASSERT_EQ(::kill(store.harness_pid(), SIGKILL), 0);
  // PR_SET_PDEATHSIG: the proxy (not a child of this process) goes too.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (Alive(proxy) && std::chrono::steady_clock::now() < deadline) ::usleep(10000);
  EXPECT_FALSE(Alive(proxy));
  EXPECT_EQ(CurlStatus(store.endpoint() + "/"), 0);  // connection refused
}

}  // namespace
}  // namespace kvfile::testing
