// SPDX-License-Identifier: Apache-2.0
// Format v1 and the v1 -> v2 upgrade on a writable open.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "kvfile/codec.h"
#include "format/header.h"
#include "kvfile/presets.h"
#include "kvfile/reader.h"
#include "kvfile/verify.h"
#include "kvfile/writer.h"
#include "support/fault_fs.h"
#include "support/testing_hooks.h"

namespace kvfile {
namespace {

using testing::CrashState;
using testing::FaultFs;
using testing::FsOp;

// The preset's geometry with every stream stored raw as `raw`.
Geometry RawPreset(const std::string& name, Dtype raw) {
  Geometry g;
  EXPECT_TRUE(GetPreset(name, Dtype::kE4M3, &g).ok());
  for (StreamSpec& s : g.streams) s.dtype = raw;
  return g;
}

// Input rows of token t as f32: a pure function.
void RowsOf(const StreamSpec& s, uint64_t t, uint32_t layer, uint32_t stream, float* out) {
  uint64_t x = t * 0x9E3779B97F4A7C15ull + layer * 131 + stream * 7 + 1;
  for (uint64_t i = 0; i < s.ElementsPerToken(); ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    out[i] = static_cast<float>(static_cast<int32_t>(x >> 40) - (1 << 23)) / 65536.0f;
  }
}

// Appends tokens [first, first + n) given as f32 rows.
Status AppendF32(Writer& w, uint64_t first, uint64_t n) {
  const Geometry& g = w.geometry();
  std::vector<std::vector<float>> blocks;
  AppendBatch b;
  std::vector<uint32_t> ids(n);
  for (uint64_t i = 0; i < n; ++i) ids[i] = static_cast<uint32_t>(first + i + 100);
  b.tokens = ids;
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t s = 0; s < g.streams.size(); ++s) {
      size_t per = g.streams[s].ElementsPerToken();
      blocks.emplace_back(n * per);
      for (uint64_t i = 0; i < n; ++i) RowsOf(g.streams[s], first + i, l, s, blocks.back().data() + i * per);
    }
  for (auto& blk : blocks) b.blocks.push_back({Dtype::kF32, blk.data(), nullptr});
  return w.Append(b);
}

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

class UpgradeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "kvfile_upgrade_" + std::to_string(getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string P(const std::string& n) { return dir_ + "/" + n; }

  void MakeV1(const std::string& path, const Geometry& g, uint64_t tokens, uint32_t chunk) {
    WriterOptions o;
    o.format_major = 1;
    o.chunk_tokens = chunk;
    std::unique_ptr<Writer> w;
    Status st = Writer::Create(path, g, {"model/v1", 42}, o, &w);
    ASSERT_TRUE(st.ok()) << st.ToString();
    for (uint64_t t = 0; t < tokens; t += 5) ASSERT_TRUE(AppendF32(*w, t, std::min<uint64_t>(5, tokens - t)).ok());
    ASSERT_TRUE(w->Close().ok());
  }
  std::string dir_;
};

TEST_F(UpgradeTest, EveryPresetAndRawDtype) {
  for (const std::string& preset : PresetNames()) {
    for (Dtype raw : {Dtype::kBF16, Dtype::kF16, Dtype::kF32}) {
      SCOPED_TRACE(preset + " " + DtypeName(raw));
      Geometry g = RawPreset(preset, raw);
      if (g.HasLayerSets()) continue;  // v1 keeps every stream in every layer (spec/FORMAT.md 11)
      std::string path = P("s.kv");
      std::filesystem::remove(path);
      uint64_t tokens = preset == "tiny" ? 23 : 7;
      MakeV1(path, g, tokens, preset == "tiny" ? 4 : 3);
      // v1 reads: raw values exactly, codes quantized on the fly.
      std::unique_ptr<Reader> r1;
      ASSERT_TRUE(Reader::Open(path, {}, &r1).ok());
      ASSERT_EQ(r1->major_version(), 1);
      std::vector<std::vector<uint8_t>> v1_codes;
      std::vector<std::vector<float>> v1_scales;
      std::vector<std::vector<float>> v1_values;
      for (uint32_t l = 0; l < g.layers; ++l)
        for (uint32_t s = 0; s < g.streams.size(); ++s) {
          const StreamSpec& spec = g.streams[s];
          size_t rows = tokens * spec.rows_per_token, elems = rows * spec.row_width;
          std::vector<float> in(elems);
          for (uint64_t t = 0; t < tokens; ++t) RowsOf(spec, t, l, s, in.data() + t * spec.ElementsPerToken());
          std::vector<uint8_t> stored(elems * ElementSize(raw)), want(stored.size());
          codec::ConvertRaw(Dtype::kF32, in.data(), elems, raw, want.data());
          ASSERT_TRUE(r1->ReadRows(l, s, 0, tokens, raw, stored.data()).ok());
          ASSERT_EQ(stored, want);
          std::vector<uint8_t> codes(elems), want_codes(elems);
          std::vector<float> scales(rows), want_scales(rows);
          ASSERT_TRUE(r1->ReadCodes(l, s, 0, tokens, codes.data(), scales.data()).ok());
          size_t bad;
          ASSERT_TRUE(codec::QuantizeRows(Dtype::kE4M3, raw, stored.data(), rows, spec.row_width,
                                          want_codes.data(), want_scales.data(), &bad));
          ASSERT_EQ(codes, want_codes);
          ASSERT_EQ(0, std::memcmp(scales.data(), want_scales.data(), rows * 4));
          v1_codes.push_back(codes);
          v1_scales.push_back(scales);
          std::vector<float> as_f32(elems);
          ASSERT_TRUE(r1->ReadRows(l, s, 0, tokens, Dtype::kF32, as_f32.data()).ok());
          v1_values.push_back(as_f32);
        }
      r1.reset();
      std::vector<uint8_t> before = ReadAll(path);
      VerifyReport rep;
      ASSERT_TRUE(VerifyFile(path, {}, &rep).ok());
      EXPECT_FALSE(rep.HasErrors());
      EXPECT_EQ(ReadAll(path), before) << "read-only access must not modify a v1 file";

      std::unique_ptr<Writer> w;
      Status st = Writer::Open(path, {}, &w);
      ASSERT_TRUE(st.ok()) << st.ToString();
      EXPECT_TRUE(w->recovery().upgraded_from_v1);
      ASSERT_TRUE(AppendF32(*w, tokens, 2).ok());
      ASSERT_TRUE(w->Close().ok());
      EXPECT_FALSE(std::filesystem::exists(path + ".kvupgrade"));
      std::unique_ptr<Reader> r2;
      ASSERT_TRUE(Reader::Open(path, {}, &r2).ok());
      EXPECT_EQ(r2->major_version(), 2);
      EXPECT_EQ(r2->token_count(), tokens + 2);
      EXPECT_EQ(r2->identity().model_id, "model/v1");
      EXPECT_EQ(r2->identity().fingerprint, 42u);
      EXPECT_EQ(r2->geometry().layers, g.layers);
      size_t i = 0;
      for (uint32_t l = 0; l < g.layers; ++l)
        for (uint32_t s = 0; s < g.streams.size(); ++s, ++i) {
          const StreamSpec& spec = r2->geometry().streams[s];
          EXPECT_EQ(spec.dtype, Dtype::kE4M3);
          size_t rows = tokens * spec.rows_per_token;
          std::vector<uint8_t> codes(rows * spec.row_width);
          std::vector<float> scales(rows);
          ASSERT_TRUE(r2->ReadCodes(l, s, 0, tokens, codes.data(), scales.data()).ok());
          ASSERT_EQ(codes, v1_codes[i]) << "layer " << l << " stream " << s;
          ASSERT_EQ(0, std::memcmp(scales.data(), v1_scales[i].data(), rows * 4));
        }
      for (uint64_t t = 0; t < tokens + 2; ++t) ASSERT_EQ(r2->tokens()[t], t + 100);
      // A second check, after the exact codes: v1 -> v2 -> decoded stays
      // within half an e4m3 step of each value's binade (times its scale).
      i = 0;
      for (uint32_t l = 0; l < g.layers; ++l)
        for (uint32_t s = 0; s < g.streams.size(); ++s, ++i) {
          const StreamSpec& spec = g.streams[s];
          std::vector<float> back(v1_values[i].size());
          ASSERT_TRUE(r2->ReadRows(l, s, 0, tokens, Dtype::kF32, back.data()).ok());
          for (size_t e = 0; e < back.size(); ++e) {
            float scale = v1_scales[i][e / spec.row_width];
            float q = std::fabs(v1_values[i][e]) / scale;
            float step = q < 0x1p-6f ? 0x1p-9f : std::exp2(std::floor(std::log2(q)) - 3);
            float bound = 0.5f * step * scale * (1 + 0x1p-20f) + std::fabs(v1_values[i][e]) * 0x1p-22f;
            ASSERT_LE(std::fabs(back[e] - v1_values[i][e]), bound) << "layer " << l << " stream " << s << " element " << e;
          }
        }
    }
  }
}

TEST_F(UpgradeTest, KeepRawStreamStaysRaw) {
  Geometry g = RawPreset("dsa-mixed", Dtype::kBF16);
  MakeV1(P("d.kv"), g, 9, 4);
  WriterOptions o;
  o.keep_raw = {"indexer"};
  o.upgrade_dtype = Dtype::kE5M2;
  std::unique_ptr<Writer> w;
  ASSERT_TRUE(Writer::Open(P("d.kv"), o, &w).ok());
  ASSERT_TRUE(w->Close().ok());
  std::unique_ptr<Reader> r;
  ASSERT_TRUE(Reader::Open(P("d.kv"), {}, &r).ok());
  EXPECT_EQ(r->geometry().streams[0].dtype, Dtype::kE5M2);
  EXPECT_EQ(r->geometry().streams[1].dtype, Dtype::kE5M2);
  EXPECT_EQ(r->geometry().streams[2].dtype, Dtype::kBF16);
  std::vector<uint16_t> got(9 * 128), want(9 * 128);
  std::vector<float> in(9 * 128);
  for (uint64_t t = 0; t < 9; ++t) RowsOf(g.streams[2], t, 5, 2, in.data() + t * 128);
  codec::ConvertRaw(Dtype::kF32, in.data(), in.size(), Dtype::kBF16, want.data());
  ASSERT_TRUE(r->ReadRows(5, 2, 0, 9, Dtype::kBF16, got.data()).ok());
  EXPECT_EQ(got, want);
  WriterOptions bad;
  bad.keep_raw = {"nope"};
  MakeV1(P("e.kv"), g, 3, 4);
  Status st = Writer::Open(P("e.kv"), bad, &w);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("'nope'"), std::string::npos) << st.message();
}

