// SPDX-License-Identifier: Apache-2.0
// s3:// paths through the kvfile command, against a real object store
// (OpenStack Swift with s3api, tests/support/swift_store.h, one store for
// the whole suite): every read verb on remote packs and .kv objects with
// the requests each costs (KVFILE_S3_TRACE), uploads by multipart, and the
// failures: refused credentials, a missing bucket or key, an existing key
// without --force, a store answering 503 or dropping connections (a proxy
// in the test, tests/support/fault_proxy.h), a store stopped under a read
// and an upload, and SIGINT/SIGTERM/SIGKILL during a multipart upload.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "kvfile/file.h"
#include "kvfile/reader.h"
#include "kvfile/verify.h"
#include "s3/s3_client.h"
#include "s3/s3_file_system.h"
#include "support/adversity.h"
#include "support/cli_run.h"
#include "support/fault_proxy.h"
#include "support/file_util.h"
#include "support/forwarding_fs.h"
#include "support/scratch_dir.h"
#include "support/swift_store.h"

namespace kvfile::testing {
namespace {

namespace fs = std::filesystem;
using s3::S3Url;
using kvfile::File;
using kvfile::FileSystem;
using kvfile::OpenMode;
using kvfile::ReadRequest;
using kvfile::Status;

constexpr const char* kBucket = "kvtest";

bool SwiftInstalled() { return fs::exists("/usr/lib/python3/dist-packages/swift/__init__.py"); }

class S3Cli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!SwiftInstalled()) return;
    root_ = new fs::path(fs::temp_directory_path() / ("kvfile_cli_s3_" + std::to_string(::getpid())));
    fs::create_directories(*root_);
    store_ = new SwiftStore(*root_);
    if (!store_->ok() || !store_->CreateBucket(kBucket)) return;
    store_->ExportEnvironment();
    ::setenv("KVFILE_S3_PART_BYTES", std::to_string(5 << 20).c_str(), 1);  // the S3 minimum: more parts
    // The inputs, shared: two sessions sharing their first chunk, and a
    // bigger one for the interrupted uploads (14 parts).
    for (const char* cmd : {"synth a.kv --preset llama-3.1-8b --tokens 512", "synth b.kv --preset llama-3.1-8b --tokens 300",
                            "synth big.kv --preset llama-3.1-8b --tokens 1024"}) {
      CliRun r = Kvfile(std::string(cmd).replace(6, 0, (*root_ / "").string()));
      ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    ready_ = true;
  }
  static void TearDownTestSuite() {
    delete store_;
    store_ = nullptr;
    if (root_) fs::remove_all(*root_);
    delete root_;
    root_ = nullptr;
  }
  void SetUp() override {
    if (!SwiftInstalled()) GTEST_SKIP() << "OpenStack Swift (python3-swift) is not installed: no object store to test against";
    ASSERT_TRUE(ready_) << "the Swift store did not start";
    dir_ = ScratchDirForCurrentTest();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    trace_ = (dir_ / "trace").string();
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  static std::string In(const std::string& name) { return (*root_ / name).string(); }
  std::string P(const std::string& name) const { return (dir_ / name).string(); }
  // A key of this test's own.
  std::string Url(const std::string& key) const {
    return std::string("s3://") + kBucket + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name() +
           "/" + key;
  }
  static S3Url Parse(const std::string& url) {
    S3Url u;
    EXPECT_TRUE(s3::ParseS3Url(url, &u).ok());
    return u;
  }
  // A client of the test's own (not the one the kvfile command uses).
  static s3::Client& Client() {
    static s3::Client* c = [] {
      s3::S3Config cfg;
      cfg.access_key = store_->access_key();
      cfg.secret_key = store_->secret_key();
      cfg.region = store_->region();
      cfg.endpoint = store_->endpoint();
      cfg.credentials_source = "the test";
      return new s3::Client(cfg);
    }();
    return *c;
  }
  static bool ObjectExists(const std::string& url) {
    bool exists = false;
    EXPECT_TRUE(Client().Head(Parse(url), &exists, nullptr).ok());
    return exists;
  }
  static std::vector<s3::UploadInfo> Uploads(const std::string& url) {
    std::vector<s3::UploadInfo> out;
    S3Url u = Parse(url);
    EXPECT_TRUE(Client().ListUploads(u.bucket, u.key, &out).ok());
    return out;
  }
  static std::vector<std::string> Keys(const std::string& url_prefix) {
    S3Url u = Parse(url_prefix);
    std::vector<s3::ObjectInfo> objects;
    EXPECT_TRUE(Client().List(u.bucket, u.key, "", &objects, nullptr).ok());
    std::vector<std::string> keys;
    for (const auto& o : objects) keys.push_back(o.key);
    return keys;
  }
  // `kvfile ARGS` with its requests traced; *requests: how many it sent.
  CliRun Traced(const std::string& args, size_t* requests, const std::string& env = "") {
    fs::remove(trace_);
    CliRun r = Kvfile(args, "env KVFILE_S3_TRACE=" + trace_ + " " + env);
    std::string t = ReadFile(trace_);
    *requests = static_cast<size_t>(std::count(t.begin(), t.end(), '\n'));
    return r;
  }
  std::string Trace() const { return ReadFile(trace_); }

  static fs::path* root_;
  static SwiftStore* store_;
  static bool ready_;
  fs::path dir_;
  std::string trace_;
};

fs::path* S3Cli::root_ = nullptr;
SwiftStore* S3Cli::store_ = nullptr;
bool S3Cli::ready_ = false;

TEST_F(S3Cli, PackUploadsByMultipartAndEveryReadVerbReadsIt) {
  const std::string url = Url("corpus/p.kvpack");
  size_t n = 0;
  CliRun r = Traced("pack -o " + url + " " + In("a.kv") + " " + In("b.kv"), &n);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  std::printf("[ info     ] requests: pack -o of 37,581,680 bytes in 5 MiB parts %zu\n", n);
  // 37,581,680 bytes in 5 MiB parts: 8 parts, all of them PUT once.
  std::string t = Trace();
  EXPECT_EQ(std::count(t.begin(), t.end(), '\n') - static_cast<long>(n), 0);
  size_t parts = 0;
  for (size_t at = 0; (at = t.find("partNumber=", at)) != std::string::npos; ++at) ++parts;
  EXPECT_EQ(parts, 8u) << t;
  EXPECT_NE(t.find("POST /kvtest/PackUploadsByMultipartAndEveryReadVerbReadsIt/corpus/p.kvpack?uploads= 200"),
            std::string::npos) << t;
  EXPECT_TRUE(Uploads(url).empty());
  // Only the object is left: its upload marker is gone.
  EXPECT_EQ(Keys(Url("corpus/")), std::vector<std::string>{"PackUploadsByMultipartAndEveryReadVerbReadsIt/corpus/p.kvpack"});
  // Byte for byte the pack written locally.
  ASSERT_EQ(Kvfile("pack -o " + P("local.kvpack") + " " + In("a.kv") + " " + In("b.kv")).exit_code, 0);
  std::string remote;
  ASSERT_TRUE(Client().GetSmall(Parse(url), &remote).ok());
  EXPECT_TRUE(remote == ReadFile(P("local.kvpack")));

  r = Traced("ls " + url, &n);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t ls_requests = n;
  EXPECT_NE(r.out.find("a.kv                                            512"), std::string::npos) << r.out;
  EXPECT_LE(n, 3u);
  r = Traced("verify " + url, &n);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, url + ": ok: 2 members, 3 chunks, 37581680 bytes\n");
  r = Traced("info " + url + ":a.kv", &n);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("tokens:          512\n"), std::string::npos) << r.out;
  // A prefix lookup on a remote pack: the GET of the index beside it (none
  // here), then the scan's 3 requests; with the index of its prefix beside
  // it, at most 3 requests and the same answer.
  std::ofstream(P("tokens")) << "1 2 3\n";
  r = Traced("find " + url + " --tokens " + P("tokens"), &n);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err, "kvfile: error: " + url + ": no member shares the first token of the query (2 searched)\n");
  EXPECT_LE(n, 4u) << Trace();
  const size_t scan_requests = n;
  ASSERT_EQ(Kvfile("index " + Url("corpus/")).exit_code, 0);
  r = Traced("find " + url + " --tokens " + P("tokens"), &n);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err, "kvfile: error: " + url + ": no member shares the first token of the query (2 searched)\n");
  EXPECT_LE(n, 3u) << Trace();
  std::printf("[ info     ] requests: ls %zu, find %zu, find with the index beside the pack %zu\n", ls_requests,
              scan_requests, n);
  // Packed again from the objects: inputs are read paths too.
  ASSERT_EQ(Kvfile("convert " + In("a.kv") + " " + Url("in/a.kv")).exit_code, 0);
  r = Kvfile("pack -o " + P("again.kvpack") + " " + Url("in/") + " " + Url("in/a.kv"));
  EXPECT_EQ(r.exit_code, 2);  // the same member name twice
  EXPECT_EQ(r.err, "kvfile: error: " + Url("in/a.kv") + ": member name 'a.kv' is also the name of " + Url("in/a.kv") + "\n");
  r = Kvfile("pack -o " + P("again.kvpack") + " " + Url("in/"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  CliRun ls = Kvfile("ls " + P("again.kvpack"));
  EXPECT_NE(ls.out.find("\na.kv                                            512 "), std::string::npos) << ls.out;
  // unpack writes local files: an s3:// OUT is refused before anything is made.
  r = Kvfile("unpack " + url + " -o s3://kvtest/out/");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: s3://kvtest/out/: unpack writes local files; upload a member with: kvfile convert "
                   "PACK:MEMBER s3://BUCKET/KEY.kv\n");
  r = Kvfile("convert " + (*root_ / "").string() + " s3://kvtest/out/ --to kv", "cd " + dir_.string() + " &&");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: s3://kvtest/out/: a directory is converted into a local directory; an object "
                   "store takes one file per convert\n");
  EXPECT_FALSE(fs::exists(dir_ / "s3:"));
  r = Traced("unpack " + url + " -o " + P("out"), &n);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Members come out as .kv files of their own (a fresh salt each, so not
  // byte-identical to the inputs): whole, and of the inputs' sizes.
  for (const char* m : {"a.kv", "b.kv"}) {
    r = Kvfile("verify " + P(std::string("out/") + m));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(fs::file_size(P(std::string("out/") + m)), fs::file_size(In(m)));
  }
}

