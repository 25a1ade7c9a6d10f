// SPDX-License-Identifier: Apache-2.0
// Tests of .kvpack archives (src/include/kvfile/pack.h, spec/PACK.md): round
// trips, deduplication, damage sweeps and crash safety, all in a FaultFs.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <cstring>
#include <filesystem>

#include "kvfile/pack.h"
#include "kvfile/reader.h"
#include "kvfile/writer.h"
#include "pack/pack_format.h"
#include "support/fault_fs.h"
#include "support/peak_memory.h"
#include "support/forwarding_fs.h"
#include "support/testing_hooks.h"
#include "support/sweep_fixtures.h"

namespace kvfile {
namespace {

using testing::FaultFs;
using testing::FsOp;
using testing::SplitMix;

Geometry MixedGeometry() {
  Geometry g;
  g.layers = 2;
  g.streams = {{"k", 2, 8, Dtype::kE4M3}, {"v", 2, 8, Dtype::kE5M2}, {"idx", 1, 4, Dtype::kBF16}};
  return g;
}

Geometry TinyGeometry() {
  Geometry g;
  g.layers = 1;
  g.streams = {{"k", 1, 4, Dtype::kE4M3}, {"r", 1, 2, Dtype::kF16}};
  return g;
}

uint16_t ToBf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return static_cast<uint16_t>(b >> 16);
}
uint16_t ToF16Small(float f) {
  // Exact for the values used here: multiples of 1/8 in (-4, 4).
  if (f == 0) return 0;
  uint16_t sign = f < 0 ? 0x8000 : 0;
  float a = std::fabs(f);
  int e = static_cast<int>(std::floor(std::log2(a)));
  float m = a / std::ldexp(1.0f, e) - 1.0f;
  return static_cast<uint16_t>(sign | ((e + 15) << 10) | static_cast<uint16_t>(m * 1024));
}

// Appends tokens[from, end) to `w`, `append_tokens` per Append (the last
// append may be shorter); rows of token t are a function of (seed_for(t),
// t), so two files with the same seed for a position hold the same rows
// there.
void AppendKv(Writer& w, const Geometry& g, const std::vector<uint32_t>& tokens, size_t from,
              const std::function<uint64_t(uint64_t)>& seed_for, size_t append_tokens = 1) {
  for (size_t first = from; first < tokens.size(); first += append_tokens) {
    const size_t n = std::min(append_tokens, tokens.size() - first);
    // store[layer * streams + stream]: the rows of the batch's tokens.
    std::vector<std::vector<uint8_t>> store(g.layers * g.streams.size());
    for (size_t t = first; t < first + n; ++t) {
      SplitMix rng(seed_for(t) * 1000003 + t);
      size_t k = 0;
      for (uint32_t l = 0; l < g.layers; ++l)
        for (const StreamSpec& s : g.streams) {
          std::vector<uint8_t>& bytes = store[k++];
          for (size_t i = 0; i < s.ElementsPerToken(); ++i) {
            if (IsFp8(s.dtype) || s.dtype == Dtype::kNvfp4) {
              float f = (static_cast<float>(rng.Below(2001)) - 1000.0f) / 16.0f;
              bytes.insert(bytes.end(), reinterpret_cast<uint8_t*>(&f), reinterpret_cast<uint8_t*>(&f) + 4);
            } else {
              float f = (static_cast<float>(rng.Below(63)) - 31.0f) / 8.0f;
              uint16_t v = s.dtype == Dtype::kBF16 ? ToBf16(f) : ToF16Small(f);
              bytes.insert(bytes.end(), reinterpret_cast<uint8_t*>(&v), reinterpret_cast<uint8_t*>(&v) + 2);
            }
          }
        }
    }
    AppendBatch b;
    b.tokens = std::span<const uint32_t>(tokens).subspan(first, n);
    for (size_t k = 0; k < store.size(); ++k) {
      Dtype d = g.streams[k % g.streams.size()].dtype;
      // A stream absent from a layer (layer sets) gets no rows there.
      if (!g.InLayer(static_cast<uint32_t>(k / g.streams.size()), static_cast<uint32_t>(k % g.streams.size())))
        b.blocks.push_back({});
      else
        b.blocks.push_back({IsFp8(d) || d == Dtype::kNvfp4 ? Dtype::kF32 : d, store[k].data(), nullptr});
    }
    ASSERT_TRUE(w.Append(b).ok());
  }
}

// Writes a .kv at `path` holding `tokens`, rows as AppendKv makes them.
void WriteKv(FileSystem& fs, const std::string& path, const Geometry& g, const std::vector<uint32_t>& tokens,
             const std::function<uint64_t(uint64_t)>& seed_for, uint32_t chunk_tokens = 3,
             ModelIdentity id = {"test/model", 0x1234}, size_t append_tokens = 1) {
  WriterOptions wo;
  wo.fs = &fs;
  wo.chunk_tokens = chunk_tokens;
  std::unique_ptr<Writer> w;
  ASSERT_TRUE(hooks::CreateWriter(path, g, id, wo, &w).ok());
  AppendKv(*w, g, tokens, 0, seed_for, append_tokens);
  ASSERT_TRUE(w->Close().ok());
}

std::vector<uint32_t> Tokens(uint32_t base, size_t n) {
  std::vector<uint32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = base + static_cast<uint32_t>(i * 7);
  return t;
}

// Every stored byte a reader returns for the file: token ids, then per
// (layer, stream) codes and scales or raw rows.
std::vector<uint8_t> Contents(FileSystem& fs, const std::string& path) {
  ReaderOptions ro;
  ro.fs = &fs;
  std::unique_ptr<Reader> r;
  Status st = Reader::Open(path, ro, &r);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (!st.ok()) return {};
  std::vector<uint8_t> out;
  auto put = [&out](const void* p, size_t n) {
    out.insert(out.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
  };
  put(r->identity().model_id.data(), r->identity().model_id.size());
  put(&r->identity().fingerprint, 8);
  put(r->tokens().data(), r->tokens().size() * 4);
  const Geometry& g = r->geometry();
  uint64_t n = r->token_count();
  if (n == 0) return out;
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t s = 0; s < g.streams.size(); ++s) {
      if (!g.InLayer(l, s)) continue;
      const StreamSpec& spec = g.streams[s];
      uint64_t rows = n * spec.rows_per_token;
      if (IsNvfp4(spec.dtype)) {
        std::vector<uint8_t> codes(n * spec.ElementsPerToken() / 2), block_scales(n * spec.ElementsPerToken() / 16);
        std::vector<float> scales(n);
        EXPECT_TRUE(r->ReadCodes(l, s, 0, n, codes.data(), block_scales.data(), scales.data()).ok());
        put(codes.data(), codes.size());
        put(block_scales.data(), block_scales.size());
        put(scales.data(), scales.size() * 4);
      } else if (IsFp8(spec.dtype)) {
        std::vector<uint8_t> codes(rows * spec.row_width);
        std::vector<float> scales(rows);
        EXPECT_TRUE(r->ReadCodes(l, s, 0, n, codes.data(), scales.data()).ok());
        put(codes.data(), codes.size());
        put(scales.data(), scales.size() * 4);
      } else {
        std::vector<uint8_t> raw(rows * spec.row_width * 4);
        EXPECT_TRUE(r->ReadRows(l, s, 0, n, spec.dtype, raw.data()).ok());
        put(raw.data(), rows * spec.row_width * ElementSize(spec.dtype));
      }
    }
  return out;
}

std::vector<uint8_t> FileBytes(FaultFs& fs, const std::string& path) {
  auto img = fs.Image();
  auto it = img.find(path);
  return it == img.end() ? std::vector<uint8_t>{} : it->second;
}

Status PackFiles(FileSystem& fs, const std::string& dest, const std::vector<std::pair<std::string, std::string>>& files,
                 uint32_t chunk_tokens, PackWriteStats* stats = nullptr) {
  PackWriterOptions po;
  po.fs = &fs;
  po.chunk_tokens = chunk_tokens;
  std::unique_ptr<PackWriter> w;
  KVFILE_RETURN_IF_ERROR(PackWriter::Begin(dest, po, &w));
  for (const auto& [name, path] : files) KVFILE_RETURN_IF_ERROR(w->AddFile(name, path));
  KVFILE_RETURN_IF_ERROR(w->Finish());
  if (stats) *stats = w->stats();
  return Status::OK();
}

TEST(PackTest, RoundTripMaterialisesEqualContents) {
  FaultFs fs;
  Geometry g = MixedGeometry();
  WriteKv(fs, "/d/a.kv", g, Tokens(10, 21), [](uint64_t) { return 1; });
  WriteKv(fs, "/d/sub/b.kv", g, Tokens(500, 5), [](uint64_t) { return 2; }, 2);
  WriteKv(fs, "/d/empty.kv", g, {}, [](uint64_t) { return 3; });
  WriteKv(fs, "/d/other.kv", TinyGeometry(), Tokens(9, 9), [](uint64_t) { return 4; }, 4, {"other", 99});
  ASSERT_TRUE(PackFiles(fs, "/p.kvpack", {{"sub/b.kv", "/d/sub/b.kv"}, {"a.kv", "/d/a.kv"}, {"empty.kv", "/d/empty.kv"},
                                          {"other.kv", "/d/other.kv"}}, 4).ok());
  std::unique_ptr<PackReader> r;
  Status st = PackReader::Open("/p.kvpack", &fs, &r);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(r->members().size(), 4u);
  EXPECT_EQ(r->members()[0].name, "a.kv");
  EXPECT_EQ(r->members()[1].name, "empty.kv");
  EXPECT_EQ(r->members()[2].name, "other.kv");
  EXPECT_EQ(r->members()[3].name, "sub/b.kv");
  EXPECT_EQ(r->members()[0].token_count, 21u);
  EXPECT_EQ(r->members()[0].chunk_count, 6u);  // 4+4+4+4+4+1
  EXPECT_EQ(r->members()[3].source_chunk_tokens, 2u);
  EXPECT_EQ(r->models().size(), 2u);
  EXPECT_EQ(r->Find("sub/b.kv"), std::optional<size_t>(3));
  EXPECT_EQ(r->Find("sub"), std::nullopt);
  PackVerifyReport rep;
  ASSERT_TRUE(r->Verify(&rep).ok());
  EXPECT_EQ(rep.members, 4u);
  EXPECT_EQ(rep.chunks, 6u + 2u + 3u);
  const char* src[] = {"/d/a.kv", "/d/empty.kv", "/d/other.kv", "/d/sub/b.kv"};
  for (size_t i = 0; i < 4; ++i) {
    std::string out = "/out/" + std::to_string(i) + ".kv";
    st = r->Materialize(i, out);
    ASSERT_TRUE(st.ok()) << st.ToString();
    std::vector<uint8_t> want = Contents(fs, src[i]);
    ASSERT_FALSE(want.empty());
    EXPECT_EQ(Contents(fs, out), want) << src[i];
  }
  // A member read as a stream of chunks: token ids and chunk payloads.
  std::vector<uint32_t> tokens, ids;
  ASSERT_TRUE(r->ReadMember(0, &tokens, &ids).ok());
  EXPECT_EQ(tokens, Tokens(10, 21));
  ASSERT_EQ(ids.size(), 6u);
  std::vector<uint8_t> payload;
  ASSERT_TRUE(r->ReadChunk(ids[5], &payload).ok());
  EXPECT_EQ(payload.size(), r->models()[0].payload_bytes_per_token);
}

// Two layers of wide rows, so that the pieces the direct path reads average
// 64 KiB at 8 tokens per pack chunk (8 x 65,574 bytes over 8 sections), and
// a stream of 3-byte rows, so that later sections lie unaligned in the
// payload.
Geometry WideGeometry() {
  Geometry g;
  g.layers = 2;
  g.streams = {{"k", 2, 8192, Dtype::kE4M3}, {"v", 1, 8192, Dtype::kE5M2}, {"idx", 1, 4096, Dtype::kBF16},
               {"odd", 1, 3, Dtype::kE4M3}};
  return g;
}

// WideGeometry with nvfp4 streams "k" (4 x 8192) and "n" (one row of 16, so
// sections start unaligned in a payload) in place of its "k" and "odd",
// beside fp8 and raw ones; wide enough for the direct path.
Geometry Nvfp4Geometry() {
  Geometry g = WideGeometry();
  g.streams[0] = {"k", 4, 8192, Dtype::kNvfp4};
  g.streams[3] = {"n", 1, 16, Dtype::kNvfp4};
  return g;
}
// Nvfp4Geometry over 4 layers with "idx" in layers 1 and 3 only.
Geometry Nvfp4LayerSetGeometry() {
  Geometry g = Nvfp4Geometry();
  g.layers = 4;
  g.streams[2].layers = {1, 3};
  return g;
}
// MixedGeometry with "k" (2 x 8) nvfp4 and a stream "n" of one nvfp4 row of 16.
Geometry SmallNvfp4Geometry() {
  Geometry g = MixedGeometry();
  g.streams[0].dtype = Dtype::kNvfp4;
  g.streams.push_back({"n", 1, 16, Dtype::kNvfp4});
  return g;
}

// WideGeometry over 4 layers with "idx" in layers 1 and 3 and "odd" in 2.
Geometry LayerSetGeometry() {
  Geometry g = WideGeometry();
  g.layers = 4;
  g.streams[2].layers = {1, 3};
  g.streams[3].layers = {2};
  return g;
}

// A pack of a member with layer sets is 1.1 with the LAYER_SETS flag, its
// model entry 1304 + 2048 bytes with the streams' layer bitmaps; the member
// comes back with its geometry and every stored byte. A pack without one is
// 1.0 as before.
TEST(PackTest, LayerSetsRoundTrip) {
  FaultFs fs;
  Geometry g = LayerSetGeometry();
  WriteKv(fs, "/a.kv", g, Tokens(3, 11), [](uint64_t) { return 5; }, 4);
  WriteKv(fs, "/t.kv", TinyGeometry(), Tokens(3, 5), [](uint64_t) { return 6; }, 4);
  ASSERT_TRUE(PackFiles(fs, "/p.kvpack", {{"a.kv", "/a.kv"}, {"t.kv", "/t.kv"}}, 4).ok());
  const std::vector<uint8_t> img = FileBytes(fs, "/p.kvpack");
  auto u64 = [&img](size_t o) {
    uint64_t x;
    std::memcpy(&x, img.data() + o, 8);
    return x;
  };
  EXPECT_EQ(img[10], 1);      // minor 1
  EXPECT_EQ(u64(16), 1u);     // required flag LAYER_SETS
  EXPECT_EQ(u64(40), 2u);     // two models
  const uint64_t models_at = u64(32);
  // The layer-set geometry's entry (models are ordered as added).
  EXPECT_EQ(img[models_at + 1304], 0x0F);           // "k": every layer
  EXPECT_EQ(img[models_at + 1304 + 2 * 128], 0x0A);  // "idx": 1 and 3
  EXPECT_EQ(img[models_at + 1304 + 3 * 128], 0x04);  // "odd": 2
  EXPECT_EQ(img[models_at + 3352 + 1304], 0x01);     // the tiny model: its one layer
  std::unique_ptr<PackReader> r;
  ASSERT_TRUE(PackReader::Open("/p.kvpack", &fs, &r).ok());
  PackVerifyReport rep;
  ASSERT_TRUE(r->Verify(&rep).ok());
  ASSERT_TRUE(r->Materialize(0, "/o.kv").ok());
  ReaderOptions ro;
  ro.fs = &fs;
  std::unique_ptr<Reader> kv;
  ASSERT_TRUE(Reader::Open("/o.kv", ro, &kv).ok());
  EXPECT_EQ(kv->geometry(), g);
  EXPECT_EQ(Contents(fs, "/o.kv"), Contents(fs, "/a.kv"));
  // Without layer sets: pack 1.0, entries of 1304 bytes.
  ASSERT_TRUE(PackFiles(fs, "/q.kvpack", {{"t.kv", "/t.kv"}}, 4).ok());
  const std::vector<uint8_t> plain = FileBytes(fs, "/q.kvpack");
  EXPECT_EQ(plain[10], 0);
  EXPECT_EQ(plain[16], 0);
}

// Materialize makes one append per pack chunk, cut at its own chunk
// boundaries: with the same salt, a member comes back as the very bytes of a
// source written with one append per pack chunk, whatever the two chunk
// sizes (3 or 7 tokens left over at the end; raw and fp8 streams, unaligned
// sections in the payload). Where the .kv chunk size is a multiple of the
// pack's and the pieces are large, the direct path
// (PackReader::Impl::MaterializeDirect) runs: it writes each section, then
// the head, where the staged path writes each chunk whole, so the count of
// writes tells which path ran.
TEST(PackTest, MaterializeWritesTheSourceBytes) {
  Geometry mixed = MixedGeometry();
  mixed.streams.push_back({"odd", 1, 3, Dtype::kE4M3});
  struct Case {
    Geometry g;
    uint32_t pack_chunk, kv_chunk;
    bool direct;
  } cases[] = {
      {mixed, 4, 5, false},            // not a multiple
      {mixed, 4, 4, false},            // a multiple, but pieces of a few bytes
      {WideGeometry(), 8, 8, true},    // one pack chunk per .kv chunk
      {WideGeometry(), 8, 16, true},   // two
      {WideGeometry(), 8, 24, true},   // all three in one
      {WideGeometry(), 8, 12, false},  // not a multiple
      // Streams in some layers only (pack 1.1): both paths.
      {LayerSetGeometry(), 8, 16, true},
      {LayerSetGeometry(), 8, 12, false},
      // nvfp4 streams (pack 1.2): both paths.
      {SmallNvfp4Geometry(), 4, 5, false},
      {Nvfp4Geometry(), 8, 16, true},
      {Nvfp4Geometry(), 8, 24, true},
      {Nvfp4Geometry(), 8, 12, false},
      {Nvfp4LayerSetGeometry(), 8, 16, true},  // both (pack flags NVFP4 | LAYER_SETS)
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("pack chunk " + std::to_string(c.pack_chunk) + ", kv chunk " + std::to_string(c.kv_chunk));
    FaultFs fs;
    WriteKv(fs, "/s.kv", c.g, Tokens(40, 23), [](uint64_t) { return 9; }, c.kv_chunk, {"test/model", 0x1234},
            c.pack_chunk);
    ASSERT_TRUE(PackFiles(fs, "/s.kvpack", {{"s.kv", "/s.kv"}}, c.pack_chunk).ok());
    std::unique_ptr<PackReader> r;
    ASSERT_TRUE(PackReader::Open("/s.kvpack", &fs, &r).ok());
    const size_t ops = fs.log().size();
    Status st = r->Materialize(0, "/o.kv");
    ASSERT_TRUE(st.ok()) << st.ToString();
    size_t writes = 0;
    for (size_t i = ops; i < fs.log().size(); ++i) writes += fs.log()[i].kind == FsOp::kWrite;
    // The unpacked file has a salt of its own (a new file's random one):
    // written again with that salt, the source must come out the same.
    uint64_t salt = 0;
    {
      ReaderOptions ro;
      ro.fs = &fs;
      std::unique_ptr<Reader> o;
      ASSERT_TRUE(Reader::Open("/o.kv", ro, &o).ok());
      salt = o->salt();
    }
    hooks::SetWriterSalt(salt);
    WriteKv(fs, "/s2.kv", c.g, Tokens(40, 23), [](uint64_t) { return 9; }, c.kv_chunk, {"test/model", 0x1234},
            c.pack_chunk);
    hooks::SetWriterSalt(0);
    std::vector<uint8_t> want = FileBytes(fs, "/s2.kv");
    ASSERT_FALSE(want.empty());
    EXPECT_EQ(FileBytes(fs, "/o.kv"), want);
    const size_t chunks = (23 + c.kv_chunk - 1) / c.kv_chunk, sections = c.g.SectionCount();
    // The header and the commit record, and the chunks.
    EXPECT_EQ(writes, 2 + (c.direct ? chunks * (sections + 1) : chunks));
  }
}

// Rewrites byte `at` of chunk `id`'s payload in a pack image and mends every
// checksum over it (the payload's, the chunk table's, the header's): a pack
// from a hostile writer, whose checksums all hold.
void ForgePayloadByte(std::vector<uint8_t>& img, const PackChunk& c, uint32_t id, uint64_t at, uint8_t v) {
  auto u64 = [&img](size_t o) {
    uint64_t x;
    std::memcpy(&x, img.data() + o, 8);
    return x;
  };
  auto put = [&img](size_t o, uint64_t x) { std::memcpy(img.data() + o, &x, 8); };
  img[c.offset + at] = v;
  const uint64_t chunks_at = u64(32) + u64(40) * 1304;  // data_end + models x 1304 (spec/PACK.md)
  put(chunks_at + 48ull * id + 32, XXH3_64bits(img.data() + c.offset, c.bytes));
  put(80, XXH3_64bits(img.data() + chunks_at, u64(48) * 48));
  put(120, XXH3_64bits(img.data(), 120));
}

// Sets the first member's source chunk size in a pack image, with the index
// and header checksums mended.
void SetSourceChunkTokens(std::vector<uint8_t>& img, uint32_t tokens) {
  auto u64 = [&img](size_t o) {
    uint64_t x;
    std::memcpy(&x, img.data() + o, 8);
    return x;
  };
  const uint64_t index_at = u64(32) + u64(40) * 1304 + u64(48) * 48 + u64(64);  // after models, chunks, names
  std::memcpy(img.data() + index_at + 40, &tokens, 4);
  uint64_t x = XXH3_64bits(img.data() + index_at, u64(56) * 64);
  std::memcpy(img.data() + 96, &x, 8);
  x = XXH3_64bits(img.data(), 120);
  std::memcpy(img.data() + 120, &x, 8);
}

// A damaged pack image and the line its damage gives after the pack's path.
struct DamageCase {
  std::string what;
  std::vector<uint8_t> image;
  std::string message;
};

// Materialises the first member of a damaged image of a pack whose source
// had .kv chunks of 8 tokens, as if it had had `kv_chunk`: the damage is
// found (kCorruption, k.message) and no file or temporary file is left.
void ExpectMaterializeDamage(const DamageCase& k, uint32_t kv_chunk) {
  SCOPED_TRACE(k.what + ", kv chunk " + std::to_string(kv_chunk));
  std::vector<uint8_t> image = k.image;
  if (kv_chunk != 8) SetSourceChunkTokens(image, kv_chunk);
  FaultFs fs({{"/p.kvpack", image}});
  std::unique_ptr<PackReader> pr;
  ASSERT_TRUE(PackReader::Open("/p.kvpack", &fs, &pr).ok());
  ASSERT_EQ(pr->members()[0].source_chunk_tokens, kv_chunk);
  Status st = pr->Materialize(0, "/out/o.kv");
  ASSERT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
  EXPECT_EQ(st.message(), "/p.kvpack: " + k.message);
  EXPECT_EQ(fs.Image().size(), 1u) << "a file or temporary file was left";
}

// Damage found while a member is written, on both paths: .kv chunks of 8
// tokens (direct, one pack chunk each), 16 (direct, the damaged pack chunk
// second in its .kv chunk), 24 (direct, all three in one) and 12 (staged).
// A flipped payload byte is a checksum mismatch; a forged code or scale
// with every checksum mended is named as the row check names it; with two
// damaged pack chunks the first is named. Every path gives the same line as
// ReadChunk, and leaves no file and no temporary file.
TEST(PackTest, MaterializeNamesDamageOnBothPaths) {
  FaultFs base;
  const Geometry g = WideGeometry();  // sections: layer * 4 + (k, v, idx, odd)
  WriteKv(base, "/s.kv", g, Tokens(40, 23), [](uint64_t) { return 9; }, 8);
  ASSERT_TRUE(PackFiles(base, "/s.kvpack", {{"s.kv", "/s.kv"}}, 8).ok());
  std::vector<uint8_t> good = FileBytes(base, "/s.kvpack");
  std::unique_ptr<PackReader> r;
  ASSERT_TRUE(PackReader::Open("/s.kvpack", &base, &r).ok());
  std::vector<uint32_t> tokens, ids;
  ASSERT_TRUE(r->ReadMember(0, &tokens, &ids).ok());
  ASSERT_EQ(ids.size(), 3u);
  const PackChunk second = r->chunks()[ids[1]], third = r->chunks()[ids[2]];
  const std::vector<PayloadSection> layout = PackPayloadLayout(g, second.token_count);
  const std::vector<PayloadSection> last = PackPayloadLayout(g, third.token_count);
  const std::string name = "chunk " + std::to_string(ids[1]);
  std::vector<DamageCase> cases;
  std::vector<uint8_t> flipped = good;
  flipped[second.offset + layout[6].data_offset + 5] ^= 0x10;  // layer 1, stream 'idx'
  cases.push_back({"flipped byte", flipped, name + ": payload checksum mismatch (at offset " +
                                               std::to_string(second.offset) + ")"});
  std::vector<uint8_t> nan_code = good;
  ForgePayloadByte(nan_code, second, ids[1], layout[4].data_offset + 9, 0x7F);  // layer 1, 'k': e4m3 NaN
  cases.push_back({"NaN code", nan_code, name + " layer 1 stream 'k': non-finite code"});
  std::vector<uint8_t> zero_scale = good;
  for (int b = 0; b < 4; ++b) ForgePayloadByte(zero_scale, second, ids[1], layout[1].scales_offset + 4 + b, 0);
  cases.push_back({"zero scale", zero_scale, name + " layer 0 stream 'v': invalid scale"});
  std::vector<uint8_t> two = good;  // a NaN code in the third chunk, a zero scale late in the second
  ForgePayloadByte(two, third, ids[2], last[0].data_offset, 0xFF);
  for (int b = 0; b < 4; ++b) ForgePayloadByte(two, second, ids[1], layout[5].scales_offset + b, 0);
  cases.push_back({"two damaged chunks", two, name + " layer 1 stream 'v': invalid scale"});
  for (const DamageCase& k : cases)
    for (uint32_t kv_chunk : {8u, 16u, 24u, 12u}) ExpectMaterializeDamage(k, kv_chunk);
}

// N members share a 16-token prefix (same ids, same rows) and add 3 tokens
// each: the prefix's 4 chunks are stored once.
TEST(PackTest, SharedPrefixIsStoredOnce) {
  FaultFs fs;
  Geometry g = MixedGeometry();
  const int n = 5;
  std::vector<std::pair<std::string, std::string>> files;
  for (int m = 0; m < n; ++m) {
    std::vector<uint32_t> t = Tokens(1, 16);
    for (uint32_t k = 0; k < 3; ++k) t.push_back(100000 + m * 10 + k);
    std::string path = "/c/s" + std::to_string(m) + ".kv";
    WriteKv(fs, path, g, t, [m](uint64_t pos) { return pos < 16 ? 7 : 100 + m; }, 5);
    files.emplace_back("s" + std::to_string(m) + ".kv", path);
  }
  PackWriteStats stats;
  ASSERT_TRUE(PackFiles(fs, "/c.kvpack", files, 4, &stats).ok());
  const uint64_t p = g.PayloadBytesPerToken();
  EXPECT_EQ(stats.chunks_stored, 4u + n);
  EXPECT_EQ(stats.chunks_referenced, 5u * n);
  uint64_t names = 0;
  for (auto& f : files) names += f.first.size();
  uint64_t expected = 128 + 16 * p + n * 3 * p + n * 4 * (19 + 5) + 1304 + (4 + n) * 48 + names + n * 64;
  EXPECT_EQ(FileBytes(fs, "/c.kvpack").size(), expected);
  EXPECT_EQ(stats.file_bytes, expected);
  std::unique_ptr<PackReader> r;
  ASSERT_TRUE(PackReader::Open("/c.kvpack", &fs, &r).ok());
  ASSERT_TRUE(r->Verify(nullptr).ok());
  for (int m = 0; m < n; ++m) {
    ASSERT_TRUE(r->Materialize(m, "/o.kv").ok());
    EXPECT_EQ(Contents(fs, "/o.kv"), Contents(fs, files[m].second));
  }
}

// Same token ids, different rows: no sharing (the payload hash differs).
TEST(PackTest, SameTokensOtherRowsAreNotShared) {
  FaultFs fs;
  Geometry g = TinyGeometry();
  WriteKv(fs, "/x.kv", g, Tokens(3, 8), [](uint64_t) { return 1; });
  WriteKv(fs, "/y.kv", g, Tokens(3, 8), [](uint64_t) { return 2; });
  PackWriteStats stats;
  ASSERT_TRUE(PackFiles(fs, "/xy.kvpack", {{"x", "/x.kv"}, {"y", "/y.kv"}}, 4, &stats).ok());
  EXPECT_EQ(stats.chunks_stored, 4u);
  std::unique_ptr<PackReader> r;
  ASSERT_TRUE(PackReader::Open("/xy.kvpack", &fs, &r).ok());
  ASSERT_TRUE(r->Materialize(1, "/y2.kv").ok());
  EXPECT_EQ(Contents(fs, "/y2.kv"), Contents(fs, "/y.kv"));
}

TEST(PackTest, BadNamesAndDuplicatesAreRefused) {
  FaultFs fs;
  WriteKv(fs, "/x.kv", TinyGeometry(), Tokens(3, 2), [](uint64_t) { return 1; });
  for (const std::string& bad : std::vector<std::string>{"", "/abs", "a//b", "./a", "a/..", std::string("a\0b", 3)}) {
    PackWriterOptions po;
    po.fs = &fs;
    std::unique_ptr<PackWriter> w;
    ASSERT_TRUE(PackWriter::Begin("/bad.kvpack", po, &w).ok());
    EXPECT_EQ(w->AddFile(bad, "/x.kv").code(), Status::Code::kInvalidArgument) << bad;
  }
  Status st = PackFiles(fs, "/dup.kvpack", {{"a", "/x.kv"}, {"a", "/x.kv"}}, 4);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  bool exists = true;
  ASSERT_TRUE(fs.Exists("/dup.kvpack", &exists).ok());
  EXPECT_FALSE(exists);
  // Nothing is left behind: only the source file remains.
  EXPECT_EQ(fs.Image().size(), 1u);
}

// spec/PACK.md 5: a name set that cannot all be unpacked under one
// directory is refused when writing, before anything replaces the
// destination; with names between the two in byte order ('-' and '.' sort
// below '/'), so a plain neighbour compare would not see the conflict.
TEST(PackTest, NamesThatCannotAllBeUnpackedAreRefused) {
  FaultFs fs;
  WriteKv(fs, "/x.kv", TinyGeometry(), Tokens(3, 2), [](uint64_t) { return 1; });
  Status st = PackFiles(fs, "/fd.kvpack", {{"a.kv", "/x.kv"}, {"a.kv-2", "/x.kv"}, {"a.kv.b", "/x.kv"},
                                           {"a.kv/b.kv", "/x.kv"}}, 4);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "/fd.kvpack: member 'a.kv' is a file and also the directory of member 'a.kv/b.kv'; not written");
  st = PackFiles(fs, "/deep.kvpack", {{"d/e", "/x.kv"}, {"d/e/f/g.kv", "/x.kv"}}, 4);
  EXPECT_EQ(st.message(), "/deep.kvpack: member 'd/e' is a file and also the directory of member 'd/e/f/g.kv'; not written");
  st = PackFiles(fs, "/dup.kvpack", {{"z", "/x.kv"}, {"a", "/x.kv"}, {"z", "/x.kv"}}, 4);
  EXPECT_EQ(st.message(), "/dup.kvpack: two members are named 'z'; not written");
  // A component longer than NAME_MAX cannot be created: refused as a name.
  PackWriterOptions po;
  po.fs = &fs;
  std::unique_ptr<PackWriter> w;
  ASSERT_TRUE(PackWriter::Begin("/long.kvpack", po, &w).ok());
  EXPECT_EQ(w->AddFile("d/" + std::string(256, 'n'), "/x.kv").code(), Status::Code::kInvalidArgument);
  EXPECT_TRUE(w->AddFile("d/" + std::string(255, 'n'), "/x.kv").ok());
  w.reset();
  EXPECT_EQ(fs.Image().size(), 1u);  // only the source: no pack, no temporary file
  // Prefixes that are no directory of the other are fine.
  EXPECT_TRUE(PackFiles(fs, "/ok.kvpack", {{"a.kv", "/x.kv"}, {"a.kvx/b.kv", "/x.kv"}, {"a/b.kv", "/x.kv"}}, 4).ok());
}

