// SPDX-License-Identifier: Apache-2.0
// Tests of the prefix index (src/include/kvfile/prefix_index.h,
// spec/INDEX.md): format round trip, damage detection, lookups against
// brute force, directory refresh and pack lookups.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <tuple>

#include "index/index_format.h"
#include "kvfile/pack.h"
#include "kvfile/prefix_index.h"
#include "support/fault_fs.h"
#include "support/forwarding_fs.h"
#include "support/kv_test_util.h"
#include "support/peak_memory.h"
#include "support/scratch_dir.h"
#include "support/tiny_kv.h"

namespace kvfile {
namespace {

using testing::ScratchDirTest;
using testing::WriteTinyKv;
using test::Code;
using test::HasCode;

#define EXPECT_OK(expr)                               \
  do {                                                \
    ::kvfile::Status _st = (expr);                    \
    EXPECT_TRUE(_st.ok()) << _st.ToString();          \
  } while (0)

void WriteFileBytes(const std::string& path, const test::Bytes& b) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// A random corpus with much sharing: small token alphabet, entries cut
// from a few stems, empty entries, duplicates under other paths, entries
// that are prefixes of others, and a few fingerprints.
std::vector<PrefixEntry> RandomCorpus(std::mt19937_64& rng, size_t n) {
  std::vector<std::vector<uint32_t>> stems;
  for (int s = 0; s < 4; ++s) {
    std::vector<uint32_t> t(rng() % 40);
    for (uint32_t& x : t) x = static_cast<uint32_t>(rng() % 3);
    stems.push_back(t);
  }
  std::vector<PrefixEntry> out;
  for (size_t i = 0; i < n; ++i) {
    PrefixEntry e;
    e.path = "d" + std::to_string(rng() % 3) + "/f" + std::to_string(i) + ".kv";
    e.fingerprint = rng() % 3 == 0 ? 7 : rng() % 2 ? 0x1234 : 0xffffffffffffffffull;
    e.model_id = "m" + std::to_string(e.fingerprint % 10);
    const auto& stem = stems[rng() % stems.size()];
    size_t keep = rng() % (stem.size() + 1);
    e.tokens.assign(stem.begin(), stem.begin() + keep);
    if (rng() % 4 == 0) e.tokens.clear();
    for (size_t extra = rng() % 6; extra > 0; --extra) e.tokens.push_back(static_cast<uint32_t>(rng() % 4));
    if (i > 0 && rng() % 5 == 0) e.tokens = out[rng() % out.size()].tokens;  // identical tokens
    e.size = rng();
    e.mtime_ns = static_cast<int64_t>(rng() >> 1);
    e.ctime_ns = -static_cast<int64_t>(rng() >> 2);
    e.device = rng();
    e.inode = rng();
    out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(), PrefixEntryLess);
  return out;
}

// The answer by definition: the longest common prefix, then the smallest
// (fingerprint, tokens, path).
std::optional<PrefixMatch> BruteForce(const std::vector<PrefixEntry>& all, const std::vector<uint32_t>& q,
                                      std::optional<uint64_t> fp) {
  const PrefixEntry* best = nullptr;
  uint64_t best_l = 0;
  for (const PrefixEntry& e : all) {
    if (fp && e.fingerprint != *fp) continue;
    uint64_t l = 0;
    while (l < q.size() && l < e.tokens.size() && q[l] == e.tokens[l]) ++l;
    if (l == 0) continue;
    auto key = [](const PrefixEntry* x) { return std::tie(x->fingerprint, x->tokens, x->path); };
    if (l > best_l || (l == best_l && key(&e) < key(best))) best = &e, best_l = l;
  }
  if (!best) return std::nullopt;
  return PrefixMatch{best->path, best->model_id, best->fingerprint, best->tokens.size(), best_l};
}

void ExpectSame(const std::optional<PrefixMatch>& want, const std::optional<PrefixMatch>& got, const std::string& ctx) {
  ASSERT_EQ(want.has_value(), got.has_value()) << ctx;
  if (!want) return;
  EXPECT_EQ(want->path, got->path) << ctx;
  EXPECT_EQ(want->matched, got->matched) << ctx;
  EXPECT_EQ(want->tokens, got->tokens) << ctx;
  EXPECT_EQ(want->fingerprint, got->fingerprint) << ctx;
  EXPECT_EQ(want->model_id, got->model_id) << ctx;
}

std::vector<uint32_t> RandomQuery(std::mt19937_64& rng, const std::vector<PrefixEntry>& all) {
  std::vector<uint32_t> q;
  if (!all.empty() && rng() % 2) {
    q = all[rng() % all.size()].tokens;
    q.resize(rng() % (q.size() + 1));
  }
  for (size_t extra = rng() % 5 + (q.empty() ? 1 : 0); extra > 0; --extra) q.push_back(static_cast<uint32_t>(rng() % 4));
  return q;
}

class PrefixIndexTest : public ScratchDirTest {
 protected:
  void WriteIndex(const std::string& path, const std::vector<PrefixEntry>& entries, uint64_t digest = 0,
                  FileSystem* fs = nullptr) {
    std::unique_ptr<PrefixIndexWriter> w;
    ASSERT_OK(PrefixIndexWriter::Begin(path, fs, &w));
    for (const PrefixEntry& e : entries) ASSERT_OK(w->Add(e));
    ASSERT_OK(w->Finish(digest, 3));
  }
  // Opens and reads every entry: the first failure, or OK.
  Status OpenAndReadAll(const std::string& path, FileSystem* fs = nullptr) {
    std::unique_ptr<PrefixIndex> ix;
    Status st = PrefixIndex::Open(path, fs, &ix);
    PrefixEntry e;
    for (uint64_t i = 0; st.ok() && i < ix->entry_count(); ++i) st = ix->ReadEntry(i, &e);
    return st;
  }
};

TEST_F(PrefixIndexTest, RoundTripKeepsEveryField) {
  std::mt19937_64 rng(1);
  for (size_t n : {0, 1, 15, 16, 17, 100}) {
    std::vector<PrefixEntry> entries = RandomCorpus(rng, n);
    std::string path = P("ix" + std::to_string(n));
    WriteIndex(path, entries, 0xabcdef0123456789ull);
    std::unique_ptr<PrefixIndex> ix;
    ASSERT_OK(PrefixIndex::Open(path, nullptr, &ix));
    ASSERT_EQ(ix->entry_count(), n);
    EXPECT_EQ(ix->directory_digest(), 0xabcdef0123456789ull);
    EXPECT_EQ(ix->skipped(), 3u);
    for (size_t i = 0; i < n; ++i) {
      PrefixEntry e;
      ASSERT_OK(ix->ReadEntry(i, &e));
      const PrefixEntry& w = entries[i];
      EXPECT_EQ(std::tie(e.path, e.model_id, e.fingerprint, e.tokens, e.size, e.mtime_ns, e.ctime_ns, e.device, e.inode),
                std::tie(w.path, w.model_id, w.fingerprint, w.tokens, w.size, w.mtime_ns, w.ctime_ns, w.device, w.inode))
          << n << " " << i;
    }
    PrefixEntry e;
    EXPECT_TRUE(HasCode(ix->ReadEntry(n, &e), Code::kInvalidArgument));
  }
}

TEST_F(PrefixIndexTest, WriterRefusesEntriesOutOfOrderOrTwice) {
  std::unique_ptr<PrefixIndexWriter> w;
  ASSERT_OK(PrefixIndexWriter::Begin(P("ix"), nullptr, &w));
  PrefixEntry a{"a.kv", "m", 1, {1, 2}};
  PrefixEntry b{"b.kv", "m", 1, {1}};
  ASSERT_OK(w->Add(a));
  EXPECT_TRUE(HasCode(w->Add(a), Code::kInvalidArgument, {"index order"}));
  EXPECT_TRUE(HasCode(w->Add(b), Code::kInvalidArgument, {"index order"}));
  PrefixEntry unnamed{"", "m", 2, {1}};
  EXPECT_TRUE(HasCode(w->Add(unnamed), Code::kInvalidArgument));
  EXPECT_FALSE(std::filesystem::exists(P("ix")));  // nothing before Finish
}

TEST_F(PrefixIndexTest, LookupEqualsBruteForce) {
  std::mt19937_64 rng(2);
  for (int round = 0; round < 40; ++round) {
    std::vector<PrefixEntry> entries = RandomCorpus(rng, rng() % 120);
    // Paths must be unique within (fingerprint, tokens) only; make all unique.
    std::string path = P("ix");
    WriteIndex(path, entries);
    std::unique_ptr<PrefixIndex> ix;
    ASSERT_OK(PrefixIndex::Open(path, nullptr, &ix));
    for (int k = 0; k < 60; ++k) {
      std::vector<uint32_t> q = RandomQuery(rng, entries);
      std::optional<uint64_t> fp;
      if (k % 3 == 1) fp = 7;
      if (k % 3 == 2) fp = 0xffffffffffffffffull;
      std::optional<PrefixMatch> got;
      ASSERT_OK(ix->Lookup(q, fp, &got));
      ExpectSame(BruteForce(entries, q, fp), got, "round " + std::to_string(round) + " query " + std::to_string(k));
    }
  }
}

TEST_F(PrefixIndexTest, TiesGoToTheFirstInIndexOrder) {
  // Four entries match [5 6] fully; the shortest sequence of the smallest
  // fingerprint wins, and among equal sequences the smallest path.
  std::vector<PrefixEntry> e = {{"z.kv", "m", 2, {5, 6}}, {"b.kv", "m", 1, {5, 6, 9}},
                                {"c.kv", "m", 1, {5, 6, 7}}, {"a.kv", "m", 1, {5, 6, 7}}, {"y.kv", "m", 1, {4}}};
  std::sort(e.begin(), e.end(), PrefixEntryLess);
  WriteIndex(P("ix"), e);
  std::unique_ptr<PrefixIndex> ix;
  ASSERT_OK(PrefixIndex::Open(P("ix"), nullptr, &ix));
  std::optional<PrefixMatch> m;
  ASSERT_OK(ix->Lookup(std::vector<uint32_t>{5, 6, 8}, std::nullopt, &m));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->path, "a.kv");
  EXPECT_EQ(m->matched, 2u);
  ASSERT_OK(ix->Lookup(std::vector<uint32_t>{5, 6, 8}, 2, &m));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->path, "z.kv");
  ASSERT_OK(ix->Lookup(std::vector<uint32_t>{3}, std::nullopt, &m));
  EXPECT_FALSE(m);  // nothing shares the first token
  ASSERT_OK(ix->Lookup(std::vector<uint32_t>{5}, 3, &m));
  EXPECT_FALSE(m);  // no entry of that fingerprint
}