TEST_F(S3Cli, ConvertWritesAndReadsObjects) {
  const std::string kv = Url("a.kv"), fp4 = Url("a4.kv");
  size_t n = 0;
  CliRun r = Traced("convert " + In("a.kv") + " " + kv, &n);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The object, downloaded: a whole .kv file of the same size.
  std::string remote;
  ASSERT_TRUE(Client().GetSmall(Parse(kv), &remote).ok());
  std::ofstream(P("down.kv"), std::ios::binary) << remote;
  EXPECT_EQ(remote.size(), fs::file_size(In("a.kv")));
  r = Kvfile("verify " + P("down.kv"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = Traced("convert " + kv + " " + fp4 + " --dtype nvfp4", &n);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Traced("info " + kv, &n);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("io backend:      s3\n"), std::string::npos) << r.out;
  std::printf("[ info     ] requests: info of a 34.6 MB .kv object %zu\n", n);
  r = Kvfile("dump --tokens " + kv);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Kvfile("dump --tokens " + In("a.kv")).out);
  r = Traced("verify " + fp4, &n);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, fp4 + ": ok: 512 tokens in 2 chunks, 19025920 bytes\n");
  std::printf("[ info     ] requests: verify of a 19.0 MB .kv object %zu\n", n);
}

TEST_F(S3Cli, VerifyReadsEveryObjectUnderAPrefix) {
  ASSERT_EQ(Kvfile("convert " + In("a.kv") + " " + Url("c/x/a.kv")).exit_code, 0);
  ASSERT_EQ(Kvfile("pack -o " + Url("c/p.kvpack") + " " + In("a.kv") + " " + In("b.kv")).exit_code, 0);
  size_t n = 0;
  CliRun r = Traced("verify --jobs 2 " + Url("c/"), &n);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(Url("c/x/a.kv") + ": ok: 512 tokens in 2 chunks, 34623488 bytes\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(Url("c/p.kvpack") + ": ok: 2 members, 3 chunks, 37581680 bytes\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("0 of 2 files damaged"), std::string::npos) << r.out;
  r = Kvfile("verify " + Url("none/"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + Url("none/") + ": no .kv or .kvpack objects under this prefix\n");
}

TEST_F(S3Cli, FindOnAPrefixReadsItsIndexInAtMostThreeRequests) {
  const std::string dir = Url("idx/");
  ASSERT_EQ(Kvfile("convert " + In("a.kv") + " " + dir + "a.kv").exit_code, 0);
  ASSERT_EQ(Kvfile("convert " + In("b.kv") + " " + dir + "sub/b.kv").exit_code, 0);
  size_t n = 0;
  CliRun r = Traced("index " + dir, &n);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, dir + ".kvfile-index: 2 files indexed (2 read, 0 unchanged)\n");
  EXPECT_TRUE(ObjectExists(dir + ".kvfile-index"));
  r = Traced("index " + dir, &n);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, dir + ".kvfile-index: up to date (2 files)\n");
  std::ofstream(P("tokens")) << "70876 24851 111887 1\n";
  r = Traced("find " + dir + " --tokens " + P("tokens") + " --no-write", &n);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.out.starts_with(dir)) << r.out;
  EXPECT_NE(r.out.find(": 3 of 4 tokens match ("), std::string::npos) << r.out;
  // The listing, the index: at most 3 requests.
  EXPECT_LE(n, 3u) << Trace();
  std::printf("[ info     ] requests: find on a prefix with a current index %zu\n", n);
  // An object replaced: the index is stale (its ETag changed) and rebuilt.
  ASSERT_EQ(Kvfile("convert --force " + In("b.kv") + " " + dir + "sub/b.kv").exit_code, 0);
  r = Kvfile("index " + dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, dir + ".kvfile-index: 2 files indexed (1 read, 1 unchanged)\n");
}