// Packs hold nvfp4 members (pack 1.2, required flag NVFP4): each (layer,
// stream) of a payload is the source's packed codes, block scales and row
// scales for the chunk's tokens, byte for byte (spec/PACK.md 4), chunks are
// shared as with fp8, verify checks every one, and members materialise with
// the same codes and scales.
TEST(PackTest, Nvfp4MembersRoundTrip) {
  FaultFs fs;
  const Geometry g = SmallNvfp4Geometry();
  WriteKv(fs, "/n.kv", g, Tokens(3, 11), [](uint64_t) { return 1; }, 3);
  WriteKv(fs, "/m.kv", g, Tokens(3, 6), [](uint64_t) { return 1; }, 2);  // n's first pack chunk, then 2 tokens
  WriteKv(fs, "/x.kv", TinyGeometry(), Tokens(3, 4), [](uint64_t) { return 1; });
  PackWriteStats stats;
  Status st = PackFiles(fs, "/n.kvpack", {{"x", "/x.kv"}, {"n", "/n.kv"}, {"m", "/m.kv"}}, 4, &stats);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(stats.chunks_stored, 5u);      // x 1, n 3, m 1 (its first is n's)
  EXPECT_EQ(stats.chunks_referenced, 6u);
  const std::vector<uint8_t> img = FileBytes(fs, "/n.kvpack");
  uint64_t flags;
  std::memcpy(&flags, img.data() + 16, 8);
  EXPECT_EQ(img[10], 2);  // minor 2
  EXPECT_EQ(flags, 2u);   // NVFP4, no LAYER_SETS
  std::unique_ptr<PackReader> r;
  ASSERT_TRUE(PackReader::Open("/n.kvpack", &fs, &r).ok());
  PackVerifyReport rep;
  st = r->Verify(&rep);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(rep.chunks, 5u);
  // Every byte of n's payloads: its source's parts, in layout order, with
  // nothing between them.
  ReaderOptions ro;
  ro.fs = &fs;
  std::unique_ptr<Reader> src;
  ASSERT_TRUE(Reader::Open("/n.kv", ro, &src).ok());
  const std::optional<size_t> n = r->Find("n");
  ASSERT_TRUE(n.has_value());
  std::vector<uint32_t> tokens, ids;
  ASSERT_TRUE(r->ReadMember(*n, &tokens, &ids).ok());
  ASSERT_EQ(ids.size(), 3u);
  for (uint32_t id : ids) {
    const PackChunk& c = r->chunks()[id];
    std::vector<uint8_t> payload;
    ASSERT_TRUE(r->ReadChunk(id, &payload).ok());
    std::vector<uint8_t> want;
    auto put = [&want](const void* p, size_t bytes) {
      want.insert(want.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + bytes);
    };
    const uint64_t b = c.first_token, e = c.first_token + c.token_count;
    for (const PayloadSection& p : PackPayloadLayout(g, c.token_count)) {
      ASSERT_EQ(p.data_offset, want.size());
      const StreamSpec& spec = g.streams[p.stream];
      const uint64_t elems = c.token_count * spec.ElementsPerToken();
      std::vector<uint8_t> codes(elems), blocks(elems / 16);
      std::vector<float> scales(c.token_count * spec.rows_per_token);
      if (IsNvfp4(spec.dtype)) {
        ASSERT_TRUE(src->ReadCodes(p.layer, p.stream, b, e, codes.data(), blocks.data(), scales.data()).ok());
        EXPECT_EQ(p.data_bytes, elems / 2);
        EXPECT_EQ(p.block_scales_bytes, elems / 16);
        EXPECT_EQ(p.scales_bytes, 4u * c.token_count);
        put(codes.data(), elems / 2);
        ASSERT_EQ(p.block_scales_offset, want.size());
        put(blocks.data(), elems / 16);
        ASSERT_EQ(p.scales_offset, want.size());
        put(scales.data(), 4 * c.token_count);
      } else if (IsFp8(spec.dtype)) {
        ASSERT_TRUE(src->ReadCodes(p.layer, p.stream, b, e, codes.data(), scales.data()).ok());
        EXPECT_EQ(p.block_scales_bytes, 0u);
        put(codes.data(), elems);
        ASSERT_EQ(p.scales_offset, want.size());
        put(scales.data(), scales.size() * 4);
      } else {
        std::vector<uint16_t> raw(elems);
        ASSERT_TRUE(src->ReadRows(p.layer, p.stream, b, e, spec.dtype, raw.data()).ok());
        EXPECT_EQ(p.block_scales_bytes + p.scales_bytes, 0u);
        put(raw.data(), elems * 2);
      }
    }
    EXPECT_EQ(payload, want) << "chunk " << id;
  }
  for (const char* m : {"n", "m", "x"}) {
    SCOPED_TRACE(m);
    st = r->Materialize(*r->Find(m), std::string("/out/") + m + ".kv");
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(Contents(fs, std::string("/out/") + m + ".kv"), Contents(fs, std::string("/") + m + ".kv"));
  }
  std::unique_ptr<Reader> out;
  ASSERT_TRUE(Reader::Open("/out/n.kv", ro, &out).ok());
  EXPECT_EQ(out->geometry(), g);
  EXPECT_EQ(out->minor_version(), src->minor_version());  // 2.2, as an nvfp4 file is
}

