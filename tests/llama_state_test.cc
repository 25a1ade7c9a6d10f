// SPDX-License-Identifier: Apache-2.0
// Tests of src/llama_state.{h,cc}: the llama.cpp state file parser, row
// codecs, provenance and writer, on files built here byte by byte (the
// layout of docs/llama.md), every truncation and every bit flip of small
// ones; and of `kvfile convert` on the fixtures llama.cpp wrote
// (tests/fixtures/llama/, made by tools/llama_roundtrip/make_fixtures.sh).
#include "kvfile/formats/llama_state.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <gtest/gtest.h>

#include "kvfile/codec.h"
#include "support/cli_run.h"

namespace kvfile::llama {
namespace {

namespace fs = std::filesystem;
using kvfile::testing::Kvfile;
using kvfile::testing::ReadFile;

// A state file as the test builds it, independently of StateWriter.
struct Spec {
  bool session = false;
  uint32_t version = 0;  // 0: the right one
  int32_t k_type = 1, v_type = 1;  // ggml type ids
  bool v_trans = false;
  uint32_t layers = 2, k_width = 64, v_width = 64, cells = 5;
  uint32_t n_stream = 1, stream = 0;
  int32_t seq = 0, pos0 = 0;
  uint32_t tokens = 0xFFFFFFFF;  // token ids written (default: cells)
  // llama-server's token record around the ids (-1, version, n, ids,
  // media count) instead of the ids alone.
  bool server_record = false;
  uint32_t record_version = 1, record_media = 0, record_extra = 0;
  uint32_t caches = 1;           // llama.cpp iSWA models write two, one after the other
  uint32_t cells2 = 0;           // cells of the second cache (0: cells)
};

struct Bytes {
  std::string b;
  void U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<char>(v >> (8 * i)));
  }
  void U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) b.push_back(static_cast<char>(v >> (8 * i)));
  }
  void U16(uint16_t v) {
    b.push_back(static_cast<char>(v));
    b.push_back(static_cast<char>(v >> 8));
  }
};

// The value of cell c, element j of layer l's K (v: 1000 + ...), exact in
// every type the test uses (multiples of 1/8 below 16).
float Value(bool v, uint32_t l, uint32_t c, uint32_t j) {
  int x = static_cast<int>((l * 7 + c * 3 + j * 5 + (v ? 11 : 0)) % 97) - 48;
  return static_cast<float>(x) / 8.0f;
}

void Element(Bytes& o, int32_t type, float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (type == 0) o.U32(u);
  else if (type == 1) o.U16(codec::F32ToF16(x));
  else o.U16(static_cast<uint16_t>(u >> 16));  // bf16: exact for these values
}

// q8_0 rows as ggml writes them: every block holds a code of 127, so its
// scale is max|x| / 127 and decoding then encoding again gives the same bytes.
constexpr float kQ8Scale = 1.0f / 64;
int Q8Code(bool v, uint32_t l, uint32_t c, uint32_t j) {
  if (j % 32 == 0) return 127;
  return static_cast<int>((l * 7 + c * 3 + j * 5 + (v ? 11 : 0)) % 255) - 127;
}
float Q8Value(bool v, uint32_t l, uint32_t c, uint32_t j) { return kQ8Scale * static_cast<float>(Q8Code(v, l, c, j)); }

void Q8Row(Bytes& o, bool v, uint32_t l, uint32_t c, uint32_t width) {
  for (uint32_t b = 0; b < width / 32; ++b) {
    o.U16(codec::F32ToF16(kQ8Scale));
    for (uint32_t i = 0; i < 32; ++i) o.b.push_back(static_cast<char>(static_cast<int8_t>(Q8Code(v, l, c, b * 32 + i))));
  }
}

uint64_t RowSize(int32_t type, uint32_t width) { return type == 8 ? width / 32 * 34 : width * (type == 0 ? 4 : 2); }

std::string Build(const Spec& s) {
  Bytes o;
  o.U32(s.session ? 0x6767736e : 0x67677371);
  o.U32(s.version ? s.version : s.session ? 10 : 3);
  uint32_t nt = s.tokens == 0xFFFFFFFF ? s.cells : s.tokens;
  if (s.server_record) {
    o.U32(nt + 4 + s.record_extra);
    o.U32(0xFFFFFFFF);
    o.U32(s.record_version);
  }
  o.U32(nt);
  for (uint32_t i = 0; i < nt; ++i) o.U32(100 + i);
  if (s.server_record) {
    o.U32(s.record_media);
    for (uint32_t i = 0; i < s.record_extra; ++i) o.U32(0);
  }
  if (s.session) {
    o.U32(5);
    o.b += "llama";
  }
  for (uint32_t cache = 0; cache < s.caches; ++cache) {
    uint32_t cells = cache > 0 && s.cells2 ? s.cells2 : s.cells;
    o.U32(s.n_stream);
    for (uint32_t st = 0; st < s.n_stream; ++st) {
      if (st != s.stream) {
        o.U32(0);
        continue;
      }
      o.U32(cells);
      for (uint32_t c = 0; c < cells; ++c) {
        o.U32(static_cast<uint32_t>(s.pos0 + static_cast<int32_t>(c)));
        o.U32(1);
        o.U32(static_cast<uint32_t>(s.seq));
      }
      o.U32(s.v_trans ? 1 : 0);
      o.U32(s.layers);
      for (uint32_t l = 0; l < s.layers; ++l) {
        o.U32(static_cast<uint32_t>(s.k_type));
        o.U64(RowSize(s.k_type, s.k_width));
        for (uint32_t c = 0; c < cells; ++c) {
          if (s.k_type == 8) Q8Row(o, false, l, c, s.k_width);
          else
            for (uint32_t j = 0; j < s.k_width; ++j) Element(o, s.k_type, Value(false, l, c, j));
        }
      }
      for (uint32_t l = 0; l < s.layers; ++l) {
        o.U32(static_cast<uint32_t>(s.v_type));
        if (s.v_trans) {
          o.U32(s.v_type == 0 ? 4 : 2);
          o.U32(s.v_width);
          for (uint32_t j = 0; j < s.v_width; ++j)
            for (uint32_t c = 0; c < cells; ++c) Element(o, s.v_type, Value(true, l, c, j));
        } else {
          o.U64(RowSize(s.v_type, s.v_width));
          for (uint32_t c = 0; c < cells; ++c) {
            if (s.v_type == 8) Q8Row(o, true, l, c, s.v_width);
            else
              for (uint32_t j = 0; j < s.v_width; ++j) Element(o, s.v_type, Value(true, l, c, j));
          }
        }
      }
    }
  }
  return o.b;
}

// A read-only file in memory, for the sweeps.
class MemFile : public File {
 public:
  explicit MemFile(std::string bytes) : bytes_(std::move(bytes)) {}
  Status ReadAt(uint64_t offset, void* buf, size_t n) override {
    if (offset > bytes_.size() || n > bytes_.size() - offset) return Status::IOError("read past the end");
    std::memcpy(buf, bytes_.data() + offset, n);
    return Status::OK();
  }
  Status WriteAt(uint64_t, const void*, size_t) override { return Status::IOError("read only"); }
  Status Sync() override { return Status::OK(); }
  Status Truncate(uint64_t) override { return Status::IOError("read only"); }
  Status Size(uint64_t* size) override {
    *size = bytes_.size();
    return Status::OK();
  }
  Status LockExclusive() override { return Status::OK(); }
  Status Id(FileId* id) override {
    *id = {};
    return Status::OK();
  }
  const char* backend() const override { return "memory"; }
  const std::string& path() const override { return path_; }

 private:
  std::string bytes_;
  std::string path_ = "mem";
};

// One name per process: CTest runs each test of this file in its own
// process, two at a time, and a shared name let one test read the other's.
std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "llama_state_" + std::to_string(::getpid()) + "_" + name;
}

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

Status Parse(const std::string& bytes, StateLayout* out) {
  std::string path = TempPath("parse.bin");
  Write(path, bytes);
  std::unique_ptr<File> f;
  KVFILE_RETURN_IF_ERROR(FileSystem::Default()->Open(path, OpenMode::kRead, &f));
  return ParseState(*f, path, out);
}

