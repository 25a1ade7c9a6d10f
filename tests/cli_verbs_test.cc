// SPDX-License-Identifier: Apache-2.0
// The verbs dump, rewind, append and convert, run as a user runs them: exit
// status, the one stderr line, files left exactly as they were on failure,
// and every code, scale and value checked against the library and the codec.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/cli_run.h"
#include "support/scratch_dir.h"
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>

#include "codec/nvfp4.h"
#include "kvfile/codec.h"
#include "kvfile/presets.h"
#include "kvfile/reader.h"
#include "kvfile/formats/safetensors.h"
#include "synth_data.h"

namespace {

namespace fs = std::filesystem;
using kvfile::Dtype;
using nlohmann::json;

using kvfile::testing::CliRun;
using kvfile::testing::Kvfile;
using kvfile::testing::ReadFile;

// ---- A safetensors writer and reader of the test's own (not the library's) -------------

struct StTensor {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  std::string bytes;
};

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

void WriteSt(const std::string& path, const std::vector<StTensor>& tensors, const json& metadata) {
  json h = json::object();
  if (!metadata.is_null()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  std::string data;
  for (const StTensor& t : tensors) {
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
    data += t.bytes;
  }
  std::string hs = h.dump();
  uint64_t n = hs.size();
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << hs << data;
}

struct StFile {
  json header;
  std::string data;
  std::string Tensor(const std::string& name) const {
    auto off = header.at(name).at("data_offsets");
    return data.substr(off[0].get<size_t>(), off[1].get<size_t>() - off[0].get<size_t>());
  }
};

StFile ReadSt(const std::string& path) {
  std::string all = ReadFile(path);
  uint64_t n;
  std::memcpy(&n, all.data(), 8);
  return {json::parse(all.substr(8, n)), all.substr(8 + n)};
}

// ---- What a .kv file holds, through the library ------------------------------------------

struct Snap {
  kvfile::Geometry g;
  kvfile::ModelIdentity id;
  std::vector<uint32_t> tokens;
  uint32_t nominal = 0;
  std::vector<kvfile::ChunkInfo> chunks;
  std::vector<std::string> data;           // [l * S + s]: codes (nvfp4: + block scales), or raw elements
  std::vector<std::vector<float>> scales;  // fp8 and nvfp4 streams
};

Snap TakeSnap(const std::string& path) {
  Snap s;
  std::unique_ptr<kvfile::Reader> r;
  kvfile::Status st = kvfile::Reader::Open(path, {}, &r);
  EXPECT_TRUE(st.ok()) << st.message();
  if (!st.ok()) return s;
  s.g = r->geometry();
  s.id = r->identity();
  s.tokens.assign(r->tokens().begin(), r->tokens().end());
  s.nominal = r->nominal_chunk_tokens();
  s.chunks.assign(r->chunks().begin(), r->chunks().end());
  uint64_t T = r->token_count();
  for (uint32_t l = 0; l < s.g.layers; ++l)
    for (uint32_t k = 0; k < s.g.streams.size(); ++k) {
      if (!s.g.InLayer(l, k)) {  // a stream absent from the layer: nothing
        s.data.emplace_back();
        s.scales.emplace_back();
        continue;
      }
      const kvfile::StreamSpec& spec = s.g.streams[k];
      uint64_t rows = T * spec.rows_per_token;
      std::string d(rows * spec.row_width * kvfile::ElementSize(spec.dtype), '\0');
      std::vector<float> sc;
      if (kvfile::IsNvfp4(spec.dtype)) {  // the codes, then the block scales; a scale per token
        const uint64_t e = spec.ElementsPerToken();
        d.resize(T * (e / 2 + e / 16));
        sc.resize(T);
        auto* p = reinterpret_cast<uint8_t*>(d.data());
        st = r->ReadCodes(l, k, 0, T, p, p + T * e / 2, sc.data());
      } else if (kvfile::IsFp8(spec.dtype)) {
        sc.resize(rows);
        st = r->ReadCodes(l, k, 0, T, reinterpret_cast<uint8_t*>(d.data()), sc.data());
      } else {
        st = r->ReadRows(l, k, 0, T, spec.dtype, d.data());
      }
      EXPECT_TRUE(st.ok()) << st.message();
      s.data.push_back(std::move(d));
      s.scales.push_back(std::move(sc));
    }
  return s;
}

// What reading (layer, stream) decoded as `out` gives, from the stored codes.
std::string Decoded(const Snap& s, size_t i, Dtype out) {
  const kvfile::StreamSpec& spec = s.g.streams[i % s.g.streams.size()];
  uint64_t rows = s.tokens.size() * spec.rows_per_token;
  std::string d(rows * spec.row_width * kvfile::ElementSize(out), '\0');
  if (kvfile::IsFp8(spec.dtype))
    kvfile::codec::DequantizeRows(spec.dtype, reinterpret_cast<const uint8_t*>(s.data[i].data()),
                                  s.scales[i].data(), rows, spec.row_width, out, d.data());
  else
    kvfile::codec::ConvertRaw(spec.dtype, s.data[i].data(), rows * spec.row_width, out, d.data());
  return d;
}

// Codes and scales the codec gives for rows of `in` dtype.
std::pair<std::string, std::vector<float>> Quantized(Dtype kind, Dtype in, const void* src, uint64_t rows,
                                                     uint32_t width) {
  std::string codes(rows * width, '\0');
  std::vector<float> scales(rows);
  size_t bad;
  EXPECT_TRUE(kvfile::codec::QuantizeRows(kind, in, src, rows, width, reinterpret_cast<uint8_t*>(codes.data()),
                                          scales.data(), &bad));
  return {codes, scales};
}

std::string Concat(const Snap& s, uint32_t stream, const std::function<std::string(size_t)>& part) {
  std::string all;
  for (uint32_t l = 0; l < s.g.layers; ++l)
    if (s.g.InLayer(l, stream)) all += part(l * s.g.streams.size() + stream);
  return all;
}

// Same geometry, identity, tokens, codes, scales and raw elements.
void ExpectSameContents(const Snap& a, const Snap& b) {
  EXPECT_EQ(a.g, b.g);
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.data.size(), b.data.size());
  for (size_t i = 0; i < a.data.size(); ++i) {
    EXPECT_TRUE(a.data[i] == b.data[i]) << "block " << i;
    EXPECT_TRUE(a.scales[i] == b.scales[i]) << "block " << i;
  }
}

// The safetensors dtype name of a kvfile dtype (the mapping is tested in
// safetensors_test).
const char* StDtype(Dtype d) { return kvfile::safetensors::DTypeName(kvfile::safetensors::DTypeOf(d)); }

class CliVerbsTest : public kvfile::testing::ScratchDirTest {
 protected:
  void Synth(const std::string& name, const std::string& flags) {
    CliRun r = Kvfile("synth " + P(name) + " " + flags);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  // Every file name in the test directory containing `part`.
  std::vector<std::string> Leftovers(const std::string& part) const {
    std::vector<std::string> found;
    for (const auto& e : fs::recursive_directory_iterator(dir_))
      if (e.path().filename().string().find(part) != std::string::npos) found.push_back(e.path().string());
    return found;
  }
};

// A small hand-made input in the convention: 2 layers, k [2 rows x 4] and
// v [1 x 8], F32 values; token ids I32.
struct Input {
  uint32_t layers = 2;
  uint64_t tokens = 5;
  std::vector<int32_t> ids;
  std::vector<float> k, v;
  Input(uint64_t n, uint32_t seed) : tokens(n) {
    for (uint64_t t = 0; t < n; ++t) ids.push_back(static_cast<int32_t>(1000 + seed * 100 + t));
    k.resize(layers * n * 2 * 4);
    v.resize(layers * n * 8);
    for (size_t i = 0; i < k.size(); ++i) k[i] = std::sin(0.37f * static_cast<float>(i + seed)) * 3.0f;
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::cos(0.11f * static_cast<float>(i * seed + 1)) * 50.0f;
  }
  void Write(const std::string& path, const json& meta) const {
    WriteSt(path,
            {{"tokens", "I32", {tokens}, Bytes(ids)},
             {"k", "F32", {layers, tokens, 2, 4}, Bytes(k)},
             {"v", "F32", {layers, tokens, 1, 8}, Bytes(v)}},
            meta);
  }
};

const json kMeta = {{"kvfile.model", "test/model"}, {"kvfile.fingerprint", "00000000000000aa"}};

// ---- convert: safetensors round trips -----------------------------------------------------------

TEST_F(CliVerbsTest, RoundTripEveryPresetAndDtypeThroughSafetensors) {
  struct Case {
    const char* preset;
    int tokens;
    int chunk;
  };
  for (Case c : {Case{"tiny", 300, 64}, Case{"llama-3.1-8b", 3, 2}, Case{"qwen2.5-7b", 4, 3},
                 Case{"deepseek-v3", 3, 2}, Case{"dsa-mixed", 3, 2}, Case{"glm-5.2", 3, 2}}) {
    for (const char* fp8 : {"e4m3", "e5m2"}) {
      SCOPED_TRACE(std::string(c.preset) + " " + fp8);
      std::string a = P("a.kv");
      fs::remove(a);
      Synth("a.kv", std::string("--preset ") + c.preset + " --tokens " + std::to_string(c.tokens) +
                        " --chunk-tokens " + std::to_string(c.chunk) + " --dtype " + fp8 + " --seed 3");
      std::string a_bytes = ReadFile(a);
      Snap sa = TakeSnap(a);
      uint64_t T = sa.tokens.size();

      // Export with --codes: every code and scale as stored, raw streams as stored.
      CliRun ex = Kvfile("convert " + a + " " + P("c.safetensors") + " --codes --force");
      ASSERT_EQ(ex.exit_code, 0) << ex.err;
      StFile st = ReadSt(P("c.safetensors"));
      EXPECT_EQ(st.header["__metadata__"]["kvfile.model"], sa.id.model_id);
      EXPECT_EQ(st.header["__metadata__"]["kvfile.fingerprint"], "0000000000000003");
      EXPECT_EQ(st.header["tokens"]["dtype"], "I64");
      std::vector<int64_t> ids(T);
      std::memcpy(ids.data(), st.Tensor("tokens").data(), T * 8);
      EXPECT_TRUE(std::equal(ids.begin(), ids.end(), sa.tokens.begin()));
      for (uint32_t s = 0; s < sa.g.streams.size(); ++s) {
        const auto& spec = sa.g.streams[s];
        // A stream's tensors hold its own layers (glm-5.2's indexer: 21 of 78).
        const uint32_t nl = sa.g.StreamLayers(s);
        json shape = {nl, T, spec.rows_per_token, spec.row_width};
        if (!spec.layers.empty()) {
          EXPECT_EQ(st.header["__metadata__"]["kvfile.layers." + spec.name], kvfile::FormatLayerList(spec.layers));
          EXPECT_EQ(st.header["__metadata__"]["kvfile.layer_count"], std::to_string(sa.g.layers));
        }
        if (kvfile::IsFp8(spec.dtype)) {
          EXPECT_EQ(st.header[spec.name + ".codes"]["dtype"], StDtype(spec.dtype));
          EXPECT_EQ(st.header[spec.name + ".codes"]["shape"], shape);
          EXPECT_EQ(st.header[spec.name + ".scales"]["shape"], json({nl, T, spec.rows_per_token}));
          EXPECT_TRUE(st.Tensor(spec.name + ".codes") == Concat(sa, s, [&](size_t i) { return sa.data[i]; }));
          EXPECT_TRUE(st.Tensor(spec.name + ".scales") == Concat(sa, s, [&](size_t i) { return Bytes(sa.scales[i]); }));
        } else {
          EXPECT_EQ(st.header[spec.name]["dtype"], StDtype(spec.dtype));
          EXPECT_EQ(st.header[spec.name]["shape"], shape);
          EXPECT_TRUE(st.Tensor(spec.name) == Concat(sa, s, [&](size_t i) { return sa.data[i]; }));
        }
      }
      // ... and back: the same file contents, codes imported exactly.
      CliRun im = Kvfile("convert " + P("c.safetensors") + " " + P("b.kv") + " --codes --force --chunk-tokens " +
                         std::to_string(c.chunk));
      ASSERT_EQ(im.exit_code, 0) << im.err;
      Snap sb = TakeSnap(P("b.kv"));
      ExpectSameContents(sa, sb);
      EXPECT_EQ(sb.chunks.size(), sa.chunks.size());

      // Export decoded: each value what DequantizeRows gives for the stored codes.
      for (Dtype out : {Dtype::kBF16, Dtype::kF16, Dtype::kF32}) {
        std::string flag = out == Dtype::kBF16 ? "" : out == Dtype::kF16 ? " --dtype f16" : " --dtype f32";
        CliRun d = Kvfile("convert " + a + " " + P("d.safetensors") + " --force" + flag);
        ASSERT_EQ(d.exit_code, 0) << d.err;
        StFile sd = ReadSt(P("d.safetensors"));
        for (uint32_t s = 0; s < sa.g.streams.size(); ++s) {
          const auto& spec = sa.g.streams[s];
          EXPECT_EQ(sd.header[spec.name]["dtype"], StDtype(out));
          EXPECT_TRUE(sd.Tensor(spec.name) == Concat(sa, s, [&](size_t i) { return Decoded(sa, i, out); }))
              << spec.name << " as " << kvfile::DtypeName(out);
        }
      }
      EXPECT_TRUE(ReadFile(a) == a_bytes) << "convert must never write IN";
    }
  }
}

// The glm-5.2 preset (78 layers, the indexer in 21): synth writes a 2.3
// file whose indexer has its 21 layers, synth --check and verify pass, info
// shows the layers, and bench, which measures presets in every layer, says
// why it does not take it (exit 2).
TEST_F(CliVerbsTest, Glm52PresetKeepsItsIndexerIn21Layers) {
  Synth("g.kv", "--preset glm-5.2 --tokens 5 --chunk-tokens 2 --seed 4");
  CliRun check = Kvfile("synth --check " + P("g.kv"));
  EXPECT_EQ(check.exit_code, 0) << check.err;
  CliRun v = Kvfile("verify " + P("g.kv"));
  EXPECT_EQ(v.exit_code, 0) << v.err;
  auto info = nlohmann::json::parse(Kvfile("info --json " + P("g.kv")).out);
  EXPECT_EQ(info["version"], "2.3");
  EXPECT_EQ(info["layers"], 78);
  EXPECT_FALSE(info["streams"][0].contains("layers"));
  EXPECT_EQ(info["streams"][2]["layers"],
            json({0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64, 68, 72, 76, 77}));
  CliRun text = Kvfile("info " + P("g.kv"));
  EXPECT_NE(text.out.find("bf16  in layers 0,4,8,12,16,20,24,28,32,36,40,44,48,52,56,60,64,68,72,76,77\n"),
            std::string::npos)
      << text.out;
  fs::create_directories(P("bench"));
  CliRun b = Kvfile("bench --preset glm-5.2 --tokens 4 --dir " + P("bench"));
  EXPECT_EQ(b.exit_code, 2);
  EXPECT_EQ(b.err, "kvfile bench: generating the session\nkvfile: error: preset glm-5.2 has a stream in some "
                   "layers only; bench measures presets whose "
                   "streams are in every layer (--fidelity takes it)\n");
}

TEST_F(CliVerbsTest, ImportQuantizesValuesWithTheCodec) {
  Input in(37, 1);
  in.Write(P("in.safetensors"), kMeta);
  std::string before = ReadFile(P("in.safetensors"));
  CliRun r = Kvfile("convert " + P("in.safetensors") + " " + P("out.kv") + " --chunk-tokens 8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, P("in.safetensors") + " -> " + P("out.kv") +
                       ": 37 tokens; k e4m3, v e4m3; 8 tokens per chunk; " +
                       std::to_string(fs::file_size(P("out.kv"))) + " bytes\n");
  EXPECT_TRUE(ReadFile(P("in.safetensors")) == before);
  Snap s = TakeSnap(P("out.kv"));
  EXPECT_EQ(s.id.model_id, "test/model");
  EXPECT_EQ(s.id.fingerprint, 0xaau);
  EXPECT_EQ(s.g.layers, 2u);
  EXPECT_EQ(s.nominal, 8u);
  EXPECT_EQ(s.chunks.size(), 5u);
  ASSERT_EQ(s.tokens.size(), 37u);
  EXPECT_EQ(s.tokens[36], 1136u);
  for (uint32_t l = 0; l < 2; ++l) {
    auto [kc, ks] = Quantized(Dtype::kE4M3, Dtype::kF32, &in.k[l * 37 * 8], 37 * 2, 4);
    EXPECT_TRUE(s.data[l * 2] == kc);
    EXPECT_TRUE(s.scales[l * 2] == ks);
    auto [vc, vs] = Quantized(Dtype::kE4M3, Dtype::kF32, &in.v[l * 37 * 8], 37, 8);
    EXPECT_TRUE(s.data[l * 2 + 1] == vc);
    EXPECT_TRUE(s.scales[l * 2 + 1] == vs);
  }
  // e5m2, --keep-raw, and a raw --dtype.
  ASSERT_EQ(Kvfile("convert " + P("in.safetensors") + " " + P("e5.kv") + " --dtype e5m2 --keep-raw v").exit_code, 0);
  Snap e5 = TakeSnap(P("e5.kv"));
  EXPECT_EQ(e5.g.streams[0].dtype, Dtype::kE5M2);
  EXPECT_EQ(e5.g.streams[1].dtype, Dtype::kBF16);
  auto [kc5, ks5] = Quantized(Dtype::kE5M2, Dtype::kF32, in.k.data(), 37 * 2, 4);
  EXPECT_TRUE(e5.data[0] == kc5);
  std::string vb(37 * 8 * 2, '\0');
  kvfile::codec::ConvertRaw(Dtype::kF32, in.v.data(), 37 * 8, Dtype::kBF16, vb.data());
  EXPECT_TRUE(e5.data[1] == vb);
  ASSERT_EQ(Kvfile("convert " + P("in.safetensors") + " " + P("f32.kv") + " --dtype f32").exit_code, 0);
  Snap f = TakeSnap(P("f32.kv"));
  EXPECT_EQ(f.g.streams[0].dtype, Dtype::kF32);
  EXPECT_TRUE(f.data[0] == std::string(reinterpret_cast<const char*>(in.k.data()), 37 * 8 * 4));
  // U32 and I64 token ids, F16 values, no metadata: model '' and fingerprint 0.
  std::vector<uint32_t> u(3, 4000000000u);
  std::vector<uint16_t> k16(2 * 3 * 2 * 4, 0x3C00);  // 1.0
  std::vector<uint16_t> v16(2 * 3 * 8, 0xC000);      // -2.0
  WriteSt(P("u.safetensors"),
          {{"tokens", "U32", {3}, Bytes(u)}, {"k", "F16", {2, 3, 2, 4}, Bytes(k16)}, {"v", "F16", {2, 3, 1, 8}, Bytes(v16)}},
          nullptr);
  ASSERT_EQ(Kvfile("convert " + P("u.safetensors") + " " + P("u.kv")).exit_code, 0);
  Snap su = TakeSnap(P("u.kv"));
  EXPECT_EQ(su.tokens, u);
  EXPECT_EQ(su.id, (kvfile::ModelIdentity{"", 0}));
  // --codes on import: value tensors are raw streams kept as stored.
  ASSERT_EQ(Kvfile("convert " + P("u.safetensors") + " " + P("u16.kv") + " --codes").exit_code, 0);
  Snap s16 = TakeSnap(P("u16.kv"));
  EXPECT_EQ(s16.g.streams[0].dtype, Dtype::kF16);
  EXPECT_TRUE(s16.data[0] == std::string(reinterpret_cast<const char*>(k16.data()), 3 * 8 * 2));
}

TEST_F(CliVerbsTest, ImportCodesIntoAnotherDtypeDecodesThem) {
  Synth("a.kv", "--preset tiny --tokens 33 --chunk-tokens 8");
  Snap a = TakeSnap(P("a.kv"));
  ASSERT_EQ(Kvfile("convert " + P("a.kv") + " " + P("c.safetensors") + " --codes").exit_code, 0);
  ASSERT_EQ(Kvfile("convert " + P("c.safetensors") + " " + P("e5.kv") + " --dtype e5m2").exit_code, 0);
  ASSERT_EQ(Kvfile("convert " + P("c.safetensors") + " " + P("bf.kv") + " --keep-raw v").exit_code, 0);
  Snap e5 = TakeSnap(P("e5.kv")), bf = TakeSnap(P("bf.kv"));
  EXPECT_EQ(bf.g.streams[0].dtype, Dtype::kE4M3);
  EXPECT_EQ(bf.g.streams[1].dtype, Dtype::kBF16);
  for (size_t i = 0; i < a.data.size(); ++i) {
    const auto& spec = a.g.streams[i % 2];
    std::string f32 = Decoded(a, i, Dtype::kF32);
    auto [codes, scales] = Quantized(Dtype::kE5M2, Dtype::kF32, f32.data(), 33 * spec.rows_per_token, spec.row_width);
    EXPECT_TRUE(e5.data[i] == codes) << i;
    EXPECT_TRUE(e5.scales[i] == scales) << i;
    if (i % 2 == 0) EXPECT_TRUE(bf.data[i] == a.data[i]) << i;  // same dtype: exact
    else EXPECT_TRUE(bf.data[i] == Decoded(a, i, Dtype::kBF16)) << i;
  }
}

TEST_F(CliVerbsTest, ImportRefusesInputsOutsideTheConvention) {
  std::string out = P("out.kv");
  auto expect_refused = [&](const std::string& input, int code, const std::string& err_line) {
    CliRun r = Kvfile("convert " + input + " " + out);
    EXPECT_EQ(r.exit_code, code) << r.err;
    EXPECT_EQ(r.err, "kvfile: error: " + err_line + "\n");
    EXPECT_EQ(r.out, "");
    EXPECT_FALSE(fs::exists(out));
    EXPECT_TRUE(Leftovers(".kvtmp").empty());
    EXPECT_TRUE(Leftovers(".kvnew").empty());
  };
  Input in(6, 2);
  std::vector<int32_t> neg = in.ids;
  neg[4] = -7;
  WriteSt(P("neg.safetensors"),
          {{"tokens", "I32", {6}, Bytes(neg)}, {"k", "F32", {2, 6, 2, 4}, Bytes(in.k)}, {"v", "F32", {2, 6, 1, 8}, Bytes(in.v)}},
          kMeta);
  expect_refused(P("neg.safetensors"), 2,
                 P("neg.safetensors") + ": tensor 'tokens': token 4 has id -7; token ids are 0..4294967295");
  WriteSt(P("notok.safetensors"), {{"k", "F32", {2, 6, 2, 4}, Bytes(in.k)}}, kMeta);
  expect_refused(P("notok.safetensors"), 2, P("notok.safetensors") + ": no 'tokens' tensor");
  in.Write(P("fp.safetensors"), {{"kvfile.fingerprint", "xyz"}});
  expect_refused(P("fp.safetensors"), 2,
                 P("fp.safetensors") + ": __metadata__ 'kvfile.fingerprint' is 'xyz'; expected 16 hex digits");
  Input nan = in;
  nan.v[2 * 6 * 8 - 3] = std::numeric_limits<float>::quiet_NaN();  // layer 1, last token
  nan.Write(P("nan.safetensors"), kMeta);
  CliRun r = Kvfile("convert " + P("nan.safetensors") + " " + out + " --chunk-tokens 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "kvfile: error: " + P("nan.safetensors") +
                       ": non-finite value in layer 1, stream 'v', token 5, row 0\n");
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(Leftovers(".kvtmp").empty());
  // Not safetensors at all: a header length of 2^63.
  {
    std::ofstream f(P("huge.safetensors"), std::ios::binary);
    uint64_t n = uint64_t{1} << 63;
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << "{}";
  }
  expect_refused(P("huge.safetensors"), 1,
                 P("huge.safetensors") + ": header length 9223372036854775808 exceeds the limit of 100000000 bytes");
  // Overlapping tensors.
  {
    std::string h = R"({"tokens":{"dtype":"I32","shape":[1],"data_offsets":[0,4]},)"
                    R"("k":{"dtype":"F32","shape":[1,1,1,1],"data_offsets":[2,6]}})";
    std::ofstream f(P("overlap.safetensors"), std::ios::binary);
    uint64_t n = h.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << h << std::string(6, '\0');
  }
  expect_refused(P("overlap.safetensors"), 1,
                 P("overlap.safetensors") +
                     ": tensor 'k': data_offsets [2, 6) overlaps the tensor before it, which ends at 4");
}

// ---- convert: .kv -> .kv --------------------------------------------------------------------------

TEST_F(CliVerbsTest, E4m3ToE5m2AndBackRequantizesDecodedValues) {
  Synth("a.kv", "--preset tiny --tokens 70 --chunk-tokens 16");
  Snap a = TakeSnap(P("a.kv"));
  CliRun r = Kvfile("convert " + P("a.kv") + " " + P("b.kv") + " --dtype e5m2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, P("a.kv") + " -> " + P("b.kv") + ": 70 tokens; k e5m2, v e5m2; 16 tokens per chunk; " +
                       std::to_string(fs::file_size(P("b.kv"))) + " bytes\n");
  Snap b = TakeSnap(P("b.kv"));
  EXPECT_EQ(b.id, a.id);
  EXPECT_EQ(b.tokens, a.tokens);
  EXPECT_EQ(b.nominal, 16u);
  for (size_t i = 0; i < a.data.size(); ++i) {
    const auto& spec = a.g.streams[i % 2];
    std::string f32 = Decoded(a, i, Dtype::kF32);
    auto [codes, scales] = Quantized(Dtype::kE5M2, Dtype::kF32, f32.data(), 70 * spec.rows_per_token, spec.row_width);
    EXPECT_TRUE(b.data[i] == codes) << i;
    EXPECT_TRUE(b.scales[i] == scales) << i;
  }
  ASSERT_EQ(Kvfile("convert " + P("b.kv") + " " + P("c.kv") + " --dtype e4m3").exit_code, 0);
  Snap c = TakeSnap(P("c.kv"));
  EXPECT_EQ(c.g.streams[0].dtype, Dtype::kE4M3);
  for (size_t i = 0; i < b.data.size(); ++i) {
    const auto& spec = b.g.streams[i % 2];
    std::string f32 = Decoded(b, i, Dtype::kF32);
    auto [codes, scales] = Quantized(Dtype::kE4M3, Dtype::kF32, f32.data(), 70 * spec.rows_per_token, spec.row_width);
    EXPECT_TRUE(c.data[i] == codes) << i;
    EXPECT_TRUE(c.scales[i] == scales) << i;
  }
  // The same dtype copies codes: no drift.
  ASSERT_EQ(Kvfile("convert " + P("a.kv") + " " + P("d.kv") + " --dtype e4m3").exit_code, 0);
  ExpectSameContents(a, TakeSnap(P("d.kv")));
}

// nvfp4 (format 2.2): convert --dtype nvfp4 quantizes what the fp8 streams
// decode to, exactly as the codec does for those rows; nvfp4 to nvfp4 keeps
// every byte; nvfp4 to e4m3 re-encodes the decoded values; info names the
// dtype; export --codes writes the three tensors of the convention.
TEST_F(CliVerbsTest, ConvertsToNvfp4AndBackAndExportsItsCodes) {
  Synth("a.kv", "--preset tiny --tokens 70 --chunk-tokens 16");
  Snap a = TakeSnap(P("a.kv"));
  CliRun r = Kvfile("convert " + P("a.kv") + " " + P("b.kv") + " --dtype nvfp4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, P("a.kv") + " -> " + P("b.kv") + ": 70 tokens; k nvfp4, v nvfp4; 16 tokens per chunk; " +
                       std::to_string(fs::file_size(P("b.kv"))) + " bytes\n");
  std::unique_ptr<kvfile::Reader> b;
  ASSERT_TRUE(kvfile::Reader::Open(P("b.kv"), {}, &b).ok());
  EXPECT_EQ(b->minor_version(), 2);
  const uint64_t T = 70, W = 32;  // tiny: 2 rows x 16 per token
  std::vector<std::string> b_codes;
  for (size_t i = 0; i < a.data.size(); ++i) {
    SCOPED_TRACE(i);
    std::string f32 = Decoded(a, i, Dtype::kF32);
    std::string want(T * (W / 2 + W / 16), '\0'), got(want.size(), '\0');
    std::vector<float> want_scales(T), got_scales(T);
    auto* wp = reinterpret_cast<uint8_t*>(want.data());
    auto* gp = reinterpret_cast<uint8_t*>(got.data());
    size_t bad;
    ASSERT_TRUE(kvfile::codec::nvfp4::QuantizeRows(Dtype::kF32, f32.data(), T, W, wp, wp + T * W / 2,
                                                   want_scales.data(), &bad));
    ASSERT_TRUE(b->ReadCodes(static_cast<uint32_t>(i / 2), static_cast<uint32_t>(i % 2), 0, T, gp, gp + T * W / 2,
                             got_scales.data())
                    .ok());
    EXPECT_TRUE(got == want);
    EXPECT_EQ(got_scales, want_scales);
    b_codes.push_back(got + std::string(reinterpret_cast<const char*>(got_scales.data()), T * 4));
  }
  CliRun info = Kvfile("info " + P("b.kv"));
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.out.find("nvfp4"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("2.2"), std::string::npos) << info.out;
  // nvfp4 -> nvfp4 keeps every code; re-chunked, the stored data is the same.
  ASSERT_EQ(Kvfile("convert " + P("b.kv") + " " + P("c.kv") + " --chunk-tokens 5").exit_code, 0);
  std::unique_ptr<kvfile::Reader> c;
  ASSERT_TRUE(kvfile::Reader::Open(P("c.kv"), {}, &c).ok());
  for (size_t i = 0; i < b_codes.size(); ++i) {
    std::string got(b_codes[i].size(), '\0');
    auto* gp = reinterpret_cast<uint8_t*>(got.data());
    ASSERT_TRUE(c->ReadCodes(static_cast<uint32_t>(i / 2), static_cast<uint32_t>(i % 2), 0, T, gp, gp + T * W / 2,
                             reinterpret_cast<float*>(gp + T * (W / 2 + W / 16)))
                    .ok());
    EXPECT_TRUE(got == b_codes[i]) << i;
  }
  // nvfp4 -> e4m3: the decoded nvfp4 values quantized by the fp8 codec.
  ASSERT_EQ(Kvfile("convert " + P("b.kv") + " " + P("d.kv") + " --dtype e4m3").exit_code, 0);
  Snap d = TakeSnap(P("d.kv"));
  for (size_t i = 0; i < d.data.size(); ++i) {
    std::vector<float> f32(T * W);
    ASSERT_TRUE(b->ReadRows(static_cast<uint32_t>(i / 2), static_cast<uint32_t>(i % 2), 0, T, Dtype::kF32,
                            f32.data())
                    .ok());
    auto [codes, scales] = Quantized(Dtype::kE4M3, Dtype::kF32, f32.data(), T * 2, 16);
    EXPECT_TRUE(d.data[i] == codes) << i;
    EXPECT_EQ(d.scales[i], scales) << i;
  }
  // Export --codes: <stream>.codes U8, .block_scales F8_E4M3, .scales F32, per layer then token.
  CliRun ex = Kvfile("convert " + P("b.kv") + " " + P("b.safetensors") + " --codes");
  ASSERT_EQ(ex.exit_code, 0) << ex.err;
  StFile st = ReadSt(P("b.safetensors"));
  for (uint32_t s = 0; s < 2; ++s) {
    const std::string name = s == 0 ? "k" : "v";
    EXPECT_EQ(st.header.at(name + ".codes").at("dtype"), "U8");
    EXPECT_EQ(st.header.at(name + ".codes").at("shape"), json({2, 70, 16}));
    EXPECT_EQ(st.header.at(name + ".block_scales").at("dtype"), "F8_E4M3");
    EXPECT_EQ(st.header.at(name + ".block_scales").at("shape"), json({2, 70, 2}));
    EXPECT_EQ(st.header.at(name + ".scales").at("dtype"), "F32");
    EXPECT_EQ(st.header.at(name + ".scales").at("shape"), json({2, 70}));
    std::string codes, blocks, scales;
    for (uint32_t l = 0; l < 2; ++l) {
      const std::string& bc = b_codes[l * 2 + s];
      codes += bc.substr(0, T * W / 2);
      blocks += bc.substr(T * W / 2, T * W / 16);
      scales += bc.substr(T * (W / 2 + W / 16));
    }
    EXPECT_TRUE(st.Tensor(name + ".codes") == codes) << name;
    EXPECT_TRUE(st.Tensor(name + ".block_scales") == blocks) << name;
    EXPECT_TRUE(st.Tensor(name + ".scales") == scales) << name;
  }
  // Export decodes to a raw dtype only.
  CliRun bad = Kvfile("convert " + P("b.kv") + " " + P("x.safetensors") + " --dtype nvfp4");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.err, "kvfile: error: --dtype nvfp4: export decodes to bf16, f16 or f32; use --codes for codes\n");
}

TEST_F(CliVerbsTest, RechunkingPreservesEveryCodeAndDropsDeadTokens) {
  Synth("a.kv", "--preset dsa-mixed --tokens 50 --chunk-tokens 16");
  Snap a = TakeSnap(P("a.kv"));
  for (int chunk : {1, 7, 50, 1000}) {
    SCOPED_TRACE(chunk);
    CliRun r = Kvfile("convert " + P("a.kv") + " " + P("b.kv") + " --force --chunk-tokens " + std::to_string(chunk));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    Snap b = TakeSnap(P("b.kv"));
    ExpectSameContents(a, b);
    EXPECT_EQ(b.nominal, static_cast<uint32_t>(chunk));
    EXPECT_EQ(b.chunks.size(), static_cast<size_t>((50 + chunk - 1) / chunk));
  }
  // A rewind into the middle of a chunk leaves dead tokens; convert compacts them.
  ASSERT_EQ(Kvfile("rewind " + P("a.kv") + " --to 21").exit_code, 0);
  Snap rw = TakeSnap(P("a.kv"));
  ASSERT_EQ(rw.chunks.size(), 2u);
  EXPECT_EQ(rw.chunks[1].stored_tokens, 16u);
  EXPECT_EQ(rw.chunks[1].live_tokens, 5u);
  ASSERT_EQ(Kvfile("convert " + P("a.kv") + " " + P("c.kv")).exit_code, 0);
  Snap c = TakeSnap(P("c.kv"));
  ExpectSameContents(rw, c);
  ASSERT_EQ(c.chunks.size(), 2u);
  EXPECT_EQ(c.chunks[1].stored_tokens, 5u);
  EXPECT_EQ(c.chunks[1].live_tokens, 5u);
}

TEST_F(CliVerbsTest, KeepRawAndRawDtypes) {
  Synth("a.kv", "--preset dsa-mixed --tokens 9 --chunk-tokens 4");
  Snap a = TakeSnap(P("a.kv"));
  ASSERT_EQ(Kvfile("convert " + P("a.kv") + " " + P("k.kv") + " --keep-raw latent").exit_code, 0);
  Snap k = TakeSnap(P("k.kv"));
  EXPECT_EQ(k.g.streams[0].dtype, Dtype::kBF16);
  EXPECT_EQ(k.g.streams[1].dtype, Dtype::kE4M3);
  EXPECT_EQ(k.g.streams[2].dtype, Dtype::kBF16);
  for (uint32_t l = 0; l < a.g.layers; ++l) {
    EXPECT_TRUE(k.data[l * 3] == Decoded(a, l * 3, Dtype::kBF16)) << l;
    EXPECT_TRUE(k.data[l * 3 + 1] == a.data[l * 3 + 1]) << l;
    EXPECT_TRUE(k.data[l * 3 + 2] == a.data[l * 3 + 2]) << l;
  }
  // An fp8 --dtype leaves the raw indexer raw; a raw --dtype converts every stream.
  ASSERT_EQ(Kvfile("convert " + P("a.kv") + " " + P("e.kv") + " --dtype e5m2").exit_code, 0);
  EXPECT_EQ(TakeSnap(P("e.kv")).g.streams[2].dtype, Dtype::kBF16);
  ASSERT_EQ(Kvfile("convert " + P("a.kv") + " " + P("f.kv") + " --dtype f16 --keep-raw rope").exit_code, 0);
  Snap f = TakeSnap(P("f.kv"));
  for (const auto& s : f.g.streams) EXPECT_EQ(s.dtype, Dtype::kF16) << s.name;
  for (size_t i = 0; i < a.data.size(); ++i) EXPECT_TRUE(f.data[i] == Decoded(a, i, Dtype::kF16)) << i;
  CliRun bad = Kvfile("convert " + P("a.kv") + " " + P("g.kv") + " --keep-raw nope,latent");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.err, "kvfile: error: " + P("a.kv") + ": --keep-raw: no stream 'nope' (streams: latent, rope, indexer)\n");
  EXPECT_FALSE(fs::exists(P("g.kv")));
}