// find on a remote pack whose member records lie far apart (12 members of
// 32 tokens, 2 MB each): a scan reads each record (more than 3 requests);
// with the index of its prefix beside it (entries PACK:MEMBER) the answer
// comes from the index and the pack's listing record in at most 3, without
// a GET of the pack; once the pack is replaced, the index no longer answers
// for it and the pack is scanned.
TEST_F(S3Cli, FindOnARemotePackAnswersFromTheIndexBesideItInAtMostThreeRequests) {
  fs::create_directories(P("in"));
  for (int i = 0; i < 12; ++i) {
    CliRun r = Kvfile("synth " + P("in/m" + std::to_string(i) + ".kv") + " --preset llama-3.1-8b --tokens 32 --seed " +
                      std::to_string(100 + i) + " --prefix-tokens 8 --prefix-seed 5");
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  const std::string url = Url("packs/p.kvpack");
  ASSERT_EQ(Kvfile("pack " + P("in") + " -o " + url).exit_code, 0);
  // The query: the first 12 tokens of m7, then one of its own.
  std::unique_ptr<Reader> m7;
  ASSERT_TRUE(Reader::Open(P("in/m7.kv"), {}, &m7).ok());
  std::ofstream tokens(P("tokens"));
  for (size_t k = 0; k < 12; ++k) tokens << m7->tokens()[k] << " ";
  tokens << "4000000000\n";
  tokens.close();
  const std::string pack_get = "GET /" + Parse(url).bucket + "/" + Parse(url).key + " 206";
  size_t scan = 0, n = 0;
  CliRun r = Traced("find " + url + " --tokens " + P("tokens"), &scan);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string answer = r.out;
  EXPECT_TRUE(answer.starts_with(url + ":m7.kv: 12 of 13 tokens match (32 tokens, model ")) << answer;
  EXPECT_GT(scan, 3u) << Trace();  // no index: the member records are read
  r = Kvfile("index " + Url("packs/"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Url("packs/") + ".kvfile-index: 12 files indexed (12 read, 0 unchanged)\n");
  r = Traced("find " + url + " --tokens " + P("tokens"), &n);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, answer);
  EXPECT_EQ(r.err, "");
  EXPECT_LE(n, 3u) << Trace();
  EXPECT_EQ(Trace().find(pack_get), std::string::npos) << Trace();
  std::printf("[ info     ] requests: find on a remote pack of 12 members %zu, with the index beside it %zu\n", scan, n);
  // Replaced by a pack of m7 alone, named x7.kv: the index lists the old
  // pack, so the new one is scanned.
  fs::create_directories(P("in2"));
  fs::copy_file(P("in/m7.kv"), P("in2/x7.kv"));
  ASSERT_EQ(Kvfile("pack --force " + P("in2") + " -o " + url).exit_code, 0);
  r = Traced("find " + url + " --tokens " + P("tokens"), &n);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, url + ":x7.kv" + answer.substr(url.size() + 6));
  EXPECT_NE(Trace().find(pack_get), std::string::npos) << Trace();
}