// Parses `bytes`, reads every cell, writes a new file with StateWriter
// from what was read, and returns its bytes.
std::string Rewrite(const std::string& bytes) {
  std::string in = TempPath("rw_in.bin"), out = TempPath("rw_out.bin");
  Write(in, bytes);
  fs::remove(out);
  std::unique_ptr<File> f, g;
  EXPECT_TRUE(FileSystem::Default()->Open(in, OpenMode::kRead, &f).ok());
  StateLayout s;
  Status st = ParseState(*f, in, &s);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (!st.ok()) return "";
  WriteSpec w;
  w.kind = s.kind;
  w.arch = s.arch;
  w.n_stream = s.n_stream;
  w.stream = s.stream;
  w.seq_id = s.seq_id;
  w.first_pos = s.first_pos;
  w.v_trans = s.v_trans;
  w.k_type = s.k[0].type;
  w.v_type = s.v[0].type;
  w.layers = s.layers;
  if (s.cache_layers.size() > 1) w.cache_layers = s.cache_layers;
  w.k_width = s.k_width;
  w.v_width = s.v_width;
  w.server_tokens = s.server_tokens;
  EXPECT_TRUE(CheckWriteSpec(w).ok());
  EXPECT_TRUE(FileSystem::Default()->Open(out, OpenMode::kCreateExclusive, &g).ok());
  StateWriter sw(g.get(), w, s.cells);
  EXPECT_TRUE(sw.Header(s.tokens).ok());
  for (int part = 0; part < 2; ++part)
    for (uint32_t l = 0; l < s.layers; ++l) {
      // Two blocks, to cover writes at an offset.
      uint32_t mid = s.cells / 2;
      std::vector<float> vals(uint64_t{s.cells} * (part ? s.v_width : s.k_width));
      EXPECT_TRUE(ReadCells(*f, s, part == 1, l, 0, mid, vals.data()).ok());
      EXPECT_TRUE(ReadCells(*f, s, part == 1, l, mid, s.cells, vals.data() + mid * (part ? s.v_width : s.k_width)).ok());
      EXPECT_TRUE(sw.Rows(part == 1, l, 0, mid, vals.data()).ok());
      EXPECT_TRUE(sw.Rows(part == 1, l, mid, s.cells - mid, vals.data() + mid * (part ? s.v_width : s.k_width)).ok());
    }
  EXPECT_EQ(StateFileSize(w, s.cells), bytes.size());
  g.reset();
  return ReadFile(out);
}

TEST(LlamaState, ParsesASequenceFile) {
  Spec sp;
  sp.cells = 6;
  sp.k_width = 128;
  sp.v_width = 64;
  StateLayout s;
  ASSERT_TRUE(Parse(Build(sp), &s).ok());
  EXPECT_EQ(s.kind, FileKind::kSequence);
  EXPECT_EQ(s.version, 3u);
  EXPECT_EQ(s.tokens, (std::vector<uint32_t>{100, 101, 102, 103, 104, 105}));
  EXPECT_EQ(s.cells, 6u);
  EXPECT_EQ(s.layers, 2u);
  EXPECT_EQ(s.k_width, 128u);
  EXPECT_EQ(s.v_width, 64u);
  EXPECT_FALSE(s.v_trans);
  EXPECT_EQ(s.k[0].type, CacheType::kF16);
  // magic, version, count, 6 ids, stream count, cell count, 6 cells, v_trans, layers, K type + row size
  EXPECT_EQ(s.k[0].offset, 12u + 24 + 4 + 4 + 72 + 8 + 12);
  EXPECT_EQ(s.k[1].offset, s.k[0].offset + 6 * 256 + 12);
}

TEST(LlamaState, ParsesASessionFileWithStreamsAndPositions) {
  Spec sp;
  sp.session = true;
  sp.n_stream = 3;
  sp.stream = 1;
  sp.seq = 1;
  sp.pos0 = 40;
  StateLayout s;
  ASSERT_TRUE(Parse(Build(sp), &s).ok());
  EXPECT_EQ(s.kind, FileKind::kSession);
  EXPECT_EQ(s.version, 10u);
  EXPECT_EQ(s.arch, "llama");
  EXPECT_EQ(s.n_stream, 3u);
  EXPECT_EQ(s.stream, 1u);
  EXPECT_EQ(s.seq_id, 1);
  EXPECT_EQ(s.first_pos, 40);
}

TEST(LlamaState, ReadsEveryCacheTypeAndTransposedV) {
  for (int32_t type : {0, 1, 30, 8})
    for (bool vt : {false, true}) {
      if (type == 8 && vt) continue;  // llama.cpp does not transpose a quantized V
      Spec sp;
      sp.k_type = sp.v_type = type;
      sp.v_trans = vt;
      sp.cells = 7;
      std::string bytes = Build(sp);
      std::string path = TempPath("read.bin");
      Write(path, bytes);
      std::unique_ptr<File> f;
      ASSERT_TRUE(FileSystem::Default()->Open(path, OpenMode::kRead, &f).ok());
      StateLayout s;
      ASSERT_TRUE(ParseState(*f, path, &s).ok()) << type << " " << vt;
      for (bool v : {false, true})
        for (uint32_t l = 0; l < 2; ++l) {
          std::vector<float> got(3 * 64);
          ASSERT_TRUE(ReadCells(*f, s, v, l, 2, 5, got.data()).ok());
          for (uint32_t c = 0; c < 3; ++c)
            for (uint32_t j = 0; j < 64; ++j)
              ASSERT_EQ(got[c * 64 + j], type == 8 ? Q8Value(v, l, c + 2, j) : Value(v, l, c + 2, j)) << "type " << type << " v_trans " << vt << " v " << v;
        }
    }
}

TEST(LlamaState, WriterReproducesTheFileExactly) {
  for (int32_t type : {0, 1, 30, 8})
    for (bool vt : {false, true})
      for (bool session : {false, true}) {
        if (type == 8 && vt) continue;
        Spec sp;
        sp.k_type = sp.v_type = type;
        sp.v_trans = vt;
        sp.session = session;
        sp.n_stream = 3;
        sp.stream = 2;
        sp.seq = 2;
        sp.pos0 = 9;
        sp.cells = 9;
        std::string bytes = Build(sp), got = Rewrite(bytes);
        size_t diff = std::mismatch(bytes.begin(), bytes.end(), got.begin(), got.end()).first - bytes.begin();
        EXPECT_EQ(got.size(), bytes.size());
        EXPECT_EQ(diff, bytes.size()) << "type " << type << " v_trans " << vt << " session " << session;
      }
}

// llama-server's slot files hold its serialized token record (tools/server,
// server_tokens::serialize): the ids are read out of it, and the writer puts
// the same record back, so the rewritten file is the server's byte for byte.
TEST(LlamaState, ServerTokenRecordIsReadAndWrittenBack) {
  for (bool session : {false, true}) {
    Spec sp;
    sp.session = session;
    sp.cells = 6;
    sp.server_record = true;
    StateLayout s;
    std::string bytes = Build(sp);
    ASSERT_TRUE(Parse(bytes, &s).ok());
    EXPECT_TRUE(s.server_tokens);
    EXPECT_EQ(s.tokens, (std::vector<uint32_t>{100, 101, 102, 103, 104, 105}));
    EXPECT_EQ(s.cells, 6u);
    EXPECT_EQ(Rewrite(bytes), bytes) << "session " << session;
  }
  Provenance p;
  p.server_tokens = true;
  std::string id = FormatModelId(p);
  EXPECT_EQ(id, "llama.cpp:seq0 k=f16 v=f16 v_trans=0 stream=0/1 seq=0 pos=0 tokens=server rotated=unknown");
  ASSERT_TRUE(ParseModelId(id));
  EXPECT_TRUE(ParseModelId(id)->server_tokens);
  EXPECT_FALSE(ParseModelId("llama.cpp:seq3 k=f16 v=f16 tokens=media"));
}

TEST(LlamaState, ServerTokenRecordsKvfileCannotImportAreRefused) {
  struct Case {
    uint32_t version, media, extra;
    bool corruption;
    const char* message;
  };
  const Case cases[] = {
      {2, 0, 0, false, ": llama.cpp sequence state: llama-server token record version 2 (kvfile reads version 1)"},
      {1, 1, 0, false, ": llama.cpp sequence state: llama-server token record: 1 media chunks (kvfile imports text "
                       "tokens only)"},
      {1, 0, 2, true, ": llama.cpp sequence state: llama-server token record: 2 values after the record"},
  };
  for (const Case& c : cases) {
    Spec sp;
    sp.server_record = true;
    sp.record_version = c.version;
    sp.record_media = c.media;
    sp.record_extra = c.extra;
    StateLayout s;
    Status st = Parse(Build(sp), &s);
    EXPECT_EQ(st.code(), c.corruption ? Status::Code::kCorruption : Status::Code::kUnsupported) << st.ToString();
    EXPECT_EQ(st.message(), TempPath("parse.bin") + c.message);
  }
}