// Damage in an nvfp4 payload's block scales is named with its chunk by
// verify and by unpacking, on the direct path (.kv chunks of 16) and the
// staged one (12): a flipped byte is a checksum mismatch; a block scale
// forged with every checksum mended (bit 7 set, or 0x7F) is the row check's
// "invalid block scale". No file is left.
TEST(PackTest, Nvfp4BlockScaleDamageIsNamed) {
  FaultFs base;
  const Geometry g = Nvfp4Geometry();  // sections: layer * 4 + (k, v, idx, n)
  WriteKv(base, "/s.kv", g, Tokens(40, 23), [](uint64_t) { return 9; }, 8);
  ASSERT_TRUE(PackFiles(base, "/s.kvpack", {{"s.kv", "/s.kv"}}, 8).ok());
  const std::vector<uint8_t> good = FileBytes(base, "/s.kvpack");
  std::unique_ptr<PackReader> r;
  ASSERT_TRUE(PackReader::Open("/s.kvpack", &base, &r).ok());
  std::vector<uint32_t> tokens, ids;
  ASSERT_TRUE(r->ReadMember(0, &tokens, &ids).ok());
  ASSERT_EQ(ids.size(), 3u);
  const PackChunk second = r->chunks()[ids[1]];
  const std::vector<PayloadSection> layout = PackPayloadLayout(g, second.token_count);
  ASSERT_GT(layout[4].block_scales_bytes, 0u);
  const std::string name = "chunk " + std::to_string(ids[1]);
  std::vector<DamageCase> cases;
  std::vector<uint8_t> flipped = good;
  flipped[second.offset + layout[4].block_scales_offset + 3] ^= 0x01;  // layer 1, 'k'
  cases.push_back({"flipped block scale", flipped, name + ": payload checksum mismatch (at offset " +
                                                       std::to_string(second.offset) + ")"});
  std::vector<uint8_t> high = good;
  ForgePayloadByte(high, second, ids[1], layout[4].block_scales_offset + 700, 0x80);
  cases.push_back({"block scale with bit 7", high, name + " layer 1 stream 'k': invalid block scale"});
  std::vector<uint8_t> nan = good;
  ForgePayloadByte(nan, second, ids[1], layout[3].block_scales_offset + 5, 0x7F);  // layer 0, 'n', token 5
  cases.push_back({"NaN block scale", nan, name + " layer 0 stream 'n': invalid block scale"});
  for (const DamageCase& k : cases) {
    {
      SCOPED_TRACE(k.what);
      FaultFs fs({{"/p.kvpack", k.image}});
      std::unique_ptr<PackReader> pr;
      ASSERT_TRUE(PackReader::Open("/p.kvpack", &fs, &pr).ok());
      Status st = pr->Verify(nullptr);
      ASSERT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
      EXPECT_EQ(st.message(), "/p.kvpack: " + k.message);
    }
    for (uint32_t kv_chunk : {16u, 12u}) ExpectMaterializeDamage(k, kv_chunk);
  }
}

