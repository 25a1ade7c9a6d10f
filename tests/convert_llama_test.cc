// SPDX-License-Identifier: Apache-2.0
// The llama.cpp driver through the library (kvfile/convert.h and
// kvfile/formats/llama.h): llama.cpp's own state files (fixtures/llama/)
// imported and exported byte for byte, detection by magic, hostile files
// refused with one line, the pieces llama-server uses (an append of cells
// to an open writer, an export placed in a slot, SaveState's create, append
// and divergent replace, the restore checks), interrupts and progress.
// The CLI's contract is in llama_state_test.
#include <gtest/gtest.h>

#include <filesystem>
#include <vector>
#include <tuple>
#include <span>

#include "kvfile/convert.h"
#include "kvfile/formats/llama.h"
#include "kvfile/formats/llama_state.h"
#include "kvfile/reader.h"
#include "kvfile/writer.h"
#include "support/file_util.h"
#include "support/scratch_dir.h"

namespace kvfile {
namespace {

namespace fs = std::filesystem;
using testing::ReadFile;
using testing::WriteFile;

const fs::path kFixtures = fs::path(KVFILE_TEST_DATA) / "fixtures" / "llama";

class ConvertLlama : public testing::ScratchDirTest {
 protected:
  // Options of a lossless import (heads of 64, the fixtures' model).
  static ConvertOptions RawImport() {
    ConvertOptions o;
    o.to = Format::kKv;
    o.keep_raw = {"k", "v"};
    o.llama.head_size = 64;
    return o;
  }
};

// A raw import exported in the cache's own type is the file llama.cpp
// wrote, byte for byte; the reports say what was done.
TEST_F(ConvertLlama, RawImportExportReproducesLlamaCppFiles) {
  struct F {
    const char* file;
    const char* type;
    bool session;
    uint64_t tokens;
    const char* imported;
    const char* exported;
  };
  const F files[] = {
      {"seq-f16-fa1.bin", "f16", false, 24,
       "24 tokens; 2 layers; sequence state of f16/f16 cache; k 2 x 64 f16, v 2 x 64 f16; 40960 bytes",
       "24 tokens; 2 layers; llama.cpp sequence state, f16 cache; 25036 bytes"},
      {"session-f16-fa0.bin", "f16", true, 24,
       "24 tokens; 2 layers; session of f16/f16 cache (V transposed); k 2 x 64 f16, v 2 x 64 f16; 40960 bytes",
       "24 tokens; 2 layers; llama.cpp session, f16 cache (V transposed); 25045 bytes"},
      {"seq-q8_0-fa1.bin", "q8_0", false, 24, nullptr, nullptr},
      {"seq-bf16-fa0.bin", "bf16", false, 24, nullptr, nullptr},
      {"server-slot-f16.bin", "f16", false, 17, nullptr, nullptr}};
  for (const F& f : files) {
    std::string in = (kFixtures / f.file).string(), kv = P(std::string(f.file) + ".kv"),
                back = P(std::string(f.file) + ".back");
    ConvertReport rep;
    ASSERT_TRUE(Convert(in, kv, RawImport(), &rep).ok()) << f.file;
    EXPECT_EQ(rep.from, Format::kLlamaState);
    EXPECT_EQ(rep.tokens, f.tokens) << f.file;
    if (f.imported) {
      EXPECT_EQ(rep.summary, f.imported);
    }
    EXPECT_TRUE(rep.warnings.empty()) << f.file;
    ConvertOptions o;
    o.to = Format::kLlamaState;
    o.llama.type = f.type;
    o.llama.session = f.session;
    ASSERT_TRUE(Convert(kv, back, o, &rep).ok()) << f.file;
    if (f.exported) {
      EXPECT_EQ(rep.summary, f.exported);
    }
    EXPECT_EQ(ReadFile(back), ReadFile(in)) << f.file;
  }
}

// The magic decides, whatever the name (a llama.cpp file named *.kv).
TEST_F(ConvertLlama, MagicDecidesBeforeTheName) {
  fs::copy_file(kFixtures / "seq-f16-fa1.bin", P("slot.kv"));
  Format f;
  ASSERT_TRUE(DetectFormat(P("slot.kv"), false, nullptr, &f).ok());
  EXPECT_EQ(f, Format::kLlamaState);
  ConvertOptions o;
  o.llama.head_size = 64;
  ConvertReport rep;
  ASSERT_TRUE(Convert(P("slot.kv"), P("out.kv"), o, &rep).ok());
  EXPECT_EQ(rep.summary, "24 tokens; 2 layers; sequence state of f16/f16 cache; k 2 x 64 e4m3, v 2 x 64 e4m3; "
                         "28672 bytes");
}

// A cut file is kCorruption with one line naming it and what is missing;
// no head size is kInvalidArgument saying what to give. Nothing is written.
TEST_F(ConvertLlama, HostileFilesAreRefusedWithOneLine) {
  std::string good = ReadFile(kFixtures / "seq-f16-fa1.bin");
  WriteFile(P("cut.bin"), good.substr(0, 1000));
  Status st = Convert(P("cut.bin"), P("cut.kv"), RawImport(), nullptr);
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_EQ(st.message(), P("cut.bin") + ": llama.cpp sequence state: layer 0 K: truncated: 24 cells of 256 bytes "
                                         "at byte 424, 576 bytes are left");
  EXPECT_FALSE(fs::exists(P("cut.kv")));
  ConvertOptions o = RawImport();
  o.llama.head_size.reset();
  st = Convert((kFixtures / "seq-f16-fa1.bin").string(), P("x.kv"), o, nullptr);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(st.message(), (kFixtures / "seq-f16-fa1.bin").string() +
                              ": a llama.cpp state file does not record the head size of its 128 K and 128 V values "
                              "per token: give --model MODEL.gguf, or --head-size (the model's values per KV head, "
                              "its GGUF's attention.key_length, or embedding_length / head_count)");
  EXPECT_EQ(st.message().find('\n'), std::string::npos);
  EXPECT_FALSE(fs::exists(P("x.kv")));
}

// llama-server save: the cells of a slot appended to an open writer in two
// appends hold what one import holds.
TEST_F(ConvertLlama, AppendCellsExtendsAnOpenFile) {
  std::string in = (kFixtures / "seq-f32-fa1.bin").string();
  ASSERT_TRUE(Convert(in, P("whole.kv"), RawImport(), nullptr).ok());
  std::unique_ptr<File> f;
  ASSERT_TRUE(FileSystem::Default()->Open(in, OpenMode::kRead, &f).ok());
  llama::StateLayout s;
  ASSERT_TRUE(llama::ParseState(*f, in, &s).ok());
  ConvertOptions o = RawImport();
  Geometry g;
  ModelIdentity id;
  ASSERT_TRUE(llama::PlanImport(in, s, o, &g, &id).ok());
  EXPECT_EQ(g.streams[0].dtype, Dtype::kF32);
  std::unique_ptr<Writer> w;
  ASSERT_TRUE(Writer::Create(P("parts.kv"), g, id, {}, &w).ok());
  ASSERT_TRUE(llama::AppendCells(in, *f, s, 0, 0, 10, o, *w).ok());
  ASSERT_TRUE(llama::AppendCells(in, *f, s, 0, 10, s.cells, o, *w).ok());
  ASSERT_TRUE(w->Close().ok());
  std::unique_ptr<Reader> a, b;
  ASSERT_TRUE(Reader::Open(P("whole.kv"), {}, &a).ok());
  ASSERT_TRUE(Reader::Open(P("parts.kv"), {}, &b).ok());
  ASSERT_EQ(b->token_count(), 24u);
  EXPECT_EQ(a->identity(), b->identity());
  for (uint32_t l = 0; l < 2; ++l)
    for (uint32_t st = 0; st < 2; ++st) {
      std::vector<float> ra(24 * 128), rb(ra.size());
      ASSERT_TRUE(a->ReadRows(l, st, 0, 24, Dtype::kF32, ra.data()).ok());
      ASSERT_TRUE(b->ReadRows(l, st, 0, 24, Dtype::kF32, rb.data()).ok());
      EXPECT_EQ(ra, rb);
    }
}

// llama-server restore: an export placed in another stream and sequence
// of a multi-stream cache (the three other streams empty: 12 bytes more);
// the file says so.
TEST_F(ConvertLlama, ExportPlacesTheCells) {
  ASSERT_TRUE(Convert((kFixtures / "seq-f16-fa1.bin").string(), P("a.kv"), RawImport(), nullptr).ok());
  std::unique_ptr<Reader> r;
  ASSERT_TRUE(Reader::Open(P("a.kv"), {}, &r).ok());
  ConvertOptions o;
  o.llama.type = "f16";
  llama::Placement at{4, 2, 5};
  std::string summary, warning;
  ASSERT_TRUE(llama::Export(P("a.kv"), *r, 24, P("placed.bin"), o, &summary, &warning, &at).ok());
  EXPECT_EQ(summary, "24 tokens; 2 layers; llama.cpp sequence state, f16 cache; stream 2 of 4; 25048 bytes");
  EXPECT_EQ(warning, "");
  std::unique_ptr<File> f;
  ASSERT_TRUE(FileSystem::Default()->Open(P("placed.bin"), OpenMode::kRead, &f).ok());
  llama::StateLayout s;
  ASSERT_TRUE(llama::ParseState(*f, P("placed.bin"), &s).ok());
  EXPECT_EQ(s.n_stream, 4u);
  EXPECT_EQ(s.stream, 2u);
  EXPECT_EQ(s.seq_id, 5);
  EXPECT_EQ(s.cells, 24u);
  EXPECT_TRUE(llama::CheckExportType("k=q8_0,v=f16").ok());
  Status st = llama::CheckExportType("e4m3");
  EXPECT_EQ(st.message(), "--dtype e4m3: not a llama.cpp cache type (a llama.cpp cache is f16, bf16, f32 or q8_0: "
                          "--dtype TYPE, or k=TYPE,v=TYPE for each stream)");
}

// interrupted() stops the import and the export between batches: kFailed
// "OUT: interrupted", OUT absent; progress() ends at done == total.
TEST_F(ConvertLlama, InterruptAndProgress) {
  std::string in = (kFixtures / "seq-f16-fa1.bin").string();
  ConvertOptions o = RawImport();
  o.interrupted = [] { return true; };
  Status st = Convert(in, P("a.kv"), o, nullptr);
  EXPECT_EQ(st.code(), Status::Code::kFailed);
  EXPECT_EQ(st.message(), P("a.kv") + ": interrupted");
  EXPECT_FALSE(fs::exists(P("a.kv")));
  ASSERT_TRUE(Convert(in, P("a.kv"), RawImport(), nullptr).ok());
  ConvertOptions e;
  e.to = Format::kLlamaState;
  e.interrupted = [] { return true; };
  st = Convert(P("a.kv"), P("b.bin"), e, nullptr);
  EXPECT_EQ(st.code(), Status::Code::kFailed);
  EXPECT_EQ(st.message(), P("b.bin") + ": interrupted");
  EXPECT_FALSE(fs::exists(P("b.bin")));
  e.interrupted = nullptr;
  uint64_t last = 0, of = 0;
  std::string seen;
  e.progress = [&](const std::string& label, uint64_t done, uint64_t total) {
    seen = label;
    last = done;
    of = total;
  };
  ASSERT_TRUE(Convert(P("a.kv"), P("b.bin"), e, nullptr).ok());
  EXPECT_EQ(seen, "convert " + P("a.kv"));
  EXPECT_EQ(of, 24u * 2 * 2);
  EXPECT_EQ(last, of);
}


// ---- kvfile llama-server's library half: SaveState and the restore checks ----

class LlamaSaveState : public ConvertLlama {
 protected:
  void SetUp() override {
    ConvertLlama::SetUp();
    ASSERT_TRUE(Convert((kFixtures / "seq-f16-fa1.bin").string(), P("a.kv"), RawImport(), nullptr).ok());
    ASSERT_TRUE(Reader::Open(P("a.kv"), {}, &a_).ok());
    ids_.assign(a_->tokens().begin(), a_->tokens().end());
  }
  // A state file of a.kv's first `tokens` rows under token ids `ids`.
  std::string State(const std::string& name, uint64_t tokens, const std::vector<uint32_t>& ids) {
    const std::string kv = P(name + ".kv"), out = P(name + ".bin");
    std::unique_ptr<Writer> w;
    EXPECT_TRUE(Writer::Create(kv, a_->geometry(), a_->identity(), {}, &w).ok());
    std::vector<std::vector<uint16_t>> rows(4, std::vector<uint16_t>(tokens * 128));
    AppendBatch b;
    b.tokens = std::span<const uint32_t>(ids.data(), tokens);
    for (uint32_t l = 0; l < 2; ++l)
      for (uint32_t st = 0; st < 2; ++st) {
        EXPECT_TRUE(a_->ReadRows(l, st, 0, tokens, Dtype::kF16, rows[l * 2 + st].data()).ok());
        b.blocks.push_back({Dtype::kF16, rows[l * 2 + st].data(), nullptr});
      }
    EXPECT_TRUE(w->Append(b).ok());
    EXPECT_TRUE(w->Close().ok());
    std::unique_ptr<Reader> r;
    EXPECT_TRUE(Reader::Open(kv, {}, &r).ok());
    ConvertOptions o;
    o.llama.type = "f16";
    std::string summary, warning;
    EXPECT_TRUE(llama::Export(kv, *r, tokens, out, o, &summary, &warning).ok());
    return out;
  }
  // SaveState of the state file `in` into `file`.
  Status Save(const std::string& file, const std::string& in, const llama::SaveStateOptions& so,
              llama::SaveStateReport* rep) {
    std::unique_ptr<File> f;
    llama::StateLayout s;
    Status st = FileSystem::Default()->Open(in, OpenMode::kRead, &f);
    if (st.ok()) st = llama::ParseState(*f, in, &s);
    return st.ok() ? llama::SaveState(file, in, *f, s, so, rep) : st;
  }
  static llama::SaveStateOptions Options() {
    llama::SaveStateOptions so;
    so.convert = RawImport();
    so.fingerprint = 0x1234;
    so.source = "slot 0 of http://127.0.0.1:1, model tiny.gguf";
    return so;
  }
  std::vector<uint32_t> Tokens(const std::string& path) {
    std::unique_ptr<Reader> r;
    EXPECT_TRUE(Reader::Open(path, {}, &r).ok());
    return r ? std::vector<uint32_t>(r->tokens().begin(), r->tokens().end()) : std::vector<uint32_t>{};
  }
  // Rows of `path` equal a.kv's for every token (the same values under any ids).
  void ExpectRows(const std::string& path) {
    std::unique_ptr<Reader> r;
    ASSERT_TRUE(Reader::Open(path, {}, &r).ok());
    ASSERT_EQ(r->token_count(), 24u);
    for (uint32_t l = 0; l < 2; ++l)
      for (uint32_t st = 0; st < 2; ++st) {
        std::vector<uint16_t> want(24 * 128), got(want.size());
        ASSERT_TRUE(a_->ReadRows(l, st, 0, 24, Dtype::kF16, want.data()).ok());
        ASSERT_TRUE(r->ReadRows(l, st, 0, 24, Dtype::kF16, got.data()).ok());
        EXPECT_EQ(got, want) << "layer " << l << " stream " << st;
      }
  }