TEST(LlamaState, Q8EncodingIsGgmlsReference) {
  // max|x| = 2.54: d = 0.02, so x = k * 0.02 encodes as k (f16 d = 0.02 rounded).
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(i * 8 - 127) * 0.02f;
  x[31] = 2.54f;
  std::vector<uint8_t> out(34);
  EncodeRow(CacheType::kQ8_0, x.data(), 32, out.data());
  uint16_t d = static_cast<uint16_t>(out[0] | out[1] << 8);
  EXPECT_EQ(d, codec::F32ToF16(2.54f / 127.0f));
  for (int i = 0; i < 31; ++i) EXPECT_EQ(static_cast<int8_t>(out[2 + i]), i * 8 - 127) << i;
  EXPECT_EQ(static_cast<int8_t>(out[33]), 127);
  // A block of zeros: scale 0, codes 0.
  std::vector<float> z(32, 0.0f);
  EncodeRow(CacheType::kQ8_0, z.data(), 32, out.data());
  EXPECT_EQ(out, std::vector<uint8_t>(34, 0));
  // Decoding and encoding again gives the same bytes back.
  EncodeRow(CacheType::kQ8_0, x.data(), 32, out.data());
  std::vector<float> back(32);
  DecodeRow(CacheType::kQ8_0, out.data(), 32, back.data());
  std::vector<uint8_t> again(34);
  EncodeRow(CacheType::kQ8_0, back.data(), 32, again.data());
  EXPECT_EQ(again, out);
}

TEST(LlamaState, ProvenanceRoundTrips) {
  Provenance p;
  p.kind = FileKind::kSession;
  p.version = 10;
  p.arch = "llama";
  p.k_type = CacheType::kQ8_0;
  p.v_type = CacheType::kBF16;
  p.v_trans = true;
  p.n_stream = 4;
  p.stream = 3;
  p.seq_id = 3;
  p.first_pos = 17;
  std::string id = FormatModelId(p);
  EXPECT_EQ(id, "llama.cpp:session10 arch=llama k=q8_0 v=bf16 v_trans=1 stream=3/4 seq=3 pos=17 rotated=unknown");
  std::optional<Provenance> q = ParseModelId(id);
  ASSERT_TRUE(q);
  EXPECT_EQ(q->kind, p.kind);
  EXPECT_EQ(q->version, 10u);
  EXPECT_EQ(q->arch, "llama");
  EXPECT_EQ(q->k_type, CacheType::kQ8_0);
  EXPECT_EQ(q->v_type, CacheType::kBF16);
  EXPECT_TRUE(q->v_trans);
  EXPECT_EQ(q->n_stream, 4u);
  EXPECT_EQ(q->stream, 3u);
  EXPECT_EQ(q->seq_id, 3);
  EXPECT_EQ(q->first_pos, 17);
  EXPECT_FALSE(ParseModelId("meta-llama/Llama-3.1-8B"));
  EXPECT_FALSE(ParseModelId("llama.cpp:seq3 k=q4_0"));
  EXPECT_FALSE(ParseModelId("llama.cpp:seq3 stream=4/4"));
  EXPECT_FALSE(ParseModelId("llama.cpp:"));
}

// ggml_gen_hadamard's matrix: entry (i, j) is (-1)^popcount(i & j) / sqrt(n);
// applying it twice gives the input back.
TEST(LlamaState, HadamardIsGgmlsOrthonormalMatrix) {
  for (uint32_t n : {64u, 128u, 256u}) {
    for (uint32_t j : {0u, 1u, 5u, n - 1}) {
      std::vector<float> e(2 * n, 0.0f);
      e[n + j] = 1.0f;  // the second block of a row of two
      Hadamard(e.data(), e.size(), n);
      for (uint32_t i = 0; i < n; ++i) {
        ASSERT_EQ(e[i], 0.0f);
        float want = (__builtin_popcount(i & j) % 2 ? -1.0f : 1.0f) / std::sqrt(static_cast<float>(n));
        ASSERT_NEAR(e[n + i], want, 1e-7f) << n << " " << i << " " << j;
      }
    }
    std::mt19937 rng(n);
    std::normal_distribution<float> d;
    std::vector<float> x(3 * n), y;
    for (float& v : x) v = d(rng);
    y = x;
    Hadamard(y.data(), y.size(), n);
    Hadamard(y.data(), y.size(), n);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(y[i], x[i], 1e-5f);
  }
  // Which rows llama.cpp rotates, and in which blocks.
  EXPECT_TRUE(RotatesRows(CacheType::kQ8_0, 64));
  EXPECT_TRUE(RotatesRows(CacheType::kQ8_0, 192));
  EXPECT_FALSE(RotatesRows(CacheType::kQ8_0, 32));
  EXPECT_FALSE(RotatesRows(CacheType::kF16, 128));
  EXPECT_FALSE(RotatesRows(CacheType::kBF16, 64));
  EXPECT_EQ(RotationBlock(false, 64), 64u);
  EXPECT_EQ(RotationBlock(false, 128), 128u);
  EXPECT_EQ(RotationBlock(false, 192), 64u);
  EXPECT_EQ(RotationBlock(false, 256), 256u);
  EXPECT_EQ(RotationBlock(true, 128), 64u);
}

// Two caches (an iSWA model's) with the same cells parse into one layout of
// both caches' layers, and the writer writes them back byte for byte.
TEST(LlamaState, TwoCachesParseAndWriteBack) {
  Spec sp;
  sp.caches = 2;
  sp.layers = 2;
  std::string bytes = Build(sp);
  StateLayout s;
  Status st = Parse(bytes, &s);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(s.layers, 4u);
  EXPECT_EQ(s.cache_layers, (std::vector<uint32_t>{2, 2}));
  EXPECT_EQ(Rewrite(bytes), bytes);
  // A second cache of other positions, or of another shape, is refused.
  auto two = [](const Spec& a, const Spec& b) {
    return Build(a) + Build(b).substr(12 + 4 * b.cells);  // b's cache after a's (b's header and ids dropped)
  };
  Spec moved = sp;
  moved.caches = 1;
  Spec other = moved;
  other.pos0 = 7;
  st = Parse(two(moved, other), &s);
  EXPECT_EQ(st.code(), Status::Code::kUnsupported);
  EXPECT_NE(st.ToString().find(": cells of sequence 0 from position 7, the first cache's of sequence 0 from 0 (kvfile "
                               "needs the same cells in both caches)"),
            std::string::npos)
      << st.ToString();
  other = moved;
  other.k_width = 96;
  st = Parse(two(moved, other), &s);
  EXPECT_EQ(st.code(), Status::Code::kUnsupported);
  EXPECT_NE(st.ToString().find(": K f16 x 96, V f16 x 64 differ from the first cache's (K f16 x 64, V f16 x 64); "
                               "kvfile needs the same shape in every layer"),
            std::string::npos)
      << st.ToString();
  // A second cache that kept fewer cells (a sliding window) is refused, naming why.
  sp.cells2 = 3;
  st = Parse(Build(sp), &s);
  EXPECT_EQ(st.code(), Status::Code::kUnsupported);
  EXPECT_NE(st.ToString().find(": holds 3 cells in stream 0, the first cache 5 in stream 0: a sliding-window cache "
                               "(llama.cpp iSWA) that dropped the positions outside its window; kvfile stores every "
                               "position in every layer"),
            std::string::npos)
      << st.ToString();
}