// The library's remote File (FileSystem::Default() routes s3:// paths):
// reads batched into few ranged GETs, every byte as stored, and a read of
// an object replaced since it was opened refused, never mixed.
TEST_F(S3Cli, RemoteFileReadsBatchedAndRefusesAReplacedObject) {
  const std::string url = Url("blob");
  std::string a(4u << 20, '\0');
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<char>((i * 2654435761u) >> 13);
  ASSERT_TRUE(Client().PutSmall(Parse(url), a).ok());
  std::unique_ptr<File> f;
  uint64_t before = s3::RequestCount();
  ASSERT_TRUE(FileSystem::Default()->Open(url, OpenMode::kRead, &f).ok());
  EXPECT_EQ(s3::RequestCount() - before, 1u);  // the first MiB, which gives the size
  EXPECT_STREQ(f->backend(), "s3");
  uint64_t size = 0;
  ASSERT_TRUE(f->Size(&size).ok());
  EXPECT_EQ(size, a.size());
  // Three small reads in blocks 1 to 3 (one GET for the run of blocks)
  // and one of a whole MiB (a GET of its own into the caller's buffer).
  const uint64_t mib = 1u << 20;
  std::string r1(10, 'x'), r2(10, 'x'), r3(10, 'x'), r4(mib, 'x');
  std::vector<ReadRequest> batch = {{mib + mib / 2, r1.data(), 10}, {2 * mib + mib / 2, r2.data(), 10},
                                    {3 * mib - 5, r3.data(), 10}, {mib / 2, r4.data(), mib}};
  before = s3::RequestCount();
  ASSERT_TRUE(f->ReadBatch(batch).ok());
  EXPECT_EQ(s3::RequestCount() - before, 2u);
  EXPECT_EQ(r1, a.substr(mib + mib / 2, 10));
  EXPECT_EQ(r2, a.substr(2 * mib + mib / 2, 10));
  EXPECT_EQ(r3, a.substr(3 * mib - 5, 10));
  EXPECT_TRUE(r4 == a.substr(mib / 2, mib));
  // Cached now: no request.
  before = s3::RequestCount();
  ASSERT_TRUE(f->ReadAt(3 * mib + 7, r1.data(), 10).ok());
  EXPECT_EQ(s3::RequestCount() - before, 0u);
  EXPECT_EQ(r1, a.substr(3 * mib + 7, 10));
  // Past the end: the format's "unexpected end of file".
  Status st = f->ReadAt(size - 5, r1.data(), 10);
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_EQ(st.message(), url + ": unexpected end of file: 10 bytes at offset 4194299 of a 4194304-byte object");
  // Replaced: a block not cached yet comes from another version.
  std::unique_ptr<File> g;
  ASSERT_TRUE(FileSystem::Default()->Open(url, OpenMode::kRead, &g).ok());
  std::string b = a;
  b[2 * mib] = static_cast<char>(b[2 * mib] + 1);
  ASSERT_TRUE(Client().PutSmall(Parse(url), b).ok());
  st = g->ReadAt(2 * mib, r1.data(), 10);
  EXPECT_EQ(st.code(), Status::Code::kBusy);
  EXPECT_TRUE(st.message().starts_with(url + ": the object was replaced while it was read (ETag ")) << st.message();
  // Writing is refused: objects are written whole.
  EXPECT_EQ(FileSystem::Default()->Open(url, OpenMode::kReadWrite, &g).code(), Status::Code::kUnsupported);
}

// A verify on one thread of a remote .kv of two chunks (16.5 MiB each):
// each chunk is fetched ahead in three ranged GETs in flight at once (the
// reads one after another sent one GET at a time), and what it reports is
// what the local verify of the same bytes reports, a flipped byte in the
// second chunk included.
// A File that counts the spans announced to it (WillRead) and forwards
// everything to the remote File.
class AnnounceCountingFile : public File {
 public:
  AnnounceCountingFile(std::unique_ptr<File> f, int* announced) : f_(std::move(f)), announced_(announced) {}
  Status ReadAt(uint64_t offset, void* buf, size_t n) override { return f_->ReadAt(offset, buf, n); }
  Status ReadBatch(std::span<const ReadRequest> requests) override { return f_->ReadBatch(requests); }
  void WillRead(uint64_t offset, uint64_t n) override {
    ++*announced_;
    f_->WillRead(offset, n);
  }
  Status WriteAt(uint64_t offset, const void* buf, size_t n) override { return f_->WriteAt(offset, buf, n); }
  Status Sync() override { return f_->Sync(); }
  Status Truncate(uint64_t size) override { return f_->Truncate(size); }
  Status Size(uint64_t* size) override { return f_->Size(size); }
  Status LockExclusive() override { return f_->LockExclusive(); }
  Status Id(FileId* id) override { return f_->Id(id); }
  const char* backend() const override { return f_->backend(); }
  const std::string& path() const override { return f_->path(); }

 private:
  std::unique_ptr<File> f_;
  int* announced_;
};

// Verify on one thread announces each chunk before reading it (so the
// remote File fetches its ranges together: AnAnnouncedSpanIsFetchedByRanges
// InFlightTogether), never more than one chunk's ranges at once, and finds
// what a local verify of the same bytes finds, clean and damaged.
TEST_F(S3Cli, VerifyOnOneThreadAnnouncesEachChunkAndFindsWhatALocalVerifyFinds) {
  int announced = 0;
  struct Counting : kvfile::testing::ForwardingFs {
    int* announced = nullptr;
    Status Open(const std::string& path, OpenMode mode, std::unique_ptr<File>* out) override {
      Status st = base_->Open(path, mode, out);
      if (st.ok()) *out = std::make_unique<AnnounceCountingFile>(std::move(*out), announced);
      return st;
    }
  } counting;
  counting.announced = &announced;
  VerifyOptions one;
  one.threads = 1;
  std::string bytes = ReadFile(In("a.kv"));
  for (bool damaged : {false, true}) {
    if (damaged) bytes[bytes.size() * 3 / 4] ^= 0x10;
    const std::string url = Url(damaged ? "damaged.kv" : "a.kv");
    ASSERT_TRUE(Client().PutSmall(Parse(url), bytes).ok());
    WriteFile(P("local.kv"), bytes);
    VerifyReport local, remote;
    ASSERT_TRUE(VerifyFile(P("local.kv"), one, &local).ok());
    s3::ResetMaxRequestsInFlight();
    announced = 0;
    VerifyOptions remote_options = one;
    remote_options.fs = &counting;
    ASSERT_TRUE(VerifyFile(url, remote_options, &remote).ok());
    EXPECT_EQ(announced, 2);  // each of the two chunks
    EXPECT_LE(s3::MaxRequestsInFlight(), 3);  // the ranges of one chunk
    EXPECT_EQ(remote.chunks, 2u);
    EXPECT_EQ(remote.HasErrors(), damaged);
    ASSERT_EQ(remote.findings.size(), local.findings.size());
    for (size_t i = 0; i < local.findings.size(); ++i) {
      EXPECT_EQ(remote.findings[i].chunk, local.findings[i].chunk);
      EXPECT_EQ(remote.findings[i].message, local.findings[i].message);
    }
  }
}

