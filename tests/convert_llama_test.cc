// SPDX-License-Identifier: Apache-2.0
// The llama.cpp driver through the library (kvfile/convert.h and
// kvfile/formats/llama.h): llama.cpp's own state files (fixtures/llama/)
// imported and exported byte for byte, detection by magic, hostile files
// refused with one line, the pieces llama-server uses (an append of cells
// to an open writer, an export placed in a slot), interrupts and progress.
// The CLI's contract is in llama_state_test.
#include <gtest/gtest.h>

#include <filesystem>

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

}  // namespace
}  // namespace kvfile