TEST(LlamaState, ProvenanceRecordsCachesAndRotation) {
  Provenance p;
  p.version = 3;
  p.k_type = CacheType::kQ8_0;
  p.cache_layers = {2, 3};
  p.rotated = Rotation::kYes;
  std::string id = FormatModelId(p);
  EXPECT_EQ(id, "llama.cpp:seq3 k=q8_0 v=f16 v_trans=0 stream=0/1 seq=0 pos=0 caches=2+3 rotated=yes");
  std::optional<Provenance> q = ParseModelId(id);
  ASSERT_TRUE(q);
  EXPECT_EQ(q->cache_layers, (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(q->rotated, Rotation::kYes);
  EXPECT_EQ(StreamRotation(*q, false, 64), Rotation::kYes);
  EXPECT_EQ(StreamRotation(*q, true, 64), Rotation::kNo);   // an f16 V is never rotated
  EXPECT_EQ(StreamRotation(*q, false, 32), Rotation::kNo);  // nor heads of 32
  EXPECT_EQ(ParseModelId("llama.cpp:seq3 k=q8_0 v=q8_0 rotated=no")->rotated, Rotation::kNo);
  EXPECT_EQ(ParseModelId("llama.cpp:seq3 k=q8_0 v=q8_0")->rotated, Rotation::kUnknown);
  EXPECT_FALSE(ParseModelId("llama.cpp:seq3 caches=2"));
  EXPECT_FALSE(ParseModelId("llama.cpp:seq3 caches=2+0"));
}

// ReadModelHeads on llama.cpp's model file; every prefix of its metadata is
// refused, and every bit flip in it refused or read without harm.
TEST(LlamaState, ModelHeadsFromGguf) {
  std::string gguf = ReadFile(fs::path(KVFILE_TEST_DATA) / "fixtures" / "llama" / "tiny.gguf");
  auto read = [](const std::string& bytes, ModelHeads* m) {
    auto f = std::make_unique<MemFile>(bytes);
    return ReadModelHeads(*f, "m.gguf", m);
  };
  ModelHeads m;
  Status st = read(gguf, &m);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(m.arch, "llama");
  EXPECT_EQ(m.k_head, 64u);
  EXPECT_EQ(m.v_head, 64u);
  size_t whole = 0;  // the shortest prefix that holds all the metadata
  while (!read(gguf.substr(0, whole), &m).ok()) ++whole;
  EXPECT_GT(whole, 100u);
  for (size_t n = 0; n < whole; ++n) {
    st = read(gguf.substr(0, n), &m);
    ASSERT_TRUE(st.code() == Status::Code::kCorruption || st.code() == Status::Code::kUnsupported)
        << n << ": " << st.ToString();
  }
  for (size_t bit = 0; bit < whole * 8; ++bit) {
    std::string b = gguf.substr(0, whole);
    b[bit / 8] = static_cast<char>(b[bit / 8] ^ (1 << (bit % 8)));
    st = read(b, &m);
    ASSERT_TRUE(st.ok() || st.code() == Status::Code::kCorruption || st.code() == Status::Code::kUnsupported)
        << bit << ": " << st.ToString();
  }
}

struct Refusal {
  const char* what;
  Spec spec;
  Status::Code code;
  const char* message;  // a part of the error message
};

TEST(LlamaState, RefusesWhatItCannotImport) {
  Spec base;
  std::vector<Refusal> cases;
  {
    Spec s = base;
    s.version = 2;
    cases.push_back({"old version", s, Status::Code::kUnsupported, "sequence state version 2 (kvfile reads version 3"});
  }
  {
    Spec s = base;
    s.session = true;
    s.version = 9;
    cases.push_back({"old session", s, Status::Code::kUnsupported, "session version 9"});
  }
  {
    Spec s = base;
    s.k_type = 2;  // q4_0
    cases.push_back({"q4_0", s, Status::Code::kUnsupported, "layer 0 K: ggml type 2"});
  }
  {
    Spec s = base;
    s.tokens = 4;
    cases.push_back({"tokens != cells", s, Status::Code::kUnsupported, "4 token ids for 5 cache cells"});
  }
  for (const Refusal& c : cases) {
    std::string bytes = Build(c.spec);
    StateLayout s;
    Status st = Parse(bytes, &s);
    EXPECT_EQ(st.code(), c.code) << c.what << ": " << st.ToString();
    EXPECT_NE(st.ToString().find(c.message), std::string::npos) << c.what << ": " << st.ToString();
  }
  // Trailing bytes, and a cell out of order.
  std::string bytes = Build(base) + "x";
  StateLayout s;
  Status st = Parse(bytes, &s);
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_NE(st.ToString().find("1 bytes after the end of the cache data"), std::string::npos) << st.ToString();
  bytes = Build(base);
  bytes[12 + 20 + 8 + 24] = 9;  // the position of cell 2 (after magic..ids, streams, cells 0-1)
  st = Parse(bytes, &s);
  EXPECT_EQ(st.code(), Status::Code::kUnsupported);
  EXPECT_NE(st.ToString().find("cell 2 has position 9"), std::string::npos) << st.ToString();
}

// Every proper prefix of a file is refused as truncated.
// With two caches, the prefix that ends where the first cache ends is a
// whole one-cache file, and parses as one.
TEST(LlamaState, EveryTruncationIsRefused) {
  for (uint32_t caches : {1u, 2u})
    for (bool session : {false, true})
      for (bool vt : {false, true}) {
        Spec sp;
        sp.session = session;
        sp.v_trans = vt;
        sp.cells = 3;
        sp.k_width = sp.v_width = 32;
        sp.n_stream = 2;
        Spec one = sp;
        sp.caches = caches;
        std::string bytes = Build(sp);
        size_t whole_first = Build(one).size();
        StateLayout s;
        ASSERT_TRUE(Parse(bytes, &s).ok());
        ASSERT_EQ(s.cache_layers.size(), caches);
        std::string path = TempPath("trunc.bin");
        Write(path, bytes);
        std::unique_ptr<File> f;
        ASSERT_TRUE(FileSystem::Default()->Open(path, OpenMode::kRead, &f).ok());
        // Shortest last: truncate(2) only shrinks then (growing would fill with zeros).
        for (size_t n = bytes.size(); n-- > 0;) {
          ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(n)), 0);
          Status st = ParseState(*f, path, &s);
          if (caches == 2 && n == whole_first) {
            ASSERT_TRUE(st.ok()) << st.ToString();
            ASSERT_EQ(s.cache_layers.size(), 1u);
            continue;
          }
          ASSERT_FALSE(st.ok()) << n;
          ASSERT_TRUE(st.code() == Status::Code::kCorruption || st.code() == Status::Code::kUnsupported)
              << n << ": " << st.ToString();
        }
      }
}

// Every single-bit flip: refused with a data error, or parsed into a layout
// that fills the file exactly and reads without error.
TEST(LlamaState, EveryBitFlipIsRefusedOrConsistent) {
  for (uint32_t caches : {1u, 2u}) {
    Spec sp;
    sp.session = true;
    sp.cells = 2;
    sp.k_width = sp.v_width = 32;
    sp.layers = 1;
    sp.caches = caches;
    std::string bytes = Build(sp);
    size_t accepted = 0;
    for (size_t bit = 0; bit < bytes.size() * 8; ++bit) {
      std::string b = bytes;
      b[bit / 8] = static_cast<char>(b[bit / 8] ^ (1 << (bit % 8)));
      auto f = std::make_unique<MemFile>(b);
      StateLayout s;
      Status st = ParseState(*f, "flip", &s);
      if (!st.ok()) {
        ASSERT_TRUE(st.code() == Status::Code::kCorruption || st.code() == Status::Code::kUnsupported)
            << bit << ": " << st.ToString();
        continue;
      }
      ++accepted;
      std::vector<float> vals(uint64_t{s.cells} * std::max(s.k_width, s.v_width));
      for (bool v : {false, true})
        for (uint32_t l = 0; l < s.layers; ++l) ASSERT_TRUE(ReadCells(*f, s, v, l, 0, s.cells, vals.data()).ok()) << bit;
    }
    // The flips in token ids and values are accepted (nothing checks them);
    // those in the structure are not.
    EXPECT_GT(accepted, 0u);
    EXPECT_LT(accepted, bytes.size() * 8);
  }
}

// ---- The CLI on llama.cpp's own files ---------------------------------------------------------

const fs::path kFixtures = fs::path(KVFILE_TEST_DATA) / "fixtures" / "llama";

std::string Out(const std::string& name) {
  std::string p = TempPath(name);
  fs::remove(p);
  return p;
}

