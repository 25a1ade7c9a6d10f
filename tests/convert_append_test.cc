// SPDX-License-Identifier: Apache-2.0
// kvfile::AppendSafetensors through the library (kvfile/append.h): a new
// file and an existing one, the identity checks, the refusals that leave
// the file as it was, a v1 file's upgrade, the stages and their stops, a
// failing disk part way, and the one chunk-size rule. The CLI's contract
// (`kvfile append`'s exit codes, lines and progress) is tested through the
// binary in cli_verbs_test, cli_progress_test and cli_signals_test.
#include "kvfile/append.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "kvfile/convert.h"
#include "kvfile/formats/safetensors.h"
#include "kvfile/reader.h"
#include "kvfile/verify.h"
#include "kvfile/writer.h"
#include "support/fault_fs.h"
#include "support/file_util.h"
#include "support/scratch_dir.h"

namespace kvfile {
namespace {

namespace fs = std::filesystem;

Geometry Tiny(Dtype dtype = Dtype::kE4M3) {
  Geometry g;
  g.layers = 2;
  g.streams = {{"k", 2, 16, dtype}, {"v", 2, 16, dtype}};
  return g;
}

class AppendSafetensorsTest : public testing::ScratchDirTest {
 protected:
  // A .kv of Tiny(dtype): `tokens` tokens with ids first, first + 1, ...
  // and values that depend on the token id, in chunks of 4.
  void WriteKv(const std::string& path, uint32_t first, uint64_t tokens, const ModelIdentity& id,
               Dtype dtype = Dtype::kE4M3, FileSystem* fs = nullptr) {
    WriterOptions wo;
    wo.chunk_tokens = 4;
    wo.fs = fs;
    std::unique_ptr<Writer> w;
    ASSERT_TRUE(Writer::Create(path, Tiny(dtype), id, wo, &w).ok());
    std::vector<float> rows(tokens * 32);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = Value(first + static_cast<uint32_t>(i / 32), i % 32);
    std::vector<uint32_t> ids(tokens);
    for (uint64_t t = 0; t < tokens; ++t) ids[t] = first + static_cast<uint32_t>(t);
    AppendBatch b;
    b.tokens = ids;
    for (int i = 0; i < 4; ++i) b.blocks.push_back({Dtype::kF32, rows.data(), nullptr});
    ASSERT_TRUE(w->Append(b).ok());
    ASSERT_TRUE(w->Close().ok());
  }
  static float Value(uint32_t token, size_t i) { return static_cast<float>((token * 7 + i) % 23) / 5.0f - 2.0f; }

  // A safetensors file in the kvfile convention: bf16 values of `tokens`
  // tokens from `first`, model `model` (none: no identity metadata).
  std::string Input(const std::string& name, uint32_t first, uint64_t tokens, const std::string& model = "test/tiny",
                    uint64_t fingerprint = 7) {
    const std::string kv = P(name + ".src.kv");
    WriteKv(kv, first, tokens, {model, fingerprint}, Dtype::kBF16);
    const std::string out = P(name + ".safetensors");
    Status st = Convert(kv, out, {}, nullptr);
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (model.empty()) StripIdentity(out);
    return out;
  }
  // Blanks the identity metadata keys (same length, so the header stays valid).
  static void StripIdentity(const std::string& path) {
    std::string bytes = testing::ReadFile(path);
    for (const std::string key : {"\"kvfile.model\"", "\"kvfile.fingerprint\""}) {
      size_t at = bytes.find(key);
      ASSERT_NE(at, std::string::npos);
      bytes[at + 1] = 'x';  // "xvfile.model": a key the convention does not know
    }
    testing::WriteFile(path, bytes);
  }