// A lookup limited to some entries (those of one pack) answers as brute
// force over those entries does, however the others interleave with them.
TEST_F(PrefixIndexTest, LookupAmongKeptEntriesEqualsBruteForce) {
  std::mt19937_64 rng(11);
  std::vector<PrefixEntry> corpus = RandomCorpus(rng, 300);
  WriteIndex(P("ix"), corpus);
  std::unique_ptr<PrefixIndex> ix;
  ASSERT_OK(PrefixIndex::Open(P("ix"), nullptr, &ix));
  for (const std::string dir : {"d0/", "d2/", "none/"}) {
    auto keep = [&](const PrefixEntry& e) { return e.path.starts_with(dir); };
    std::vector<PrefixEntry> kept;
    std::copy_if(corpus.begin(), corpus.end(), std::back_inserter(kept), keep);
    for (int k = 0; k < 200; ++k) {
      std::vector<uint32_t> q = RandomQuery(rng, kept.empty() ? corpus : kept);
      std::optional<uint64_t> fp;
      if (k % 3 == 1) fp = 0x1234;
      std::optional<PrefixMatch> m;
      ASSERT_OK(ix->Lookup(q, fp, keep, &m));
      ExpectSame(BruteForce(kept, q, fp), m, dir + " query " + std::to_string(k));
    }
  }
}