// A span announced by WillRead is fetched as ranges in flight together:
// with the store frozen (SIGSTOP), no GET can finish, so every range the
// span launched stays in flight until it is continued; then the reads get
// the object's bytes. No timing: the store answers nothing meanwhile.
TEST_F(S3Cli, AnAnnouncedSpanIsFetchedByRangesInFlightTogether) {
  const std::string url = Url("a.kv");
  const std::string bytes = ReadFile(In("a.kv"));
  ASSERT_GT(bytes.size(), 17u << 20);
  ASSERT_TRUE(Client().PutSmall(Parse(url), bytes).ok());
  std::unique_ptr<File> f;
  ASSERT_TRUE(FileSystem::Default()->Open(url, OpenMode::kRead, &f).ok());
  const pid_t swift = store_->proxy_pid();
  s3::ResetMaxRequestsInFlight();
  ASSERT_EQ(::kill(swift, SIGSTOP), 0);
  f->WillRead(1u << 20, 16u << 20);  // 16 MiB: two ranges of 8 MiB
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (s3::MaxRequestsInFlight() < 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const int in_flight = s3::MaxRequestsInFlight();
  ASSERT_EQ(::kill(swift, SIGCONT), 0);
  EXPECT_EQ(in_flight, 2);
  std::string got(16u << 20, 'x');
  ASSERT_TRUE(f->ReadAt(1u << 20, got.data(), got.size()).ok());
  EXPECT_TRUE(got == bytes.substr(1u << 20, got.size()));
}

// A read of 20 MiB straight into the caller's buffer (a pack's chunk):
// three ranged GETs of 6.7 MiB in flight together, not one of 20 MiB.
TEST_F(S3Cli, ALargeReadIsSplitIntoRangesInFlightTogether) {
  const std::string url = Url("a.kv");
  const std::string bytes = ReadFile(In("a.kv"));
  ASSERT_TRUE(Client().PutSmall(Parse(url), bytes).ok());
  std::unique_ptr<File> f;
  ASSERT_TRUE(FileSystem::Default()->Open(url, OpenMode::kRead, &f).ok());
  std::string got(20u << 20, 'x');
  uint64_t before = s3::RequestCount();
  s3::ResetMaxRequestsInFlight();
  ASSERT_TRUE(f->ReadAt(1000, got.data(), got.size()).ok());
  EXPECT_EQ(s3::RequestCount() - before, 3u);
  EXPECT_EQ(s3::MaxRequestsInFlight(), 3);  // handed to curl together, before any answer
  EXPECT_TRUE(got == bytes.substr(1000, got.size()));
}

TEST_F(S3Cli, AnExistingKeyIsRefusedWithoutForce) {
  const std::string url = Url("p.kvpack");
  ASSERT_EQ(Kvfile("pack -o " + url + " " + In("b.kv")).exit_code, 0);
  std::string before;
  ASSERT_TRUE(Client().GetSmall(Parse(url), &before).ok());
  CliRun r = Kvfile("pack -o " + url + " " + In("a.kv"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + url + ": file exists; use --force to replace it\n");
  r = Kvfile("convert " + In("a.kv") + " " + Url("p.kvpack"));
  EXPECT_EQ(r.exit_code, 2);
  std::string after;
  ASSERT_TRUE(Client().GetSmall(Parse(url), &after).ok());
  EXPECT_TRUE(before == after);
  r = Kvfile("pack --force -o " + url + " " + In("a.kv"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(Client().GetSmall(Parse(url), &after).ok());
  ASSERT_EQ(Kvfile("pack -o " + P("a.kvpack") + " " + In("a.kv")).exit_code, 0);
  EXPECT_TRUE(after == ReadFile(P("a.kvpack")));  // replaced whole
}

TEST_F(S3Cli, RefusedCredentialsNameTheirSource) {
  CliRun r = Kvfile("info " + Url("a.kv"), "env AWS_SECRET_ACCESS_KEY=wrong");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(r.err.starts_with("kvfile: error: " + Url("a.kv") + ": access denied (")) << r.err;
  EXPECT_TRUE(r.err.ends_with("); the credentials come from the environment (AWS_ACCESS_KEY_ID)\n")) << r.err;
  // From a profile: the file is named.
  std::ofstream(P("credentials")) << "[other]\naws_access_key_id = test:tester\naws_secret_access_key = bad\n";
  r = Kvfile("info " + Url("a.kv"), "env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY AWS_PROFILE=other "
                                    "AWS_SHARED_CREDENTIALS_FILE=" + P("credentials"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(r.err.ends_with("; the credentials come from profile 'other' in " + P("credentials") + "\n")) << r.err;
  r = Kvfile("info " + Url("a.kv"), "env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY HOME=" + P("home") +
                                        " AWS_SHARED_CREDENTIALS_FILE=" + P("none"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + Url("a.kv") + ": no S3 credentials: set AWS_ACCESS_KEY_ID and "
                   "AWS_SECRET_ACCESS_KEY, or a profile in " + P("none") + "\n");
}

TEST_F(S3Cli, AMissingBucketOrKeyIsNamed) {
  CliRun r = Kvfile("info s3://no-such-bucket/a.kv");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: s3://no-such-bucket/a.kv: no such bucket 'no-such-bucket' at " +
                       store_->endpoint() + "\n");
  r = Kvfile("pack -o s3://no-such-bucket/p.kvpack " + In("b.kv"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: s3://no-such-bucket/p.kvpack: no such bucket 'no-such-bucket' at " +
                       store_->endpoint() + "\n");
  r = Kvfile("verify " + Url("absent.kv"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + Url("absent.kv") + ": no such object\n");
}

int PortOf(const std::string& endpoint) { return std::stoi(endpoint.substr(endpoint.rfind(':') + 1)); }

TEST_F(S3Cli, A503IsRetriedThenFailsCleanly) {
  ASSERT_EQ(Kvfile("convert " + In("b.kv") + " " + Url("b.kv")).exit_code, 0);
  FaultProxy proxy(PortOf(store_->endpoint()), FaultProxy::Fault::k503, 1000, 10);
  CliRun r = Kvfile("info " + Url("b.kv"), "env KVFILE_S3_ATTEMPTS=3 KVFILE_S3_BACKOFF_MS=5 AWS_ENDPOINT_URL=" +
                                              proxy.endpoint());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + Url("b.kv") + ": the store answered 503 3 times\n");
  EXPECT_EQ(proxy.connections(), 3);
}

TEST_F(S3Cli, DroppedConnectionsAreRetriedThenFailCleanly) {
  FaultProxy proxy(PortOf(store_->endpoint()), FaultProxy::Fault::kDrop, 1000, 10);
  CliRun r = Kvfile("info " + Url("b.kv"), "env KVFILE_S3_ATTEMPTS=3 KVFILE_S3_BACKOFF_MS=5 AWS_ENDPOINT_URL=" +
                                              proxy.endpoint());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(r.err.starts_with("kvfile: error: " + Url("b.kv") + ": cannot reach " + proxy.endpoint() + ": "))
      << r.err;
  EXPECT_TRUE(r.err.ends_with(" (3 attempts)\n")) << r.err;
  EXPECT_EQ(proxy.connections(), 3);
}

TEST_F(S3Cli, ConnectionsAreReused) {
  ASSERT_EQ(Kvfile("pack -o " + Url("p.kvpack") + " " + In("a.kv") + " " + In("b.kv")).exit_code, 0);
  FaultProxy proxy(PortOf(store_->endpoint()), FaultProxy::Fault::k503, 0);  // forwards every connection
  size_t n = 0;
  CliRun r = Traced("ls " + Url("p.kvpack"), &n, "AWS_ENDPOINT_URL=" + proxy.endpoint());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(n, 3u) << Trace();
  EXPECT_EQ(proxy.connections(), 1);  // three requests one after another: one connection
}

TEST_F(S3Cli, RetriesRideOutTransientFaults) {
  // Two 503s, then two dropped connections, then the store: every
  // operation succeeds.
  FaultProxy fail503(PortOf(store_->endpoint()), FaultProxy::Fault::k503, 2);
  FaultProxy drop(fail503.port(), FaultProxy::Fault::kDrop, 2);
  const std::string env = "env KVFILE_S3_ATTEMPTS=5 KVFILE_S3_BACKOFF_MS=5 AWS_ENDPOINT_URL=" + drop.endpoint();
  CliRun r = Kvfile("pack -o " + Url("p.kvpack") + " " + In("b.kv"), env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Kvfile("verify " + Url("p.kvpack"), env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_GE(drop.connections(), 3);
  EXPECT_GE(fail503.connections(), 3);
}

// A pack of big.kv to `url` started in the background with 5 MiB parts,
// frozen once its first parts are stored.
void StartFrozenUpload(KvfileChild* child, const std::string& url, const std::string& big, const std::string& trace,
                       const std::string& options = "") {
  ::setenv("KVFILE_S3_TRACE", trace.c_str(), 1);
  child->Start("pack " + options + "-o " + url + " " + big);
  ::unsetenv("KVFILE_S3_TRACE");
  ASSERT_TRUE(child->WaitUntil([&] { return ReadFile(trace).find("partNumber=") != std::string::npos; }))
      << child->err();
  ASSERT_TRUE(child->Freeze());
}

TEST_F(S3Cli, SigintOrSigtermDuringAnUploadAbortsIt) {
  for (int sig : {SIGINT, SIGTERM}) {
    const std::string url = Url(std::string(sig == SIGINT ? "int" : "term") + ".kvpack");
    KvfileChild child(P("err"));
    StartFrozenUpload(&child, url, In("big.kv"), trace_);
    ASSERT_EQ(Uploads(url).size(), 1u);
    EXPECT_EQ(child.SignalAndWait(sig), 128 + sig);
    EXPECT_EQ(child.err(), "kvfile: error: " + url + ": interrupted by " + (sig == SIGINT ? "SIGINT" : "SIGTERM") + "\n");
    EXPECT_FALSE(ObjectExists(url));
    EXPECT_TRUE(Uploads(url).empty());
    EXPECT_TRUE(Keys(url).empty());  // neither the object nor its marker
    fs::remove(trace_);
  }
}

TEST_F(S3Cli, AnUploadLeftBySigkillIsAbortedByTheNextRun) {
  const std::string url = Url("killed.kvpack");
  // Someone else's upload of the same key: never touched.
  std::string theirs;
  ASSERT_TRUE(Client().CreateUpload(Parse(url), &theirs).ok());
  {
    KvfileChild child(P("err"));
    StartFrozenUpload(&child, url, In("big.kv"), trace_);
    EXPECT_EQ(child.SignalAndWait(SIGKILL), 1000 + SIGKILL);
  }
  EXPECT_FALSE(ObjectExists(url));
  ASSERT_EQ(Uploads(url).size(), 2u);
  size_t n = 0;
  CliRun r = Traced("pack -o " + url + " " + In("b.kv"), &n);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<s3::UploadInfo> left = Uploads(url);
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].upload_id, theirs);
  EXPECT_NE(Trace().find("?uploadId="), std::string::npos);
  EXPECT_EQ(Keys(url), std::vector<std::string>{Parse(url).key});  // the stale marker went too
  ASSERT_TRUE(Client().AbortUpload(Parse(url), theirs).ok());
  r = Kvfile("verify " + url);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(S3Cli, AStoreStoppedUnderAReadOrAnUploadFailsTheCommandCleanly) {
  const std::string kv = Url("a.kv"), pack = Url("p.kvpack");
  ASSERT_EQ(Kvfile("convert " + In("a.kv") + " " + kv).exit_code, 0);
  // Two attempts, and a stalled transfer (no byte for 1 s) is a timeout.
  ::setenv("KVFILE_S3_ATTEMPTS", "2", 1);
  ::setenv("KVFILE_S3_BACKOFF_MS", "5", 1);
  ::setenv("KVFILE_S3_STALL_S", "1", 1);
  const pid_t swift = store_->proxy_pid();
  // A read: the command frozen after its first request, the store
  // stopped, the command let go.
  {
    ::setenv("KVFILE_S3_TRACE", trace_.c_str(), 1);
    KvfileChild child(P("err"));
    child.Start("verify " + kv);
    ::unsetenv("KVFILE_S3_TRACE");
    ASSERT_TRUE(child.WaitUntil([&] { return !ReadFile(trace_).empty(); })) << child.err();
    ASSERT_TRUE(child.Freeze());
    ASSERT_EQ(::kill(swift, SIGSTOP), 0);
    int code = child.SignalAndWait(0);  // continues it
    ::kill(swift, SIGCONT);
    EXPECT_EQ(code, 2);
    std::string err = child.err();
    EXPECT_TRUE(err.starts_with("kvfile: error: " + kv + ": cannot reach " + store_->endpoint() + ": ")) << err;
    EXPECT_TRUE(err.ends_with(" (2 attempts)\n")) << err;
    fs::remove(trace_);
  }
  // An upload: the same, once its first parts are stored; the next run
  // aborts what the failed one could not.
  {
    KvfileChild child(P("err2"));
    StartFrozenUpload(&child, pack, In("big.kv"), trace_);
    ASSERT_EQ(::kill(swift, SIGSTOP), 0);
    int code = child.SignalAndWait(0);
    ::kill(swift, SIGCONT);
    EXPECT_EQ(code, 2);
    std::string err = child.err();
    EXPECT_TRUE(err.starts_with("kvfile: error: " + pack + ": cannot reach " + store_->endpoint() + ": ")) << err;
  }
  ::unsetenv("KVFILE_S3_ATTEMPTS");
  ::unsetenv("KVFILE_S3_BACKOFF_MS");
  ::unsetenv("KVFILE_S3_STALL_S");
  EXPECT_FALSE(ObjectExists(pack));
  // The abort's request may sit in the stopped store's socket and run when
  // it continues, or time out unsent: at most the one upload is left.
  EXPECT_LE(Uploads(pack).size(), 1u);
  CliRun r = Kvfile("pack -o " + pack + " " + In("b.kv"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(Uploads(pack).empty());
  EXPECT_EQ(Keys(pack), std::vector<std::string>{Parse(pack).key});  // no marker left
  EXPECT_EQ(Kvfile("verify " + pack).exit_code, 0);
}

// A key another client creates while the upload runs is not overwritten
// (the Complete carries If-None-Match: *, which the store honours); with
// --force, a key another client replaces meanwhile is not either (a HEAD
// right before the Complete compares its ETag with the one seen at the
// start). Either way the upload is aborted and its marker deleted.
TEST_F(S3Cli, AKeyCreatedOrReplacedByAnotherClientDuringAnUploadIsNotOverwritten) {
  const std::string url = Url("raced.kvpack");
  const std::string key = Parse(url).key;
  {
    KvfileChild child(P("err"));
    StartFrozenUpload(&child, url, In("big.kv"), trace_);
    ASSERT_TRUE(Client().PutSmall(Parse(url), "another client's object").ok());
    EXPECT_EQ(child.SignalAndWait(0), 2);
    EXPECT_EQ(child.err(),
              "kvfile: error: " + url + ": created by another client while the new object was uploaded; not replaced\n");
  }
  std::string now;
  ASSERT_TRUE(Client().GetSmall(Parse(url), &now).ok());
  EXPECT_EQ(now, "another client's object");
  EXPECT_TRUE(Uploads(url).empty());
  EXPECT_EQ(Keys(url), std::vector<std::string>{key});  // no marker left
  fs::remove(trace_);
  {
    KvfileChild child(P("err2"));
    StartFrozenUpload(&child, url, In("big.kv"), trace_, "--force ");
    ASSERT_TRUE(Client().PutSmall(Parse(url), "a third client's object").ok());
    EXPECT_EQ(child.SignalAndWait(0), 2);
    EXPECT_EQ(child.err(),
              "kvfile: error: " + url + ": replaced by another client while the new object was uploaded; not replaced\n");
  }
  ASSERT_TRUE(Client().GetSmall(Parse(url), &now).ok());
  EXPECT_EQ(now, "a third client's object");
  EXPECT_TRUE(Uploads(url).empty());
  EXPECT_EQ(Keys(url), std::vector<std::string>{key});
  // Unraced, --force replaces it.
  CliRun r = Kvfile("pack --force -o " + url + " " + In("b.kv"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(Kvfile("pack -o " + P("b.kvpack") + " " + In("b.kv")).exit_code, 0);
  ASSERT_TRUE(Client().GetSmall(Parse(url), &now).ok());
  EXPECT_TRUE(now == ReadFile(P("b.kvpack")));
}

// A Complete whose answer is lost is retried; the retry finds the upload
// gone (NoSuchUpload, as AWS S3 answers; the proxy answers it here), or is
// refused by the If-None-Match: * it carries (412; the proxy again). The
// object the store holds then says whether it is this upload's (the token
// the upload was created with, in its metadata): it is, when the lost
// Complete reached the store, and the command succeeds; it is not, when
// it never did, and the command fails with the store's answer.
TEST_F(S3Cli, ACompleteWhoseAnswerWasLostIsCheckedAgainstTheObject) {
  ASSERT_EQ(Kvfile("pack -o " + P("b.kvpack") + " " + In("b.kv")).exit_code, 0);
  const std::string packed = ReadFile(P("b.kvpack"));
  // `pack -o url b.kv` through a proxy with `fault`, which must have seen
  // the Complete and its retry.
  auto pack = [&](FaultProxy::Fault fault, const std::string& url) {
    FaultProxy proxy(PortOf(store_->endpoint()), fault, 0);
    CliRun r = Kvfile("pack -o " + url + " " + In("b.kv"),
                      "env KVFILE_S3_BACKOFF_MS=5 AWS_ENDPOINT_URL=" + proxy.endpoint());
    EXPECT_EQ(proxy.completes(), 2) << url;
    return r;
  };
  // The retry finds the upload gone, or (the key absent at the start) is
  // refused by the If-None-Match: * it carries: the object there is this
  // upload's all the same.
  for (FaultProxy::Fault fault : {FaultProxy::Fault::kCompleteAnswerLost, FaultProxy::Fault::kCompleteAnswerLost412}) {
    const std::string url = Url(fault == FaultProxy::Fault::kCompleteAnswerLost ? "gone.kvpack" : "refused.kvpack");
    CliRun r = pack(fault, url);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err, "");
    std::string now;
    ASSERT_TRUE(Client().GetSmall(Parse(url), &now).ok());
    EXPECT_TRUE(now == packed) << url;
    EXPECT_TRUE(Uploads(url).empty());
    EXPECT_EQ(Keys(url), std::vector<std::string>{Parse(url).key});  // no marker left
  }
  // The first Complete never reached the store: no object is this upload's.
  const std::string lost = Url("lost.kvpack");
  CliRun r = pack(FaultProxy::Fault::kCompleteLost, lost);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + lost +
                       ": the multipart upload is gone (NoSuchUpload: The specified multipart upload does not exist.)\n");
  EXPECT_FALSE(ObjectExists(lost));
  EXPECT_TRUE(Uploads(lost).empty());  // aborted
  EXPECT_TRUE(Keys(lost).empty());
}

// The ranges fetched ahead hold at most kAheadBudget bytes in the
// process, however many objects are open: six Files announcing a whole
// 33 MiB object each get what the budget has room for (the first all of
// it, the second most, the others none until earlier ranges are let go),
// and every read still gets the object's bytes.
TEST_F(S3Cli, ReadAheadNeverHoldsMoreThanItsBudget) {
  const std::string url = Url("a.kv");
  const std::string bytes = ReadFile(In("a.kv"));
  ASSERT_GT(bytes.size(), 32u << 20);  // 5 ranges per File
  ASSERT_LE(bytes.size(), 40u << 20);
  ASSERT_TRUE(Client().PutSmall(Parse(url), bytes).ok());
  std::vector<std::unique_ptr<File>> files(6);
  for (auto& f : files) ASSERT_TRUE(FileSystem::Default()->Open(url, OpenMode::kRead, &f).ok());
  ASSERT_EQ(s3::AheadBytes(), 0u);
  s3::ResetPeakAheadBytes();
  for (auto& f : files) f->WillRead(0, bytes.size());
  // 5 ranges of 6.6 MiB per File: the first File's 5 and the second's
  // first 4 fit in 64 MiB, no more.
  const uint64_t range = (bytes.size() + 4) / 5;
  ASSERT_GT(bytes.size() + 5 * range, s3::kAheadBudget);
  EXPECT_EQ(s3::AheadBytes(), bytes.size() + 4 * range);
  EXPECT_LE(s3::PeakAheadBytes(), s3::kAheadBudget);
  for (size_t i = 0; i < files.size(); ++i) {
    std::string got(bytes.size(), 'x');
    for (uint64_t at = 0; at < bytes.size(); at += 3u << 20) {
      uint64_t n = std::min<uint64_t>(3u << 20, bytes.size() - at);
      ASSERT_TRUE(files[i]->ReadAt(at, got.data() + at, n).ok()) << i;
    }
    EXPECT_TRUE(got == bytes) << i;
    EXPECT_LE(s3::PeakAheadBytes(), s3::kAheadBudget) << i;
  }
  files.clear();
  EXPECT_EQ(s3::AheadBytes(), 0u);
}

// Another host's upload (whose process cannot be asked whether it lives)
// is left alone while its marker is younger than KVFILE_S3_STALE_UPLOAD_S
// (a day by default) and aborted, with its marker, once it is older.
TEST_F(S3Cli, AnotherHostsUploadIsAbortedOnlyOnceItsMarkerIsOld) {
  const std::string url = Url("aged.kvpack");
  const int64_t now = static_cast<int64_t>(::time(nullptr));
  std::string old_id, young_id;
  ASSERT_TRUE(Client().CreateUpload(Parse(url), &old_id).ok());
  ASSERT_TRUE(Client().CreateUpload(Parse(url), &young_id).ok());
  const s3::UploadMarker old_marker = s3::MarkUpload(url, old_id, "elsewhere.invalid", 1, now - 86400 - 600);
  const s3::UploadMarker young_marker = s3::MarkUpload(url, young_id, "elsewhere.invalid", 1, now - 600);
  ASSERT_TRUE(Client().PutSmall(Parse(old_marker.path), old_marker.text).ok());
  ASSERT_TRUE(Client().PutSmall(Parse(young_marker.path), young_marker.text).ok());
  CliRun r = Kvfile("pack -o " + url + " " + In("b.kv"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<s3::UploadInfo> left = Uploads(url);
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].upload_id, young_id);
  EXPECT_EQ(Keys(url), (std::vector<std::string>{Parse(url).key, Parse(young_marker.path).key}));
  // A limit of 5 minutes makes the 10-minute-old one stale too.
  r = Kvfile("pack --force -o " + url + " " + In("b.kv"), "env KVFILE_S3_STALE_UPLOAD_S=300");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(Uploads(url).empty());
  EXPECT_EQ(Keys(url), std::vector<std::string>{Parse(url).key});
}

}  // namespace
}  // namespace kvfile::testing