  static std::vector<uint32_t> Tokens(const std::string& path) {
    std::unique_ptr<Reader> r;
    EXPECT_TRUE(Reader::Open(path, {}, &r).ok()) << path;
    if (!r) return {};
    return {r->tokens().begin(), r->tokens().end()};
  }
  static std::vector<uint32_t> Range(uint32_t first, uint32_t n) {
    std::vector<uint32_t> v(n);
    for (uint32_t i = 0; i < n; ++i) v[i] = first + i;
    return v;
  }
};

TEST_F(AppendSafetensorsTest, CreatesThenExtendsAFileWithTheInputsValues) {
  const std::string a = Input("a", 100, 10), b = Input("b", 200, 6);
  AppendReport rep;
  ASSERT_TRUE(AppendSafetensors(P("s.kv"), a, {}, &rep).ok());
  EXPECT_TRUE(rep.created);
  EXPECT_EQ(rep.input_tokens, 10u);
  EXPECT_EQ(rep.tokens_before, 0u);
  EXPECT_FALSE(rep.upgraded_from_v1);
  EXPECT_EQ(rep.geometry, Tiny());  // values become e4m3 by default
  EXPECT_TRUE(rep.notes.empty());

  Status st = AppendSafetensors(P("s.kv"), b, {}, &rep);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_FALSE(rep.created);
  EXPECT_EQ(rep.major_before, 2);
  EXPECT_EQ(rep.geometry_before, Tiny());
  EXPECT_EQ(rep.tokens_before, 10u);
  EXPECT_EQ(rep.input_tokens, 6u);

  std::vector<uint32_t> want = Range(100, 10), more = Range(200, 6);
  want.insert(want.end(), more.begin(), more.end());
  EXPECT_EQ(Tokens(P("s.kv")), want);
  std::unique_ptr<Reader> r;
  ASSERT_TRUE(Reader::Open(P("s.kv"), {}, &r).ok());
  EXPECT_EQ(r->identity().model_id, "test/tiny");
  EXPECT_EQ(r->identity().fingerprint, 7u);
  // The codes and scales are exactly what the library's quantizer makes of
  // the input's values: those of the same bf16 sources converted to e4m3.
  ConvertOptions q;
  q.dtype = Dtype::kE4M3;
  q.every_stream = true;
  ASSERT_TRUE(Convert(P("a.src.kv"), P("a.ref.kv"), q, nullptr).ok());
  ASSERT_TRUE(Convert(P("b.src.kv"), P("b.ref.kv"), q, nullptr).ok());
  std::unique_ptr<Reader> ra, rb;
  ASSERT_TRUE(Reader::Open(P("a.ref.kv"), {}, &ra).ok());
  ASSERT_TRUE(Reader::Open(P("b.ref.kv"), {}, &rb).ok());
  for (uint32_t l = 0; l < 2; ++l)
    for (uint32_t k = 0; k < 2; ++k) {
      std::vector<uint8_t> got(16 * 32), ref(16 * 32);
      std::vector<float> got_scales(16 * 2), want_scales(16 * 2);
      ASSERT_TRUE(r->ReadCodes(l, k, 0, 16, got.data(), got_scales.data()).ok());
      ASSERT_TRUE(ra->ReadCodes(l, k, 0, 10, ref.data(), want_scales.data()).ok());
      ASSERT_TRUE(rb->ReadCodes(l, k, 0, 6, ref.data() + 10 * 32, want_scales.data() + 10 * 2).ok());
      EXPECT_EQ(got, ref) << "layer " << l << " stream " << k;
      EXPECT_EQ(got_scales, want_scales) << "layer " << l << " stream " << k;
    }
  // The values are the input's, within e4m3's error (the bf16 inputs hold
  // Value() exactly: multiples of 0.2 in [-2, 2.4] round to bf16 within 1%).
  std::vector<float> got(16 * 32);
  ASSERT_TRUE(r->ReadRows(1, 1, 0, 16, Dtype::kF32, got.data()).ok());
  for (uint32_t t = 0; t < 16; ++t)
    for (size_t i = 0; i < 32; ++i) {
      const float v = Value(want[t], i);
      EXPECT_NEAR(got[t * 32 + i], v, std::fabs(v) * 0.07f + 1e-3f) << "token " << t << " element " << i;
    }
}

TEST_F(AppendSafetensorsTest, OptionsChooseTheNewFilesDtypesModelAndChunkSize) {
  const std::string a = Input("a", 0, 9);
  AppendOptions o;
  o.dtype = Dtype::kE5M2;
  o.keep_raw = {"v"};
  o.model = "other/model";
  o.chunk_tokens = 3;
  ASSERT_TRUE(AppendSafetensors(P("s.kv"), a, o, nullptr).ok());
  std::unique_ptr<Reader> r;
  ASSERT_TRUE(Reader::Open(P("s.kv"), {}, &r).ok());
  EXPECT_EQ(r->geometry().streams[0].dtype, Dtype::kE5M2);
  EXPECT_EQ(r->geometry().streams[1].dtype, Dtype::kBF16);
  EXPECT_EQ(r->identity().model_id, "other/model");
  EXPECT_EQ(r->nominal_chunk_tokens(), 3u);
  // Without chunk_tokens: the one rule, 256 fitted to the input's size
  // (FitChunkTokens), as Writer and Convert have it.
  ASSERT_TRUE(AppendSafetensors(P("d.kv"), a, {}, nullptr).ok());
  ASSERT_TRUE(Reader::Open(P("d.kv"), {}, &r).ok());
  EXPECT_EQ(r->nominal_chunk_tokens(), FitChunkTokens(Tiny(), 256, fs::file_size(a)));
}

// Every refusal comes before the first byte is written: FILE keeps its
// bytes, or stays absent.
TEST_F(AppendSafetensorsTest, RefusalsLeaveTheFileAsItWas) {
  WriteKv(P("s.kv"), 0, 8, {"test/tiny", 7});
  const std::string before = testing::ReadFile(P("s.kv"));
  struct Case {
    std::string input;
    AppendOptions options;
    Status::Code code;
    std::string message;
  };
  const std::string good = Input("good", 50, 4);
  const std::string other_model = Input("m", 50, 4, "other/model", 7);
  AppendOptions model, keep, nvfp4;
  model.model = "someone/else";
  keep.keep_raw = {"q"};
  std::vector<Case> cases = {
      {other_model, {}, Status::Code::kMismatch, P("s.kv") + ": model"},
      {good, model, Status::Code::kMismatch, P("s.kv") + ": model"},
      {good, keep, Status::Code::kInvalidArgument, P("s.kv") + ": --keep-raw: no stream 'q' (streams: k, v)"},
      {P("absent.safetensors"), {}, Status::Code::kNotFound, P("absent.safetensors")},
  };
  for (const Case& c : cases) {
    Status st = AppendSafetensors(P("s.kv"), c.input, c.options, nullptr);
    EXPECT_EQ(st.code(), c.code) << st.ToString();
    EXPECT_TRUE(st.message().starts_with(c.message)) << st.message();
    EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
    EXPECT_EQ(testing::ReadFile(P("s.kv")), before) << c.message;
  }
  // A non-finite value anywhere in the input: refused before the open.
  const std::string nan = Input("nan", 60, 4);
  {
    std::unique_ptr<safetensors::SafetensorsFile> f;
    ASSERT_TRUE(safetensors::SafetensorsFile::Open(nan, nullptr, &f).ok());
    const safetensors::TensorInfo* v = f->header().Find("v");
    ASSERT_NE(v, nullptr);
    ASSERT_EQ(v->dtype, safetensors::DType::kBF16);
    const uint64_t last = f->data_offset() + v->end - 2;  // v's last value, of the last layer and token
    f.reset();
    std::string bytes = testing::ReadFile(nan);
    bytes[last] = static_cast<char>(0xc0);  // bf16 0x7fc0: a NaN
    bytes[last + 1] = 0x7f;
    testing::WriteFile(nan, bytes);
  }
  AppendReport rep;
  Status st = AppendSafetensors(P("s.kv"), nan, {}, &rep);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("finite"), std::string::npos) << st.message();
  EXPECT_EQ(testing::ReadFile(P("s.kv")), before);
  st = AppendSafetensors(P("new.kv"), nan, {}, &rep);
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(rep.created);
  EXPECT_EQ(testing::SortedNames(dir_), std::vector<std::string>({"good.safetensors", "good.src.kv",
                                                                  "m.safetensors", "m.src.kv", "nan.safetensors",
                                                                  "nan.src.kv", "s.kv"}));
}

TEST_F(AppendSafetensorsTest, AnInputThatNamesNoModelIsAppendedOnItsGeometryWithANote) {
  WriteKv(P("s.kv"), 0, 4, {"test/tiny", 7});
  const std::string anon = Input("anon", 10, 3, "");
  AppendReport rep;
  ASSERT_TRUE(AppendSafetensors(P("s.kv"), anon, {}, &rep).ok());
  ASSERT_EQ(rep.notes.size(), 1u);
  EXPECT_EQ(rep.notes[0], P("s.kv") + ": " + anon + " names no model (no kvfile.model or kvfile.fingerprint "
                          "metadata, no --model): appended to model 'test/tiny' on its geometry alone");
  EXPECT_EQ(Tokens(P("s.kv")).size(), 7u);
  // Naming the model (options.model) is no longer a guess: no note.
  ASSERT_TRUE(AppendSafetensors(P("s.kv"), anon, [] {
                AppendOptions o;
                o.model = "test/tiny";
                return o;
              }(), &rep).ok());
  EXPECT_TRUE(rep.notes.empty());
}

TEST_F(AppendSafetensorsTest, AV1FileIsUpgradedFirstAndTheReportSaysFromWhat) {
  WriteKv(P("v2.kv"), 0, 8, {"test/tiny", 7}, Dtype::kBF16);
  ConvertOptions co;
  co.kv_major = 1;
  ASSERT_TRUE(Convert(P("v2.kv"), P("v1.kv"), co, nullptr).ok());
  AppendOptions o;
  o.upgrade_dtype = Dtype::kE5M2;
  o.keep_raw = {"v"};
  AppendReport rep;
  Status st = AppendSafetensors(P("v1.kv"), Input("a", 8, 4), o, &rep);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(rep.major_before, 1);
  EXPECT_EQ(rep.geometry_before, Tiny(Dtype::kBF16));
  EXPECT_TRUE(rep.upgraded_from_v1);
  Geometry after = Tiny(Dtype::kE5M2);
  after.streams[1].dtype = Dtype::kBF16;
  EXPECT_EQ(rep.geometry, after);
  std::unique_ptr<Reader> r;
  ASSERT_TRUE(Reader::Open(P("v1.kv"), {}, &r).ok());
  EXPECT_EQ(r->major_version(), 2);
  EXPECT_EQ(r->geometry(), after);
  EXPECT_EQ(Tokens(P("v1.kv")), Range(0, 12));
}

// on_stage is called at each stage in order; a stop at any of them, or
// from on_progress between blocks, ends the append with that status and
// keeps nothing of it.
TEST_F(AppendSafetensorsTest, AStopAtAnyStageKeepsNothingOfTheAppend) {
  WriteKv(P("s.kv"), 0, 8, {"test/tiny", 7});
  const std::string before = testing::ReadFile(P("s.kv"));
  const std::string in = Input("a", 100, 40);
  // 64 tokens per block would be one block; the budget makes 5 of 8 tokens.
  const uint64_t block_bytes = 8 * 2 * 2 * 32 * 12;

  std::vector<AppendStage> seen;
  std::vector<uint64_t> progress;
  AppendOptions o;
  o.block_bytes = block_bytes;
  o.on_stage = [&](AppendStage s, const AppendReport&) {
    seen.push_back(s);
    return Status::OK();
  };
  o.on_progress = [&](uint64_t done) {
    progress.push_back(done);
    return Status::OK();
  };
  ASSERT_TRUE(AppendSafetensors(P("copy.kv"), in, o, nullptr).ok());
  EXPECT_EQ(seen, std::vector<AppendStage>({AppendStage::kOpening, AppendStage::kAppending, AppendStage::kSyncing}));
  // After every block but the last, and just before the last.
  EXPECT_EQ(progress, std::vector<uint64_t>({8, 16, 24, 32, 32}));

  for (AppendStage stop : {AppendStage::kOpening, AppendStage::kAppending}) {
    for (const std::string& file : {P("s.kv"), P("new.kv")}) {
      AppendOptions s = o;
      s.on_stage = [stop](AppendStage at, const AppendReport&) {
        return at == stop ? Status::Failed("stopped") : Status::OK();
      };
      Status st = AppendSafetensors(file, in, s, nullptr);
      EXPECT_EQ(st.code(), Status::Code::kFailed) << static_cast<int>(stop);
      EXPECT_NE(st.message().find("stopped"), std::string::npos) << st.message();
      if (file == P("s.kv")) EXPECT_EQ(testing::ReadFile(file), before) << static_cast<int>(stop);
      else EXPECT_FALSE(fs::exists(file)) << static_cast<int>(stop);
    }
  }
  // At kSyncing the append is done: a status from there is not looked at.
  {
    AppendOptions s = o;
    s.on_stage = [](AppendStage at, const AppendReport&) {
      return at == AppendStage::kSyncing ? Status::Failed("too late") : Status::OK();
    };
    ASSERT_TRUE(AppendSafetensors(P("late.kv"), in, s, nullptr).ok());
    EXPECT_EQ(Tokens(P("late.kv")), Range(100, 40));
    fs::remove(P("late.kv"));
  }
  // A stop between blocks, or just before the last: the blocks before it
  // are dropped too.
  for (uint64_t at : {2, 5}) {  // the second call (after block 2), the fifth (just before the last block)
    AppendOptions s = o;
    uint64_t calls = 0;
    s.on_progress = [at, &calls](uint64_t done) {
      return ++calls == at ? Status::Failed("stopped at " + std::to_string(done)) : Status::OK();
    };
    EXPECT_EQ(AppendSafetensors(P("s.kv"), in, s, nullptr).code(), Status::Code::kFailed) << at;
    // The writer dropped the unfinished append (its chunks on disk are cut
    // back, FORMAT.md 5.4): the old tokens, and a file verify finds clean.
    EXPECT_EQ(Tokens(P("s.kv")), Range(0, 8)) << at;
    VerifyReport vr;
    ASSERT_TRUE(VerifyFile(P("s.kv"), {}, &vr).ok());
    EXPECT_TRUE(vr.findings.empty()) << at;
  }
  // A new FILE stopped part way: none.
  AppendOptions s = o;
  s.on_progress = [](uint64_t done) { return done >= 16 ? Status::Failed("stopped at 16") : Status::OK(); };
  EXPECT_EQ(AppendSafetensors(P("new.kv"), in, s, nullptr).code(), Status::Code::kFailed);
  EXPECT_FALSE(fs::exists(P("new.kv")));
  EXPECT_EQ(testing::SortedNames(dir_),
            std::vector<std::string>({"a.safetensors", "a.src.kv", "copy.kv", "s.kv"}));  // no temporary left
}

// A disk that fails part way through the append (each write in turn):
// the file reads back as it was, with its tokens; with no fault the
// same append completes.
TEST_F(AppendSafetensorsTest, AFailingDiskAtEveryWriteLeavesTheFileItsTokens) {
  const std::string in = Input("a", 100, 20);
  testing::FaultFs disk;
  WriteKv("s.kv", 0, 8, {"test/tiny", 7}, Dtype::kE4M3, &disk);
  const testing::DiskImage before = disk.Image();
  AppendOptions o;
  o.block_bytes = 8 * 2 * 2 * 32 * 12;
  int failures = 0;
  for (int nth = 0;; ++nth) {
    testing::FaultFs d(before);
    o.fs = &d;
    d.FailOn(testing::FsOp::kWrite, nth, ENOSPC, true);
    Status st = AppendSafetensors("s.kv", in, o, nullptr);
    d.ClearFaults();
    std::unique_ptr<Reader> r;
    ReaderOptions ro;
    ro.fs = &d;
    ASSERT_TRUE(Reader::Open("s.kv", ro, &r).ok()) << "write " << nth;
    if (st.ok()) {
      EXPECT_EQ(r->token_count(), 28u);
      break;
    }
    // Never part of the append: none of it, or (the commit record's own
    // write failed, after the whole append was durable) all of it.
    std::vector<uint32_t> got(r->tokens().begin(), r->tokens().end());
    if (got.size() == 8) {
      ++failures;
      EXPECT_EQ(got, Range(0, 8)) << "write " << nth;
    } else {
      std::vector<uint32_t> all = Range(0, 8), more = Range(100, 20);
      all.insert(all.end(), more.begin(), more.end());
      EXPECT_EQ(got, all) << "write " << nth << ": " << st.ToString();
      EXPECT_NE(st.message().find("write at offset"), std::string::npos) << st.message();
    }
    ASSERT_LT(nth, 1000);
  }
  EXPECT_GE(failures, 3);  // the append's chunk writes: several points, each tried, each leaving the old tokens
}

}  // namespace
}  // namespace kvfile