// PackWriterOptions::dtype kNvfp4 requantizes as convert --dtype nvfp4:
// fp8 streams become nvfp4, raw ones stay raw; a stream whose rows x width
// is no multiple of 16 is refused, naming the file, and the member leaves
// no trace: the pack holds the rest.
TEST(PackTest, Nvfp4RequantizeNeedsBlocksOf16) {
  FaultFs fs;
  WriteKv(fs, "/x.kv", TinyGeometry(), Tokens(3, 4), [](uint64_t) { return 1; });  // k: 1 x 4
  WriteKv(fs, "/m.kv", MixedGeometry(), Tokens(3, 6), [](uint64_t) { return 2; });
  PackWriterOptions po;
  po.fs = &fs;
  po.chunk_tokens = 4;
  po.dtype = Dtype::kNvfp4;
  std::unique_ptr<PackWriter> w;
  ASSERT_TRUE(PackWriter::Begin("/p.kvpack", po, &w).ok());
  Status st = w->AddFile("x", "/x.kv");
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
  EXPECT_EQ(st.message(),
            "/x.kv: stream 'k': nvfp4 needs rows x width (4) to be a multiple of 16 (one block scale per 16 elements)");
  st = w->AddFile("m", "/m.kv");
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_TRUE(w->Finish().ok());
  std::unique_ptr<PackReader> r;
  ASSERT_TRUE(PackReader::Open("/p.kvpack", &fs, &r).ok());
  ASSERT_EQ(r->members().size(), 1u);
  ASSERT_EQ(r->models().size(), 1u);
  const Geometry& g = r->models()[0].geometry;
  EXPECT_EQ(g.streams[0].dtype, Dtype::kNvfp4);
  EXPECT_EQ(g.streams[1].dtype, Dtype::kNvfp4);
  EXPECT_EQ(g.streams[2].dtype, Dtype::kBF16);
  EXPECT_TRUE(r->Verify(nullptr).ok());
}

