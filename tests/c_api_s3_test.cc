// SPDX-License-Identifier: Apache-2.0
// The C API on s3:// paths, against a real store (tests/support/swift_store.h):
// a .kv uploaded by another client (curl, SigV4) read and verified, a pack
// written by kvfile_pack_files to a key (multipart upload) and read back
// through kvfile_pack_open, prefix lookup in it, and the errors of a
// missing key and an existing one.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kvfile/c.h"
#include "kvfile/file.h"
#include "support/file_util.h"
#include "support/scratch_dir.h"
#include "support/swift_store.h"
#include "support/tiny_kv.h"

namespace kvfile::testing {
namespace {

// One store for the suite: the library reads the AWS variables once per
// process.
class CApiS3Test : public ScratchDirTest {
 protected:
  static void SetUpTestSuite() {
    if (!SwiftStore::Installed()) return;
    root_ = new std::filesystem::path(std::filesystem::path(::testing::TempDir()) /
                                      ("kvfile_CApiS3Test_" + std::to_string(::getpid())));
    std::filesystem::create_directories(*root_);
    store_ = new SwiftStore(*root_);
    if (store_->ok() && store_->CreateBucket("kvtest")) store_->ExportEnvironment();
  }
  static void TearDownTestSuite() {
    delete store_;
    store_ = nullptr;
    if (root_) std::filesystem::remove_all(*root_);
    delete root_;
    root_ = nullptr;
  }
  void SetUp() override {
    if (!SwiftStore::Installed()) GTEST_SKIP() << "OpenStack Swift (python3-swift) is not installed: no object store to test against";
    ScratchDirTest::SetUp();
    ASSERT_TRUE(store_->ok());
  }
  // The token ids of the .kv file `path`, through the C API.
  static std::vector<uint32_t> Tokens(const std::string& path) {
    kvfile_reader* r = nullptr;
    if (kvfile_reader_open(path.c_str(), &r) != KVFILE_OK) return {};
    std::vector<uint32_t> ids(64);
    size_t n = 0;
    kvfile_status st = kvfile_reader_tokens(r, ids.data(), ids.size(), &n);
    kvfile_reader_close(r);
    if (st != KVFILE_OK) return {};
    ids.resize(n);
    return ids;
  }
  // curl ARGS, signed for the store (its own SigV4 signing); the HTTP status.
  static int Curl(const std::string& args) {
    std::string cmd = "curl -s -w '%{http_code}' " + store_->CurlArgs() + " " + args;
    FILE* f = ::popen(cmd.c_str(), "r");
    char buf[8] = {};
    size_t n = f ? std::fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) ::pclose(f);
    return n ? std::stoi(std::string(buf, n)) : -1;
  }
  static std::filesystem::path* root_;
  static SwiftStore* store_;
};
std::filesystem::path* CApiS3Test::root_ = nullptr;
SwiftStore* CApiS3Test::store_ = nullptr;

TEST_F(CApiS3Test, ReadsAndVerifiesAnObjectAnotherClientUploaded) {
  WriteTinyKv(P("a.kv"), {5, 6, 7, 8, 9}, ModelIdentity{"org/m", 0x11});
  ASSERT_EQ(Curl("-o /dev/null -T " + P("a.kv") + " " + store_->endpoint() + "/kvtest/dir/a.kv"), 200);
  kvfile_reader* r = nullptr;
  ASSERT_EQ(kvfile_reader_open("s3://kvtest/dir/a.kv", &r), KVFILE_OK) << kvfile_last_error();
  uint64_t n = 0;
  ASSERT_EQ(kvfile_reader_token_count(r, &n), KVFILE_OK);
  EXPECT_EQ(n, 5u);
  kvfile_reader_close(r);
  EXPECT_EQ(Tokens("s3://kvtest/dir/a.kv"), (std::vector<uint32_t>{5, 6, 7, 8, 9}));
  kvfile_verify_result v;
  ASSERT_EQ(kvfile_verify("s3://kvtest/dir/a.kv", 0, &v), KVFILE_OK) << kvfile_last_error();
  EXPECT_EQ(v.ok, 1);
  EXPECT_EQ(v.tokens, 5u);
  EXPECT_EQ(v.bytes, std::filesystem::file_size(P("a.kv")));
  ASSERT_EQ(kvfile_reader_open("s3://kvtest/dir/nosuch.kv", &r), KVFILE_NOT_FOUND);
  EXPECT_EQ(r, nullptr);
  EXPECT_NE(std::string(kvfile_last_error()).find("s3://kvtest/dir/nosuch.kv"), std::string::npos)
      << kvfile_last_error();
}

// An object replaced by another client is another file: the id of an open
// object, of its path, and of a later open follow the object's version
// (its ETag), as a local file's device and inode follow its replacement.
// A parallel read compares its worker files' ids with the first open's.
TEST_F(CApiS3Test, AnObjectReplacedByAnotherClientIsAnotherFile) {
  WriteTinyKv(P("a.kv"), {5, 6, 7}, ModelIdentity{"org/m", 0x11});
  WriteTinyKv(P("b.kv"), {5, 6, 7, 8}, ModelIdentity{"org/m", 0x11});
  const std::string url = store_->endpoint() + "/kvtest/id/x.kv";
  ASSERT_EQ(Curl("-o /dev/null -T " + P("a.kv") + " " + url), 200);
  FileSystem* fs = FileSystem::Default();
  std::unique_ptr<File> first;
  ASSERT_TRUE(fs->Open("s3://kvtest/id/x.kv", OpenMode::kRead, &first).ok());
  FileId opened, named;
  ASSERT_TRUE(first->Id(&opened).ok());
  ASSERT_TRUE(fs->PathId("s3://kvtest/id/x.kv", &named).ok());
  EXPECT_EQ(opened, named);
  ASSERT_EQ(Curl("-o /dev/null -T " + P("b.kv") + " " + url), 200);
  FileId renamed, reopened;
  ASSERT_TRUE(fs->PathId("s3://kvtest/id/x.kv", &renamed).ok());
  EXPECT_FALSE(renamed == opened);
  std::unique_ptr<File> second;
  ASSERT_TRUE(fs->Open("s3://kvtest/id/x.kv", OpenMode::kRead, &second).ok());
  ASSERT_TRUE(second->Id(&reopened).ok());
  EXPECT_EQ(reopened, renamed);
  EXPECT_EQ(fs->PathId("s3://kvtest/id/nosuch.kv", &named).code(), Status::Code::kNotFound);
}

TEST_F(CApiS3Test, PacksToAKeyAndReadsThePackBack) {
  WriteTinyKv(P("a.kv"), {1, 2, 3}, ModelIdentity{"org/m", 0x11});
  WriteTinyKv(P("b.kv"), {1, 2, 4, 5}, ModelIdentity{"org/m", 0x11});
  const std::string a = P("a.kv"), b = P("b.kv");
  const char* paths[2] = {a.c_str(), b.c_str()};
  const char* names[2] = {"a.kv", "sub/b.kv"};
  ASSERT_EQ(kvfile_pack_files("s3://kvtest/p/c.kvpack", paths, names, 2, 4), KVFILE_OK) << kvfile_last_error();
  // The object as another client (curl) downloads it: a whole, valid pack.
  ASSERT_EQ(Curl("-o " + P("dl.kvpack") + " " + store_->endpoint() + "/kvtest/p/c.kvpack"), 200);
  kvfile_verify_result v;
  kvfile_pack* pack = nullptr;
  ASSERT_EQ(kvfile_pack_open("s3://kvtest/p/c.kvpack", &pack), KVFILE_OK) << kvfile_last_error();
  size_t count = 0, index = 0;
  ASSERT_EQ(kvfile_pack_member_count(pack, &count), KVFILE_OK);
  EXPECT_EQ(count, 2u);
  ASSERT_EQ(kvfile_pack_find(pack, "sub/b.kv", &index), KVFILE_OK);
  ASSERT_EQ(kvfile_pack_verify(pack), KVFILE_OK) << kvfile_last_error();
  ASSERT_EQ(kvfile_pack_materialize(pack, index, P("b_out.kv").c_str()), KVFILE_OK) << kvfile_last_error();
  kvfile_pack_close(pack);
  // Read remotely or from the downloaded copy, the member holds the same
  // tokens (its bytes differ: each materialised file gets its own salt).
  kvfile_pack* local = nullptr;
  ASSERT_EQ(kvfile_pack_open(P("dl.kvpack").c_str(), &local), KVFILE_OK) << kvfile_last_error();
  ASSERT_EQ(kvfile_pack_verify(local), KVFILE_OK) << kvfile_last_error();
  ASSERT_EQ(kvfile_pack_materialize(local, index, P("b_local.kv").c_str()), KVFILE_OK);
  kvfile_pack_close(local);
  EXPECT_EQ(Tokens(P("b_out.kv")), (std::vector<uint32_t>{1, 2, 4, 5}));
  EXPECT_EQ(Tokens(P("b_local.kv")), (std::vector<uint32_t>{1, 2, 4, 5}));
  ASSERT_EQ(kvfile_verify(P("b_out.kv").c_str(), 0, &v), KVFILE_OK);
  EXPECT_EQ(v.ok, 1);
  EXPECT_EQ(v.tokens, 4u);

  kvfile_prefix_match m;
  const uint32_t query[3] = {1, 2, 4};
  ASSERT_EQ(kvfile_find_prefix("s3://kvtest/p/c.kvpack", query, 3, nullptr, &m), KVFILE_OK) << kvfile_last_error();
  EXPECT_EQ(m.found, 1);
  EXPECT_STREQ(m.path, "sub/b.kv");
  EXPECT_EQ(m.matched, 3u);
  EXPECT_EQ(m.tokens, 4u);

  // An existing key is refused, as an existing file is; the object stays.
  ASSERT_EQ(kvfile_pack_files("s3://kvtest/p/c.kvpack", paths, names, 1, 4), KVFILE_INVALID_ARGUMENT);
  ASSERT_EQ(kvfile_pack_open("s3://kvtest/p/c.kvpack", &pack), KVFILE_OK);
  ASSERT_EQ(kvfile_pack_member_count(pack, &count), KVFILE_OK);
  EXPECT_EQ(count, 2u);
  kvfile_pack_close(pack);
}

}  // namespace
}  // namespace kvfile::testing