TEST_F(PrefixIndexTest, EveryTruncationAndBitFlipIsDetected) {
  std::mt19937_64 rng(3);
  std::vector<PrefixEntry> entries = RandomCorpus(rng, 20);
  testing::FaultFs fs;
  const std::string path = "/ix";
  WriteIndex(path, entries, 1, &fs);
  ASSERT_OK(OpenAndReadAll(path, &fs));
  const testing::DiskImage image = fs.Image();
  const test::Bytes good = image.at(path);
  ASSERT_GT(good.size(), 1000u);
  for (size_t n = 0; n < good.size(); ++n) {
    testing::DiskImage cut = image;
    cut[path].resize(n);
    testing::FaultFs f(cut);
    Status st = OpenAndReadAll(path, &f);
    ASSERT_TRUE(st.IsDataError()) << "cut at " << n << ": " << st.ToString();
  }
  for (size_t off = 0; off < good.size(); ++off)
    for (int bit = 0; bit < 8; ++bit) {
      testing::DiskImage flipped = image;
      flipped[path][off] ^= static_cast<uint8_t>(1 << bit);
      testing::FaultFs f(flipped);
      Status st = OpenAndReadAll(path, &f);
      ASSERT_TRUE(st.IsDataError()) << "flip at " << off << " bit " << bit << ": " << st.ToString();
    }
}

// A header whose tables are holes of a sparse file: 2^24 entries of
// restart interval 16 in 2^24 groups, the blocks exactly as large as that
// many minimal entries need, so every count agrees with the file's size
// (1.5 GiB, all hole) and only the checksums can refuse it. The block
// table (24 MiB) is checked piece by piece before anything of its size is
// allocated; the tables cost 408 MiB when they were read whole first.
TEST_F(PrefixIndexTest, SparseTablesAreRefusedWithBoundedMemory) {
  index::Header h;
  h.entry_count = uint64_t{1} << 24;
  h.restart_interval = 16;
  h.blocks_bytes = h.entry_count * (index::kEntryFixedBytes + 1);
  h.block_count = h.entry_count / 16;
  h.group_count = h.entry_count;
  h.block_table_checksum = 1;
  h.group_table_checksum = 1;
  h.file_bytes = index::kHeaderBytes + h.blocks_bytes + h.block_count * index::kBlockEntryBytes +
                 h.group_count * index::kGroupEntryBytes;
  test::Bytes head(index::kHeaderBytes);
  index::EncodeHeader(h, head.data());
  const std::string path = P("sparse.kvindex");
  WriteFileBytes(path, head);
  std::filesystem::resize_file(path, h.file_bytes);
  testing::ChildCost c = testing::RunInChild([&path] {
    std::unique_ptr<PrefixIndex> ix;
    Status st = PrefixIndex::Open(path, nullptr, &ix);
    return st.ok() ? std::string("ok") : st.message();
  });
  EXPECT_EQ(c.result, path + ": index block table checksum mismatch");
  EXPECT_GE(c.growth_mib, 0);
  EXPECT_LT(c.growth_mib, testing::kSmallGrowthMib);
}

