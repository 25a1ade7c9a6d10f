// SPDX-License-Identifier: Apache-2.0
// colibri .coli_kv sessions <-> .kv files (kvfile/formats/coli_kv.h). The wire
// constants of the .coli_kv layout live here only.
#include "kvfile/formats/coli_kv.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "kvfile/codec.h"
#include "format/endian.h"
#include "convert/magic.h"
#include "kvfile/reader.h"
#include "kvfile/writer.h"

namespace kvfile::coli {

namespace {

constexpr int kWords = 8;           // i32 header words after the magic
constexpr int kWordRecords = 6;     // h[6]: record count
constexpr int kWordTag = 7;         // h[7]: format tag
constexpr int32_t kTagF32 = 0;      // COLIKV1
constexpr int32_t kTagKv8 = 1;      // COLIKV2 (fp8 e4m3 rows + f32 scale per row)
constexpr uint64_t kMaxRecordWithoutData = uint64_t{64} << 20;  // record size when h[6] = 0
constexpr uint64_t kBatchBytes = uint64_t{32} << 20;             // records read per batch
constexpr char kLatent[] = "latent";
constexpr char kRope[] = "rope";
constexpr char kIndexer[] = "indexer";
constexpr char kVocabPrefix[] = "coli_kv:vocab=";

uint64_t RecordBytes(int version, uint64_t layers, uint64_t lora, uint64_t rope, uint64_t ihd, uint64_t nic) {
  uint64_t per_layer = version == 1 ? (lora + rope) * 4 : lora + rope + 8;
  return 4 + layers * per_layer + nic * ihd * 4;
}

std::string Where(uint64_t record) { return "record " + std::to_string(record); }

// A float as it reads back exactly (9 significant digits).
std::string FloatText(float f) {
  char b[32];
  std::snprintf(b, sizeof b, "%.9g", static_cast<double>(f));
  return b;
}

// COLIKV1: a row of e4m3 codes decoded as kvfile decodes it (code value x
// scale in f32, clamped to the finite range), stored as little-endian f32
// at p; returns the end.
uint8_t* StoreDecodedRow(const uint8_t* codes, float scale, uint32_t width, uint8_t* p, std::vector<float>* row) {
  row->resize(width);
  codec::DequantizeRows(Dtype::kE4M3, codes, &scale, 1, width, Dtype::kF32, row->data());
  for (uint32_t e = 0; e < width; ++e) format::StoreU32(p + 4 * e, std::bit_cast<uint32_t>((*row)[e]));
  return p + uint64_t{width} * 4;
}

// colibri's loader (kv_persist.h) zeroes a COLIKV2 row whose scale is not in
// (0, 3.4e38f), and its decoder multiplies code value by scale in f32 with
// no clamp. kvfile's decode clamps, so a row where colibri and kvfile would
// hold different values is refused both ways: why colibri cannot hold this
// row as kvfile decodes it, or "" when it can. The scale is one kvfile
// accepts (FindInvalidScale); the codes are not NaN codes.
constexpr float kColiScaleLimit = 3.4e38f;  // colibri zeroes a row whose scale is at least this
std::string ColibriRowProblem(const uint8_t* codes, uint32_t width, float scale) {
  if (scale >= kColiScaleLimit)
    return "scale " + FloatText(scale) + " is at least 3.4e38, a row colibri's loader zeroes";
  uint8_t top = 0;  // e4m3 magnitudes grow with their low 7 bits
  for (uint32_t j = 0; j < width; ++j) top = std::max<uint8_t>(top, codes[j] & 0x7F);
  float v = codec::DecodeElement(top, Dtype::kE4M3) * scale;
  if (std::isinf(v))
    return "code " + FloatText(codec::DecodeElement(top, Dtype::kE4M3)) + " x scale " + FloatText(scale) +
           " is infinite in colibri's f32 decode";
  return "";
}

}  // namespace

Status ParseHeader(const uint8_t* b, uint64_t file_size, Header* out) {
  Header h;
  if (std::memcmp(b, kMagicV1, 8) == 0) h.version = 1;
  else if (std::memcmp(b, kMagicV2, 8) == 0) h.version = 2;
  else if (std::memcmp(b, kMagicV3, 8) == 0)
    return Status::Unsupported("COLIKV3 (PolarQuant rows) is not supported; only COLIKV1 and COLIKV2");
  else return Status::Corruption("not a .coli_kv file (bad magic)");
  int32_t w[kWords];
  for (int i = 0; i < kWords; ++i) w[i] = static_cast<int32_t>(format::LoadU32(b + 8 + 4 * i));
  int32_t want_tag = h.version == 1 ? kTagF32 : kTagKv8;
  if (w[kWordTag] != want_tag)
    return Status::Unsupported("COLIKV" + std::to_string(h.version) + " header word 7 is " +
                               std::to_string(w[kWordTag]) + ", not the format tag " + std::to_string(want_tag) +
                               ": a layout this reader does not know");
  const char* names[6] = {"layers", "kv_lora", "qk_rope", "index_hd", "indexer layers", "vocab"};
  for (int i = 0; i < 6; ++i)
    if (w[i] < 0) return Status::Corruption(std::string("header: ") + names[i] + " is negative");
  if (w[kWordRecords] < 0) return Status::Corruption("header: record count is negative");
  if (w[0] < 1 || w[1] < 1 || w[2] < 1 || w[5] < 1)
    return Status::Corruption("header: layers, kv_lora, qk_rope and vocab must be positive");
  if (w[4] > w[0]) return Status::Corruption("header: more indexer layers than layers");
  if (w[4] > 0 && w[3] < 1) return Status::Corruption("header: indexer layers without an indexer width");
  if (w[3] > 0 && w[4] == 0)
    return Status::Unsupported("an indexer width without indexer layers: a layout this reader does not know");
  h.layers = static_cast<uint32_t>(w[0]);
  h.kv_lora = static_cast<uint32_t>(w[1]);
  h.qk_rope = static_cast<uint32_t>(w[2]);
  h.index_hd = static_cast<uint32_t>(w[3]);
  h.indexer_layers = static_cast<uint32_t>(w[4]);
  h.vocab = static_cast<uint32_t>(w[5]);
  h.records = static_cast<uint32_t>(w[kWordRecords]);
  Status st = GeometryOf(h).Validate();
  if (!st.ok()) return Status::Unsupported("a geometry beyond kvfile's limits: " + st.message());
  // Each operand is at most 2^31, so the products stay far below 2^64.
  h.record_bytes = RecordBytes(h.version, h.layers, h.kv_lora, h.qk_rope, h.index_hd, h.indexer_layers);
  uint64_t avail = file_size < kHeaderBytes ? 0 : file_size - kHeaderBytes;
  if (h.records > 0 && avail / h.record_bytes < h.records)
    return Status::Corruption("the file ends inside record " + std::to_string(avail / h.record_bytes) + " of " +
                              std::to_string(h.records) + " (" + std::to_string(h.record_bytes) +
                              " bytes each): the committed records are not all there");
  if (h.records == 0 && h.record_bytes > kMaxRecordWithoutData)
    return Status::Unsupported("records of " + std::to_string(h.record_bytes) + " bytes each");
  *out = h;
  return Status::OK();
}

Geometry GeometryOf(const Header& h) {
  Geometry g;
  g.layers = h.layers;
  g.streams.push_back({kLatent, 1, h.kv_lora, Dtype::kE4M3});
  g.streams.push_back({kRope, 1, h.qk_rope, Dtype::kE4M3});
  if (h.indexer_layers > 0) g.streams.push_back({kIndexer, 1, h.index_hd, Dtype::kF32, h.indexer_layer_list});
  return g;
}

Status SetIndexerLayers(const std::optional<std::vector<uint32_t>>& given, Header* h) {
  const std::string of = std::to_string(h->indexer_layers) + " of " + std::to_string(h->layers) + " layers";
  if (!given) {
    if (h->indexer_layers == 0 || h->indexer_layers == h->layers) return Status::OK();
    return Status::InvalidArgument("the indexer is in " + of +
                                   " and a colibri header does not say which: give them (--indexer-layers, "
                                   "e.g. 0..20 or 0,4,8)");
  }
  if (h->indexer_layers == 0) return Status::InvalidArgument("--indexer-layers given, but the file has no indexer");
  if (given->size() != h->indexer_layers)
    return Status::InvalidArgument("--indexer-layers names " + std::to_string(given->size()) +
                                   " layers; the header's h[4] says the indexer is in " + of);
  if (!given->empty() && given->back() >= h->layers)
    return Status::InvalidArgument("--indexer-layers names layer " + std::to_string(given->back()) +
                                   "; the file has " + std::to_string(h->layers) + " layers");
  if (std::adjacent_find(given->begin(), given->end(), std::greater_equal<uint32_t>()) != given->end())
    return Status::InvalidArgument("--indexer-layers: the layers are not ascending without repeats");
  h->indexer_layer_list = given->size() == h->layers ? std::vector<uint32_t>{} : *given;
  return Status::OK();
}

std::string ModelIdFor(uint32_t vocab) { return kVocabPrefix + std::to_string(vocab); }

Status Import(const std::string& in, const std::string& out, FileSystem* fs, ImportResult* result) {
  ImportOptions o;
  o.fs = fs;
  return Import(in, out, o, result);
}

Status Import(const std::string& in, const std::string& out, const ImportOptions& options, ImportResult* result) {
  FileSystem* fs = options.fs ? options.fs : FileSystem::Default();
  std::unique_ptr<File> f;
  KVFILE_RETURN_IF_ERROR(fs->Open(in, OpenMode::kRead, &f));
  uint64_t size = 0;
  KVFILE_RETURN_IF_ERROR(f->Size(&size));
  if (size < kHeaderBytes)
    return Status::Corruption(in + ": " + std::to_string(size) + " bytes, shorter than the 40-byte header");
  uint8_t hb[kHeaderBytes];
  KVFILE_RETURN_IF_ERROR(f->ReadAt(0, hb, sizeof hb));
  Header h;
  Status st = ParseHeader(hb, size, &h);
  if (st.ok()) st = SetIndexerLayers(options.indexer_layers, &h);
  if (!st.ok()) return st.WithContext(in);
  Geometry g = GeometryOf(h);
  // The layers whose records hold an indexer row, in record order.
  std::vector<uint32_t> index_layers;
  for (uint32_t l = 0; h.indexer_layers > 0 && l < h.layers; ++l)
    if (g.InLayer(l, 2)) index_layers.push_back(l);
  uint64_t rec = h.record_bytes;
  uint64_t batch = std::clamp<uint64_t>(kBatchBytes / rec, 1, 65536);
  WriterOptions wo;
  wo.fs = fs;
  wo.chunk_tokens = options.chunk_tokens.value_or(FitChunkTokens(g, 256, size));
  std::unique_ptr<Writer> w;
  KVFILE_RETURN_IF_ERROR(Writer::Create(out, g, {ModelIdFor(h.vocab), 0}, wo, &w));
  size_t S = g.streams.size();
  std::vector<uint8_t> raw;
  std::vector<uint32_t> ids;
  // Per (layer, stream): v2 codes (or v1/indexer f32 rows) and v2 scales.
  std::vector<std::vector<uint8_t>> data(h.layers * S);
  std::vector<std::vector<float>> scales(h.layers * S);
  for (uint64_t t0 = 0; t0 < h.records; t0 += batch) {
    uint64_t n = std::min<uint64_t>(batch, h.records - t0);
    raw.resize(n * rec);
    KVFILE_RETURN_IF_ERROR(f->ReadAt(kHeaderBytes + t0 * rec, raw.data(), raw.size()));
    ids.resize(n);
    for (size_t i = 0; i < data.size(); ++i) {
      const StreamSpec& s = g.streams[i % S];
      if (!g.InLayer(static_cast<uint32_t>(i / S), static_cast<uint32_t>(i % S))) continue;
      bool codes = h.version == 2 && s.name != kIndexer;
      data[i].resize(n * s.row_width * (codes ? 1 : 4));
      scales[i].resize(codes ? n : 0);
    }
    for (uint64_t t = 0; t < n; ++t) {
      const uint8_t* p = raw.data() + t * rec;
      int32_t id = static_cast<int32_t>(format::LoadU32(p));
      if (id < 0 || static_cast<uint32_t>(id) >= h.vocab)
        return Status::Corruption(in + ": " + Where(t0 + t) + ": token id " + std::to_string(id) +
                                  " is outside the vocabulary [0, " + std::to_string(h.vocab) + ")");
      ids[t] = static_cast<uint32_t>(id);
      p += 4;
      for (uint32_t l = 0; l < h.layers; ++l) {
        for (uint32_t s = 0; s < 2; ++s) {
          uint32_t width = s == 0 ? h.kv_lora : h.qk_rope;
          size_t i = l * S + s;
          if (h.version == 2) {
            std::memcpy(data[i].data() + t * width, p, width);
            p += width;
            scales[i][t] = std::bit_cast<float>(format::LoadU32(p));
            p += 4;
          } else {
            std::memcpy(data[i].data() + t * width * 4, p, width * 4);
            p += width * 4;
          }
        }
      }
      for (uint32_t l : index_layers) {
        std::memcpy(data[l * S + 2].data() + t * h.index_hd * 4, p, h.index_hd * 4);
        p += h.index_hd * 4;
      }
    }
    // Check everything of the batch before appending any of it.
    AppendBatch b;
    b.tokens = ids;
    for (size_t i = 0; i < data.size(); ++i) {
      const StreamSpec& s = g.streams[i % S];
      uint32_t layer = static_cast<uint32_t>(i / S);
      if (!g.InLayer(layer, static_cast<uint32_t>(i % S))) {
        b.blocks.push_back({});  // the indexer is not in this layer
        continue;
      }
      uint64_t elems = n * s.row_width;
      auto where = [&](uint64_t row) {
        return in + ": " + Where(t0 + row) + ": layer " + std::to_string(layer) + " " + s.name + " row: ";
      };
      if (!scales[i].empty()) {
        size_t c = codec::FindInvalidCode(Dtype::kE4M3, data[i].data(), elems);
        if (c < elems) return Status::Corruption(where(c / s.row_width) + "NaN code");
        size_t k = codec::FindInvalidScale(scales[i].data(), n);
        if (k < n) return Status::Corruption(where(k) + "scale is not a finite number >= FLT_MIN");
        for (uint64_t row = 0; row < n; ++row) {
          std::string why = ColibriRowProblem(data[i].data() + row * s.row_width, s.row_width, scales[i][row]);
          if (!why.empty()) return Status::Corruption(where(row) + why);
        }
        b.blocks.push_back({Dtype::kE4M3, data[i].data(), scales[i].data()});
      } else {
        size_t e = codec::FindNonFinite(Dtype::kF32, data[i].data(), elems);
        if (e < elems) return Status::Corruption(where(e / s.row_width) + "NaN or infinity");
        b.blocks.push_back({Dtype::kF32, data[i].data(), nullptr});
      }
    }
    st = w->Append(b);
    if (!st.ok()) return st.WithContext(in);
    if (options.on_batch) KVFILE_RETURN_IF_ERROR(options.on_batch(t0 + n, h.records));
  }
  KVFILE_RETURN_IF_ERROR(w->Close());
  result->header = h;
  result->ignored_bytes = size - kHeaderBytes - uint64_t{h.records} * rec;
  return Status::OK();
}

Status Export(const std::string& in, const std::string& out, const ExportOptions& options, uint64_t* tokens) {
  ReaderOptions ro;
  ro.fs = options.fs;
  std::unique_ptr<Reader> r;
  KVFILE_RETURN_IF_ERROR(Reader::Open(in, ro, &r));
  KVFILE_RETURN_IF_ERROR(Export(*r, in, r->token_count(), out, options));
  *tokens = r->token_count();
  return Status::OK();
}

Status Export(Reader& reader, const std::string& in, uint64_t T, const std::string& out,
              const ExportOptions& options) {
  FileSystem* fs = options.fs ? options.fs : FileSystem::Default();
  Reader* r = &reader;
  const Geometry& g = r->geometry();
  auto incompatible = [&in](const std::string& why) {
    return Status::InvalidArgument(in + ": not a colibri geometry: " + why);
  };
  std::optional<uint32_t> si_latent = g.FindStream(kLatent), si_rope = g.FindStream(kRope),
                          si_index = g.FindStream(kIndexer);
  if (!si_latent || !si_rope) return incompatible("streams 'latent' and 'rope' are needed");
  if (g.streams.size() != 2u + (si_index ? 1u : 0u))
    return incompatible("streams other than latent, rope and indexer");
  for (uint32_t s : {*si_latent, *si_rope}) {
    const StreamSpec& spec = g.streams[s];
    if (spec.dtype != Dtype::kE4M3)
      return incompatible("stream '" + spec.name + "' is " + DtypeName(spec.dtype) + ", not e4m3");
    if (spec.rows_per_token != 1)
      return incompatible("stream '" + spec.name + "' has " + std::to_string(spec.rows_per_token) +
                          " rows per token, not 1");
  }
  if (si_index) {
    const StreamSpec& spec = g.streams[*si_index];
    if (IsFp8(spec.dtype)) return incompatible("stream 'indexer' is fp8; colibri keeps it as f32 rows");
    if (spec.rows_per_token != 1) return incompatible("stream 'indexer' has more than one row per token");
  }
  if (options.version != 1 && options.version != 2)
    return Status::InvalidArgument("COLIKV" + std::to_string(options.version) + " is not written; only 1 and 2");
  if (T > r->token_count()) return Status::InvalidArgument(in + ": " + std::to_string(T) + " tokens to export of " +
                                                           std::to_string(r->token_count()));
  if (T > INT32_MAX) return incompatible(std::to_string(T) + " tokens do not fit the i32 record count");
  uint32_t vocab = 0;
  const std::string& model = r->identity().model_id;
  if (options.vocab) {
    vocab = *options.vocab;
  } else if (model.starts_with(kVocabPrefix)) {
    std::string digits = model.substr(sizeof kVocabPrefix - 1);
    uint64_t v = 0;
    bool ok = !digits.empty() && digits.size() <= 10;
    for (char c : digits) {
      ok = ok && c >= '0' && c <= '9';
      v = v * 10 + static_cast<uint64_t>(c - '0');
    }
    if (ok && v >= 1 && v <= INT32_MAX) vocab = static_cast<uint32_t>(v);
  }
  if (vocab == 0)
    return Status::InvalidArgument(in + ": the vocabulary size colibri's header needs is unknown (model id '" +
                                   model + "' does not give it): pass it (--vocab)");
  if (vocab > INT32_MAX) return Status::InvalidArgument(in + ": vocabulary " + std::to_string(vocab) + " does not fit i32");
  auto ids = r->tokens();
  for (uint64_t t = 0; t < T; ++t)
    if (ids[t] >= vocab)
      return incompatible("token " + std::to_string(t) + " has id " + std::to_string(ids[t]) +
                          ", outside the vocabulary of " + std::to_string(vocab));
  Header h;
  h.version = options.version;
  h.layers = g.layers;
  h.kv_lora = g.streams[*si_latent].row_width;
  h.qk_rope = g.streams[*si_rope].row_width;
  h.index_hd = si_index ? g.streams[*si_index].row_width : 0;
  // The indexer's layers as the file records them: h[4] counts them, and
  // each record holds their rows in layer order.
  std::vector<uint32_t> index_layers;
  for (uint32_t l = 0; si_index && l < g.layers; ++l)
    if (g.InLayer(l, *si_index)) index_layers.push_back(l);
  h.indexer_layers = static_cast<uint32_t>(index_layers.size());
  h.vocab = vocab;
  h.records = static_cast<uint32_t>(T);
  uint64_t rec = RecordBytes(h.version, h.layers, h.kv_lora, h.qk_rope, h.index_hd, h.indexer_layers);
  std::unique_ptr<File> f;
  KVFILE_RETURN_IF_ERROR(fs->Open(out, OpenMode::kCreateExclusive, &f));
  uint8_t hb[kHeaderBytes];
  std::memcpy(hb, h.version == 1 ? kMagicV1 : kMagicV2, 8);
  int32_t w[kWords] = {static_cast<int32_t>(h.layers), static_cast<int32_t>(h.kv_lora),
                       static_cast<int32_t>(h.qk_rope), static_cast<int32_t>(h.index_hd),
                       static_cast<int32_t>(h.indexer_layers), static_cast<int32_t>(vocab),
                       static_cast<int32_t>(T), h.version == 1 ? kTagF32 : kTagKv8};
  for (int i = 0; i < kWords; ++i) format::StoreU32(hb + 8 + 4 * i, static_cast<uint32_t>(w[i]));
  KVFILE_RETURN_IF_ERROR(f->WriteAt(0, hb, sizeof hb));
  uint64_t batch = std::clamp<uint64_t>(kBatchBytes / rec, 1, 65536);
  std::vector<uint8_t> buf;
  std::vector<float> decoded;  // COLIKV1: one row
  std::vector<std::vector<uint8_t>> codes(h.layers * 2);
  std::vector<std::vector<float>> scales(h.layers * 2);
  std::vector<std::vector<float>> index(index_layers.size());
  for (uint64_t t0 = 0; t0 < T; t0 += batch) {
    uint64_t n = std::min<uint64_t>(batch, T - t0);
    for (uint32_t l = 0; l < h.layers; ++l) {
      for (uint32_t s = 0; s < 2; ++s) {
        uint32_t width = s == 0 ? h.kv_lora : h.qk_rope;
        size_t i = l * 2 + s;
        codes[i].resize(n * width);
        scales[i].resize(n);
        KVFILE_RETURN_IF_ERROR(r->ReadCodes(l, s == 0 ? *si_latent : *si_rope, t0, t0 + n, codes[i].data(),
                                            scales[i].data()));
      }
    }
    for (size_t k = 0; k < index_layers.size(); ++k) {
      index[k].resize(n * h.index_hd);
      KVFILE_RETURN_IF_ERROR(r->ReadRows(index_layers[k], *si_index, t0, t0 + n, Dtype::kF32, index[k].data()));
    }
    buf.resize(n * rec);
    uint8_t* p = buf.data();
    for (uint64_t t = 0; t < n; ++t) {
      format::StoreU32(p, ids[t0 + t]);
      p += 4;
      for (uint32_t l = 0; l < h.layers; ++l)
        for (uint32_t s = 0; s < 2; ++s) {
          uint32_t width = s == 0 ? h.kv_lora : h.qk_rope;
          const uint8_t* c = codes[l * 2 + s].data() + t * width;
          float scale = scales[l * 2 + s][t];
          if (h.version == 1) {
            p = StoreDecodedRow(c, scale, width, p, &decoded);
            continue;
          }
          std::string why = ColibriRowProblem(c, width, scale);
          if (!why.empty())
            return Status::InvalidArgument(in + ": token " + std::to_string(t0 + t) + ": layer " + std::to_string(l) +
                                           " " + (s == 0 ? kLatent : kRope) + " row: " + why + "; not exported");
          std::memcpy(p, c, width);
          p += width;
          format::StoreU32(p, std::bit_cast<uint32_t>(scale));
          p += 4;
        }
      for (size_t l = 0; l < index.size(); ++l) {
        const float* row = index[l].data() + t * h.index_hd;
        for (uint32_t e = 0; e < h.index_hd; ++e) format::StoreU32(p + 4 * e, std::bit_cast<uint32_t>(row[e]));
        p += uint64_t{h.index_hd} * 4;
      }
    }
    KVFILE_RETURN_IF_ERROR(f->WriteAt(kHeaderBytes + t0 * rec, buf.data(), buf.size()));
    if (options.on_batch) KVFILE_RETURN_IF_ERROR(options.on_batch(t0 + n, T));
  }
  return f->Sync();
}

}  // namespace kvfile::coli