// The NVFP4 flag is set exactly when a model has an nvfp4 stream (spec/PACK.md
// 2): an nvfp4 model in a pack without it, and the flag in a pack without
// one, are damage, named. A required bit the reader does not know is
// unsupported: so a 1.0 or 1.1 reader, which knows bit 0 only, refuses a
// pack with NVFP4 (bit 1) rather than misread it, as this one refuses bit 2.
TEST(PackTest, Nvfp4FlagMustMatchTheModels) {
  FaultFs fs;
  Geometry g;
  g.layers = 1;
  g.streams = {{"k", 1, 16, Dtype::kNvfp4}};
  WriteKv(fs, "/n.kv", g, Tokens(3, 4), [](uint64_t) { return 1; });
  WriteKv(fs, "/x.kv", TinyGeometry(), Tokens(3, 4), [](uint64_t) { return 1; });
  ASSERT_TRUE(PackFiles(fs, "/n.kvpack", {{"x", "/x.kv"}, {"n", "/n.kv"}}, 4).ok());
  ASSERT_TRUE(PackFiles(fs, "/x.kvpack", {{"x", "/x.kv"}}, 4).ok());
  auto set_flags = [](std::vector<uint8_t> img, uint64_t flags) {
    std::memcpy(img.data() + 16, &flags, 8);
    uint64_t sum = XXH3_64bits(img.data(), 120);
    std::memcpy(img.data() + 120, &sum, 8);
    return img;
  };
  struct Case {
    std::vector<uint8_t> image;
    Status::Code code;
    std::string message;
  } cases[] = {
      {set_flags(FileBytes(fs, "/n.kvpack"), 0), Status::Code::kCorruption,
       "/p.kvpack: model 1: stream 0: dtype nvfp4 (6) without the NVFP4 required flag"},
      {set_flags(FileBytes(fs, "/x.kvpack"), 2), Status::Code::kCorruption,
       "/p.kvpack: the NVFP4 required flag without an nvfp4 stream"},
      {set_flags(FileBytes(fs, "/n.kvpack"), 2 | 4), Status::Code::kUnsupported,
       "/p.kvpack: the pack needs features this build lacks (required flags 6)"},
  };
  for (const Case& c : cases) {
    FaultFs one({{"/p.kvpack", c.image}});
    std::unique_ptr<PackReader> r;
    Status st = PackReader::Open("/p.kvpack", &one, &r);
    EXPECT_EQ(st.code(), c.code) << st.ToString();
    EXPECT_EQ(st.message(), c.message);
  }
}

// Packs without nvfp4 are the bytes they always were (1.0, and 1.1 with
// layer sets): the XXH3-64 of each whole pack as the writer before nvfp4
// members wrote it.
TEST(PackTest, PacksWithoutNvfp4KeepTheirBytes) {
  FaultFs fs;
  WriteKv(fs, "/a.kv", MixedGeometry(), Tokens(10, 21), [](uint64_t) { return 1; });
  WriteKv(fs, "/b.kv", MixedGeometry(), Tokens(10, 9), [](uint64_t) { return 1; }, 2);
  WriteKv(fs, "/t.kv", TinyGeometry(), Tokens(9, 9), [](uint64_t) { return 4; }, 4, {"other", 99});
  WriteKv(fs, "/l.kv", LayerSetGeometry(), Tokens(3, 11), [](uint64_t) { return 5; }, 4);
  ASSERT_TRUE(PackFiles(fs, "/p10.kvpack", {{"a.kv", "/a.kv"}, {"b.kv", "/b.kv"}, {"t.kv", "/t.kv"}}, 4).ok());
  ASSERT_TRUE(PackFiles(fs, "/p11.kvpack", {{"l.kv", "/l.kv"}, {"t.kv", "/t.kv"}}, 4).ok());
  const std::vector<uint8_t> p10 = FileBytes(fs, "/p10.kvpack"), p11 = FileBytes(fs, "/p11.kvpack");
  EXPECT_EQ(p10.size(), 6196u);
  EXPECT_EQ(XXH3_64bits(p10.data(), p10.size()), uint64_t{7996049472970515171u});
  EXPECT_EQ(p11.size(), 1269641u);
  EXPECT_EQ(XXH3_64bits(p11.data(), p11.size()), uint64_t{5167986172806566929u});
}

// A small pack of two members sharing one chunk, for the damage sweeps.
std::vector<uint8_t> SmallPack(FaultFs& fs) {
  Geometry g = TinyGeometry();
  WriteKv(fs, "/s/a.kv", g, Tokens(1, 6), [](uint64_t) { return 1; });
  std::vector<uint32_t> t = Tokens(1, 4);
  t.push_back(77);
  WriteKv(fs, "/s/b.kv", g, t, [](uint64_t pos) { return pos < 4 ? 1 : 9; });
  EXPECT_TRUE(PackFiles(fs, "/s.kvpack", {{"a.kv", "/s/a.kv"}, {"b.kv", "/s/b.kv"}}, 4).ok());
  return FileBytes(fs, "/s.kvpack");
}

// Open + Verify + every member's materialisation of an image.
Status CheckAll(const std::vector<uint8_t>& image) {
  FaultFs fs({{"/p.kvpack", image}});
  std::unique_ptr<PackReader> r;
  KVFILE_RETURN_IF_ERROR(PackReader::Open("/p.kvpack", &fs, &r));
  KVFILE_RETURN_IF_ERROR(r->Verify(nullptr));
  return Status::OK();
}

TEST(PackTest, EveryTruncationIsDetected) {
  FaultFs fs;
  std::vector<uint8_t> pack = SmallPack(fs);
  ASSERT_GT(pack.size(), 1000u);
  ASSERT_TRUE(CheckAll(pack).ok());
  for (size_t len = 0; len < pack.size(); ++len) {
    std::vector<uint8_t> cut(pack.begin(), pack.begin() + len);
    Status st = CheckAll(cut);
    ASSERT_EQ(st.code(), Status::Code::kCorruption) << "length " << len << ": " << st.ToString();
  }
}

TEST(PackTest, EveryBitFlipIsDetected) {
  FaultFs fs;
  std::vector<uint8_t> pack = SmallPack(fs);
  for (size_t i = 0; i < pack.size(); ++i)
    for (int bit = 0; bit < 8; ++bit) {
      std::vector<uint8_t> bad = pack;
      bad[i] ^= static_cast<uint8_t>(1 << bit);
      Status st = CheckAll(bad);
      ASSERT_FALSE(st.ok()) << "byte " << i << " bit " << bit;
      // The major version's bytes make it "unsupported"; everything else is damage.
      if (i == 8 || i == 9)
        EXPECT_EQ(st.code(), Status::Code::kUnsupported);
      else
        ASSERT_EQ(st.code(), Status::Code::kCorruption) << "byte " << i << ": " << st.ToString();
    }
}

// A header forged with its checksum recomputed, claiming huge tables: refused
// before anything is allocated for them.
TEST(PackTest, ForgedCountsAreRefusedBeforeAllocation) {
  FaultFs fs;
  std::vector<uint8_t> pack = SmallPack(fs);
  auto forge = [&](size_t field, uint64_t value) {
    std::vector<uint8_t> bad = pack;
    std::memcpy(bad.data() + field, &value, 8);
    uint64_t sum = XXH3_64bits(bad.data(), 120);
    std::memcpy(bad.data() + 120, &sum, 8);
    return bad;
  };
  for (size_t field : {size_t{32}, size_t{40}, size_t{48}, size_t{56}, size_t{64}, size_t{104}})
    for (uint64_t v : {uint64_t{1} << 31, ~uint64_t{0}, ~uint64_t{0} / 48}) {
      Status st = CheckAll(forge(field, v));
      EXPECT_EQ(st.code(), Status::Code::kCorruption) << field << " " << v;
    }
}

// A crash or an I/O error at any point of writing a pack leaves the old
// pack byte for byte, and no temporary file.
TEST(PackTest, FailedWriteLeavesTheOldPack) {
  FaultFs base;
  std::vector<uint8_t> old = SmallPack(base);
  WriteKv(base, "/s/c.kv", MixedGeometry(), Tokens(5, 9), [](uint64_t) { return 3; });
  const testing::DiskImage start = base.Image();
  int failures = 0;
  for (FsOp::Kind kind : {FsOp::kCreate, FsOp::kWrite, FsOp::kSync, FsOp::kRename, FsOp::kSyncDir})
    for (int nth = 0;; ++nth) {
      FaultFs fs(start);
      fs.FailOn(kind, nth, EIO, false);
      Status st = PackFiles(fs, "/s.kvpack", {{"c.kv", "/s/c.kv"}, {"a.kv", "/s/a.kv"}}, 4);
      testing::DiskImage after = fs.Image();
      if (st.ok()) {
        EXPECT_NE(after.at("/s.kvpack"), old);
        EXPECT_EQ(after.size(), start.size());
        break;
      }
      ++failures;
      // kSyncDir after the rename: the new pack is in place but not known durable.
      if (kind != FsOp::kSyncDir) {
        EXPECT_EQ(after.at("/s.kvpack"), old) << kind << " " << nth;
      }
      EXPECT_EQ(after.size(), start.size()) << "a temporary file is left: " << kind << " " << nth;
      ASSERT_LT(nth, 1000);
    }
  EXPECT_GT(failures, 5);
}

}  // namespace
}  // namespace kvfile