// More entries than the blocks' bytes can hold (each takes at least 65),
// or more groups than entries: refused from the header, before the tables
// are read.
TEST_F(PrefixIndexTest, CountsTheBlocksCannotHoldAreRefusedFromTheHeader) {
  for (auto [entries, groups] : {std::pair<uint64_t, uint64_t>{1601, 1}, {1600, 1601}}) {
    index::Header h;
    h.entry_count = entries;
    h.restart_interval = 16;
    h.blocks_bytes = 1600 * (index::kEntryFixedBytes + 1);
    h.block_count = (entries + 15) / 16;
    h.group_count = groups;
    h.file_bytes = index::kHeaderBytes + h.blocks_bytes + h.block_count * index::kBlockEntryBytes +
                   h.group_count * index::kGroupEntryBytes;
    test::Bytes img(h.file_bytes);
    index::EncodeHeader(h, img.data());
    testing::FaultFs fs({{"/ix", img}});
    std::unique_ptr<PrefixIndex> ix;
    Status st = PrefixIndex::Open("/ix", &fs, &ix);
    EXPECT_EQ(st.code(), Status::Code::kCorruption);
    EXPECT_EQ(st.message(), "/ix: index claims " + std::to_string(entries) + " entries in " + std::to_string(groups) +
                                " groups, more than 104000 bytes of blocks hold");
  }
}

// ---- directories ----

class PrefixDirTest : public ScratchDirTest {
 protected:
  void Put(const std::string& rel, const std::vector<uint32_t>& tokens, uint64_t fp = 0x1234) {
    std::filesystem::create_directories((dir_ / rel).parent_path());
    WriteTinyKv(P(rel), tokens, {"org/m" + std::to_string(fp % 100), fp});
    PrefixEntry e{rel, "org/m" + std::to_string(fp % 100), fp, tokens};
    std::erase_if(truth_, [&](const PrefixEntry& x) { return x.path == rel; });
    truth_.push_back(e);
  }
  void Drop(const std::string& rel) {
    std::filesystem::remove(P(rel));
    std::erase_if(truth_, [&](const PrefixEntry& x) { return x.path == rel; });
  }
  std::optional<PrefixMatch> Find(const std::vector<uint32_t>& q, PrefixIndexReport* report = nullptr,
                                  std::optional<uint64_t> fp = std::nullopt, FileSystem* fs = nullptr) {
    PrefixFindOptions o;
    o.fingerprint = fp;
    o.fs = fs;
    std::optional<PrefixMatch> m;
    Status st = FindPrefix(dir_.string(), q, o, &m, report);
    EXPECT_OK(st);
    return m;
  }
  void ExpectTruth(const std::vector<uint32_t>& q, std::optional<uint64_t> fp = std::nullopt) {
    ExpectSame(BruteForce(truth_, q, fp), Find(q, nullptr, fp), "query");
  }
  std::string IndexPath() const { return P(kPrefixIndexName); }
  std::vector<PrefixEntry> truth_;
};

TEST_F(PrefixDirTest, IndexThenFindEqualsBruteForce) {
  std::mt19937_64 rng(4);
  std::vector<PrefixEntry> corpus = RandomCorpus(rng, 40);
  for (size_t i = 0; i < corpus.size(); ++i) Put(corpus[i].path, corpus[i].tokens, corpus[i].fingerprint);
  PrefixIndexReport r;
  ASSERT_OK(IndexDirectory(dir_.string(), nullptr, &r));
  EXPECT_EQ(r.files, 40u);
  EXPECT_EQ(r.indexed, 40u);
  EXPECT_EQ(r.reread, 40u);
  EXPECT_TRUE(r.written);
  test::Bytes before = test::ReadFileBytes(IndexPath());
  for (int k = 0; k < 50; ++k) {
    std::vector<uint32_t> q = RandomQuery(rng, truth_);
    PrefixIndexReport fr;
    ExpectSame(BruteForce(truth_, q, std::nullopt), Find(q, &fr), "query " + std::to_string(k));
    EXPECT_TRUE(fr.was_fresh);
    EXPECT_EQ(fr.reread, 0u);
    ExpectTruth(q, 7);
  }
  EXPECT_EQ(test::ReadFileBytes(IndexPath()), before);  // a fresh index is not rewritten
  ASSERT_OK(IndexDirectory(dir_.string(), nullptr, &r));
  EXPECT_TRUE(r.was_fresh);
  EXPECT_FALSE(r.written);
}