// A raw import exported in the cache's own type is the file llama.cpp wrote,
// byte for byte.
TEST(LlamaConvert, RawImportExportReproducesLlamaCppFiles) {
  struct F {
    const char* file;
    const char* type;
    const char* format;
  };
  const F files[] = {{"seq-f16-fa1.bin", "f16", "llama-seq"},   {"seq-f16-fa0.bin", "f16", "llama-seq"},
                     {"seq-bf16-fa1.bin", "bf16", "llama-seq"}, {"seq-bf16-fa0.bin", "bf16", "llama-seq"},
                     {"seq-f32-fa1.bin", "f32", "llama-seq"},   {"seq-f32-fa0.bin", "f32", "llama-seq"},
                     {"seq-q8_0-fa1.bin", "q8_0", "llama-seq"}, {"session-f16-fa0.bin", "f16", "llama-session"},
                     // llama-server's slot file (its token record; tests/llama_server's model, turn 1)
                     {"server-slot-f16.bin", "f16", "llama-seq"}};
  for (const F& f : files) {
    fs::path in = kFixtures / f.file;
    ASSERT_TRUE(fs::exists(in)) << in;
    std::string kv = Out(std::string(f.file) + ".kv"), back = Out(std::string(f.file) + ".back");
    auto r = Kvfile("convert " + in.string() + " " + kv + " --keep-raw k,v --head-size 64");
    ASSERT_EQ(r.exit_code, 0) << f.file << ": " << r.err;
    EXPECT_EQ(r.err, "");
    r = Kvfile("verify " + kv);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    r = Kvfile("convert " + kv + " " + back + " --format " + f.format + " --dtype " + f.type);
    ASSERT_EQ(r.exit_code, 0) << f.file << ": " << r.err;
    EXPECT_EQ(ReadFile(back), ReadFile(in)) << f.file;
  }
}

TEST(LlamaConvert, ImportRecordsProvenanceAndGeometry) {
  std::string kv = Out("prov.kv");
  auto r = Kvfile("convert " + (kFixtures / "seq-q8_0-fa1.bin").string() + " " + kv + " --head-size 64");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Kvfile("info " + kv + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("llama.cpp:seq3 k=q8_0 v=q8_0 v_trans=0 stream=0/1 seq=0 pos=0 rotated=unknown"),
            std::string::npos)
      << r.out;
  // A head size that does not divide the 128 values per token is refused
  // (usage: the file is fine), and nothing is written.
  std::string kv2 = Out("prov2.kv");
  r = Kvfile("convert " + (kFixtures / "seq-f16-fa1.bin").string() + " " + kv2 + " --head-size 48");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--head-size 48 does not divide the 128 K and 128 V values per token"), std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(kv2));
}

// Hostile llama.cpp files: exit 1, one error line naming the file, no OUT.
TEST(LlamaConvert, HostileFilesAreRefusedWithOneLine) {
  std::string good = ReadFile(kFixtures / "seq-f16-fa0.bin");
  ASSERT_GT(good.size(), 100u);
  struct Case {
    std::string name, bytes, message;
  };
  std::string bad_version = good;
  bad_version[4] = 2;
  std::string bad_row = good;
  // The K row size of layer 0: after 3 u32, the ids, stream count, cell count, cells, v_trans, layers and K type.
  uint32_t n = static_cast<uint8_t>(good[8]);
  size_t row_at = 12 + 4 * n + 8 + 12 * n + 8 + 4;
  bad_row[row_at] = static_cast<char>(bad_row[row_at] + 1);  // an odd number of f16 bytes
  std::string long_row = good;
  long_row[row_at] = static_cast<char>(long_row[row_at] + 2);  // 129 f16 values: the next header is misread
  const Case cases[] = {
      {"trunc", good.substr(0, good.size() - 1), "truncated"},
      {"version", bad_version, "sequence state version 2 (kvfile reads version 3"},
      {"row", bad_row, "layer 0 K: row size 257 is not a whole number of f16 values"},
      {"long_row", long_row, "layer 0 K: row size 258 x 24 cells ends at byte 6616, where K of layer 1 would begin but ggml type "
                           "925052996 is: that size or the header after it is damaged"},
      {"tail", good + std::string(4, '\0'), "4 bytes after the end of the cache data"},
  };
  for (const Case& c : cases) {
    std::string in = TempPath("hostile_" + c.name + ".bin"), out = Out("hostile_" + c.name + ".kv");
    Write(in, c.bytes);
    auto r = Kvfile("convert " + in + " " + out + " --head-size 64");
    EXPECT_EQ(r.exit_code, 1) << c.name << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.rfind("kvfile: error: " + in + ": ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.name << ": " << r.err;
    EXPECT_FALSE(fs::exists(out)) << c.name;
  }
}

// Runs `args`, expects exit 2 (the request, not the file, is at fault) and
// exactly `line` on stderr, and that `out` was not written.
void ExpectRefused(const std::string& args, int code, const std::string& line, const std::string& out) {
  auto r = Kvfile(args);
  EXPECT_EQ(r.exit_code, code) << args << ": " << r.err;
  EXPECT_EQ(r.err, "kvfile: error: " + line + "\n") << args;
  EXPECT_FALSE(fs::exists(out)) << args;
}

std::string ModelId(const std::string& kv) {
  auto r = Kvfile("info " + kv + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  size_t at = r.out.find("llama.cpp:");
  return at == std::string::npos ? "" : r.out.substr(at, r.out.find('"', at) - at);
}

// The file records no head size: without --head-size the import is refused
// with a line that says how to give it (it used to assume 128).
TEST(LlamaConvert, HeadSizeIsNeverGuessed) {
  std::string in = (kFixtures / "seq-f16-fa1.bin").string(), kv = Out("nohead.kv");
  ExpectRefused("convert " + in + " " + kv, 2,
                in + ": a llama.cpp state file does not record the head size of its 128 K and 128 V values per "
                     "token: give --model MODEL.gguf, or --head-size (the model's values per KV head, its GGUF's "
                     "attention.key_length, or embedding_length / head_count)",
                kv);
  auto r = Kvfile("convert " + in + " " + kv + " --head-size 64");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("; k 2 x 64 e4m3, v 2 x 64 e4m3;"), std::string::npos) << r.out;
}

// A file named .kv that holds a llama.cpp state is imported, not read as a damaged .kv.
TEST(LlamaConvert, MagicDecidesBeforeTheName) {
  std::string slot = TempPath("slot.kv"), kv = Out("slot-imported.kv");
  Write(slot, ReadFile(kFixtures / "seq-f16-fa1.bin"));
  auto r = Kvfile("convert " + slot + " " + kv + " --head-size 64");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind(slot + " -> " + kv + ": 24 tokens; 2 layers; sequence state of f16/f16 cache;", 0), 0u)
      << r.out;
  // As an OUT, the name decides: --force replaces it with a .kv.
  r = Kvfile("convert " + kv + " " + slot + " --force");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Kvfile("verify " + slot).exit_code, 0);
}

// Float caches are recorded as unrotated; a quantized one as the user says
// (else unknown); contradictions are refused.
TEST(LlamaConvert, RotationIsRecorded) {
  std::string f16 = (kFixtures / "seq-f16-fa1.bin").string(), q8 = (kFixtures / "seq-q8_0-fa1.bin").string();
  std::string kv = Out("rot.kv");
  ASSERT_EQ(Kvfile("convert " + f16 + " " + kv + " --head-size 64").exit_code, 0);
  EXPECT_EQ(ModelId(kv), "llama.cpp:seq3 k=f16 v=f16 v_trans=0 stream=0/1 seq=0 pos=0 rotated=no");
  ASSERT_EQ(Kvfile("convert " + q8 + " " + kv + " --head-size 64 --force").exit_code, 0);
  EXPECT_EQ(ModelId(kv), "llama.cpp:seq3 k=q8_0 v=q8_0 v_trans=0 stream=0/1 seq=0 pos=0 rotated=unknown");
  auto r = Kvfile("convert " + q8 + " " + kv + " --head-size 64 --force --rotated yes");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("; rotated yes; k 2 x 64 e4m3"), std::string::npos) << r.out;
  EXPECT_EQ(ModelId(kv), "llama.cpp:seq3 k=q8_0 v=q8_0 v_trans=0 stream=0/1 seq=0 pos=0 rotated=yes");
  ASSERT_EQ(Kvfile("convert " + q8 + " " + kv + " --head-size 64 --force --rotated no").exit_code, 0);
  EXPECT_EQ(ModelId(kv), "llama.cpp:seq3 k=q8_0 v=q8_0 v_trans=0 stream=0/1 seq=0 pos=0 rotated=no");
  // Heads of 32: llama.cpp cannot have rotated them, so no is recorded.
  ASSERT_EQ(Kvfile("convert " + q8 + " " + kv + " --head-size 32 --force").exit_code, 0);
  EXPECT_EQ(ModelId(kv), "llama.cpp:seq3 k=q8_0 v=q8_0 v_trans=0 stream=0/1 seq=0 pos=0 rotated=no");
  std::string no = Out("rot-refused.kv");
  ExpectRefused("convert " + f16 + " " + no + " --head-size 64 --rotated yes", 2,
                f16 + ": --rotated yes: llama.cpp rotates only quantized (q8_0) rows with head sizes that are "
                      "multiples of 64, and this is a f16/f16 cache with --head-size 64: its rows are never rotated",
                no);
  ExpectRefused("convert " + f16 + " " + no + " --head-size 64 --unrotate", 2,
                f16 + ": --unrotate: llama.cpp rotates only quantized (q8_0) rows with head sizes that are "
                      "multiples of 64, and this is a f16/f16 cache with --head-size 64: its rows are never rotated",
                no);
  ExpectRefused("convert " + q8 + " " + no + " --head-size 32 --rotated yes", 2,
                q8 + ": --rotated yes: llama.cpp rotates only quantized (q8_0) rows with head sizes that are "
                     "multiples of 64, and this is a q8_0/q8_0 cache with --head-size 32: its rows are never rotated",
                no);
  ExpectRefused("convert " + q8 + " " + no + " --head-size 64 --unrotate --rotated no", 2,
                q8 + ": --unrotate with --rotated no: the rows are not rotated", no);
}