namespace kvfile {
namespace {

// Tables forged with every checksum recomputed: what the checksums cannot
// catch is caught by the structural rules (tiling, ranges, order).
TEST(PackTest, ForgedTablesAreRefused) {
  FaultFs fs;
  std::vector<uint8_t> pack = SmallPack(fs);
  auto u64 = [&](size_t at) {
    uint64_t v;
    std::memcpy(&v, pack.data() + at, 8);
    return v;
  };
  const uint64_t data_end = u64(32), models = u64(40), chunks = u64(48), members = u64(56), names = u64(64);
  const uint64_t chunk_table = data_end + 1304 * models;
  const uint64_t index = chunk_table + 48 * chunks + names;
  ASSERT_EQ(chunks, 3u);  // a and b share [0, 4); a: [4, 6); b: [4, 5)
  ASSERT_EQ(members, 2u);
  // Rewrites one table field and recomputes the table's and the header's checksums.
  auto forge = [&](uint64_t at, uint64_t value, size_t width, uint64_t table, uint64_t table_bytes, size_t sum_field) {
    std::vector<uint8_t> bad = pack;
    std::memcpy(bad.data() + at, &value, width);
    uint64_t sum = XXH3_64bits(bad.data() + table, table_bytes);
    std::memcpy(bad.data() + sum_field, &sum, 8);
    sum = XXH3_64bits(bad.data(), 120);
    std::memcpy(bad.data() + 120, &sum, 8);
    return bad;
  };
  auto chunk_field = [&](uint64_t chunk, uint64_t field, uint64_t value, size_t width = 8) {
    return CheckAll(forge(chunk_table + 48 * chunk + field, value, width, chunk_table, 48 * chunks, 80));
  };
  auto index_field = [&](uint64_t member, uint64_t field, uint64_t value, size_t width = 8) {
    return CheckAll(forge(index + 64 * member + field, value, width, index, 64 * members, 96));
  };
  std::vector<std::pair<std::string, Status>> cases = {
      {"chunk offset +1", chunk_field(0, 0, u64(chunk_table) + 1)},
      {"chunk offset = another chunk's", chunk_field(1, 0, u64(chunk_table))},
      {"chunk offset past data_end", chunk_field(0, 0, data_end)},
      {"chunk first_token", chunk_field(1, 8, 8)},
      {"chunk token_count 0", chunk_field(0, 16, 0, 4)},
      {"chunk model", chunk_field(0, 20, 1, 4)},
      {"chunk chain hash", chunk_field(0, 24, 12345)},
      {"chunk reserved", chunk_field(0, 40, 1)},
      {"record offset", index_field(0, 24, u64(index + 64 + 24))},
      {"token count", index_field(0, 16, 7)},
      {"name length", index_field(0, 8, 3, 4)},
      {"member reserved", index_field(1, 48, 1)},
      {"source chunk tokens 0", index_field(1, 40, 0, 4)},
  };
  for (const auto& [what, st] : cases) EXPECT_EQ(st.code(), Status::Code::kCorruption) << what << ": " << st.ToString();
  // A stray byte at the end of the data region, header fixed up: no
  // checksum covers it; the tiling rule does.
  std::vector<uint8_t> stray = pack;
  stray.insert(stray.begin() + data_end, 0x00);
  uint64_t v = data_end + 1;
  std::memcpy(stray.data() + 32, &v, 8);
  v = pack.size() + 1;
  std::memcpy(stray.data() + 104, &v, 8);
  uint64_t hs = XXH3_64bits(stray.data(), 120);
  std::memcpy(stray.data() + 120, &hs, 8);
  Status stray_st = CheckAll(stray);
  EXPECT_EQ(stray_st.code(), Status::Code::kCorruption);
  EXPECT_NE(stray_st.message().find("belong to no chunk or record"), std::string::npos) << stray_st.message();
  // Swapping the two index entries breaks the name order.
  std::vector<uint8_t> swapped = pack;
  std::swap_ranges(swapped.begin() + index, swapped.begin() + index + 64, swapped.begin() + index + 64);
  uint64_t sum = XXH3_64bits(swapped.data() + index, 128);
  std::memcpy(swapped.data() + 96, &sum, 8);
  sum = XXH3_64bits(swapped.data(), 120);
  std::memcpy(swapped.data() + 120, &sum, 8);
  Status st = CheckAll(swapped);
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_NE(st.message().find("name"), std::string::npos) << st.message();
}

// A pack whose names are a file and a directory of it (forged: no writer
// makes one) is damaged: Open refuses it before anything is unpacked.
TEST(PackTest, ForgedFileAndDirectoryNamesAreRefused) {
  FaultFs fs;
  Geometry g = TinyGeometry();
  WriteKv(fs, "/s/a.kv", g, Tokens(1, 6), [](uint64_t) { return 1; });
  ASSERT_TRUE(PackFiles(fs, "/s.kvpack", {{"a.kv", "/s/a.kv"}, {"a.kvXb.kv", "/s/a.kv"}}, 4).ok());
  std::vector<uint8_t> pack = FileBytes(fs, "/s.kvpack");
  ASSERT_TRUE(CheckAll(pack).ok());
  auto u64 = [&](size_t at) {
    uint64_t v;
    std::memcpy(&v, pack.data() + at, 8);
    return v;
  };
  const uint64_t names_at = u64(32) + 1304 * u64(40) + 48 * u64(48), names = u64(64);
  ASSERT_EQ(std::string(pack.begin() + names_at, pack.begin() + names_at + names), "a.kva.kvXb.kv");
  pack[names_at + 8] = '/';  // "a.kv/b.kv": still sorted after "a.kv"
  uint64_t sum = XXH3_64bits(pack.data() + names_at, names);
  std::memcpy(pack.data() + 88, &sum, 8);
  sum = XXH3_64bits(pack.data(), 120);
  std::memcpy(pack.data() + 120, &sum, 8);
  Status st = CheckAll(pack);
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_EQ(st.message(), "/p.kvpack: member 'a.kv' is a file and also the directory of member 'a.kv/b.kv'");
}

}  // namespace
}  // namespace kvfile

namespace kvfile {
namespace {

// A member refused half way (its source is damaged near its end, after some
// of its chunks were written) leaves no trace: the finished pack is byte for
// byte the pack made without it.
TEST(PackTest, RefusedMemberLeavesNoTrace) {
  FaultFs base;
  Geometry g = MixedGeometry();
  WriteKv(base, "/a.kv", g, Tokens(10, 21), [](uint64_t) { return 1; });
  WriteKv(base, "/b.kv", g, Tokens(10, 9), [](uint64_t) { return 1; });
  testing::DiskImage img = base.Image();
  img["/a.kv"][img["/a.kv"].size() - 100] ^= 1;  // the last chunk's last section
  FaultFs fs(img);
  PackWriterOptions po;
  po.fs = &fs;
  po.chunk_tokens = 4;
  std::unique_ptr<PackWriter> w;
  ASSERT_TRUE(PackWriter::Begin("/with.kvpack", po, &w).ok());
  Status st = w->AddFile("a.kv", "/a.kv");
  ASSERT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
  ASSERT_TRUE(w->AddFile("b.kv", "/b.kv").ok());
  ASSERT_TRUE(w->Finish().ok());
  EXPECT_EQ(w->stats().members, 1u);
  ASSERT_TRUE(PackFiles(fs, "/without.kvpack", {{"b.kv", "/b.kv"}}, 4).ok());
  EXPECT_EQ(FileBytes(fs, "/with.kvpack"), FileBytes(fs, "/without.kvpack"));
}

}  // namespace
}  // namespace kvfile

namespace kvfile {
namespace {

// Issue 27, classes 1 and 2: what opening a pack costs follows the bytes the
// file holds, not the counts its header claims.

uint64_t HeaderU64(const std::vector<uint8_t>& img, size_t at) {
  uint64_t v;
  std::memcpy(&v, img.data() + at, 8);
  return v;
}

void SetHeaderU64(std::vector<uint8_t>& img, size_t at, uint64_t v) { std::memcpy(img.data() + at, &v, 8); }

void ResealHeader(std::vector<uint8_t>& img) { SetHeaderU64(img, 120, XXH3_64bits(img.data(), 120)); }

// SmallPack with `extra` model entries inserted after its one model (the
// chunks and members keep using model 0), every checksum recomputed.
std::vector<uint8_t> WithModels(const std::vector<uint8_t>& pack, const std::vector<PackModel>& extra) {
  const uint64_t data_end = HeaderU64(pack, 32);
  const uint64_t table_end = data_end + pack::kModelEntryBytes * HeaderU64(pack, 40);
  std::vector<uint8_t> entries(extra.size() * pack::kModelEntryBytes);
  for (size_t i = 0; i < extra.size(); ++i) pack::EncodeModel(extra[i], entries.data() + i * pack::kModelEntryBytes);
  std::vector<uint8_t> img = pack;
  img.insert(img.begin() + static_cast<ptrdiff_t>(table_end), entries.begin(), entries.end());
  const uint64_t models = HeaderU64(pack, 40) + extra.size();
  SetHeaderU64(img, 40, models);
  SetHeaderU64(img, 72, XXH3_64bits(img.data() + data_end, models * pack::kModelEntryBytes));
  SetHeaderU64(img, 104, img.size());
  ResealHeader(img);
  return img;
}

// 24,000 models that differ only in their last stream's row width, at the
// end of the entry: comparing each with every earlier one (what the reader
// did) scans 24,000^2 / 2 x ~1,260 bytes, 4 s of CPU and more on any
// machine; sorting them takes milliseconds.
std::vector<PackModel> ManyModels(size_t n) {
  std::vector<PackModel> models(n);
  for (size_t i = 0; i < n; ++i) {
    PackModel& m = models[i];
    m.identity.model_id = "many";
    m.identity.fingerprint = 7;
    m.chunk_tokens = 4;
    m.geometry.layers = 1;
    for (int s = 0; s < 16; ++s) m.geometry.streams.push_back({"s" + std::to_string(s), 1, 8, Dtype::kBF16});
    m.geometry.streams.back().row_width = static_cast<uint32_t>(8 + i);
  }
  return models;
}

double CpuSeconds(const std::function<void()>& f) {
  timespec a{}, b{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
  f();
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
  return double(b.tv_sec - a.tv_sec) + double(b.tv_nsec - a.tv_nsec) * 1e-9;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr double kModelsCpuSeconds = 10.0;  // sanitizers: the old check took minutes
#else
constexpr double kModelsCpuSeconds = 1.0;   // idle: about 0.05 s; the old check: 4 s and more
#endif

TEST(PackTest, ManyModelsOpenInTimeProportionalToTheirCount) {
  FaultFs base;
  const std::vector<uint8_t> small = SmallPack(base);
  std::vector<PackModel> extra = ManyModels(24000);
  FaultFs fs({{"/p.kvpack", WithModels(small, extra)}});
  std::unique_ptr<PackReader> r;
  Status st;
  double cpu = CpuSeconds([&] { st = PackReader::Open("/p.kvpack", &fs, &r); });
  std::printf("open of a pack of 24,001 models: %.3f s of CPU\n", cpu);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(r->models().size(), 24001u);
  EXPECT_LT(cpu, kModelsCpuSeconds);
  ASSERT_TRUE(r->Verify(nullptr).ok());

  // Duplicates are still found, the first one in table order, named with
  // the first model it repeats (chunk_tokens does not count): the models
  // are 0 (SmallPack's) and 1.. (extra[0]..).
  extra[23990] = extra[17];
  extra[23990].chunk_tokens = 8;
  extra[23995] = extra[3];
  extra[23999] = extra[3];
  FaultFs dup({{"/p.kvpack", WithModels(small, extra)}});
  cpu = CpuSeconds([&] { st = PackReader::Open("/p.kvpack", &dup, &r); });
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_EQ(st.message(), "/p.kvpack: models 18 and 23991 are the same");
  EXPECT_LT(cpu, kModelsCpuSeconds);
  // A model that fails its own rules before its duplicate is reached is
  // reported as such (the order of the checks is the table's).
  extra[500].geometry.streams[0].row_width = 0;
  FaultFs bad({{"/p.kvpack", WithModels(small, extra)}});
  st = PackReader::Open("/p.kvpack", &bad, &r);
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_EQ(st.message().rfind("/p.kvpack: model 501: ", 0), 0u) << st.message();
}

// A sparse pack on disk: `image` with `hole` zero bytes inserted at
// `at` (a hole of the file, made by ftruncate and writing past it).
std::string WriteWithHole(const std::string& path, const std::vector<uint8_t>& image, uint64_t at, uint64_t hole) {
  int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::pwrite(fd, image.data(), at, 0), static_cast<ssize_t>(at));
  EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(at + hole)), 0);
  const uint64_t rest = image.size() - at;
  EXPECT_EQ(::pwrite(fd, image.data() + at, rest, static_cast<off_t>(at + hole)), static_cast<ssize_t>(rest));
  ::close(fd);
  return path;
}

// Opens the pack in a child process: the open's line ("ok" if it opened)
// and the child's peak RSS growth over the open.
testing::ChildCost OpenInChild(const std::string& path) {
  return testing::RunInChild([&path] {
    std::unique_ptr<PackReader> r;
    Status st = PackReader::Open(path, nullptr, &r);
    return st.ok() ? std::string("ok") : st.message();
  });
}

constexpr uint64_t kHole = uint64_t{512} << 20;

class PackHoleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "kvfile_pack_hole_" + std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
    FaultFs fs;
    pack_ = SmallPack(fs);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
  std::vector<uint8_t> pack_;
};