  std::unique_ptr<Reader> a_;
  std::vector<uint32_t> ids_;
};

// Create, append the turn's new cells, nothing to do, then a divergence:
// the file each time holds the state's tokens and rows.
TEST_F(LlamaSaveState, CreatesAppendsAndReplacesADivergenceWhole) {
  const std::string s10 = State("s10", 10, ids_), s24 = State("s24", 24, ids_);
  std::vector<uint32_t> other = ids_;
  for (size_t i = 12; i < other.size(); ++i) other[i] += 1000;
  const std::string div = State("div", 24, other);
  llama::SaveStateReport rep;
  ASSERT_TRUE(Save(P("chat.kv"), s10, Options(), &rep).ok());
  EXPECT_TRUE(rep.created);
  EXPECT_EQ(std::tuple(rep.before, rep.kept, rep.cells, rep.size_before), std::tuple(0u, 0u, 10u, 0u));
  EXPECT_EQ(rep.size_after, fs::file_size(P("chat.kv")));
  EXPECT_EQ(Tokens(P("chat.kv")), std::vector<uint32_t>(ids_.begin(), ids_.begin() + 10));
  {
    std::unique_ptr<Reader> r;
    ASSERT_TRUE(Reader::Open(P("chat.kv"), {}, &r).ok());
    EXPECT_EQ(r->identity().fingerprint, 0x1234u);
    EXPECT_EQ(r->geometry(), a_->geometry());
  }
  Status st = Save(P("chat.kv"), s24, Options(), &rep);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_FALSE(rep.created);
  EXPECT_EQ(std::tuple(rep.before, rep.kept, rep.cells), std::tuple(10u, 10u, 24u));
  EXPECT_EQ(Tokens(P("chat.kv")), ids_);
  ExpectRows(P("chat.kv"));
  const std::string whole = testing::ReadFile(P("chat.kv"));
  ASSERT_TRUE(Save(P("chat.kv"), s24, Options(), &rep).ok());
  EXPECT_EQ(std::tuple(rep.before, rep.kept, rep.cells), std::tuple(24u, 24u, 24u));  // up to date
  EXPECT_EQ(testing::ReadFile(P("chat.kv")), whole);
  ASSERT_TRUE(Save(P("chat.kv"), div, Options(), &rep).ok());
  EXPECT_EQ(std::tuple(rep.before, rep.kept, rep.cells), std::tuple(24u, 12u, 24u));
  EXPECT_EQ(Tokens(P("chat.kv")), other);
  ExpectRows(P("chat.kv"));
  EXPECT_EQ(testing::SortedNames(dir_),  // no temporary file left
            std::vector<std::string>({"a.kv", "chat.kv", "div.bin", "div.kv", "s10.bin", "s10.kv", "s24.bin",
                                      "s24.kv"}));
}

// Another model, a stop before the file is opened or during a divergent
// save's copy, a writer that holds the file: refused, the file as it was,
// nothing left beside it.
TEST_F(LlamaSaveState, RefusalsAndStopsLeaveTheFileAsItWas) {
  std::vector<uint32_t> other = ids_;
  for (size_t i = 4; i < other.size(); ++i) other[i] += 1000;
  const std::string s24 = State("s24", 24, ids_), div = State("div", 24, other);
  ASSERT_TRUE(Save(P("chat.kv"), s24, Options(), nullptr).ok());
  const std::string before = testing::ReadFile(P("chat.kv"));
  const auto names = testing::SortedNames(dir_);

  llama::SaveStateOptions so = Options();
  so.fingerprint = 0x9999;
  Status st = Save(P("chat.kv"), div, so, nullptr);
  EXPECT_EQ(st.code(), Status::Code::kMismatch);
  EXPECT_EQ(st.message(), P("chat.kv") + ": model fingerprint: file has 0000000000001234, expected "
                          "0000000000009999 (slot 0 of http://127.0.0.1:1, model tiny.gguf)");
  // A stop where the file is about to be opened, and one in the copy of a
  // divergent save (the copy asks with FILE's path too, after the open).
  int asked = 0;
  for (int stop_at : {1, 2}) {
    so = Options();
    asked = 0;
    so.check_stop = [&asked, stop_at](const std::string& path) {
      return ++asked == stop_at ? Status::Failed(path + ": stopped") : Status::OK();
    };
    st = Save(P("chat.kv"), div, so, nullptr);
    EXPECT_EQ(st.code(), Status::Code::kFailed) << stop_at;
    EXPECT_EQ(st.message(), P("chat.kv") + ": stopped") << stop_at;
    EXPECT_EQ(asked, stop_at + 1) << "after the failure, asked once more with the state's path";
  }
  // A writer holding the file.
  {
    std::unique_ptr<Writer> holder;
    ASSERT_TRUE(Writer::Open(P("chat.kv"), {}, &holder).ok());
    st = Save(P("chat.kv"), div, Options(), nullptr);
    EXPECT_EQ(st.code(), Status::Code::kBusy) << st.ToString();
    ASSERT_TRUE(holder->Close().ok());
  }
  EXPECT_EQ(testing::ReadFile(P("chat.kv")), before);
  EXPECT_EQ(testing::SortedNames(dir_), names);
}

// The restore checks: a file kvfile llama-server save did not write, an
// empty one, a server whose cache is quantized (rotated) where the file's
// was not, or of another shape, or of two types.
TEST_F(LlamaSaveState, RestoreChecks) {
  std::unique_ptr<File> f;
  auto layout = [&f](const std::string& name) {
    const std::string in = (kFixtures / name).string();
    llama::StateLayout s;
    EXPECT_TRUE(FileSystem::Default()->Open(in, OpenMode::kRead, &f).ok());
    EXPECT_TRUE(llama::ParseState(*f, in, &s).ok()) << name;
    return s;
  };
  // a.kv is a plain import: its model id has the provenance, its fingerprint is 0.
  Status st = llama::CheckRestorable("a.kv", *a_);
  EXPECT_EQ(st.code(), Status::Code::kMismatch);
  EXPECT_TRUE(st.message().starts_with("a.kv: not saved by kvfile llama-server save (model '")) << st.message();
  EXPECT_TRUE(st.message().ends_with("', fingerprint 0000000000000000)")) << st.message();
  ASSERT_TRUE(Save(P("chat.kv"), State("s24", 24, ids_), Options(), nullptr).ok());
  std::unique_ptr<Reader> r;
  ASSERT_TRUE(Reader::Open(P("chat.kv"), {}, &r).ok());
  EXPECT_TRUE(llama::CheckRestorable("chat.kv", *r).ok());
  EXPECT_TRUE(llama::CheckRestoreInto("chat.kv", *r, layout("seq-f16-fa1.bin")).ok());
  EXPECT_TRUE(llama::CheckRestoreInto("chat.kv", *r, layout("seq-bf16-fa0.bin")).ok());  // unquantized both
  st = llama::CheckRestoreInto("chat.kv", *r, layout("seq-q8_0-fa1.bin"));
  EXPECT_EQ(st.code(), Status::Code::kMismatch);
  EXPECT_EQ(st.message(), "chat.kv: saved from a f16/f16 cache, the server's is q8_0/q8_0: llama.cpp "
                          "Hadamard-rotates the rows of quantized caches only, the server would misread them; "
                          "not restored");
  st = llama::CheckRestoreInto("chat.kv", *r, layout("seq-q8_0-f16-fa0.bin"));
  EXPECT_EQ(st.code(), Status::Code::kMismatch) << st.ToString();  // K quantized on one side only
  llama::StateLayout wide = layout("seq-f16-fa1.bin");
  wide.k_width *= 2;
  st = llama::CheckRestoreInto("chat.kv", *r, wide);
  EXPECT_EQ(st.code(), Status::Code::kMismatch);
  EXPECT_TRUE(st.message().ends_with("V values per token; the file 2 layers of another shape; not restored"))
      << st.message();
  llama::StateLayout mixed = layout("seq-f16-fa1.bin");
  for (auto& v : mixed.v) v.type = layout("seq-bf16-fa0.bin").v[0].type;
  st = llama::CheckRestoreInto("chat.kv", *r, mixed);
  EXPECT_EQ(st.code(), Status::Code::kUnsupported);
  EXPECT_EQ(st.message(), "chat.kv: the server's K and V caches differ in type (f16/bf16): kvfile exports one type "
                          "for both; not restored");
}

}  // namespace
}  // namespace kvfile