// Values of one layer's K and V as a llama.cpp file holds them.
std::vector<float> Cells(const std::string& path, bool v, uint32_t layer, uint32_t* width) {
  std::unique_ptr<File> f;
  EXPECT_TRUE(FileSystem::Default()->Open(path, OpenMode::kRead, &f).ok());
  StateLayout s;
  Status st = ParseState(*f, path, &s);
  EXPECT_TRUE(st.ok()) << st.ToString();
  *width = v ? s.v_width : s.k_width;
  std::vector<float> x(uint64_t{s.cells} * *width);
  EXPECT_TRUE(ReadCells(*f, s, v, layer, 0, s.cells, x.data()).ok());
  return x;
}

// Largest |a - b| over the largest |b|.
float RelError(const std::vector<float>& a, const std::vector<float>& b) {
  float d = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::fabs(a[i] - b[i]));
    m = std::max(m, std::fabs(b[i]));
  }
  return d / m;
}

// --unrotate undoes llama.cpp's own rotation: the q8_0 file's rows, un-rotated,
// are the keys and values of the f32 cache of the same run within q8_0's
// error, and so are those of the q8_0 file saved with LLAMA_ATTN_ROT_DISABLE=1;
// the rotated rows are not. An export of a rotated=yes import into an f16
// file un-rotates them the same way.
TEST(LlamaConvert, UnrotateMatchesLlamaCppsRotation) {
  std::string q8 = (kFixtures / "seq-q8_0-fa1.bin").string();
  std::string plain = Out("unrot.kv"), plain_bin = Out("unrot.bin"), rot = Out("rot-yes.kv"), rot_bin = Out("rot-yes.bin");
  auto r = Kvfile("convert " + q8 + " " + plain + " --head-size 64 --keep-raw k,v --unrotate");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("; rotated yes, stored un-rotated; k 2 x 64 f32, v 2 x 64 f32;"), std::string::npos) << r.out;
  EXPECT_EQ(ModelId(plain), "llama.cpp:seq3 k=q8_0 v=q8_0 v_trans=0 stream=0/1 seq=0 pos=0 rotated=no");
  r = Kvfile("convert " + plain + " " + plain_bin + " --format llama-seq --dtype f32");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  ASSERT_EQ(Kvfile("convert " + q8 + " " + rot + " --head-size 64 --keep-raw k,v --rotated yes").exit_code, 0);
  r = Kvfile("convert " + rot + " " + rot_bin + " --format llama-seq --dtype f32");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_NE(r.out.find("f32 cache; k rows un-rotated; v rows un-rotated;"), std::string::npos) << r.out;
  EXPECT_EQ(ReadFile(rot_bin), ReadFile(plain_bin));
  for (bool v : {false, true})
    for (uint32_t l = 0; l < 2; ++l) {
      uint32_t w = 0;
      std::vector<float> truth = Cells((kFixtures / "seq-f32-fa1.bin").string(), v, l, &w);
      std::vector<float> unrotated = Cells(plain_bin, v, l, &w);
      std::vector<float> rotated = Cells(q8, v, l, &w);
      std::vector<float> norot = Cells((kFixtures / "seq-q8_0-fa1-norot.bin").string(), v, l, &w);
      EXPECT_LT(RelError(unrotated, truth), 0.03f) << v << l;
      EXPECT_LT(RelError(norot, truth), 0.03f) << v << l;
      EXPECT_GT(RelError(rotated, truth), 0.5f) << v << l;
    }
}

// Rows known to be rotated are not handed out as plain keys; rows that may
// be are handed out with a warning; no warning where no rotation can have
// happened.
TEST(LlamaConvert, RotatedRowsAreNotExportedAsPlain) {
  std::string q8 = (kFixtures / "seq-q8_0-fa1.bin").string();
  std::string kv = Out("plain.kv"), st = Out("plain.safetensors"), bin = Out("plain.bin");
  ASSERT_EQ(Kvfile("convert " + q8 + " " + kv + " --head-size 64 --rotated yes").exit_code, 0);
  ExpectRefused("convert " + kv + " " + st, 2,
                kv + ": the k rows (imported from a llama.cpp q8_0 cache with heads of 64, rotated=yes) are "
                     "Hadamard-rotated, not plain keys: import the llama.cpp file again with --unrotate, or export "
                     "with --format llama-seq|llama-session (which un-rotates them for a float cache)",
                st);
  std::string mc = Out("plain-mooncake");
  ExpectRefused("convert " + kv + " " + mc + " --format mooncake", 2,
                kv + ": the k rows (imported from a llama.cpp q8_0 cache with heads of 64, rotated=yes) are "
                     "Hadamard-rotated, not plain keys: import the llama.cpp file again with --unrotate, or export "
                     "with --format llama-seq|llama-session (which un-rotates them for a float cache)",
                mc);
  ASSERT_EQ(Kvfile("convert " + q8 + " " + kv + " --head-size 64 --force").exit_code, 0);
  auto r = Kvfile("convert " + kv + " " + mc + " --format mooncake");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "kvfile: note: " + kv + ": the k rows (imported from a llama.cpp q8_0 cache with heads of 64, "
                   "rotated=unknown) may be Hadamard-rotated (llama.cpp does so unless LLAMA_ATTN_ROT_DISABLE=1): "
                   "import with --rotated yes --unrotate, or --rotated no, to say which\n");
  r = Kvfile("convert " + kv + " " + st);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "kvfile: warning: " + kv + ": the k rows (imported from a llama.cpp q8_0 cache with heads of 64, "
                   "rotated=unknown) may be Hadamard-rotated (llama.cpp does so unless LLAMA_ATTN_ROT_DISABLE=1): "
                   "import with --rotated yes --unrotate, or --rotated no, to say which\n");
  r = Kvfile("convert " + kv + " " + bin + " --format llama-seq --dtype f16");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("rotated=unknown), exported as f16/f16: llama.cpp Hadamard-rotates"), std::string::npos)
      << r.err;
  // Heads of 32 are never rotated: no warning either way.
  ASSERT_EQ(Kvfile("convert " + q8 + " " + kv + " --head-size 32 --force").exit_code, 0);
  r = Kvfile("convert " + kv + " " + bin + " --format llama-seq --dtype f16 --force");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  r = Kvfile("convert " + kv + " " + st + " --force");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  // A float cache exported as q8_0 is rotated the way llama.cpp expects.
  std::string f16kv = Out("f16.kv");
  ASSERT_EQ(Kvfile("convert " + (kFixtures / "seq-f16-fa1.bin").string() + " " + f16kv + " --head-size 64").exit_code, 0);
  r = Kvfile("convert " + f16kv + " " + bin + " --format llama-seq --dtype q8_0 --force");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_NE(r.out.find("q8_0 cache; k rows rotated; v rows rotated;"), std::string::npos) << r.out;
  ExpectRefused("convert " + f16kv + " " + Out("r.bin") + " --format llama-seq --rotated yes", 2,
                f16kv + ": --rotated yes: llama.cpp rotates only quantized (q8_0) rows with head sizes that are "
                        "multiples of 64, and k is f16 with heads of 64, v f16 with heads of 64",
                TempPath("r.bin"));
}

