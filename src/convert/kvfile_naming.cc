// SPDX-License-Identifier: Apache-2.0
// The kvfile naming convention over safetensors (kvfile/formats/safetensors.h,
// "The kvfile convention"; names in kvfile_naming.h): reading a file that
// follows it (DescribeKv and the reads after it) and planning one that
// follows it (PlanExport). The file format itself is safetensors.cc.
#include "convert/kvfile_naming.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <optional>

#include "codec/dtype_codec.h"
#include "codec/row_check.h"
#include "format/endian.h"
#include "format/geometry.h"
#include "kvfile/codec.h"
#include "kvfile/writer.h"

namespace kvfile::safetensors {

namespace {

std::string Quote(std::string_view s) { return "'" + std::string(s) + "'"; }

}  // namespace

const char* PartSuffix(DtypePart p) {
  switch (p) {  // the names of kvfile_naming.h
    case DtypePart::kCodes: return naming::kCodesSuffix.data();
    case DtypePart::kBlockScales: return naming::kBlockScalesSuffix.data();
    case DtypePart::kRowScales: return naming::kScalesSuffix.data();
  }
  return "";
}

const TensorInfo*& KvStream::part(DtypePart p) {
  switch (p) {
    case DtypePart::kCodes: return codes;
    case DtypePart::kBlockScales: return block_scales;
    case DtypePart::kRowScales: return scales;
  }
  return codes;
}

Dtype KvStream::source_dtype() const {
  if (block_scales) return Dtype::kNvfp4;
  const TensorInfo* t = codes ? codes : values;
  return KvDtypeOf(t->dtype).value_or(Dtype::kBF16);
}

std::string FingerprintHex(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

bool ParseFingerprint(std::string_view s, uint64_t* out) {
  if (s.size() != 16) return false;
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else return false;
    v = v << 4 | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

namespace {

std::string ShapeText(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() > suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The shape [layers, tokens, rows_per_token, row_width] of an nvfp4 stream's
// three tensors: codes U8 [layers, tokens, n / 2] (n = rows_per_token *
// row_width, a multiple of 16), block scales F8_E4M3 [layers, tokens, n / 16],
// scales F32 [layers, tokens]; rows x width from __metadata__
// "kvfile.shape.<stream>" ("ROWSxWIDTH"), else 1 x n.
Status Nvfp4Shape(const Header& h, const KvStream& s, std::vector<uint64_t>* shape) {
  const TensorInfo& c = *s.codes;
  const TensorInfo& b = *s.block_scales;
  const TensorInfo& sc = *s.scales;
  auto wrong_dtype = [](const TensorInfo& t, const char* want) {
    return Status::InvalidArgument("tensor " + Quote(t.name) + " is " + DTypeName(t.dtype) + "; " + want);
  };
  if (c.dtype != DType::kU8) return wrong_dtype(c, "nvfp4 codes (beside block scales) must be U8");
  if (b.dtype != DType::kF8E4M3) return wrong_dtype(b, "block scales must be F8_E4M3");
  if (sc.dtype != DType::kF32) return wrong_dtype(sc, "scales must be F32");
  if (c.shape.size() != 3 || c.shape[2] == 0 || c.shape[2] % 8 != 0)
    return Status::InvalidArgument("tensor " + Quote(c.name) + " has shape " + ShapeText(c.shape) +
                                   "; expected [layers, tokens, n / 2], n = rows_per_token * row_width a "
                                   "multiple of 16");
  const uint64_t n = c.shape[2] * 2;
  for (auto [t, want] : {std::pair{&b, std::vector<uint64_t>{c.shape[0], c.shape[1], n / 16}},
                         std::pair{&sc, std::vector<uint64_t>{c.shape[0], c.shape[1]}}})
    if (t->shape != want)
      return Status::InvalidArgument("tensor " + Quote(t->name) + " has shape " + ShapeText(t->shape) +
                                     "; expected " + ShapeText(want));
  uint64_t rows = 1, width = n;
  const std::string key = naming::ShapeKey(s.name);
  if (auto it = h.metadata.find(key); it != h.metadata.end()) {
    const std::string& v = it->second;
    const char* end = v.data() + v.size();
    auto r = std::from_chars(v.data(), end, rows);
    bool ok = r.ec == std::errc() && r.ptr != end && *r.ptr == 'x';
    if (ok) {
      auto w = std::from_chars(r.ptr + 1, end, width);
      ok = w.ec == std::errc() && w.ptr == end && rows != 0 && n % rows == 0 && width == n / rows;
    }
    if (!ok)
      return Status::InvalidArgument("__metadata__ " + Quote(key) + " is " + Quote(v) + "; expected ROWSxWIDTH with " +
                                     "ROWS * WIDTH = " + std::to_string(n) + " (the elements of a token)");
  }
  *shape = {c.shape[0], c.shape[1], rows, width};
  return Status::OK();
}

}  // namespace

Status DescribeKv(const Header& h, KvTensors* out) {
  KvTensors kv;
  auto stream_named = [&](const std::string& name) -> KvStream& {
    for (KvStream& s : kv.streams)
      if (s.name == name) return s;
    kv.streams.push_back({});
    kv.streams.back().name = name;
    return kv.streams.back();
  };
  for (const TensorInfo& t : h.tensors) {
    if (t.name == naming::kTokens) {
      if (t.dtype != DType::kI32 && t.dtype != DType::kI64 && t.dtype != DType::kU32)
        return Status::InvalidArgument("tensor 'tokens' is " + std::string(DTypeName(t.dtype)) +
                                       "; token ids must be I32, I64 or U32");
      if (t.shape.size() != 1)
        return Status::InvalidArgument("tensor 'tokens' has shape " + ShapeText(t.shape) + "; expected [tokens]");
      kv.token_ids = &t;
      continue;
    }
    // "<stream>" (values) or "<stream><suffix>" (a part), the parts in
    // DtypePart order: ".block_scales" before ".scales".
    std::string base = t.name;
    std::optional<DtypePart> part;
    for (DtypePart p : {DtypePart::kCodes, DtypePart::kBlockScales, DtypePart::kRowScales}) {
      const std::string_view suffix = PartSuffix(p);
      if (!EndsWith(t.name, suffix)) continue;
      base = t.name.substr(0, t.name.size() - suffix.size());
      part = p;
      break;
    }
    if (!format::IsValidStreamName(base))
      return Status::InvalidArgument("tensor " + Quote(t.name) + ": " + Quote(base) +
                                     " is not a stream name (1-31 characters of [a-z0-9_.-])");
    KvStream& s = stream_named(base);
    (part ? s.part(*part) : s.values) = &t;
  }
  if (kv.token_ids == nullptr) return Status::InvalidArgument("no 'tokens' tensor");
  if (kv.streams.empty()) return Status::InvalidArgument("no stream tensors");
  kv.tokens = kv.token_ids->shape[0];
  // With layer sets the model's layer count is stated, not taken from a tensor.
  std::optional<uint32_t> layer_count;
  if (auto it = h.metadata.find(std::string(naming::kLayerCountKey)); it != h.metadata.end()) {
    uint32_t n = 0;
    auto r = std::from_chars(it->second.data(), it->second.data() + it->second.size(), n);
    if (r.ec != std::errc() || r.ptr != it->second.data() + it->second.size() || n == 0 || n > format::kMaxLayers)
      return Status::InvalidArgument("__metadata__ 'kvfile.layer_count' is " + Quote(it->second) + "; expected 1.." +
                                     std::to_string(format::kMaxLayers));
    layer_count = n;
    kv.layers = n;
  }
  bool first = !layer_count;
  for (KvStream& s : kv.streams) {
    std::string where = "stream " + Quote(s.name);
    if (s.values && (s.codes || s.scales || s.block_scales))
      return Status::InvalidArgument(where + ": both " + Quote(s.name) + " and " +
                                     Quote(s.name + PartSuffix(s.codes    ? DtypePart::kCodes
                                                               : s.scales ? DtypePart::kRowScales
                                                                          : DtypePart::kBlockScales)) +
                                     " are present");
    if (!s.values && !s.codes)
      return Status::InvalidArgument(
          where + ": " + Quote(s.name + PartSuffix(s.scales ? DtypePart::kRowScales : DtypePart::kBlockScales)) +
          " without " + Quote(s.name + PartSuffix(DtypePart::kCodes)));
    if (s.codes && !s.scales)
      return Status::InvalidArgument(where + ": " + Quote(s.name + PartSuffix(DtypePart::kCodes)) + " without " +
                                     Quote(s.name + PartSuffix(DtypePart::kRowScales)));
    const TensorInfo& t = s.values ? *s.values : *s.codes;
    const std::optional<Dtype> kd = KvDtypeOf(t.dtype);
    if (s.values && (!kd || IsFp8(*kd)))
      return Status::InvalidArgument("tensor " + Quote(t.name) + " is " + DTypeName(t.dtype) +
                                     "; stream values must be BF16, F16 or F32");
    if (s.codes && !s.block_scales && (!kd || !IsFp8(*kd)))
      return Status::InvalidArgument("tensor " + Quote(t.name) + " is " + DTypeName(t.dtype) +
                                     "; codes must be F8_E4M3 or F8_E5M2" +
                                     (t.dtype == DType::kU8 ? " (U8: nvfp4 codes, with " +
                                                                  Quote(s.name + PartSuffix(DtypePart::kBlockScales)) + ")"
                                                            : std::string()));
    std::vector<uint64_t> shape = t.shape;  // [layers, tokens, rows_per_token, row_width]
    if (s.block_scales) KVFILE_RETURN_IF_ERROR(Nvfp4Shape(h, s, &shape));
    if (shape.size() != 4)
      return Status::InvalidArgument("tensor " + Quote(t.name) + " has shape " + ShapeText(t.shape) +
                                     "; expected [layers, tokens, rows_per_token, row_width]");
    if (shape[0] == 0 || shape[0] > format::kMaxLayers)
      return Status::InvalidArgument("tensor " + Quote(t.name) + ": " + std::to_string(shape[0]) +
                                     " layers, outside 1.." + std::to_string(format::kMaxLayers));
    if (shape[2] == 0 || shape[2] > format::kMaxRowsPerToken)
      return Status::InvalidArgument("tensor " + Quote(t.name) + ": " + std::to_string(shape[2]) +
                                     " rows per token, outside 1.." + std::to_string(format::kMaxRowsPerToken));
    if (shape[3] == 0 || shape[3] > format::kMaxRowWidth)
      return Status::InvalidArgument("tensor " + Quote(t.name) + ": row width " + std::to_string(shape[3]) +
                                     " outside 1.." + std::to_string(format::kMaxRowWidth));
    if (auto it = h.metadata.find(naming::LayersKey(s.name)); it != h.metadata.end()) {
      Status ls = ParseLayerList(it->second, &s.layers);
      if (!ls.ok()) return Status::InvalidArgument("__metadata__ " + Quote(it->first) + ": " + ls.message());
      if (!layer_count)
        return Status::InvalidArgument("__metadata__ " + Quote(it->first) +
                                       " without 'kvfile.layer_count' (the model's layers)");
      if (s.layers.empty() || s.layers.back() >= *layer_count)
        return Status::InvalidArgument("__metadata__ " + Quote(it->first) + " names layers outside 0.." +
                                       std::to_string(*layer_count - 1));
      if (shape[0] != s.layers.size())
        return Status::InvalidArgument("tensor " + Quote(t.name) + " has " + std::to_string(shape[0]) +
                                       " layers; " + Quote(it->first) + " names " + std::to_string(s.layers.size()));
      if (s.layers.size() == *layer_count) s.layers.clear();  // every layer
    } else {
      if (first) kv.layers = static_cast<uint32_t>(shape[0]);
      first = false;
      if (shape[0] != kv.layers)
        return Status::InvalidArgument("tensor " + Quote(t.name) + " has " + std::to_string(shape[0]) +
                                       " layers; the other streams have " + std::to_string(kv.layers));
    }
    if (shape[1] != kv.tokens)
      return Status::InvalidArgument("tensor " + Quote(t.name) + " has " + std::to_string(shape[1]) +
                                     " tokens; 'tokens' has " + std::to_string(kv.tokens));
    s.rows_per_token = static_cast<uint32_t>(shape[2]);
    s.row_width = static_cast<uint32_t>(shape[3]);
    if (s.scales && !s.block_scales) {
      if (s.scales->dtype != DType::kF32)
        return Status::InvalidArgument("tensor " + Quote(s.scales->name) + " is " + DTypeName(s.scales->dtype) +
                                       "; scales must be F32");
      std::vector<uint64_t> want = {shape[0], shape[1], shape[2]};
      if (s.scales->shape != want)
        return Status::InvalidArgument("tensor " + Quote(s.scales->name) + " has shape " +
                                       ShapeText(s.scales->shape) + "; expected " + ShapeText(want));
    }
  }
  if (auto it = h.metadata.find(std::string(naming::kModelKey)); it != h.metadata.end()) {
    if (it->second.size() > format::hdr::kModelIdCapacity - 1)
      return Status::InvalidArgument("__metadata__ 'kvfile.model' is " + std::to_string(it->second.size()) +
                                     " bytes; a model id has at most 255");
    kv.model_id = it->second;
  }
  if (auto it = h.metadata.find(std::string(naming::kFingerprintKey)); it != h.metadata.end()) {
    uint64_t fp;
    if (!ParseFingerprint(it->second, &fp))
      return Status::InvalidArgument("__metadata__ 'kvfile.fingerprint' is " + Quote(it->second) +
                                     "; expected 16 hex digits");
    kv.fingerprint = fp;
  }
  *out = std::move(kv);
  return Status::OK();
}

Status ReadTokenIds(SafetensorsFile& f, const KvTensors& kv, std::vector<uint32_t>* out) {
  const TensorInfo& t = *kv.token_ids;
  std::vector<uint8_t> raw(t.bytes());
  KVFILE_RETURN_IF_ERROR(f.Read(t, 0, raw.data(), raw.size()));
  std::vector<uint32_t> ids(kv.tokens);
  for (uint64_t i = 0; i < kv.tokens; ++i) {
    int64_t v;
    if (t.dtype == DType::kI64) v = static_cast<int64_t>(format::LoadU64(&raw[i * 8]));
    else if (t.dtype == DType::kI32) v = static_cast<int32_t>(format::LoadU32(&raw[i * 4]));
    else v = format::LoadU32(&raw[i * 4]);
    if (v < 0 || static_cast<uint64_t>(v) > format::kMaxTokenId)
      return Status::InvalidArgument(f.path() + ": tensor 'tokens': token " + std::to_string(i) + " has id " +
                                     std::to_string(v) + "; token ids are 0.." + std::to_string(format::kMaxTokenId));
    ids[i] = static_cast<uint32_t>(v);
  }
  *out = std::move(ids);
  return Status::OK();
}

Status ReadStreamSlab(SafetensorsFile& f, const KvTensors& kv, const KvStream& s, uint32_t model_layer,
                      uint64_t t0, uint64_t n, std::vector<uint8_t>* data, std::vector<float>* scales) {
  // The tensors hold the stream's own layers only.
  const uint32_t layer = s.layers.empty() ? model_layer
                                          : static_cast<uint32_t>(std::lower_bound(s.layers.begin(), s.layers.end(),
                                                                                   model_layer) - s.layers.begin());
  if (s.block_scales) {
    // nvfp4: one row per token; the codes, then the block scales, in data.
    const uint64_t e = uint64_t{s.rows_per_token} * s.row_width;
    const uint64_t first = uint64_t{layer} * kv.tokens + t0;
    data->resize(n * (e / 2 + e / 16));
    scales->resize(n);
    KVFILE_RETURN_IF_ERROR(f.Read(*s.codes, first * e / 2, data->data(), n * e / 2));
    KVFILE_RETURN_IF_ERROR(f.Read(*s.block_scales, first * e / 16, data->data() + n * e / 2, n * e / 16));
    return f.Read(*s.scales, first * 4, scales->data(), n * 4);
  }
  const TensorInfo& t = s.codes ? *s.codes : *s.values;
  uint64_t per_token = uint64_t{s.rows_per_token} * s.row_width * DTypeSize(t.dtype);
  uint64_t first = uint64_t{layer} * kv.tokens + t0;
  data->resize(n * per_token);
  KVFILE_RETURN_IF_ERROR(f.Read(t, first * per_token, data->data(), data->size()));
  if (s.codes) {
    uint64_t rows = n * s.rows_per_token;
    scales->resize(rows);
    KVFILE_RETURN_IF_ERROR(f.Read(*s.scales, first * s.rows_per_token * 4, scales->data(), rows * 4));
  }
  return Status::OK();
}

namespace {
// The parts of a slab as ReadStreamSlab reads it: the codes (or values),
// then the block scales, in `data`; the row scales in `scales`.
codec::PartsIn SlabParts(Dtype d, const std::vector<uint8_t>& data, const std::vector<float>& scales, uint64_t rows,
                         uint64_t width) {
  codec::PartsIn p{data.data()};
  if (PartBytes(d, DtypePart::kBlockScales, rows, width))
    p.block_scales = data.data() + PartBytes(d, DtypePart::kCodes, rows, width);
  if (PartBytes(d, DtypePart::kRowScales, rows, width)) p.row_scales = scales.data();
  return p;
}
}  // namespace

Status CheckValues(SafetensorsFile& f, const KvTensors& kv) {
  std::vector<uint8_t> data;
  std::vector<float> scales;
  for (const KvStream& s : kv.streams) {
    const TensorInfo& t = s.codes ? *s.codes : *s.values;
    uint64_t elems_per_token = uint64_t{s.rows_per_token} * s.row_width;
    uint64_t block = std::max<uint64_t>(1, (uint64_t{64} << 20) / (elems_per_token * DTypeSize(t.dtype)));
    Dtype dt = s.source_dtype();
    for (uint32_t l = 0; l < kv.layers; ++l) {
      if (!s.layers.empty() && !std::binary_search(s.layers.begin(), s.layers.end(), l)) continue;
      for (uint64_t t0 = 0; t0 < kv.tokens; t0 += block) {
        uint64_t n = std::min(block, kv.tokens - t0);
        KVFILE_RETURN_IF_ERROR(ReadStreamSlab(f, kv, s, l, t0, n, &data, &scales));
        // A per-token row (nvfp4) is a token's elements, so a fault names no row.
        const CodecRows cr = CodecRowsOf(dt, s.rows_per_token, s.row_width);
        const bool per_token = FindDtype(dt)->quantization == Quantization::kPerToken;
        auto where = [&](uint64_t row, const std::string& tensor) {
          return f.path() + ": tensor " + Quote(tensor) + ": layer " + std::to_string(l) + ", token " +
                 (per_token
                      ? std::to_string(t0 + row)
                      : std::to_string(t0 + row / s.rows_per_token) + ", row " + std::to_string(row % s.rows_per_token));
        };
        const uint64_t rows = n * cr.per_token;
        codec::RowCheck rc = codec::CodecOf(dt)->check(dt, SlabParts(dt, data, scales, rows, cr.width), rows, cr.width);
        if (rc.fault == codec::RowFault::kInvalidBlockScale)
          return Status::NonFinite(where(rc.row, s.block_scales->name) +
                                   ": invalid block scale (bit 7 set, or 0x7F)");
        if (rc.fault == codec::RowFault::kNonFiniteCode)
          return Status::NonFinite(where(rc.row, t.name) + ": non-finite code");
        if (rc.fault == codec::RowFault::kInvalidScale)
          return Status::NonFinite(where(rc.row, s.scales->name) + ": invalid scale (scales must be finite and > 0)");
        if (rc.fault == codec::RowFault::kNonFiniteValue)
          return Status::NonFinite(where(rc.row, t.name) + ": non-finite value");
      }
    }
  }
  return Status::OK();
}

Status AppendAll(SafetensorsFile& f, const KvTensors& kv, std::span<const uint32_t> token_ids,
                 const std::vector<size_t>& stream_of, Writer& w, uint64_t block_tokens,
                 const std::function<Status()>& between) {
  const Geometry& g = w.geometry();
  size_t S = g.streams.size();
  if (stream_of.size() != S || g.layers != kv.layers || token_ids.size() != kv.tokens)
    return Status::InvalidArgument(f.path() + ": the input does not match the writer's geometry");
  size_t blocks = static_cast<size_t>(g.layers) * S;
  std::vector<std::vector<uint8_t>> data(blocks);
  std::vector<std::vector<float>> scales(blocks);
  std::vector<std::vector<float>> decoded(blocks);
  block_tokens = std::max<uint64_t>(block_tokens, 1);
  for (uint64_t t0 = 0; t0 < kv.tokens; t0 += block_tokens) {
    uint64_t n = std::min(block_tokens, kv.tokens - t0);
    AppendBatch batch;
    batch.tokens = token_ids.subspan(t0, n);
    // One append, whatever the number of blocks: all or nothing.
    batch.continued = t0 + n < kv.tokens;
    for (uint32_t l = 0; l < g.layers; ++l) {
      for (size_t s = 0; s < S; ++s) {
        const KvStream& src = kv.streams[stream_of[s]];
        const StreamSpec& spec = g.streams[s];
        size_t i = l * S + s;
        if (!g.InLayer(l, static_cast<uint32_t>(s))) {
          batch.blocks.push_back({});  // the stream is not in this layer
          continue;
        }
        KVFILE_RETURN_IF_ERROR(ReadStreamSlab(f, kv, src, l, t0, n, &data[i], &scales[i]));
        Dtype from = src.source_dtype();
        // The parts as the slab holds them (nvfp4: one row per token, the
        // block scales after the codes).
        const CodecRows cr = CodecRowsOf(from, spec.rows_per_token, spec.row_width);
        const uint64_t rows = n * cr.per_token, width = cr.width;
        const codec::PartsIn parts = SlabParts(from, data[i], scales[i], rows, width);
        if (!src.is_codes()) {
          batch.blocks.push_back({from, data[i].data(), nullptr});
        } else if (from == spec.dtype) {
          batch.blocks.push_back({from, data[i].data(), parts.row_scales, parts.block_scales});
        } else {
          // Codes of another quantized dtype (or into a raw stream): decode
          // to f32 and let the writer quantize or convert. The decoder wants
          // valid codes and scales.
          const codec::DtypeCodec& codec = *codec::CodecOf(from);
          codec::RowCheck rc = codec.check(from, parts, rows, width);
          if (!rc.ok())
            return Status::NonFinite(f.path() + ": stream " + Quote(src.name) + ": layer " + std::to_string(l) +
                                     ", token " + std::to_string(t0 + rc.row / cr.per_token) + ": " +
                                     codec::RowFaultText(rc.fault));
          decoded[i].resize(rows * width);
          codec.decode(from, parts, rows, width, Dtype::kF32, decoded[i].data());
          batch.blocks.push_back({Dtype::kF32, decoded[i].data(), nullptr});
        }
      }
    }
    // The last Append finishes (commits) the append: `between` comes
    // before it, so that a stop it asks for leaves none of the append.
    if (between && !batch.continued) KVFILE_RETURN_IF_ERROR(between());
    Status st = w.Append(batch);
    // The writer's I/O errors name the file written, not this input.
    if (!st.ok()) return st.code() == Status::Code::kIOError ? st : st.WithContext(f.path());
    if (between && batch.continued) KVFILE_RETURN_IF_ERROR(between());
  }
  return Status::OK();
}

}  // namespace kvfile::safetensors

namespace kvfile::safetensors::naming {

bool IsReserved(const std::string& stream) {
  return stream == kTokens || stream.ends_with(kCodesSuffix) || stream.ends_with(kScalesSuffix) || stream.ends_with(kBlockScalesSuffix);
}

Status PlanExport(const std::string& in, const Geometry& g, const ModelIdentity& id, uint64_t tokens, bool codes,
                  Dtype values, ExportLayout* out) {
  const uint64_t T = tokens;
  ExportLayout x;
  x.tensors.push_back({std::string(kTokens), DType::kI64, {T}, 0, 0, 0});
  for (uint32_t s = 0; s < g.streams.size(); ++s) {
    const StreamSpec& spec = g.streams[s];
    if (IsReserved(spec.name))
      return Status::InvalidArgument(in + ": stream '" + spec.name +
                                     "' cannot be exported: the name is reserved by the safetensors convention");
    // A stream's tensors hold the layers it is in (its layer set, in the metadata).
    const uint64_t nl = g.StreamLayers(s);
    std::vector<uint64_t> shape = {nl, T, spec.rows_per_token, spec.row_width};
    if (codes && IsQuantized(spec.dtype)) {
      // One tensor per stored part of the dtype (kDtypeTable), in its order:
      // codes whole bytes shaped as the values, or packed (under 8 bits)
      // per token; block scales E4M3 per token; row scales F32 per codec row.
      const DtypeInfo& info = *FindDtype(spec.dtype);
      const CodecRows cr = CodecRowsOf(spec.dtype, spec.rows_per_token, spec.row_width);
      for (uint8_t i = 0; i < info.part_count; ++i) {
        const DtypePart p = info.parts[i];
        const std::string name = spec.name + PartSuffix(p);
        const uint64_t per_token = PartBytes(spec.dtype, p, cr.per_token, cr.width);
        switch (p) {
          case DtypePart::kCodes:
            if (info.element_bits >= 8)
              x.tensors.push_back({name, DTypeOf(spec.dtype), shape, 0, 0, 0});
            else
              x.tensors.push_back({name, DType::kU8, {nl, T, per_token}, 0, 0, 0});
            x.items.push_back({s, p, spec.dtype});
            break;
          case DtypePart::kBlockScales:
            x.tensors.push_back({name, DType::kF8E4M3, {nl, T, per_token}, 0, 0, 0});
            x.items.push_back({s, p, spec.dtype});
            break;
          case DtypePart::kRowScales:
            if (info.quantization == Quantization::kPerToken)
              x.tensors.push_back({name, DType::kF32, {nl, T}, 0, 0, 0});
            else
              x.tensors.push_back({name, DType::kF32, {nl, T, cr.per_token}, 0, 0, 0});
            x.items.push_back({s, p, spec.dtype});
            break;
        }
      }
      // Packed codes do not show rows x width: it travels in the metadata.
      if (info.element_bits < 8)
        x.metadata[ShapeKey(spec.name)] = std::to_string(spec.rows_per_token) + "x" + std::to_string(spec.row_width);
    } else {
      Dtype d = codes ? spec.dtype : values;
      x.tensors.push_back({spec.name, DTypeOf(d), shape, 0, 0, 0});
      x.items.push_back({s, std::nullopt, d});
    }
  }
  x.metadata[std::string(kModelKey)] = id.model_id;
  x.metadata[std::string(kFingerprintKey)] = FingerprintHex(id.fingerprint);
  // Streams absent from some layers: which layers, and of how many.
  if (g.HasLayerSets()) x.metadata[std::string(kLayerCountKey)] = std::to_string(g.layers);
  for (const StreamSpec& spec : g.streams)
    if (!spec.layers.empty()) x.metadata[LayersKey(spec.name)] = FormatLayerList(spec.layers);
  *out = std::move(x);
  return Status::OK();
}

uint64_t TensorLayer(const Geometry& g, uint32_t layer, uint32_t stream) {
  const std::vector<uint32_t>& ls = g.streams[stream].layers;
  return ls.empty() ? layer : static_cast<uint64_t>(std::lower_bound(ls.begin(), ls.end(), layer) - ls.begin());
}

}  // namespace kvfile::safetensors::naming