TEST_F(PrefixDirTest, ChangedAddedAndRemovedFilesRefreshTheIndex) {
  Put("a.kv", {1, 2, 3});
  Put("sub/b.kv", {1, 2, 4, 4});
  Put("c.kv", {});
  PrefixIndexReport r;
  ASSERT_OK(IndexDirectory(dir_.string(), nullptr, &r));
  ASSERT_EQ(r.reread, 3u);
  // Modified: new tokens.
  Put("a.kv", {9, 9});
  std::optional<PrefixMatch> m = Find({1, 2, 3}, &r);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->path, "sub/b.kv");
  EXPECT_EQ(m->matched, 2u);
  EXPECT_FALSE(r.was_fresh);
  EXPECT_EQ(r.reread, 1u);
  EXPECT_EQ(r.kept, 2u);
  EXPECT_TRUE(r.written);
  // Touched only: read again, same answer.
  auto t = std::filesystem::last_write_time(P("c.kv"));
  std::filesystem::last_write_time(P("c.kv"), t + std::chrono::seconds(5));
  m = Find({9}, &r);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->path, "a.kv");
  EXPECT_EQ(r.reread, 1u);
  // Added.
  Put("d/e.kv", {1, 2, 3, 4});
  m = Find({1, 2, 3, 4, 5}, &r);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->path, "d/e.kv");
  EXPECT_EQ(m->matched, 4u);
  EXPECT_EQ(r.reread, 1u);
  // Removed.
  Drop("d/e.kv");
  m = Find({1, 2, 3, 4, 5}, &r);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->path, "sub/b.kv");
  EXPECT_EQ(r.reread, 0u);
  EXPECT_EQ(r.indexed, 3u);
  EXPECT_TRUE(r.written);
  m = Find({1, 2, 3, 4, 5}, &r);
  EXPECT_TRUE(r.was_fresh);
}

TEST_F(PrefixDirTest, DamagedIndexIsRebuiltNeverTrusted) {
  std::mt19937_64 rng(5);
  Put("a.kv", {1, 2, 3});
  Put("b.kv", {1, 5});
  Put("c.kv", {2});
  PrefixIndexReport r;
  ASSERT_OK(IndexDirectory(dir_.string(), nullptr, &r));
  test::Bytes good = test::ReadFileBytes(IndexPath());
  for (size_t off = 0; off < good.size(); off += 29) {
    test::XorByte(IndexPath(), off, 0x10);
    std::optional<PrefixMatch> m = Find({1, 5, 5}, &r);
    ASSERT_TRUE(m) << off;
    EXPECT_EQ(m->path, "b.kv") << off;
    EXPECT_TRUE(r.rebuilt) << off;
    EXPECT_EQ(r.reread, 3u) << off;
    EXPECT_EQ(test::ReadFileBytes(IndexPath()), good) << off;  // the same index again
  }
  std::filesystem::resize_file(IndexPath(), good.size() / 2);
  ASSERT_TRUE(Find({2}));
  EXPECT_EQ(test::ReadFileBytes(IndexPath()), good);
}

TEST_F(PrefixDirTest, UnreadableFilesAreLeftOutAndCounted) {
  Put("a.kv", {1, 2});
  WriteFileBytes(P("junk.kv"), test::Bytes(100, 0x55));
  PrefixIndexReport r;
  ASSERT_OK(IndexDirectory(dir_.string(), nullptr, &r));
  EXPECT_EQ(r.files, 2u);
  EXPECT_EQ(r.indexed, 1u);
  EXPECT_EQ(r.skipped, 1u);
  EXPECT_NE(r.first_skipped.find("junk.kv"), std::string::npos) << r.first_skipped;
  std::optional<PrefixMatch> m = Find({1}, &r);
  ASSERT_TRUE(m);
  EXPECT_TRUE(r.was_fresh);
  EXPECT_EQ(r.skipped, 1u);
}