// A q8_0 K + f16 V cache (-ctk q8_0, flash attention off) goes back out with
// the types it came with; --dtype k=TYPE,v=TYPE gives each stream its own.
TEST(LlamaConvert, PerStreamTypes) {
  std::string mixed = (kFixtures / "seq-q8_0-f16-fa0.bin").string();
  std::string kv = Out("mixed.kv"), back = Out("mixed.bin");
  auto r = Kvfile("convert " + mixed + " " + kv + " --head-size 64 --keep-raw k,v");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("sequence state of q8_0/f16 cache (V transposed); rotated unknown; k 2 x 64 f32, v 2 x 64 f16"),
            std::string::npos)
      << r.out;
  r = Kvfile("convert " + kv + " " + back + " --format llama-seq");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_NE(r.out.find("llama.cpp sequence state, k q8_0, v f16 cache (V transposed);"), std::string::npos) << r.out;
  EXPECT_EQ(ReadFile(back), ReadFile(mixed));
  // bf16 goes back as bf16 without --dtype.
  std::string bf = (kFixtures / "seq-bf16-fa1.bin").string();
  ASSERT_EQ(Kvfile("convert " + bf + " " + kv + " --head-size 64 --keep-raw k,v --force").exit_code, 0);
  ASSERT_EQ(Kvfile("convert " + kv + " " + back + " --format llama-seq --force").exit_code, 0);
  EXPECT_EQ(ReadFile(back), ReadFile(bf));
  // An f16 import into the mixed context.
  std::string f16 = (kFixtures / "seq-f16-fa0.bin").string();
  ASSERT_EQ(Kvfile("convert " + f16 + " " + kv + " --head-size 64 --keep-raw k,v --force").exit_code, 0);
  r = Kvfile("convert " + kv + " " + back + " --format llama-seq --dtype k=q8_0,v=f16 --force");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("k q8_0, v f16 cache (V transposed); k rows rotated;"), std::string::npos) << r.out;
  r = Kvfile("convert " + kv + " " + back + " --format llama-seq --dtype k=q8_0,v=f16 --rotated yes --force");
  EXPECT_NE(r.out.find("k q8_0, v f16 cache (V transposed); k rows rotated;"), std::string::npos) << r.err;
  r = Kvfile("convert " + kv + " " + back + " --format llama-seq --dtype k=q8_0,v=f16 --rotated no --force");
  EXPECT_NE(r.out.find("k q8_0, v f16 cache (V transposed); 19"), std::string::npos) << r.out << r.err;
  std::unique_ptr<File> f;
  ASSERT_TRUE(FileSystem::Default()->Open(back, OpenMode::kRead, &f).ok());
  StateLayout s;
  ASSERT_TRUE(ParseState(*f, back, &s).ok());
  EXPECT_EQ(s.k[0].type, CacheType::kQ8_0);
  EXPECT_EQ(s.v[0].type, CacheType::kF16);
  std::string no = Out("mixed-refused.bin");
  for (auto [dtype, why] : {std::pair<std::string, std::string>{"k=q4_0", "'q4_0' is not a llama.cpp cache type"},
                            {"k=f16,k=f32", "stream k given twice"},
                            {"x=f16", "'x=f16' is not k=TYPE or v=TYPE"}})
    ExpectRefused("convert " + kv + " " + no + " --format llama-seq --dtype " + dtype, 2,
                  "--dtype " + dtype + ": " + why +
                      " (a llama.cpp cache is f16, bf16, f32 or q8_0: --dtype TYPE, or k=TYPE,v=TYPE for each stream)",
                  no);
  ExpectRefused("convert " + kv + " " + no + " --format llama-seq --dtype e9m9", 2,
                "--dtype: e9m9 not in {e4m3,e5m2,nvfp4,bf16,f16,f32,q8_0,k=TYPE,v=TYPE} (see kvfile convert --help)",
                no);
  ExpectRefused("convert " + kv + " " + no + " --format llama-seq --dtype e4m3", 2,
                "--dtype e4m3: not a llama.cpp cache type (a llama.cpp cache is f16, bf16, f32 or q8_0: --dtype TYPE, "
                "or k=TYPE,v=TYPE for each stream)",
                no);
  ExpectRefused("convert " + kv + " " + Out("m.safetensors") + " --dtype k=f16", 2,
                "--dtype k=f16 applies to --format llama-seq|llama-session", TempPath("m.safetensors"));
}

// A 1-stream file goes into a 4-stream context (llama-server -np 4) and back.
TEST(LlamaConvert, StreamCountChangesOnExport) {
  std::string np4 = (kFixtures / "seq-f16-fa1-np4.bin").string(), one = (kFixtures / "seq-f16-fa1.bin").string();
  std::string kv = Out("np4.kv"), back = Out("np4.bin");
  ASSERT_EQ(Kvfile("convert " + np4 + " " + kv + " --head-size 64 --keep-raw k,v").exit_code, 0);
  EXPECT_EQ(ModelId(kv), "llama.cpp:seq3 k=f16 v=f16 v_trans=0 stream=0/4 seq=0 pos=0 rotated=no");
  ASSERT_EQ(Kvfile("convert " + kv + " " + back + " --format llama-seq").exit_code, 0);
  EXPECT_EQ(ReadFile(back), ReadFile(np4));
  std::string kv1 = Out("one.kv");
  ASSERT_EQ(Kvfile("convert " + one + " " + kv1 + " --head-size 64 --keep-raw k,v").exit_code, 0);
  auto r = Kvfile("convert " + kv1 + " " + back + " --format llama-seq --n-stream 4 --force");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("f16 cache; stream 0 of 4;"), std::string::npos) << r.out;
  std::unique_ptr<File> f;
  ASSERT_TRUE(FileSystem::Default()->Open(back, OpenMode::kRead, &f).ok());
  StateLayout s;
  ASSERT_TRUE(ParseState(*f, back, &s).ok());
  EXPECT_EQ(s.n_stream, 4u);
  EXPECT_EQ(s.stream, 0u);
  uint32_t w = 0;
  EXPECT_EQ(Cells(back, false, 1, &w), Cells(one, false, 1, &w));
  r = Kvfile("convert " + kv + " " + back + " --format llama-seq --n-stream 1 --force");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(FileSystem::Default()->Open(back, OpenMode::kRead, &f).ok());  // the new file
  ASSERT_TRUE(ParseState(*f, back, &s).ok());
  EXPECT_EQ(s.n_stream, 1u);
}

// An iSWA model's two caches (Gemma-2-shaped, made by llama.cpp): imported
// whole, their layer counts recorded, written back byte for byte; a window
// smaller than the sequence is refused, naming why.
TEST(LlamaConvert, TwoCachesImportAndExport) {
  std::string w64 = (kFixtures / "seq-gemma2-w64-f16-fa1.bin").string();
  std::string kv = Out("iswa.kv"), back = Out("iswa.bin");
  auto r = Kvfile("convert " + w64 + " " + kv + " --head-size 64 --keep-raw k,v");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(": 24 tokens; 4 layers in 2 caches (2+2); sequence state of f16/f16 cache;"), std::string::npos)
      << r.out;
  EXPECT_EQ(ModelId(kv), "llama.cpp:seq3 k=f16 v=f16 v_trans=0 stream=0/1 seq=0 pos=0 caches=2+2 rotated=no");
  r = Kvfile("convert " + kv + " " + back + " --format llama-seq");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(": 24 tokens; 4 layers in 2 caches (2+2); llama.cpp sequence state, f16 cache;"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(ReadFile(back), ReadFile(w64));
  // The session file of the window-8 model keeps the masked cells too: both caches hold all 24.
  std::string s8 = (kFixtures / "session-gemma2-w8-f16-fa0.bin").string();
  ASSERT_EQ(Kvfile("convert " + s8 + " " + kv + " --head-size 64 --keep-raw k,v --force").exit_code, 0);
  EXPECT_EQ(ModelId(kv),
            "llama.cpp:session10 arch=gemma2 k=f16 v=f16 v_trans=1 stream=0/1 seq=0 pos=0 caches=2+2 rotated=no");
  ASSERT_EQ(Kvfile("convert " + kv + " " + back + " --format llama-session --force").exit_code, 0);
  EXPECT_EQ(ReadFile(back), ReadFile(s8));
  std::string w8 = (kFixtures / "seq-gemma2-w8-f16-fa1.bin").string(), no = Out("iswa8.kv");
  ExpectRefused("convert " + w8 + " " + no + " --head-size 64", 1, w8 + ": llama.cpp sequence state: cache 1 (from byte 25036): holds 8 cells in stream 0, the first cache "
                     "24 in stream 0: a sliding-window cache (llama.cpp iSWA) that dropped the positions outside its "
                     "window; kvfile stores every position in every layer", no);
}

// The llama.cpp flags where they do not apply, and --n-stream's range.
TEST(LlamaConvert, FlagsOutOfPlaceAreRefused) {
  std::string kv = Out("flags.kv"), bin = Out("flags.bin"), st = Out("flags.safetensors");
  ASSERT_EQ(Kvfile("convert " + (kFixtures / "seq-f16-fa1.bin").string() + " " + kv + " --head-size 64").exit_code, 0);
  ExpectRefused("convert " + kv + " " + bin + " --format llama-seq --unrotate", 2,
                "--unrotate applies to a llama.cpp state IN (an export rotates or un-rotates rows as the context's "
                "cache type needs, see --rotated)",
                bin);
  ExpectRefused("convert " + kv + " " + st + " --unrotate", 2,
                "--head-size, --model and --unrotate apply to a llama.cpp state IN", st);
  ExpectRefused("convert " + kv + " " + st + " --rotated yes", 2,
                "--rotated applies to a llama.cpp state IN or --format llama-seq|llama-session", st);
  ExpectRefused("convert " + kv + " " + st + " --n-stream 2", 2,
                "--v-trans, --arch and --n-stream apply to --format llama-seq|llama-session", st);
  ExpectRefused("convert " + kv + " " + bin + " --format llama-seq --n-stream 0", 2,
                "--n-stream: must be at least 1, not 0 (see kvfile convert --help)", bin);
  ExpectRefused("convert " + kv + " " + bin + " --format llama-seq --n-stream 1025", 2,
                "--n-stream: must be at most 1024, not 1025 (see kvfile convert --help)", bin);
}

// The model's GGUF (here the one llama.cpp ran, written by gguf-py) gives
// the head size: embedding_length 128 / head_count 2.
TEST(LlamaConvert, ModelGivesTheHeadSize) {
  std::string in = (kFixtures / "seq-f16-fa1.bin").string(), model = (kFixtures / "tiny.gguf").string();
  std::string kv = Out("model.kv");
  auto r = Kvfile("convert " + in + " " + kv + " --model " + model);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("; k 2 x 64 e4m3, v 2 x 64 e4m3;"), std::string::npos) << r.out;
  std::string no = Out("model-refused.kv");
  ExpectRefused("convert " + in + " " + no + " --model " + model + " --head-size 32", 2,
                in + ": --head-size 32 contradicts --model " + model + " (llama, heads of 64)", no);
  ExpectRefused("convert " + in + " " + no + " --model " + in, 1,
                in + ": not a GGUF model file (magic is not 'GGUF')", no);
}

// --arch on export follows the import's rule.
TEST(LlamaConvert, ArchIsCheckedOnExport) {
  std::string kv = Out("arch.kv"), out = Out("arch.session");
  ASSERT_EQ(Kvfile("convert " + (kFixtures / "seq-f16-fa1.bin").string() + " " + kv + " --head-size 64").exit_code, 0);
  ExpectRefused("convert " + kv + " " + out + " --format llama-session --arch 'Llama 3!'", 2,
                kv + ": --arch 'Llama 3!': architecture name has a byte outside [a-z0-9._-]", out);
  ExpectRefused("convert " + kv + " " + out + " --format llama-session", 2,
                kv + ": a session file needs the model architecture name (--arch)", out);
}

// e4m3 in between: the export is a valid llama.cpp file of the same size,
// values within the fp8 error of the original.
TEST(LlamaConvert, Fp8RoundTripStaysClose) {
  fs::path in = kFixtures / "seq-f16-fa1.bin";
  std::string kv = Out("fp8.kv"), back = Out("fp8.bin");
  ASSERT_EQ(Kvfile("convert " + in.string() + " " + kv + " --head-size 64").exit_code, 0);
  auto r = Kvfile("convert " + kv + " " + back + " --format llama-seq");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string a = ReadFile(in), b = ReadFile(back);
  ASSERT_EQ(a.size(), b.size());
  for (const std::string* p : {&a, &b}) Write(TempPath(p == &a ? "fp8_a.bin" : "fp8_b.bin"), *p);
  std::unique_ptr<File> fa, fb;
  ASSERT_TRUE(FileSystem::Default()->Open(TempPath("fp8_a.bin"), OpenMode::kRead, &fa).ok());
  ASSERT_TRUE(FileSystem::Default()->Open(TempPath("fp8_b.bin"), OpenMode::kRead, &fb).ok());
  StateLayout sa, sb;
  ASSERT_TRUE(ParseState(*fa, "a", &sa).ok());
  ASSERT_TRUE(ParseState(*fb, "b", &sb).ok());
  EXPECT_EQ(sa.tokens, sb.tokens);
  bool differs = false;
  for (bool v : {false, true})
    for (uint32_t l = 0; l < sa.layers; ++l) {
      uint32_t w = v ? sa.v_width : sa.k_width;
      std::vector<float> x(uint64_t{sa.cells} * w), y(x.size());
      ASSERT_TRUE(ReadCells(*fa, sa, v, l, 0, sa.cells, x.data()).ok());
      ASSERT_TRUE(ReadCells(*fb, sb, v, l, 0, sb.cells, y.data()).ok());
      for (uint64_t row = 0; row < x.size() / 64; ++row) {
        float amax = 0;
        for (int j = 0; j < 64; ++j) amax = std::max(amax, std::fabs(x[row * 64 + j]));
        for (int j = 0; j < 64; ++j) {
          float e = std::fabs(x[row * 64 + j] - y[row * 64 + j]);
          // e4m3 keeps 3 mantissa bits: half an ulp is 1/16 of the value,
          // and values far below the row's maximum lose more (subnormals).
          ASSERT_LE(e, std::fabs(x[row * 64 + j]) / 16 + amax / 448 * 0.01f + 1e-3f) << row << " " << j;
          differs |= e > 0;
        }
      }
    }
  EXPECT_TRUE(differs);
}

// kvfile llama-server without a server: what is refused before any request,
// and a server that cannot be reached, each as one line with FILE untouched
// (tests/llama_server runs the rest against a real llama-server).
TEST(LlamaServerCli, RefusalsAndAnUnreachableServerAreOneLine) {
  std::string dir = Out("ls_slots"), kv = Out("ls_chat.kv");
  fs::create_directories(dir);
  auto r = Kvfile("llama-server save http://127.0.0.1:1 0 " + kv + " --slot-dir " + dir + "/none");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + dir + "/none: --slot-dir is not a directory (it must be the server's "
                   "--slot-save-path, on this machine)\n");
  r = Kvfile("llama-server save http://127.0.0.1:1 0 " + kv + " --slot-dir " + dir);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(r.err.starts_with("kvfile: error: http://127.0.0.1:1/slots/0?action=save: llama-server did not "
                                "answer: Failed to connect to 127.0.0.1 port 1 "))
      << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1);
  EXPECT_FALSE(fs::exists(kv));
  EXPECT_TRUE(fs::is_empty(dir));
  // A .kv that no llama-server save made: refused before the server is asked.
  ASSERT_EQ(Kvfile("convert " + (kFixtures / "seq-f16-fa1.bin").string() + " " + kv + " --head-size 64").exit_code, 0);
  std::string before = ReadFile(kv);
  r = Kvfile("llama-server restore http://127.0.0.1:1 0 " + kv + " --slot-dir " + dir);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "kvfile: error: " + kv + ": not saved by kvfile llama-server save (model 'llama.cpp:seq3 k=f16 "
                   "v=f16 v_trans=0 stream=0/1 seq=0 pos=0 rotated=no', fingerprint 0000000000000000)\n");
  EXPECT_EQ(ReadFile(kv), before);
  EXPECT_TRUE(fs::is_empty(dir));
}

}  // namespace
}  // namespace kvfile::llama