// A names region of 512 MiB, a hole after the two names (the header says
// so, its checksum recomputed): refused from the header's counts, before
// anything is read or allocated for it (it cost 517 MiB, refused by the
// names checksum).
TEST_F(PackHoleTest, NamesRegionLargerThanItsNamesIsRefusedFromTheHeader) {
  std::vector<uint8_t> img = pack_;
  const uint64_t names = HeaderU64(img, 64), members = HeaderU64(img, 56);
  const uint64_t index_at = img.size() - 64 * members;
  SetHeaderU64(img, 64, names + kHole);
  SetHeaderU64(img, 104, img.size() + kHole);
  ResealHeader(img);
  std::string path = WriteWithHole(dir_ + "/names.kvpack", img, index_at, kHole);
  testing::ChildCost c = OpenInChild(path);
  EXPECT_EQ(c.result, path + ": the names region is " + std::to_string(names + kHole) +
                         " bytes, more than 2 names of at most 4096 bytes hold");
  EXPECT_GE(c.growth_mib, 0);
  EXPECT_LT(c.growth_mib, testing::kSmallGrowthMib);
}

// A model table of 512 MiB more entries, a hole (the count and the file
// size agree, so only the checksum can refuse it): its checksum is taken
// piece by piece before the table is allocated.
TEST_F(PackHoleTest, HoleInTheModelTableIsRefusedWithBoundedMemory) {
  std::vector<uint8_t> img = pack_;
  const uint64_t data_end = HeaderU64(img, 32), models = HeaderU64(img, 40);
  const uint64_t extra = kHole / pack::kModelEntryBytes, hole = extra * pack::kModelEntryBytes;
  SetHeaderU64(img, 40, models + extra);
  SetHeaderU64(img, 104, img.size() + hole);
  ResealHeader(img);
  std::string path = WriteWithHole(dir_ + "/models.kvpack", img, data_end + models * pack::kModelEntryBytes, hole);
  testing::ChildCost c = OpenInChild(path);
  EXPECT_EQ(c.result, path + ": model table checksum mismatch (at offset " + std::to_string(data_end) + ")");
  EXPECT_GE(c.growth_mib, 0);
  EXPECT_LT(c.growth_mib, testing::kSmallGrowthMib);
  // The same pack without the hole opens (the test's image is sound).
  std::string sound = dir_ + "/sound.kvpack";
  WriteWithHole(sound, pack_, pack_.size(), 0);
  EXPECT_EQ(OpenInChild(sound).result, "ok");
}

class PackConcurrentChange : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvfile_packchange_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    // a.kv: 12 tokens in chunks of 3.
    WriteKv(*FileSystem::Default(), P("a.kv"), MixedGeometry(), Tokens(10, 12), [](uint64_t) { return 1; });
    std::filesystem::copy_file(P("a.kv"), P("before.kv"));
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string P(const std::string& name) const { return dir_ + "/" + name; }

  // Packs a.kv with 8 threads, `event` run once the first thread has
  // opened it (and read its state).
  Status PackA(const std::function<void()>& event) {
    testing::BeforeSecondOpen fs(P("a.kv"), event);
    PackWriterOptions po;
    po.fs = &fs;
    po.chunk_tokens = 4;
    po.threads = 8;
    std::unique_ptr<PackWriter> w;
    KVFILE_RETURN_IF_ERROR(PackWriter::Begin(P("a.kvpack"), po, &w));
    Status st = w->AddFile("a.kv", P("a.kv"));
    EXPECT_TRUE(fs.ran()) << "a.kv was opened once only";
    KVFILE_RETURN_IF_ERROR(st);
    return w->Finish();
  }
  // The member of a.kvpack, written out as a .kv file.
  std::vector<uint8_t> Member() {
    std::unique_ptr<PackReader> r;
    EXPECT_TRUE(PackReader::Open(P("a.kvpack"), nullptr, &r).ok());
    if (!r) return {};
    EXPECT_TRUE(r->Materialize(0, P("member.kv")).ok());
    return Contents(*FileSystem::Default(), P("member.kv"));
  }

  std::string dir_;
};

// A file appended to (and committed) by a writer while the pack has it
// open: every thread reads the tokens the first open found, so the member
// is the file as it was then. (Before, each thread opened the path again,
// found the longer file and the pack failed.)
TEST_F(PackConcurrentChange, AppendedFileIsPackedAsOpened) {
  ASSERT_TRUE(PackA([&] {
                std::unique_ptr<Writer> w;
                ASSERT_TRUE(Writer::Open(P("a.kv"), {}, &w).ok());
                AppendKv(*w, MixedGeometry(), Tokens(10, 17), 12, [](uint64_t) { return 1; });
                ASSERT_TRUE(w->Close().ok());
              }).ok());
  std::unique_ptr<Reader> now;
  ASSERT_TRUE(Reader::Open(P("a.kv"), {}, &now).ok());
  ASSERT_EQ(now->token_count(), 17u);  // the append happened
  EXPECT_EQ(Member(), Contents(*FileSystem::Default(), P("before.kv")));
}

// Another file renamed over the path while the pack has it open (same
// model, geometry and token count, other rows): refused, never a member
// mixing both. (Before, the other threads packed the new file's sections
// beside the old file's.)
TEST_F(PackConcurrentChange, FileRenamedOverIsRefused) {
  WriteKv(*FileSystem::Default(), P("new.kv"), MixedGeometry(), Tokens(10, 12), [](uint64_t) { return 2; });
  Status st = PackA([&] { std::filesystem::rename(P("new.kv"), P("a.kv")); });
  EXPECT_EQ(st.code(), Status::Code::kFailed) << st.ToString();
  EXPECT_EQ(st.message(), P("a.kv") + ": the file was replaced since it was opened");
  EXPECT_FALSE(std::filesystem::exists(P("a.kvpack")));
}

// A file rewound and appended to again (a new epoch, new rows where the
// old chunks were) while the pack has it open: the reads of the rewritten
// chunks fail as a change of the file, not as damage. (Before: "payload
// checksum mismatch", kCorruption.)
TEST_F(PackConcurrentChange, RewoundFileIsAChangeNotDamage) {
  Status st = PackA([&] {
    std::unique_ptr<Writer> w;
    ASSERT_TRUE(Writer::Open(P("a.kv"), {}, &w).ok());
    ASSERT_TRUE(w->Rewind(2).ok());
    AppendKv(*w, MixedGeometry(), Tokens(10, 12), 2, [](uint64_t) { return 3; });
    ASSERT_TRUE(w->Close().ok());
  });
  EXPECT_EQ(st.code(), Status::Code::kBusy) << st.ToString();
  EXPECT_EQ(st.message(),
            P("a.kv") + ": changed while being read (rewound or repaired by another process); read it again");
  EXPECT_FALSE(std::filesystem::exists(P("a.kvpack")));
}

}  // namespace
}  // namespace kvfile