// A file system that refuses to create files: a directory it cannot write.
class ReadOnlyFs : public testing::ForwardingFs {
 public:
  Status Open(const std::string& path, OpenMode mode, std::unique_ptr<File>* out) override {
    if (mode == OpenMode::kCreateExclusive) return Status::IOError(path + ": Permission denied");
    return base_->Open(path, mode, out);
  }
};

TEST_F(PrefixDirTest, ReadOnlyDirectoryStillAnswers) {
  Put("a.kv", {1, 2, 3});
  Put("b.kv", {1, 2});
  ReadOnlyFs ro;
  PrefixIndexReport r;
  std::optional<PrefixMatch> m = Find({1, 2, 3}, &r, std::nullopt, &ro);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->path, "a.kv");
  EXPECT_EQ(m->matched, 3u);
  EXPECT_FALSE(r.written);
  EXPECT_NE(r.not_written.find("Permission denied"), std::string::npos) << r.not_written;
  EXPECT_FALSE(std::filesystem::exists(IndexPath()));
  PrefixIndexReport ir;
  EXPECT_TRUE(HasCode(IndexDirectory(dir_.string(), &ro, &ir), Code::kIOError, {"Permission denied"}));
}

TEST_F(PrefixDirTest, LargeRefreshSpillsRunsAndMergesThem) {
  index::SetRunTokensForTesting(5);
  std::mt19937_64 rng(6);
  std::vector<PrefixEntry> corpus = RandomCorpus(rng, 30);
  for (const PrefixEntry& e : corpus) Put(e.path, e.tokens, e.fingerprint);
  PrefixIndexReport r;
  ASSERT_OK(IndexDirectory(dir_.string(), nullptr, &r));
  index::SetRunTokensForTesting(0);
  EXPECT_EQ(r.indexed, 30u);
  std::vector<std::string> names = test::ListDir(dir_.string());
  for (const std::string& n : names) EXPECT_EQ(n.find(".run"), std::string::npos) << n;  // runs removed
  for (int k = 0; k < 30; ++k) ExpectTruth(RandomQuery(rng, truth_));
}

TEST_F(PrefixDirTest, NotADirectoryNorAPack) {
  std::optional<PrefixMatch> m;
  EXPECT_TRUE(HasCode(FindPrefix(P("missing"), std::vector<uint32_t>{1}, {}, &m), Code::kNotFound));
  Put("a.kv", {1});
  EXPECT_TRUE(HasCode(FindPrefix(P("a.kv"), std::vector<uint32_t>{1}, {}, &m), Code::kCorruption, {"not a kvfile pack"}));
  EXPECT_TRUE(HasCode(IndexDirectory(P("a.kv"), nullptr, nullptr), Code::kInvalidArgument, {"not a directory"}));
}

// The members of the packs of a directory are entries PACK:MEMBER of its
// index; a pack is then searched through the index beside it while that
// lists the pack as it is, and member by member once the pack changed.
TEST_F(PrefixDirTest, PacksAreIndexedAndSearchedThroughTheIndexBesideThem) {
  std::mt19937_64 rng(9);
  std::vector<PrefixEntry> corpus = RandomCorpus(rng, 60);
  // The packs' source files live beside the directory, not in it.
  const std::filesystem::path src = dir_.string() + "_src";
  std::filesystem::create_directories(src);
  std::map<std::string, std::vector<PrefixEntry>> packs;  // pack -> its members
  for (size_t i = 0; i < corpus.size(); ++i) {
    const PrefixEntry& e = corpus[i];
    std::string model = "org/m" + std::to_string(e.fingerprint % 100);
    if (i % 3 == 0) {
      Put(e.path, e.tokens, e.fingerprint);
      continue;
    }
    std::string name = "m" + std::to_string(i) + ".kv";
    WriteTinyKv((src / name).string(), e.tokens, {model, e.fingerprint});
    packs[i % 3 == 1 ? "p1.kvpack" : "p2.kvpack"].push_back({name, model, e.fingerprint, e.tokens});
  }
  auto write_pack = [&](const std::string& pack) {
    std::filesystem::remove(P(pack));
    std::unique_ptr<PackWriter> pw;
    ASSERT_OK(PackWriter::Begin(P(pack), {}, &pw));
    for (const PrefixEntry& m : packs[pack]) ASSERT_OK(pw->AddFile(m.path, (src / m.path).string()));
    ASSERT_OK(pw->Finish());
  };
  for (const auto& [pack, members] : packs) {
    write_pack(pack);
    for (PrefixEntry named : members) {
      named.path = pack + ":" + named.path;
      truth_.push_back(named);
    }
  }
  PrefixIndexReport r;
  ASSERT_OK(IndexDirectory(dir_.string(), nullptr, &r));
  EXPECT_EQ(r.files, 22u);  // 20 .kv files and 2 packs
  EXPECT_EQ(r.indexed, 60u);
  EXPECT_EQ(r.reread, 60u);
  for (int k = 0; k < 60; ++k) {
    std::vector<uint32_t> q = RandomQuery(rng, truth_);
    std::optional<uint64_t> fp;
    if (k % 3 == 1) fp = 0x1234;
    ExpectTruth(q, fp);
    for (const auto& [pack, members] : packs) {
      PrefixFindOptions o;
      o.fingerprint = fp;
      std::optional<PrefixMatch> m;
      PrefixIndexReport pr;
      ASSERT_OK(FindPrefix(P(pack), q, o, &m, &pr));
      ExpectSame(BruteForce(members, q, fp), m, pack + " query " + std::to_string(k));
      EXPECT_TRUE(pr.was_fresh) << pack;
      if (!m) {
        EXPECT_EQ(pr.indexed, members.size());
      }
    }
  }
  // p2 written again with one member less: its entries are stale and not
  // used; a refresh reads p2 again and keeps the other entries.
  packs["p2.kvpack"].pop_back();
  write_pack("p2.kvpack");
  for (int k = 0; k < 20; ++k) {
    std::vector<uint32_t> q = RandomQuery(rng, packs["p2.kvpack"]);
    std::optional<PrefixMatch> m;
    PrefixIndexReport pr;
    ASSERT_OK(FindPrefix(P("p2.kvpack"), q, {}, &m, &pr));
    ExpectSame(BruteForce(packs["p2.kvpack"], q, std::nullopt), m, "stale p2, query " + std::to_string(k));
    EXPECT_FALSE(pr.was_fresh);
  }
  ASSERT_OK(IndexDirectory(dir_.string(), nullptr, &r));
  EXPECT_EQ(r.reread, packs["p2.kvpack"].size());
  EXPECT_EQ(r.kept, 60u - 20u);
  std::filesystem::remove_all(src);
}

TEST_F(PrefixDirTest, PackLookupEqualsBruteForce) {
  std::mt19937_64 rng(7);
  std::vector<PrefixEntry> corpus = RandomCorpus(rng, 25);
  for (const PrefixEntry& e : corpus) Put(e.path, e.tokens, e.fingerprint);
  std::unique_ptr<PackWriter> pw;
  ASSERT_OK(PackWriter::Begin(P("c.kvpack"), {}, &pw));
  for (const PrefixEntry& e : truth_) ASSERT_OK(pw->AddFile(e.path, P(e.path)));
  ASSERT_OK(pw->Finish());
  for (int k = 0; k < 40; ++k) {
    std::vector<uint32_t> q = RandomQuery(rng, truth_);
    std::optional<uint64_t> fp;
    if (k % 2) fp = 0x1234;
    PrefixFindOptions o;
    o.fingerprint = fp;
    std::optional<PrefixMatch> m;
    ASSERT_OK(FindPrefix(P("c.kvpack"), q, o, &m));
    ExpectSame(BruteForce(truth_, q, fp), m, "query " + std::to_string(k));
  }
}

}  // namespace
}  // namespace kvfile