TEST_F(UpgradeTest, DamagedV1ChunkIsNotUpgraded) {
  Geometry g = RawPreset("tiny", Dtype::kBF16);
  MakeV1(P("x.kv"), g, 20, 4);
  std::vector<uint8_t> bytes = ReadAll(P("x.kv"));
  bytes[12288 + 4096 * 2 + 700] ^= 0x20;  // a payload byte of chunk 2
  std::ofstream(P("x.kv"), std::ios::binary).write(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  std::unique_ptr<Writer> w;
  Status st = Writer::Open(P("x.kv"), {}, &w);
  EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
  EXPECT_NE(st.message().find("not upgraded"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("v1 chunk 2"), std::string::npos) << st.message();
  EXPECT_EQ(ReadAll(P("x.kv")), bytes);
  EXPECT_FALSE(std::filesystem::exists(P("x.kv.kvupgrade")));
}

TEST_F(UpgradeTest, LeftoverTemporaryFileIsRemoved) {
  Geometry g = RawPreset("tiny", Dtype::kF16);
  MakeV1(P("y.kv"), g, 6, 4);
  std::ofstream(P("y.kv.kvupgrade")) << "half an upgrade";
  std::unique_ptr<Reader> r;
  ASSERT_TRUE(Reader::Open(P("y.kv"), {}, &r).ok());
  EXPECT_TRUE(std::filesystem::exists(P("y.kv.kvupgrade"))) << "a read-only open changes nothing";
  // What `kvfile repair` does: remove it without upgrading.
  std::vector<uint8_t> v1 = ReadAll(P("y.kv"));
  bool removed = false;
  ASSERT_TRUE(RemoveLeftoverUpgradeFile(P("y.kv"), nullptr, &removed).ok());
  EXPECT_TRUE(removed);
  EXPECT_FALSE(std::filesystem::exists(P("y.kv.kvupgrade")));
  EXPECT_EQ(ReadAll(P("y.kv")), v1);
  std::ofstream(P("y.kv.kvupgrade")) << "half an upgrade";
  std::unique_ptr<Writer> w;
  ASSERT_TRUE(Writer::Open(P("y.kv"), {}, &w).ok());
  EXPECT_TRUE(w->recovery().removed_stale_upgrade);
  EXPECT_TRUE(w->recovery().upgraded_from_v1);
  EXPECT_FALSE(std::filesystem::exists(P("y.kv.kvupgrade")));
}

// Disk full (and EIO) at every write of the upgrade: the original stays
// byte for byte, the temporary file is gone, the error is clear.
TEST(UpgradeFaults, DiskFullAtEveryWriteKeepsTheOriginal) {
  Geometry g = RawPreset("tiny", Dtype::kBF16);
  int failures = 0;
  for (int nth = 0; nth < 30; ++nth) {
    FaultFs fs;
    WriterOptions o;
    o.fs = &fs;
    o.format_major = 1;
    o.chunk_tokens = 4;
    std::unique_ptr<Writer> w;
    ASSERT_TRUE(Writer::Create("/d/v.kv", g, {"m", 1}, o, &w).ok());
    ASSERT_TRUE(AppendF32(*w, 0, 30).ok());
    ASSERT_TRUE(w->Close().ok());
    testing::DiskImage before = fs.Image();
    fs.FailOn(FsOp::kWrite, nth, ENOSPC, true);
    WriterOptions o2;
    o2.fs = &fs;
    Status st = Writer::Open("/d/v.kv", o2, &w);
    if (st.ok()) continue;
    ++failures;
    EXPECT_NE(st.message().find("No space left on device"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("the v1 file is unchanged"), std::string::npos) << st.message();
    testing::DiskImage after = fs.Image();
    EXPECT_EQ(after.count("/d/v.kv.kvupgrade"), 0u) << "temporary file left behind";
    EXPECT_EQ(after.at("/d/v.kv"), before.at("/d/v.kv"));
  }
  EXPECT_GT(failures, 5);
}

// Every crash state of an upgrade (and of the appends after it): the file
// is the whole v1 or the whole v2 with every token; the next writable open
// leaves no temporary file.
TEST(UpgradeCrash, EveryStateIsWholeV1OrWholeV2) {
  Geometry g = RawPreset("tiny", Dtype::kF32);
  FaultFs setup;
  WriterOptions o;
  o.fs = &setup;
  o.format_major = 1;
  o.chunk_tokens = 4;
  std::unique_ptr<Writer> w;
  ASSERT_TRUE(Writer::Create("/d/u.kv", g, {"m", 1}, o, &w).ok());
  ASSERT_TRUE(AppendF32(*w, 0, 14).ok());
  ASSERT_TRUE(w->Close().ok());
  // Replay the upgrade on a FaultFs that starts from the synced v1 file,
  // recording from an empty log: build it by copying through Create.
  FaultFs fs;
  {
    std::unique_ptr<File> f;
    ASSERT_TRUE(fs.Open("/d/u.kv", OpenMode::kCreateExclusive, &f).ok());
    testing::DiskImage image = setup.Image();
    const auto& bytes = image.at("/d/u.kv");
    ASSERT_TRUE(f->WriteAt(0, bytes.data(), bytes.size()).ok());
    ASSERT_TRUE(f->Sync().ok());
    ASSERT_TRUE(fs.SyncDir("/d").ok());
  }
  size_t setup_ops = fs.log().size();
  WriterOptions o2;
  o2.fs = &fs;
  o2.chunk_tokens = 4;
  Status ost = Writer::Open("/d/u.kv", o2, &w);
  ASSERT_TRUE(ost.ok()) << ost.ToString();
  size_t upgraded_ops = fs.log().size();
  ASSERT_TRUE(AppendF32(*w, 14, 3).ok());
  ASSERT_TRUE(w->Close().ok());
  size_t states = 0;
  for (size_t k = setup_ops; k <= fs.log().size(); ++k) {
    states += testing::EnumerateCrashStates(fs.log(), k, [&](const CrashState& s) {
      SCOPED_TRACE("after " + std::to_string(k) + " operations: " + s.description);
      FaultFs disk(s.image);
      ReaderOptions ro;
      ro.fs = &disk;
      std::unique_ptr<Reader> r;
      Status st = Reader::Open("/d/u.kv", ro, &r);
      ASSERT_TRUE(st.ok()) << st.ToString();
      if (r->major_version() == 1) {
        ASSERT_LT(k, upgraded_ops + 1) << "v1 after the upgrade returned";
        ASSERT_EQ(r->token_count(), 14u);
      } else {
        ASSERT_GE(r->token_count(), 14u);
        ASSERT_LE(r->token_count(), 17u);
      }
      for (uint64_t t = 0; t < r->token_count(); ++t) ASSERT_EQ(r->tokens()[t], t + 100);
      std::vector<uint8_t> codes(r->token_count() * 32);
      std::vector<float> scales(r->token_count() * 2);
      ASSERT_TRUE(r->ReadCodes(1, 1, 0, r->token_count(), codes.data(), scales.data()).ok());
      std::unique_ptr<Writer> w2;
      WriterOptions o3;
      o3.fs = &disk;
      st = Writer::Open("/d/u.kv", o3, &w2);
      ASSERT_TRUE(st.ok()) << st.ToString();
      ASSERT_TRUE(w2->Close().ok());
      EXPECT_EQ(disk.Image().count("/d/u.kv.kvupgrade"), 0u);
    });
    if (::testing::Test::HasFailure()) break;
  }
  std::printf("[ %zu crash states of the upgrade ]\n", states);
  EXPECT_GT(states, 200u);
}

}  // namespace
}  // namespace kvfile

namespace kvfile {
namespace {

// kill -9 at random moments while a large v1 file is being upgraded: after
// every kill the file is the whole v1 or the whole v2, and verify passes.
TEST(UpgradeKill, FileIsWholeV1OrWholeV2AfterEveryKill) {
  std::string dir = ::testing::TempDir() + "kvfile_upgrade_kill_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::string pristine = dir + "/pristine.kv", path = dir + "/s.kv";
  Geometry g = RawPreset("llama-3.1-8b", Dtype::kBF16);
  const uint64_t kTokens = 2048;  // 268 MB of bf16 rows: the upgrade takes about a second
  {
    WriterOptions o;
    o.format_major = 1;
    std::unique_ptr<Writer> w;
    ASSERT_TRUE(Writer::Create(pristine, g, {"big", 7}, o, &w).ok());
    for (uint64_t t = 0; t < kTokens; t += 64) ASSERT_TRUE(AppendF32(*w, t, 64).ok());
    ASSERT_TRUE(w->Close().ok());
  }
  // How long one upgrade takes, to spread the kills over it.
  std::filesystem::copy_file(pristine, path);
  auto t0 = std::chrono::steady_clock::now();
  {
    std::unique_ptr<Writer> w;
    ASSERT_TRUE(Writer::Open(path, {}, &w).ok());
  }
  int upgrade_us = static_cast<int>(std::chrono::duration_cast<std::chrono::microseconds>(
                                        std::chrono::steady_clock::now() - t0).count());
  std::filesystem::remove(path);
  std::mt19937 rng(7);
  int v1_seen = 0, v2_seen = 0;
  for (int kill_no = 0; kill_no < 20; ++kill_no) {
    if (!std::filesystem::exists(path)) std::filesystem::copy_file(pristine, path);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      std::unique_ptr<Writer> w;
      _exit(Writer::Open(path, {}, &w).ok() ? 0 : 3);
    }
    usleep(static_cast<useconds_t>(std::uniform_int_distribution<int>(0, upgrade_us)(rng)));
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    ASSERT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << "the upgrade failed by itself";
    std::unique_ptr<Reader> r;
    Status st = Reader::Open(path, {}, &r);
    ASSERT_TRUE(st.ok()) << "after kill " << kill_no << ": " << st.ToString();
    ASSERT_EQ(r->token_count(), kTokens);
    (r->major_version() == 1 ? v1_seen : v2_seen)++;
    VerifyReport rep;
    ASSERT_TRUE(VerifyFile(path, {}, &rep).ok());
    ASSERT_FALSE(rep.HasErrors()) << rep.findings[0].message;
    if (r->major_version() == 2) std::filesystem::remove(path);  // start over from v1
  }
  std::printf("[ upgrade of %llu tokens takes %d ms; after 20 kills: %d x v1, %d x v2 ]\n",
              static_cast<unsigned long long>(kTokens), upgrade_us / 1000, v1_seen, v2_seen);
  EXPECT_GT(v1_seen, 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvfile
