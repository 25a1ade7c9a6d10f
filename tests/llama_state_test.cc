// SPDX-License-Identifier: Apache-2.0
// Tests of src/llama_state.{h,cc}: the llama.cpp state file parser, row
// codecs, provenance and writer, on files built here byte by byte (the
// layout of docs/llama.md), every truncation and every bit flip of small
// ones; and of `kvfile convert` on the fixtures llama.cpp wrote
// (tests/fixtures/llama/, made by tools/llama_roundtrip/make_fixtures.sh).
#include "kvfile/llama_state.h"

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
  o.U32(s.n_stream);
  for (uint32_t st = 0; st < s.n_stream; ++st) {
    if (st != s.stream) {
      o.U32(0);
      continue;
    }
    o.U32(s.cells);
    for (uint32_t c = 0; c < s.cells; ++c) {
      o.U32(static_cast<uint32_t>(s.pos0 + static_cast<int32_t>(c)));
      o.U32(1);
      o.U32(static_cast<uint32_t>(s.seq));
    }
    o.U32(s.v_trans ? 1 : 0);
    o.U32(s.layers);
    for (uint32_t l = 0; l < s.layers; ++l) {
      o.U32(static_cast<uint32_t>(s.k_type));
      o.U64(RowSize(s.k_type, s.k_width));
      for (uint32_t c = 0; c < s.cells; ++c) {
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
          for (uint32_t c = 0; c < s.cells; ++c) Element(o, s.v_type, Value(true, l, c, j));
      } else {
        o.U64(RowSize(s.v_type, s.v_width));
        for (uint32_t c = 0; c < s.cells; ++c) {
          if (s.v_type == 8) Q8Row(o, true, l, c, s.v_width);
          else
            for (uint32_t j = 0; j < s.v_width; ++j) Element(o, s.v_type, Value(true, l, c, j));
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
TEST(LlamaState, EveryTruncationIsRefused) {
  for (bool session : {false, true})
    for (bool vt : {false, true}) {
      Spec sp;
      sp.session = session;
      sp.v_trans = vt;
      sp.cells = 3;
      sp.k_width = sp.v_width = 32;
      sp.n_stream = 2;
      std::string bytes = Build(sp);
      StateLayout s;
      ASSERT_TRUE(Parse(bytes, &s).ok());
      std::string path = TempPath("trunc.bin");
      Write(path, bytes);
      std::unique_ptr<File> f;
      ASSERT_TRUE(FileSystem::Default()->Open(path, OpenMode::kRead, &f).ok());
      for (size_t n = 0; n < bytes.size(); ++n) {
        ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(n)), 0);
        Status st = ParseState(*f, path, &s);
        ASSERT_FALSE(st.ok()) << n;
        ASSERT_TRUE(st.code() == Status::Code::kCorruption || st.code() == Status::Code::kUnsupported)
            << n << ": " << st.ToString();
      }
    }
}

// Every single-bit flip: refused with a data error, or parsed into a layout
// that fills the file exactly and reads without error.
TEST(LlamaState, EveryBitFlipIsRefusedOrConsistent) {
  Spec sp;
  sp.session = true;
  sp.cells = 2;
  sp.k_width = sp.v_width = 32;
  sp.layers = 1;
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
  const Case cases[] = {
      {"trunc", good.substr(0, good.size() - 1), "truncated"},
      {"version", bad_version, "sequence state version 2 (kvfile reads version 3"},
      {"row", bad_row, "layer 0 K: row size 257 is not a whole number of f16 values"},
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
                   "v=f16 v_trans=0 stream=0/1 seq=0 pos=0 rotated=unknown', fingerprint 0000000000000000)\n");
  EXPECT_EQ(ReadFile(kv), before);
  EXPECT_TRUE(fs::is_empty(dir));
}

}  // namespace
}  // namespace kvfile::llama