TEST_F(CliVerbsTest, OutputIsAtomicAndExistingOutNeedsForce) {
  Synth("a.kv", "--preset tiny --tokens 20");
  Synth("b.kv", "--preset tiny --tokens 5 --seed 9");
  std::string a = ReadFile(P("a.kv")), b = ReadFile(P("b.kv"));
  CliRun r = Kvfile("convert " + P("a.kv") + " " + P("b.kv"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + P("b.kv") + ": file exists; use --force to replace it\n");
  EXPECT_TRUE(ReadFile(P("b.kv")) == b);
  // A failing conversion with --force leaves the old OUT as it was.
  Input nan(4, 1);
  nan.k[5] = std::numeric_limits<float>::infinity();
  nan.Write(P("nan.safetensors"), kMeta);
  r = Kvfile("convert " + P("nan.safetensors") + " " + P("b.kv") + " --force");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "kvfile: error: " + P("nan.safetensors") + ": non-finite value in layer 0, stream 'k', token 0, row 1\n");
  EXPECT_TRUE(ReadFile(P("b.kv")) == b);
  std::string st_before;
  ASSERT_EQ(Kvfile("convert " + P("a.kv") + " " + P("x.safetensors")).exit_code, 0);
  st_before = ReadFile(P("x.safetensors"));
  r = Kvfile("convert " + P("b.kv") + " " + P("x.safetensors"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(ReadFile(P("x.safetensors")) == st_before);
  r = Kvfile("convert " + P("a.kv") + " " + P("b.kv") + " --force");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ExpectSameContents(TakeSnap(P("a.kv")), TakeSnap(P("b.kv")));
  EXPECT_TRUE(ReadFile(P("a.kv")) == a);
  EXPECT_TRUE(Leftovers(".kvtmp").empty());
  EXPECT_TRUE(Leftovers(".kvnew").empty());
}

TEST_F(CliVerbsTest, ConvertUsageErrors) {
  Synth("a.kv", "--preset tiny --tokens 4");
  std::ofstream(P("x.txt")) << "x";
  auto usage = [&](const std::string& args, const std::string& err) {
    CliRun r = Kvfile("convert " + args);
    EXPECT_EQ(r.exit_code, 2) << args;
    if (!err.empty()) {
      EXPECT_EQ(r.err, "kvfile: error: " + err + "\n") << args;
    }
  };
  usage(P("a.kv") + " " + P("o.npz"), P("o.npz") + ": cannot tell the format: the name must end in .kv, .safetensors "
                                                   "or .coli_kv, or give --format llama-seq|llama-session|mooncake|coli-v2");
  usage(P("x.txt") + " " + P("o.kv"), P("x.txt") + ": cannot tell the format: the name must end in .kv or .safetensors");
  usage(P("nope.kv") + " " + P("o.kv"), P("nope.kv") + ": No such file or directory");
  usage(P("a.kv") + " " + P("a.kv") + " --force", P("a.kv") + ": IN and OUT are the same file");
  usage(P("a.kv") + " " + P("o.kv") + " --codes", "--codes applies to .safetensors input or output");
  usage(P("a.kv") + " " + P("o.kv") + " --format v1 --dtype e4m3",
        "--format v1 stores raw rows: --dtype must be bf16, f16 or f32");
  usage(P("a.kv") + " " + P("o.kv") + " --format v1 --keep-raw k", "--keep-raw applies to v2 output (v1 is all raw)");
  usage(P("a.kv") + " " + P("o.kv") + " --format v3", "");
  usage(P("a.kv") + " " + P("o.safetensors") + " --dtype e4m3",
        "--dtype e4m3: export decodes to bf16, f16 or f32; use --codes for codes");
  usage(P("a.kv") + " " + P("o.safetensors") + " --keep-raw k", "--keep-raw applies to .kv output");
  usage(P("a.kv") + " " + P("o.safetensors") + " --chunk-tokens 4", "--chunk-tokens applies to .kv output");
  usage(P("a.kv") + " " + P("o.kv") + " --dtype f8", "");
  ASSERT_EQ(Kvfile("convert " + P("a.kv") + " " + P("s.safetensors")).exit_code, 0);
  usage(P("s.safetensors") + " " + P("t.safetensors"), "convert reads or writes a .kv file; both IN and OUT are .safetensors");
  EXPECT_FALSE(fs::exists(P("o.kv")));
  EXPECT_FALSE(fs::exists(P("o.safetensors")));
  EXPECT_EQ(Kvfile("convert " + P("a.kv") + " " + P("o.kv") + " --format v2").exit_code, 0);
  CliRun help = Kvfile("convert --help");
  EXPECT_NE(help.out.find("--format v1 writes the older raw layout"), std::string::npos);
}

// The refusals of a flag or a format out of place that ConvertUsageErrors,
// convert_seeds_test and llama_state_test leave out: one usage line each
// (exit 2), nothing written.
TEST_F(CliVerbsTest, ConvertFlagsAndFormatsOutOfPlace) {
  const std::string data = KVFILE_TEST_DATA "/fixtures/";
  for (const char* d : {"tree", "st", "dir"}) fs::create_directories(P(d));
  Synth("a.kv", "--preset tiny --tokens 4");
  Synth("tree/b.kv", "--preset tiny --tokens 4");
  fs::copy_file(data + "llama/seq-f16-fa1.bin", P("seq.bin"));
  fs::copy_file(data + "seeds/coli_v2.coli_kv", P("c.coli_kv"));
  ASSERT_EQ(Kvfile("convert " + P("c.coli_kv") + " " + P("c.kv")).exit_code, 0);
  ASSERT_EQ(Kvfile("convert " + P("c.kv") + " " + P("mc") + " --format mooncake").exit_code, 0);
  ASSERT_EQ(Kvfile("convert " + P("a.kv") + " " + P("st/a.safetensors")).exit_code, 0);
  auto names = [&] {
    std::vector<std::string> all;
    for (const auto& e : fs::recursive_directory_iterator(dir_)) all.push_back(e.path().string());
    std::sort(all.begin(), all.end());
    return all;
  };
  const std::vector<std::string> before = names();
  auto usage = [&](const std::string& args, const std::string& err) {
    CliRun r = Kvfile("convert " + args);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_EQ(r.err, "kvfile: error: " + err + "\n") << args;
    EXPECT_EQ(r.out, "") << args;
  };
  // Mooncake directories and .coli_kv sessions.
  usage(P("a.kv") + " " + P("m2") + " --format mooncake --chunk-tokens 4",
        "--dtype, --keep-raw, --codes, --chunk-tokens, --salvage and --jobs do not apply to Mooncake or .coli_kv "
        "conversions");
  usage(P("st/a.safetensors") + " " + P("m2") + " --format mooncake",
        P("st/a.safetensors") + ": --format mooncake converts a .kv file");
  usage(P("mc") + " " + P("x.coli_kv"), P("mc") + ": --format coli-v2 converts a .kv file");
  usage(P("c.coli_kv") + " " + P("x.safetensors"),
        P("x.safetensors") + ": a .coli_kv file is converted to a .kv file (OUT must end in .kv)");
  usage(P("mc") + " " + P("x.safetensors"),
        P("x.safetensors") + ": a Mooncake directory is converted to a .kv file (OUT must end in .kv)");
  // A directory IN.
  usage(P("tree") + " " + P("t2") + " --format llama-seq",
        P("tree") + ": --format llama-seq converts one .kv file, not a directory");
  usage(P("tree") + " " + P("a.kv"), P("a.kv") + ": IN is a directory, so OUT must be one too");
  usage(P("tree") + " " + P("tree/sub"), P("tree/sub") + ": OUT must not be IN or inside it");
  usage(P("st") + " " + P("t2.safetensors"), P("st") + ": no .kv files in this directory to export");
  usage(P("tree") + " " + P("t2") + " --codes", "--codes applies to .safetensors input or output, not to .kv -> .kv");
  usage(P("tree") + " " + P("t2.safetensors") + " --codes --dtype bf16",
        "--codes exports fp8 streams as stored and raw streams as stored; drop --dtype");
  // A file IN.
  usage(P("a.kv") + " " + P("x.kv") + " --to kv",
        "--to applies to a directory IN (a file's OUT suffix says the format)");
  usage(P("a.kv") + " " + P("dir"), P("dir") + ": is a directory (IN is a file)");
  usage(P("a.kv") + " " + P("seq.bin") + " --force",
        P("seq.bin") + ": is a llama.cpp state file; OUT is a .kv or .safetensors file unless --format "
                       "llama-seq|llama-session");
  usage(P("a.kv") + " " + P("x.safetensors") + " --codes --dtype bf16",
        "--codes exports fp8 streams as stored and raw streams as stored; drop --dtype");
  // llama.cpp state files.
  usage(P("st/a.safetensors") + " " + P("x.bin") + " --format llama-seq",
        P("st/a.safetensors") + ": --format llama-seq writes a llama.cpp file from a .kv IN");
  usage(P("a.kv") + " " + P("x.bin") + " --format llama-session --chunk-tokens 4",
        "--keep-raw, --chunk-tokens and --codes apply to .kv or .safetensors output");
  usage(P("seq.bin") + " " + P("x.safetensors") + " --head-size 64",
        P("x.safetensors") + ": a llama.cpp state file is imported into a .kv OUT");
  usage(P("seq.bin") + " " + P("x.kv") + " --head-size 64 --codes", "--codes applies to .safetensors input or output");
  EXPECT_EQ(names(), before);
}

// v2 -> v1 decodes to raw rows; v1 -> v2 quantizes exactly as the codec (and
// the upgrade) does; info, verify and convert leave a v1 input untouched;
// append upgrades a v1 file on the way.
TEST_F(CliVerbsTest, ConvertsToV1AndBackAndAppendUpgrades) {
  Synth("a.kv", "--preset dsa-mixed --tokens 9 --chunk-tokens 4");
  CliRun r = Kvfile("convert " + P("a.kv") + " " + P("v1.kv") + " --format v1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto info = nlohmann::json::parse(Kvfile("info --json " + P("v1.kv")).out);
  EXPECT_EQ(info["version"], "1.0");
  for (const auto& s : info["streams"]) EXPECT_EQ(s["dtype"], "bf16");
  std::string v1 = ReadFile(P("v1.kv"));
  EXPECT_EQ(Kvfile("verify " + P("v1.kv")).exit_code, 0);
  r = Kvfile("convert " + P("v1.kv") + " " + P("v2.kv"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ReadFile(P("v1.kv")), v1) << "read-only verbs never write a v1 input";
  auto info2 = nlohmann::json::parse(Kvfile("info --json " + P("v2.kv")).out);
  EXPECT_EQ(info2["version"], "2.1");
  EXPECT_EQ(info2["streams"][0]["dtype"], "e4m3");
  EXPECT_EQ(info2["streams"][2]["dtype"], "e4m3");  // every v1 stream is quantized unless --keep-raw
  // The codes of the converted file are exactly the codec's for the v1 rows.
  std::unique_ptr<kvfile::Reader> r1, r2;
  ASSERT_TRUE(kvfile::Reader::Open(P("v1.kv"), {}, &r1).ok());
  ASSERT_TRUE(kvfile::Reader::Open(P("v2.kv"), {}, &r2).ok());
  ASSERT_EQ(r1->token_count(), 9u);
  ASSERT_EQ(r2->token_count(), 9u);
  for (uint32_t l = 0; l < r1->geometry().layers; l += 7)
    for (uint32_t s = 0; s < 3; ++s) {
      size_t rows = 9 * r1->geometry().streams[s].rows_per_token;
      size_t elems = rows * r1->geometry().streams[s].row_width;
      std::vector<uint8_t> c1(elems), c2(elems);
      std::vector<float> s1(rows), s2(rows);
      ASSERT_TRUE(r1->ReadCodes(l, s, 0, 9, c1.data(), s1.data()).ok());
      ASSERT_TRUE(r2->ReadCodes(l, s, 0, 9, c2.data(), s2.data()).ok());
      ASSERT_EQ(c1, c2);
      ASSERT_EQ(0, std::memcmp(s1.data(), s2.data(), rows * 4));
    }
  r1.reset();
  // append on a v1 file upgrades it first.
  ASSERT_EQ(Kvfile("convert " + P("a.kv") + " " + P("more.safetensors") + " --dtype f32").exit_code, 0);
  r = Kvfile("append " + P("v1.kv") + " " + P("more.safetensors"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  auto info3 = nlohmann::json::parse(Kvfile("info --json " + P("v1.kv")).out);
  EXPECT_EQ(info3["version"], "2.1");
  EXPECT_EQ(info3["tokens"], 18);
  EXPECT_FALSE(fs::exists(P("v1.kv.kvupgrade")));
}

TEST_F(CliVerbsTest, ConvertsDirectoryTrees) {
  fs::create_directories(P("in/sub/deeper"));
  std::vector<std::string> rel = {"a.kv", "b.kv", "sub/c.kv", "sub/deeper/d.kv", "sub/deeper/e.kv"};
  for (size_t i = 0; i < rel.size(); ++i)
    Synth("in/" + rel[i], "--preset tiny --tokens " + std::to_string(3 + 5 * i) + " --seed " + std::to_string(i + 1));
  std::ofstream(P("in/sub/notes.txt")) << "not a kv file";
  std::vector<std::string> before;
  for (const auto& f : rel) before.push_back(ReadFile(P("in/" + f)));
  CliRun r = Kvfile("convert " + P("in") + " " + P("out") + " --dtype e5m2 --jobs 3 --chunk-tokens 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 6) << r.out;
  EXPECT_NE(r.out.find("converted 5 of 5 files from " + P("in") + " to " + P("out")), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(P("out/sub/notes.txt")));
  for (size_t i = 0; i < rel.size(); ++i) {
    SCOPED_TRACE(rel[i]);
    EXPECT_TRUE(ReadFile(P("in/" + rel[i])) == before[i]);
    Snap in = TakeSnap(P("in/" + rel[i]));
    Snap out = TakeSnap(P("out/" + rel[i]));
    EXPECT_EQ(out.tokens, in.tokens);
    EXPECT_EQ(out.id, in.id);
    EXPECT_EQ(out.g.streams[0].dtype, Dtype::kE5M2);
    EXPECT_EQ(out.nominal, 4u);
  }
  // Again without --force: refused before anything is written.
  std::string out_a = ReadFile(P("out/a.kv"));
  Synth("in/sub/new.kv", "--preset tiny --tokens 2");
  r = Kvfile("convert " + P("in") + " " + P("out"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + P("out/a.kv") + ": file exists; use --force to replace it\n");
  EXPECT_FALSE(fs::exists(P("out/sub/new.kv")));
  EXPECT_TRUE(ReadFile(P("out/a.kv")) == out_a);
  r = Kvfile("convert " + P("in") + " " + P("out") + " --force --jobs 2");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(P("out/sub/new.kv")));
  EXPECT_EQ(TakeSnap(P("out/a.kv")).g.streams[0].dtype, Dtype::kE4M3);
  // A damaged file: one error line, the others converted, exit 1.
  {
    std::fstream f(P("in/b.kv"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(12288 + 250);
    f.put('\x55');
  }
  r = Kvfile("convert " + P("in") + " " + P("out2") + " --jobs 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.rfind("kvfile: error: " + P("in/b.kv") + ": chunk 0 at offset 12288", 0), 0u) << r.err;
  EXPECT_NE(r.out.find("converted 5 of 6 files"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(P("out2/b.kv")));
  EXPECT_TRUE(fs::exists(P("out2/sub/deeper/e.kv")));
  EXPECT_TRUE(Leftovers(".kvtmp").empty());
  // OUT inside IN, or a file: refused.
  EXPECT_EQ(Kvfile("convert " + P("in") + " " + P("in/sub/x")).exit_code, 2);
  EXPECT_EQ(Kvfile("convert " + P("in") + " " + P("in/a.kv")).exit_code, 2);
}

// ---- append ------------------------------------------------------------------------------------------

TEST_F(CliVerbsTest, AppendCreatesThenExtends) {
  Input first(10, 1), second(7, 2);
  first.Write(P("1.safetensors"), kMeta);
  second.Write(P("2.safetensors"), kMeta);
  CliRun r = Kvfile("append " + P("s.kv") + " " + P("1.safetensors") + " --chunk-tokens 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, P("s.kv") + ": created; appended 10 tokens from " + P("1.safetensors") + " (10 in total)\n");
  r = Kvfile("append " + P("s.kv") + " " + P("2.safetensors") + " --sync chunk");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, P("s.kv") + ": appended 7 tokens from " + P("2.safetensors") + " (17 in total)\n");
  Snap s = TakeSnap(P("s.kv"));
  EXPECT_EQ(s.id, (kvfile::ModelIdentity{"test/model", 0xaa}));
  EXPECT_EQ(s.nominal, 4u);
  ASSERT_EQ(s.tokens.size(), 17u);
  EXPECT_EQ(s.tokens[9], 1109u);
  EXPECT_EQ(s.tokens[10], 1200u);
  for (uint32_t l = 0; l < 2; ++l) {
    std::vector<float> k(first.k.begin() + l * 80, first.k.begin() + (l + 1) * 80);
    k.insert(k.end(), second.k.begin() + l * 56, second.k.begin() + (l + 1) * 56);
    auto [codes, scales] = Quantized(Dtype::kE4M3, Dtype::kF32, k.data(), 17 * 2, 4);
    EXPECT_TRUE(s.data[l * 2] == codes) << l;
    EXPECT_TRUE(s.scales[l * 2] == scales) << l;
  }
  // The codes form appends exactly (here: the file's own first 10 tokens again).
  ASSERT_EQ(Kvfile("convert " + P("s.kv") + " " + P("c.safetensors") + " --codes").exit_code, 0);
  r = Kvfile("append " + P("s.kv") + " " + P("c.safetensors") + " --sync none");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Snap s2 = TakeSnap(P("s.kv"));
  ASSERT_EQ(s2.tokens.size(), 34u);
  for (size_t i = 0; i < s2.data.size(); ++i) {
    EXPECT_TRUE(s2.data[i] == s.data[i] + s.data[i]) << i;
    std::vector<float> twice = s.scales[i];
    twice.insert(twice.end(), s.scales[i].begin(), s.scales[i].end());
    EXPECT_TRUE(s2.scales[i] == twice) << i;
  }
  // A new file in e5m2 with the model from --model.
  r = Kvfile("append " + P("e.kv") + " " + P("1.safetensors") + " --dtype e5m2 --model other/id");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Snap e = TakeSnap(P("e.kv"));
  EXPECT_EQ(e.g.streams[1].dtype, Dtype::kE5M2);
  EXPECT_EQ(e.id.model_id, "other/id");
  EXPECT_EQ(e.nominal, 256u);
  // Streams are matched by name, whatever the input's order.
  WriteSt(P("swapped.safetensors"),
          {{"tokens", "I32", {10}, Bytes(first.ids)},
           {"v", "F32", {2, 10, 1, 8}, Bytes(first.v)},
           {"k", "F32", {2, 10, 2, 4}, Bytes(first.k)}},
          kMeta);
  r = Kvfile("append " + P("s.kv") + " " + P("swapped.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Snap s3 = TakeSnap(P("s.kv"));
  ASSERT_EQ(s3.tokens.size(), 44u);
  EXPECT_TRUE(s3.data[0].substr(34 * 8) == s.data[0].substr(0, 10 * 8));
}

// Runs `kvfile ARGS` (output discarded) and returns its exit status and
// its own peak resident set in MiB, as wait4 reports it for that process.
struct Measured {
  int exit_code;
  long peak_mib;
};
Measured KvfileMeasured(const std::vector<std::string>& args) {
  std::vector<char*> argv = {const_cast<char*>(KVFILE_BINARY)};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    dup2(devnull, 2);
    execv(KVFILE_BINARY, argv.data());
    _exit(127);
  }
  int status = 0;
  rusage usage{};
  if (pid < 0 || wait4(pid, &status, 0, &usage) != pid) return {-1, 0};
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, usage.ru_maxrss / 1024};
}

// A header may declare a wide geometry (32 layers x 2 streams x 8 rows x
// 4096: 2.1 MB per token as e4m3) over one token or none. The new file's
// staging buffers must stay within max(64 MiB, the input's size) per chunk
// (FORMAT.md 7.1), not 2 x 256 tokens (1.07 GB), and a file that gets no
// append allocates none at all.
TEST_F(CliVerbsTest, WideGeometryOverFewTokensNeedsLittleMemory) {
  auto wide = [&](const std::string& name, uint64_t tokens) {
    std::vector<int32_t> ids(tokens, 7);
    std::vector<uint16_t> rows(32 * tokens * 8 * 4096, 0x3F80);  // bf16 1.0
    WriteSt(P(name),
            {{"tokens", "I32", {tokens}, Bytes(ids)},
             {"k", "BF16", {32, tokens, 8, 4096}, Bytes(rows)},
             {"v", "BF16", {32, tokens, 8, 4096}, Bytes(rows)}},
            kMeta);
  };
  wide("none.safetensors", 0);
  wide("one.safetensors", 1);
  struct Run {
    std::vector<std::string> args;
    long limit_mib;  // the old code took over 1,000 for each
  };
  const Run runs[] = {
      // No token: no staging buffer, even for an explicit 256 tokens per chunk.
      {{"convert", P("none.safetensors"), P("none.kv"), "--chunk-tokens", "256"}, 200},
      {{"append", P("none-a.kv"), P("none.safetensors"), "--chunk-tokens", "256"}, 200},
      // One token (a 4 MiB input): two chunks of at most 64 MiB.
      {{"convert", P("one.safetensors"), P("one.kv")}, 300},
      {{"append", P("one-a.kv"), P("one.safetensors")}, 300},
      {{"convert", P("one.kv"), P("one-c.kv")}, 300},
  };
  for (const Run& run : runs) {
    Measured m = KvfileMeasured(run.args);
    EXPECT_EQ(m.exit_code, 0) << run.args[0] << " " << run.args[1];
    EXPECT_LT(m.peak_mib, run.limit_mib) << run.args[0] << " " << run.args[1];
  }
  // 256 halved while a chunk (2,099,200 bytes per token + head) exceeds
  // 64 MiB: 16 tokens. An explicit --chunk-tokens is taken as given.
  for (const char* f : {"one.kv", "one-a.kv", "one-c.kv", "none.kv", "none-a.kv"}) {
    Snap s = TakeSnap(P(f));
    EXPECT_EQ(s.nominal, std::string(f).starts_with("none") ? 256u : 16u) << f;
    EXPECT_EQ(s.tokens.size(), std::string(f).starts_with("none") ? 0u : 1u) << f;
  }
}

TEST_F(CliVerbsTest, AppendRefusesMismatchAndNonFiniteLeavingTheFileUntouched) {
  Input base(10, 1);
  base.Write(P("1.safetensors"), kMeta);
  ASSERT_EQ(Kvfile("append " + P("s.kv") + " " + P("1.safetensors") + " --chunk-tokens 4").exit_code, 0);
  std::string before = ReadFile(P("s.kv"));
  auto refused = [&](const std::string& args, int code, const std::string& err) {
    CliRun r = Kvfile("append " + P("s.kv") + " " + args);
    EXPECT_EQ(r.exit_code, code) << args;
    EXPECT_EQ(r.err, "kvfile: error: " + err + "\n") << args;
    EXPECT_EQ(r.out, "");
    EXPECT_TRUE(ReadFile(P("s.kv")) == before) << args;
  };
  refused(P("1.safetensors") + " --model x/y", 1,
          P("s.kv") + ": model id: file has 'test/model', expected 'x/y' (from " + P("1.safetensors") + ")");
  Input fp = base;
  fp.Write(P("fp.safetensors"), {{"kvfile.model", "test/model"}, {"kvfile.fingerprint", "00000000000000ab"}});
  refused(P("fp.safetensors"), 1,
          P("s.kv") + ": model fingerprint: file has 00000000000000aa, expected 00000000000000ab (from " +
              P("fp.safetensors") + ")");
  refused(P("1.safetensors") + " --dtype e5m2", 1,
          P("s.kv") + ": stream 'k' dtype: file has e4m3, expected e5m2 (from " + P("1.safetensors") + ")");
  WriteSt(P("layers.safetensors"),
          {{"tokens", "I32", {10}, Bytes(base.ids)},
           {"k", "F32", {1, 10, 2, 4}, std::string(Bytes(base.k), 0, 320)},
           {"v", "F32", {1, 10, 1, 8}, std::string(Bytes(base.v), 0, 320)}},
          kMeta);
  refused(P("layers.safetensors"), 1,
          P("s.kv") + ": layer count: file has 2, expected 1 (from " + P("layers.safetensors") + ")");
  WriteSt(P("width.safetensors"),
          {{"tokens", "I32", {10}, Bytes(base.ids)},
           {"k", "F32", {2, 10, 2, 4}, Bytes(base.k)},
           {"v", "F32", {2, 10, 2, 4}, Bytes(base.v)}},
          kMeta);
  refused(P("width.safetensors"), 1,
          P("s.kv") + ": stream 'v' rows per token: file has 1, expected 2 (from " + P("width.safetensors") + ")");
  WriteSt(P("names.safetensors"),
          {{"tokens", "I32", {10}, Bytes(base.ids)},
           {"k", "F32", {2, 10, 2, 4}, Bytes(base.k)},
           {"w", "F32", {2, 10, 1, 8}, Bytes(base.v)}},
          kMeta);
  refused(P("names.safetensors"), 1,
          P("s.kv") + ": stream 1 name: file has 'v', expected 'w' (from " + P("names.safetensors") + ")");
  // A NaN in the last token of a long input: nothing of it is appended.
  Input nan(40, 3);
  nan.v.back() = std::numeric_limits<float>::quiet_NaN();
  nan.Write(P("nan.safetensors"), kMeta);
  refused(P("nan.safetensors"), 1, P("nan.safetensors") + ": tensor 'v': layer 1, token 39, row 0: non-finite value");
  // Bad codes (an e4m3 NaN code) in the codes form, too.
  ASSERT_EQ(Kvfile("convert " + P("s.kv") + " " + P("c.safetensors") + " --codes").exit_code, 0);
  {
    StFile c = ReadSt(P("c.safetensors"));
    uint64_t off = c.header["k.codes"]["data_offsets"][0].get<uint64_t>() + 17;
    std::string all = ReadFile(P("c.safetensors"));
    all[8 + (all.size() - 8 - c.data.size()) + off] = '\x7f';
    std::ofstream(P("c.safetensors"), std::ios::binary) << all;
  }
  refused(P("c.safetensors"), 1, P("c.safetensors") + ": tensor 'k.codes': layer 0, token 2, row 0: non-finite code");
  // A non-finite input never creates a new file either.
  CliRun r = Kvfile("append " + P("new.kv") + " " + P("nan.safetensors"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_FALSE(fs::exists(P("new.kv")));
  // Usage: a bad --sync, a missing input.
  r = Kvfile("append " + P("s.kv") + " " + P("1.safetensors") + " --sync sometimes");
  EXPECT_EQ(r.exit_code, 2);
  r = Kvfile("append " + P("s.kv") + " " + P("none.safetensors"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + P("none.safetensors") + ": No such file or directory\n");
  EXPECT_TRUE(ReadFile(P("s.kv")) == before);
}

// ---- rewind --------------------------------------------------------------------------------------------

TEST_F(CliVerbsTest, RewindKeepsAPrefix) {
  Synth("a.kv", "--preset tiny --tokens 100 --chunk-tokens 16");
  Snap a = TakeSnap(P("a.kv"));
  std::string before = ReadFile(P("a.kv"));
  CliRun r = Kvfile("rewind " + P("a.kv") + " --to 101");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + P("a.kv") + ": cannot rewind to 101 tokens; the file has 100\n");
  EXPECT_TRUE(ReadFile(P("a.kv")) == before);
  r = Kvfile("rewind " + P("a.kv") + " --to 100");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, P("a.kv") + ": kept 100 tokens, dropped 0\n");
  EXPECT_TRUE(ReadFile(P("a.kv")) == before);
  r = Kvfile("rewind " + P("a.kv") + " --to 40");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, P("a.kv") + ": kept 40 tokens, dropped 60\n");
  Snap b = TakeSnap(P("a.kv"));
  ASSERT_EQ(b.tokens.size(), 40u);
  EXPECT_TRUE(std::equal(b.tokens.begin(), b.tokens.end(), a.tokens.begin()));
  for (size_t i = 0; i < b.data.size(); ++i) {
    EXPECT_TRUE(b.data[i] == a.data[i].substr(0, b.data[i].size())) << i;
    EXPECT_TRUE(std::equal(b.scales[i].begin(), b.scales[i].end(), a.scales[i].begin())) << i;
  }
  EXPECT_EQ(Kvfile("verify " + P("a.kv")).exit_code, 0);
  // A torn tail is cut first (the writable open recovers the file).
  {
    std::ofstream f(P("a.kv"), std::ios::binary | std::ios::app);
    f << std::string(1000, 'x');
  }
  r = Kvfile("rewind " + P("a.kv") + " --to 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, P("a.kv") + ": cut a torn tail of 1000 bytes first\n" + P("a.kv") + ": kept 0 tokens, dropped 40\n");
  EXPECT_EQ(TakeSnap(P("a.kv")).tokens.size(), 0u);
  EXPECT_EQ(fs::file_size(P("a.kv")), 12288u);
  r = Kvfile("rewind " + P("missing.kv") + " --to 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + P("missing.kv") + ": No such file or directory\n");
  EXPECT_EQ(Kvfile("rewind " + P("a.kv")).exit_code, 2);  // --to is required
  // Damage in committed data: refused (exit 1), file untouched.
  Synth("d.kv", "--preset tiny --tokens 40 --chunk-tokens 16");
  {
    std::fstream f(P("d.kv"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(12288 + 70);
    f.put('\x01');
  }
  std::string damaged = ReadFile(P("d.kv"));
  r = Kvfile("rewind " + P("d.kv") + " --to 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.rfind("kvfile: error: " + P("d.kv") + ": chunk 0 at offset 12288", 0), 0u) << r.err;
  EXPECT_TRUE(ReadFile(P("d.kv")) == damaged);
}

// ---- dump ----------------------------------------------------------------------------------------------

TEST_F(CliVerbsTest, DumpJsonHasEverySelectedPart) {
  Synth("a.kv", "--preset dsa-mixed --tokens 20 --chunk-tokens 8 --seed 5");
  ASSERT_EQ(Kvfile("rewind " + P("a.kv") + " --to 13").exit_code, 0);
  Snap a = TakeSnap(P("a.kv"));
  std::string before = ReadFile(P("a.kv"));
  CliRun r = Kvfile("dump " + P("a.kv") + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json j = json::parse(r.out);
  EXPECT_EQ(j["path"], P("a.kv"));
  ASSERT_TRUE(j.contains("header") && j.contains("commit") && j.contains("chunks"));
  EXPECT_FALSE(j.contains("tokens"));
  EXPECT_FALSE(j.contains("rows"));
  const json& h = j["header"];
  EXPECT_EQ(h["version"], "2.1");
  EXPECT_EQ(h["required_flags"], "0000000000000001");
  EXPECT_EQ(h["optional_flags"], "0000000000000000");
  EXPECT_EQ(h["salt"].get<std::string>().size(), 16u);
  EXPECT_NE(h["salt"], "0000000000000000");
  EXPECT_EQ(h["fingerprint"], "0000000000000005");
  EXPECT_EQ(h["model"], "synthetic/dsa-mixed");
  EXPECT_EQ(h["layers"], 61);
  EXPECT_EQ(h["chunk_tokens"], 8);
  EXPECT_EQ(h["token_count"], 13);
  ASSERT_EQ(h["streams"].size(), 3u);
  EXPECT_EQ(h["streams"][2], json({{"index", 2}, {"name", "indexer"}, {"rows_per_token", 1}, {"row_width", 128},
                                   {"dtype", "bf16"}}));
  // synth closes once (sequence 3), the rewind commits once (sequence 4, epoch 2).
  const json& c = j["commit"];
  EXPECT_EQ(c["active_slot"], 0);
  EXPECT_EQ(c["sequence"], 4);
  EXPECT_EQ(c["epoch"], 2);
  EXPECT_EQ(c["committed_tokens"], 13);
  EXPECT_EQ(c["committed_chunks"], 2);
  EXPECT_EQ(c["committed_end"], a.chunks[1].offset + a.chunks[1].bytes);
  EXPECT_EQ(c["slots"][1], json({{"slot", 1}, {"valid", true}, {"sequence", 3}, {"error", nullptr}}));
  ASSERT_EQ(j["chunks"].size(), 2u);
  const json& c1 = j["chunks"][1];
  EXPECT_EQ(c1["index"], 1);
  EXPECT_EQ(c1["offset"], a.chunks[1].offset);
  EXPECT_EQ(c1["first_token"], 8);
  EXPECT_EQ(c1["live_tokens"], 5);
  EXPECT_EQ(c1["stored_tokens"], 8);
  EXPECT_EQ(c1["bytes"], a.chunks[1].bytes);
  EXPECT_EQ(c1["epoch"], 1);
  EXPECT_EQ(c1["committed"], true);
  char hex[20];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(a.chunks[1].head_checksum));
  EXPECT_EQ(c1["head_checksum"], hex);

  // Tokens and rows only.
  r = Kvfile("dump " + P("a.kv") + " --tokens --rows --layer 60 --stream latent --token 3:5 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  j = json::parse(r.out);
  EXPECT_FALSE(j.contains("header"));
  EXPECT_FALSE(j.contains("chunks"));
  EXPECT_EQ(j["tokens"].get<std::vector<uint32_t>>(), a.tokens);
  const json& rows = j["rows"];
  EXPECT_EQ(rows["layer"], 60);
  EXPECT_EQ(rows["stream"], "latent");
  EXPECT_EQ(rows["dtype"], "e4m3");
  EXPECT_EQ(rows["begin"], 3);
  EXPECT_EQ(rows["end"], 5);
  ASSERT_EQ(rows["rows"].size(), 2u);
  size_t blk = 60 * 3 + 0;
  std::string f32 = Decoded(a, blk, Dtype::kF32);
  const float* v = reinterpret_cast<const float*>(f32.data());
  EXPECT_EQ(rows["rows"][1]["token"], 4);
  EXPECT_EQ(rows["rows"][1]["row"], 0);
  ASSERT_EQ(rows["rows"][1]["values"].size(), 512u);
  for (int k = 0; k < 512; ++k) EXPECT_EQ(rows["rows"][1]["values"][k].get<float>(), v[4 * 512 + k]) << k;
  // Codes by stream index: hex codes and the scale.
  r = Kvfile("dump " + P("a.kv") + " --rows --layer 2 --stream 1 --token 12 --codes --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  j = json::parse(r.out);
  const json& row = j["rows"]["rows"][0];
  EXPECT_EQ(row["scale"].get<float>(), a.scales[2 * 3 + 1][12]);
  std::string codes;
  for (int k = 0; k < 64; ++k) {
    std::snprintf(hex, sizeof hex, "%02x", static_cast<uint8_t>(a.data[2 * 3 + 1][12 * 64 + k]));
    codes += hex;
  }
  EXPECT_EQ(row["codes"], codes);
  // A raw stream with --codes: its stored bits.
  r = Kvfile("dump " + P("a.kv") + " --rows --layer 0 --stream indexer --token 0 --codes --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  uint16_t bits0;
  std::memcpy(&bits0, a.data[2].data(), 2);
  std::snprintf(hex, sizeof hex, "%04x", bits0);
  EXPECT_EQ(json::parse(r.out)["rows"]["rows"][0]["bits"].get<std::string>().substr(0, 4), hex);
  EXPECT_TRUE(ReadFile(P("a.kv")) == before) << "dump is read-only";
}

TEST_F(CliVerbsTest, DumpTextAndErrors) {
  Synth("a.kv", "--preset tiny --tokens 10 --chunk-tokens 4 --seed 2");
  Snap a = TakeSnap(P("a.kv"));
  CliRun r = Kvfile("dump " + P("a.kv"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("header:\n  version           2.1\n", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("  model id          synthetic/tiny\n"), std::string::npos);
  EXPECT_NE(r.out.find("  stream 1          v: 2 rows x 16, e4m3\n"), std::string::npos);
  EXPECT_NE(r.out.find("  commit slot 1     valid, sequence 3 (active)\n"), std::string::npos);
  EXPECT_NE(r.out.find("  committed tokens  10\n"), std::string::npos);
  EXPECT_NE(r.out.find("\nchunks:\n  chunk       offset  first_token"), std::string::npos);
  EXPECT_NE(r.out.find("\n      2        20480            8      2      2       4096      1 yes       "),
            std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("tokens:"), std::string::npos);
  r = Kvfile("dump " + P("a.kv") + " --tokens");
  EXPECT_EQ(r.out.rfind("tokens:\n         0: " + std::to_string(a.tokens[0]) + " ", 0), 0u) << r.out;
  r = Kvfile("dump " + P("a.kv") + " --rows --layer 1 --stream v --token 8:");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1 + 4) << r.out;
  EXPECT_EQ(r.out.rfind("rows of layer 1, stream 'v' (e4m3, 2 rows x 16), tokens [8, 10):\n  token 8 row 0: ", 0), 0u);
  std::string f32 = Decoded(a, 3, Dtype::kF32);
  char want[64];
  std::snprintf(want, sizeof want, "  token 9 row 1: %g ",
                static_cast<double>(reinterpret_cast<const float*>(f32.data())[(9 * 2 + 1) * 16]));
  EXPECT_NE(r.out.find(want), std::string::npos) << r.out;
  r = Kvfile("dump " + P("a.kv") + " --rows --layer 0 --stream k --token 0 --codes");
  std::snprintf(want, sizeof want, "  token 0 row 0: scale %g codes %02x ", static_cast<double>(a.scales[0][0]),
                static_cast<uint8_t>(a.data[0][0]));
  EXPECT_NE(r.out.find(want), std::string::npos) << r.out;

  auto usage = [&](const std::string& args, const std::string& err) {
    CliRun u = Kvfile("dump " + P("a.kv") + " " + args);
    EXPECT_EQ(u.exit_code, 2) << args;
    EXPECT_EQ(u.err, "kvfile: error: " + err + "\n") << args;
  };
  usage("--layer 0", "--layer, --stream, --token and --codes select rows: add --rows");
  usage("--rows --stream k", "--rows needs --layer and --stream");
  usage("--rows --layer 2 --stream k", P("a.kv") + ": layer 2 out of range (2 layers)");
  usage("--rows --layer 0 --stream q", P("a.kv") + ": no stream 'q' (streams: k, v)");
  usage("--rows --layer 0 --stream 2", P("a.kv") + ": no stream '2' (streams: k, v)");
  usage("--rows --layer 0 --stream k --token 5:20", P("a.kv") + ": token range [5, 20) is empty or outside [0, 10)");
  usage("--rows --layer 0 --stream k --token 10", P("a.kv") + ": token range [10, 11) is empty or outside [0, 10)");
  usage("--rows --layer 0 --stream k --token x", "--token 'x': expected T, T:T2 (T2 excluded) or T:");
  // A damaged (inactive) commit slot is shown as such; the file still opens.
  {
    std::fstream f(P("a.kv"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096 + 100);
    f.put('\x01');
  }
  r = Kvfile("dump " + P("a.kv") + " --header");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("  commit slot 0     invalid: commit slot checksum mismatch\n"
                       "  commit slot 1     valid, sequence 3 (active)\n"),
            std::string::npos)
      << r.out;
  json slots = json::parse(Kvfile("dump " + P("a.kv") + " --header --json").out)["commit"]["slots"];
  EXPECT_EQ(slots[0], json({{"slot", 0}, {"valid", false}, {"sequence", nullptr},
                            {"error", "commit slot checksum mismatch"}}));
  CliRun junk = Kvfile("dump " + P("missing.kv"));
  EXPECT_EQ(junk.exit_code, 2);
  std::ofstream(P("junk.kv")) << std::string(20000, 'x');
  junk = Kvfile("dump " + P("junk.kv"));
  EXPECT_EQ(junk.exit_code, 1);
  EXPECT_EQ(junk.err, "kvfile: error: " + P("junk.kv") + ": not a kvfile: bad magic at offset 0\n");
}

// --header of several FILEs: each single FILE's block under "file: PATH",
// a failed one as an "error:" entry while the others are still shown, one
// stderr line (the first failure), exit status the worst; --json an array
// of the single FILEs' documents. The other parts take one FILE.
TEST_F(CliVerbsTest, DumpHeaderOfSeveralFiles) {
  Synth("a.kv", "--preset tiny --tokens 10 --chunk-tokens 4 --seed 2");
  Synth("b.kv", "--preset dsa-mixed --tokens 20 --chunk-tokens 8 --seed 5");
  std::ofstream(P("junk.kv")) << std::string(20000, 'x');
  const std::string a = P("a.kv"), b = P("b.kv"), junk = P("junk.kv"), missing = P("missing.kv");
  const std::string before_a = ReadFile(a), before_b = ReadFile(b);
  CliRun one_a = Kvfile("dump --header " + a), one_b = Kvfile("dump --header " + b);
  ASSERT_EQ(one_a.exit_code, 0) << one_a.err;
  ASSERT_EQ(one_b.exit_code, 0) << one_b.err;
  ASSERT_TRUE(one_a.out.starts_with("header:\n  version           2.1\n")) << one_a.out;
  const std::string junk_error = junk + ": not a kvfile: bad magic at offset 0";
  CliRun m = Kvfile("dump " + missing);
  ASSERT_EQ(m.exit_code, 2);
  ASSERT_TRUE(m.err.starts_with("kvfile: error: " + missing + ": ")) << m.err;
  const std::string missing_error = m.err.substr(15, m.err.size() - 16);

  CliRun r = Kvfile("dump --header " + a + " " + b);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.out, "file: " + a + "\n" + one_a.out + "\nfile: " + b + "\n" + one_b.out);
  // Flags after the files, a damaged and a missing one among them: the
  // others are still shown; the first failure is the stderr line; the
  // worst status (2, the missing file, over 1, the damaged one) is the exit.
  r = Kvfile("dump " + a + " " + junk + " " + missing + " " + b + " --header");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + junk_error + "\n");
  EXPECT_EQ(r.out, "file: " + a + "\n" + one_a.out + "\nfile: " + junk + "\nerror: " + junk_error + "\n\nfile: " +
                       missing + "\nerror: " + missing_error + "\n\nfile: " + b + "\n" + one_b.out);
  r = Kvfile("dump --header " + junk + " " + a);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "kvfile: error: " + junk_error + "\n");

  // JSON: an array of what each FILE alone prints.
  json ja = json::parse(Kvfile("dump --header --json " + a).out);
  json jb = json::parse(Kvfile("dump --header --json " + b).out);
  ASSERT_TRUE(ja.contains("header") && ja.contains("commit")) << ja.dump();
  r = Kvfile("dump --header --json " + a + " " + junk + " " + b);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "kvfile: error: " + junk_error + "\n");
  json j = json::parse(r.out);
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[0], ja);
  EXPECT_EQ(j[1], json({{"path", junk}, {"ok", false}, {"error", junk_error}}));
  EXPECT_EQ(j[2], jb);
  EXPECT_EQ(j[2]["header"]["token_count"], 20);
  // The JSON of one FILE that fails, as before: one object.
  r = Kvfile("dump --header --json " + junk);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(json::parse(r.out), json({{"path", junk}, {"ok", false}, {"error", junk_error}}));

  // More than the header of several FILEs: one usage line, nothing on stdout.
  const std::string refused = "kvfile: error: dump: 2 FILEs: several FILEs take --header alone (chunks, tokens and "
                              "rows: one FILE at a time)\n";
  for (std::string parts : {"", "--header --chunks", "--chunks", "--header --tokens --json",
                                    "--header --rows --layer 0 --stream k"}) {
    SCOPED_TRACE(parts);
    r = Kvfile("dump " + parts + " " + a + " " + b);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(r.err, refused);
    EXPECT_EQ(r.out, "");
  }
  r = Kvfile("dump " + a + " " + b + " " + junk);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(r.err.starts_with("kvfile: error: dump: 3 FILEs: ")) << r.err;
  EXPECT_TRUE(ReadFile(a) == before_a && ReadFile(b) == before_b) << "dump is read-only";
}

TEST_F(CliVerbsTest, EveryVerbHasHelpWithAnExample) {
  for (const char* verb : {"dump", "rewind", "append", "convert"}) {
    CliRun h = Kvfile(std::string(verb) + " --help");
    EXPECT_EQ(h.exit_code, 0) << verb;
    EXPECT_NE(h.out.find(std::string("Example: kvfile ") + verb), std::string::npos) << verb;
  }
}

// ---- nvfp4 through synth, append and import ------------------------------------------------------

// An nvfp4 stream's data for tokens [0, T): per token e/2 code bytes, then
// (after all codes) e/16 block scales, as one string; and the T row scales.
struct Nvfp4Data {
  std::string codes;
  std::vector<float> scales;
  bool operator==(const Nvfp4Data&) const = default;
};

// What the codec makes of T tokens of `in` rows of e elements each.
Nvfp4Data Nvfp4Of(Dtype in, const void* src, uint64_t T, uint64_t e) {
  Nvfp4Data d{std::string(T * (e / 2 + e / 16), '\0'), std::vector<float>(T)};
  auto* p = reinterpret_cast<uint8_t*>(d.codes.data());
  size_t bad;
  EXPECT_TRUE(kvfile::codec::QuantizeNvfp4Rows(in, src, T, e, p, p + T * e / 2, d.scales.data(), &bad));
  return d;
}

// What the file stores for (layer, stream), through Reader::ReadCodes.
Nvfp4Data StoredNvfp4(const std::string& path, uint32_t layer, uint32_t stream) {
  std::unique_ptr<kvfile::Reader> r;
  EXPECT_TRUE(kvfile::Reader::Open(path, {}, &r).ok()) << path;
  if (!r) return {};
  const uint64_t T = r->token_count(), e = r->geometry().streams[stream].ElementsPerToken();
  Nvfp4Data d{std::string(T * (e / 2 + e / 16), '\0'), std::vector<float>(T)};
  auto* p = reinterpret_cast<uint8_t*>(d.codes.data());
  kvfile::Status st = r->ReadCodes(layer, stream, 0, T, p, p + T * e / 2, d.scales.data());
  EXPECT_TRUE(st.ok()) << st.message();
  return d;
}

// synth --dtype nvfp4 stores what the codec makes of the generator's bf16
// rows; --check compares them (and tells a file whose codes came another way).
TEST_F(CliVerbsTest, SynthWritesAndChecksNvfp4) {
  CliRun r = Kvfile("synth " + P("n.kv") + " --preset tiny --tokens 40 --chunk-tokens 16 --dtype nvfp4 --seed 7");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "wrote " + P("n.kv") + ": 40 tokens of tiny (nvfp4), seed 7\n");
  kvfile::Geometry g;
  ASSERT_TRUE(kvfile::GetPreset("tiny", Dtype::kNvfp4, &g).ok());
  Snap n = TakeSnap(P("n.kv"));
  EXPECT_EQ(n.g, g);
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t s = 0; s < g.streams.size(); ++s) {
      const uint64_t e = g.streams[s].ElementsPerToken();
      std::vector<uint16_t> bf16(40 * e);
      kvfile::synth::GenerateRows(g, 7, l, s, 0, 40, bf16.data());
      EXPECT_TRUE(StoredNvfp4(P("n.kv"), l, s) == Nvfp4Of(Dtype::kBF16, bf16.data(), 40, e)) << l << " " << s;
    }
  r = Kvfile("synth --check " + P("n.kv"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, P("n.kv") + ": ok, all 40 tokens match the synthetic data of seed 7\n");
  // The same session quantized from its e4m3 codes instead: other codes.
  Synth("e.kv", "--preset tiny --tokens 40 --seed 7");
  ASSERT_EQ(Kvfile("convert " + P("e.kv") + " " + P("x.kv") + " --dtype nvfp4").exit_code, 0);
  r = Kvfile("synth --check " + P("x.kv"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "kvfile: error: " + P("x.kv") +
                       ": layer 0 stream 'k' tokens [0, 40): stored codes differ from the regenerated data\n");
  r = Kvfile("synth " + P("y.kv") + " --dtype nvfp5");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_FALSE(fs::exists(P("y.kv")));
}

// k [2 rows x 8] and v [1 x 16] per token: 16 elements, one nvfp4 block each.
struct Nvfp4Input {
  uint32_t layers = 2;
  uint64_t tokens;
  std::vector<int32_t> ids;
  std::vector<float> k, v;
  Nvfp4Input(uint64_t n, uint32_t seed) : tokens(n) {
    for (uint64_t t = 0; t < n; ++t) ids.push_back(static_cast<int32_t>(500 + seed * 100 + t));
    k.resize(layers * n * 16);
    v.resize(layers * n * 16);
    for (size_t i = 0; i < k.size(); ++i) k[i] = std::sin(0.29f * static_cast<float>(i + seed)) * 4.0f;
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::cos(0.13f * static_cast<float>(i * seed + 3)) * 90.0f;
  }
  void Write(const std::string& path) const {
    WriteSt(path,
            {{"tokens", "I32", {tokens}, Bytes(ids)},
             {"k", "F32", {layers, tokens, 2, 8}, Bytes(k)},
             {"v", "F32", {layers, tokens, 1, 16}, Bytes(v)}},
            kMeta);
  }
  // The f32 rows of (layer, stream): k is stream 0, v stream 1.
  const float* Rows(uint32_t layer, uint32_t stream) const {
    return (stream == 0 ? k : v).data() + uint64_t{layer} * tokens * 16;
  }
};

// append --dtype nvfp4: values are quantized by the codec into a new nvfp4
// FILE, later appends extend it; fp8 codes are decoded and requantized,
// nvfp4 codes (export --codes) go in exactly; a dtype that is not the
// file's is refused with FILE untouched.
TEST_F(CliVerbsTest, AppendsIntoNvfp4Streams) {
  Nvfp4Input first(9, 1), second(6, 2);
  first.Write(P("1.safetensors"));
  second.Write(P("2.safetensors"));
  CliRun r = Kvfile("append " + P("s.kv") + " " + P("1.safetensors") + " --dtype nvfp4 --chunk-tokens 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, P("s.kv") + ": created; appended 9 tokens from " + P("1.safetensors") + " (9 in total)\n");
  r = Kvfile("append " + P("s.kv") + " " + P("2.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Snap s = TakeSnap(P("s.kv"));
  ASSERT_EQ(s.tokens.size(), 15u);
  EXPECT_EQ(s.g.streams[0], (kvfile::StreamSpec{"k", 2, 8, Dtype::kNvfp4}));
  EXPECT_EQ(s.g.streams[1], (kvfile::StreamSpec{"v", 1, 16, Dtype::kNvfp4}));
  std::vector<Nvfp4Data> want(4);
  for (uint32_t l = 0; l < 2; ++l)
    for (uint32_t k = 0; k < 2; ++k) {
      std::vector<float> rows(first.Rows(l, k), first.Rows(l, k) + 9 * 16);
      rows.insert(rows.end(), second.Rows(l, k), second.Rows(l, k) + 6 * 16);
      want[l * 2 + k] = Nvfp4Of(Dtype::kF32, rows.data(), 15, 16);
      EXPECT_TRUE(StoredNvfp4(P("s.kv"), l, k) == want[l * 2 + k]) << l << " " << k;
    }
  // Refused: another quantized --dtype for the nvfp4 FILE.
  std::string before = ReadFile(P("s.kv"));
  r = Kvfile("append " + P("s.kv") + " " + P("2.safetensors") + " --dtype e4m3");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "kvfile: error: " + P("s.kv") + ": stream 'k' dtype: file has nvfp4, expected e4m3 (from " +
                       P("2.safetensors") + ")\n");
  EXPECT_TRUE(ReadFile(P("s.kv")) == before);
  // e4m3 codes of the same geometry: decoded to f32, then quantized to nvfp4.
  ASSERT_EQ(Kvfile("append " + P("e.kv") + " " + P("2.safetensors")).exit_code, 0);
  ASSERT_EQ(Kvfile("convert " + P("e.kv") + " " + P("e.safetensors") + " --codes").exit_code, 0);
  ASSERT_EQ(Kvfile("append " + P("s.kv") + " " + P("e.safetensors") + " --dtype nvfp4").exit_code, 0);
  // The file's own nvfp4 codes: appended exactly.
  ASSERT_EQ(Kvfile("convert " + P("s.kv") + " " + P("n.safetensors") + " --codes").exit_code, 0);
  r = Kvfile("append " + P("s.kv") + " " + P("n.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, P("s.kv") + ": appended 21 tokens from " + P("n.safetensors") + " (42 in total)\n");
  std::unique_ptr<kvfile::Reader> er;
  ASSERT_TRUE(kvfile::Reader::Open(P("e.kv"), {}, &er).ok());
  for (uint32_t l = 0; l < 2; ++l)
    for (uint32_t k = 0; k < 2; ++k) {
      std::vector<float> decoded(6 * 16);
      ASSERT_TRUE(er->ReadRows(l, k, 0, 6, Dtype::kF32, decoded.data()).ok());
      std::vector<float> rows(first.Rows(l, k), first.Rows(l, k) + 9 * 16);
      rows.insert(rows.end(), second.Rows(l, k), second.Rows(l, k) + 6 * 16);
      rows.insert(rows.end(), decoded.begin(), decoded.end());
      Nvfp4Data once = Nvfp4Of(Dtype::kF32, rows.data(), 21, 16);
      // Tokens [21, 42) are tokens [0, 21) again: codes, block scales, scales.
      const uint64_t c = 21 * 8, b = 21;
      Nvfp4Data twice{once.codes.substr(0, c) + once.codes.substr(0, c) + once.codes.substr(c, b) +
                          once.codes.substr(c, b),
                      once.scales};
      twice.scales.insert(twice.scales.end(), once.scales.begin(), once.scales.end());
      EXPECT_TRUE(StoredNvfp4(P("s.kv"), l, k) == twice) << l << " " << k;
    }
  // A new nvfp4 FILE needs rows of a multiple of 16 elements: refused.
  Input narrow(3, 1);  // k 2 x 4, v 1 x 8
  narrow.Write(P("narrow.safetensors"), kMeta);
  r = Kvfile("append " + P("w.kv") + " " + P("narrow.safetensors") + " --dtype nvfp4");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.find("kvfile: error: " + P("narrow.safetensors") + ": "), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1);
  EXPECT_FALSE(fs::exists(P("w.kv")));
}

// export --codes of an nvfp4 file and its import give back every code,
// block scale and row scale, the geometry (kvfile.shape.<stream>) and the
// export's bytes; --dtype e4m3 decodes them first. Inputs that break the
// three tensors' rules are refused with one line and no output.
TEST_F(CliVerbsTest, ImportsNvfp4CodesExactly) {
  Synth("a.kv", "--preset tiny --tokens 70 --chunk-tokens 16 --dtype nvfp4 --seed 3");
  ASSERT_EQ(Kvfile("convert " + P("a.kv") + " " + P("a.safetensors") + " --codes").exit_code, 0);
  StFile st = ReadSt(P("a.safetensors"));
  EXPECT_EQ(st.header.at("__metadata__").at("kvfile.shape.k"), "2x16");
  EXPECT_EQ(st.header.at("__metadata__").at("kvfile.shape.v"), "2x16");
  CliRun r = Kvfile("convert " + P("a.safetensors") + " " + P("b.kv") + " --chunk-tokens 16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, P("a.safetensors") + " -> " + P("b.kv") + ": 70 tokens; k nvfp4, v nvfp4; 16 tokens per chunk; " +
                       std::to_string(fs::file_size(P("b.kv"))) + " bytes\n");
  Snap a = TakeSnap(P("a.kv")), b = TakeSnap(P("b.kv"));
  ExpectSameContents(a, b);
  EXPECT_EQ(b.chunks.size(), a.chunks.size());
  r = Kvfile("verify " + P("b.kv"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(Kvfile("convert " + P("b.kv") + " " + P("b.safetensors") + " --codes").exit_code, 0);
  EXPECT_TRUE(ReadFile(P("b.safetensors")) == ReadFile(P("a.safetensors")));
  // Appended to the file they came from: its tokens twice.
  ASSERT_EQ(Kvfile("append " + P("b.kv") + " " + P("a.safetensors")).exit_code, 0);
  Snap b2 = TakeSnap(P("b.kv"));
  for (size_t i = 0; i < a.data.size(); ++i) {
    const size_t codes = 70 * 16;  // 70 tokens of 32 elements: 16 bytes of codes each
    EXPECT_TRUE(b2.data[i] == a.data[i].substr(0, codes) + a.data[i].substr(0, codes) + a.data[i].substr(codes) +
                                  a.data[i].substr(codes))
        << i;
  }
  // Into e4m3: the decoded nvfp4 values, quantized by the fp8 codec.
  ASSERT_EQ(Kvfile("convert " + P("a.safetensors") + " " + P("e.kv") + " --dtype e4m3").exit_code, 0);
  Snap e = TakeSnap(P("e.kv"));
  std::unique_ptr<kvfile::Reader> ar;
  ASSERT_TRUE(kvfile::Reader::Open(P("a.kv"), {}, &ar).ok());
  for (size_t i = 0; i < e.data.size(); ++i) {
    std::vector<float> f32(70 * 32);
    ASSERT_TRUE(ar->ReadRows(static_cast<uint32_t>(i / 2), static_cast<uint32_t>(i % 2), 0, 70, Dtype::kF32,
                             f32.data())
                    .ok());
    auto [codes, scales] = Quantized(Dtype::kE4M3, Dtype::kF32, f32.data(), 70 * 2, 16);
    EXPECT_TRUE(e.data[i] == codes) << i;
    EXPECT_EQ(e.scales[i], scales) << i;
  }

  // Variants of a.safetensors, k's tensors changed.
  auto tensor = [&](const std::string& name, const std::string& dtype, std::vector<uint64_t> shape,
                    std::string bytes = "") {
    return StTensor{name, dtype, std::move(shape), bytes.empty() ? st.Tensor(name) : bytes};
  };
  const StTensor tokens = tensor("tokens", "I64", {70});
  const StTensor v_codes = tensor("v.codes", "U8", {2, 70, 16}), v_blocks = tensor("v.block_scales", "F8_E4M3", {2, 70, 2}),
                 v_scales = tensor("v.scales", "F32", {2, 70});
  const json meta = {{"kvfile.model", "synthetic/tiny"}, {"kvfile.fingerprint", "0000000000000003"}};
  auto write_k = [&](const std::string& file, const std::vector<StTensor>& k, const json& m) {
    std::vector<StTensor> all = {tokens};
    all.insert(all.end(), k.begin(), k.end());
    all.insert(all.end(), {v_codes, v_blocks, v_scales});
    WriteSt(P(file), all, m);
  };
  const StTensor k_codes = tensor("k.codes", "U8", {2, 70, 16}), k_blocks = tensor("k.block_scales", "F8_E4M3", {2, 70, 2}),
                 k_scales = tensor("k.scales", "F32", {2, 70});
  // No kvfile.shape.k: k is one row of 32 per token; same codes.
  write_k("flat.safetensors", {k_codes, k_blocks, k_scales}, meta);
  ASSERT_EQ(Kvfile("convert " + P("flat.safetensors") + " " + P("flat.kv")).exit_code, 0);
  Snap flat = TakeSnap(P("flat.kv"));
  EXPECT_EQ(flat.g.streams[0], (kvfile::StreamSpec{"k", 1, 32, Dtype::kNvfp4}));
  EXPECT_EQ(flat.g.streams[1], (kvfile::StreamSpec{"v", 1, 32, Dtype::kNvfp4}));
  for (size_t i = 0; i < a.data.size(); ++i) EXPECT_TRUE(flat.data[i] == a.data[i] && flat.scales[i] == a.scales[i]);

  auto refused = [&](const std::string& file, int code, const std::string& err) {
    for (const std::string& verb : {"convert " + P(file) + " " + P("out.kv"), "append " + P("out.kv") + " " + P(file)}) {
      CliRun x = Kvfile(verb);
      EXPECT_EQ(x.exit_code, code) << verb;
      EXPECT_EQ(x.err, "kvfile: error: " + P(file) + ": " + err + "\n") << verb;
      EXPECT_EQ(x.out, "");
      EXPECT_FALSE(fs::exists(P("out.kv"))) << verb;
    }
  };
  const json with_shape = {{"kvfile.shape.k", "2x16"}};
  write_k("i8.safetensors", {tensor("k.codes", "I8", {2, 70, 16}), k_blocks, k_scales}, with_shape);
  refused("i8.safetensors", 2, "tensor 'k.codes' is I8; nvfp4 codes (beside block scales) must be U8");
  write_k("e5.safetensors", {k_codes, tensor("k.block_scales", "F8_E5M2", {2, 70, 2}), k_scales}, with_shape);
  refused("e5.safetensors", 2, "tensor 'k.block_scales' is F8_E5M2; block scales must be F8_E4M3");
  write_k("bf.safetensors", {k_codes, k_blocks, tensor("k.scales", "BF16", {2, 140}, st.Tensor("k.scales"))}, with_shape);
  refused("bf.safetensors", 2, "tensor 'k.scales' is BF16; scales must be F32");
  write_k("odd.safetensors", {tensor("k.codes", "U8", {2, 70, 12}, st.Tensor("k.codes").substr(0, 2 * 70 * 12)),
                              k_blocks, k_scales}, with_shape);
  refused("odd.safetensors", 2,
          "tensor 'k.codes' has shape [2, 70, 12]; expected [layers, tokens, n / 2], n = rows_per_token * row_width "
          "a multiple of 16");
  write_k("blocks.safetensors", {k_codes, tensor("k.block_scales", "F8_E4M3", {2, 70, 1},
                                                 st.Tensor("k.block_scales").substr(0, 140)), k_scales}, with_shape);
  refused("blocks.safetensors", 2, "tensor 'k.block_scales' has shape [2, 70, 1]; expected [2, 70, 2]");
  write_k("scales.safetensors", {k_codes, k_blocks, tensor("k.scales", "F32", {2, 70, 1})}, with_shape);
  refused("scales.safetensors", 2, "tensor 'k.scales' has shape [2, 70, 1]; expected [2, 70]");
  write_k("meta.safetensors", {k_codes, k_blocks, k_scales}, {{"kvfile.shape.k", "3x10"}});
  refused("meta.safetensors", 2,
          "__metadata__ 'kvfile.shape.k' is '3x10'; expected ROWSxWIDTH with ROWS * WIDTH = 32 (the elements of a "
          "token)");
  write_k("lone.safetensors", {k_blocks}, with_shape);
  refused("lone.safetensors", 2, "stream 'k': 'k.block_scales' without 'k.codes'");
  write_k("u8.safetensors", {k_codes, k_scales}, with_shape);
  refused("u8.safetensors", 2,
          "tensor 'k.codes' is U8; codes must be F8_E4M3 or F8_E5M2 (U8: nvfp4 codes, with 'k.block_scales')");
  // An invalid block scale (bit 7 set) of layer 1, token 69: data at fault.
  std::string bad_blocks = st.Tensor("k.block_scales");
  bad_blocks[bad_blocks.size() - 1] = '\x80';
  write_k("bad.safetensors", {k_codes, tensor("k.block_scales", "F8_E4M3", {2, 70, 2}, bad_blocks), k_scales},
          with_shape);
  CliRun x = Kvfile("append " + P("out.kv") + " " + P("bad.safetensors"));
  EXPECT_EQ(x.exit_code, 1);
  EXPECT_EQ(x.err, "kvfile: error: " + P("bad.safetensors") +
                       ": tensor 'k.block_scales': layer 1, token 69: invalid block scale (bit 7 set, or 0x7F)\n");
  x = Kvfile("convert " + P("bad.safetensors") + " " + P("out.kv"));
  EXPECT_EQ(x.exit_code, 1);
  EXPECT_EQ(std::count(x.err.begin(), x.err.end(), '\n'), 1) << x.err;
  EXPECT_EQ(x.err.find("kvfile: error: " + P("bad.safetensors") + ": "), 0u) << x.err;
  EXPECT_FALSE(fs::exists(P("out.kv")));
  EXPECT_TRUE(Leftovers(".kvtmp").empty());
}

}  // namespace
