// SPDX-License-Identifier: Apache-2.0
// Table codecs and hashes of the .kvpack format (spec/PACK.md).
#include "pack/pack_format.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "format/endian.h"
#include "format/header.h"
#include "format/kv_format.h"

namespace kvfile::pack {

using format::LoadU32;
using format::LoadU64;
using format::StoreU32;
using format::StoreU64;

uint64_t PayloadBytesPerToken(const Geometry& g) { return g.PayloadBytesPerToken(); }

uint64_t ChainHash(uint64_t previous, std::span<const uint32_t> tokens) {
  std::vector<uint8_t> bytes(tokens.size() * 4);
  for (size_t i = 0; i < tokens.size(); ++i) StoreU32(bytes.data() + 4 * i, tokens[i]);
  return XXH3_64bits_withSeed(bytes.data(), bytes.size(), previous);
}

std::string NameSetConflict(std::vector<std::string_view> names) {
  // '/' ranks below every other byte (NUL is not in a name).
  auto rank = [](char c) { return c == '/' ? 0 : static_cast<unsigned char>(c); };
  std::sort(names.begin(), names.end(), [&](std::string_view a, std::string_view b) {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(),
                                        [&](char x, char y) { return rank(x) < rank(y); });
  });
  for (size_t i = 1; i < names.size(); ++i) {
    std::string_view a = names[i - 1], b = names[i];
    if (a == b) return "two members are named '" + std::string(a) + "'";
    if (b.size() > a.size() && b.starts_with(a) && b[a.size()] == '/')
      return "member '" + std::string(a) + "' is a file and also the directory of member '" + std::string(b) + "'";
  }
  return "";
}

void EncodeModel(const PackModel& m, uint8_t* out, bool layer_sets) {
  std::memset(out, 0, ModelEntryBytes(layer_sets));
  if (layer_sets) format::EncodeLayerSets(m.geometry, out + kModelEntryBytes);
  StoreU64(out + me::kFingerprint, m.identity.fingerprint);
  StoreU32(out + me::kLayers, m.geometry.layers);
  StoreU32(out + me::kStreams, static_cast<uint32_t>(m.geometry.streams.size()));
  StoreU32(out + me::kChunkTokens, m.chunk_tokens);
  StoreU32(out + me::kModelIdLength, static_cast<uint32_t>(m.identity.model_id.size()));
  std::memcpy(out + me::kModelId, m.identity.model_id.data(), m.identity.model_id.size());
  for (size_t s = 0; s < m.geometry.streams.size(); ++s) {
    const StreamSpec& spec = m.geometry.streams[s];
    uint8_t* d = out + me::kDescriptors + s * me::kDescriptorBytes;
    std::memcpy(d + format::sd::kName, spec.name.data(), spec.name.size());
    d[format::sd::kDtype] = static_cast<uint8_t>(spec.dtype);
    StoreU32(d + format::sd::kRowsPerToken, spec.rows_per_token);
    StoreU32(d + format::sd::kRowWidth, spec.row_width);
  }
}

bool HasNvfp4(const Geometry& g) {
  return std::any_of(g.streams.begin(), g.streams.end(), [](const StreamSpec& s) { return IsNvfp4(s.dtype); });
}

Status DecodeModel(const uint8_t* in, PackModel* out, uint64_t required_flags) {
  const bool layer_sets = (required_flags & kFlagLayerSets) != 0;
  PackModel m;
  m.identity.fingerprint = LoadU64(in + me::kFingerprint);
  m.geometry.layers = LoadU32(in + me::kLayers);
  uint32_t streams = LoadU32(in + me::kStreams);
  m.chunk_tokens = LoadU32(in + me::kChunkTokens);
  uint32_t id_len = LoadU32(in + me::kModelIdLength);
  if (streams < 1 || streams > me::kMaxStreams)
    return Status::Corruption("stream count " + std::to_string(streams) + " is outside 1..16");
  if (id_len >= me::kModelIdCapacity)
    return Status::Corruption("model id length " + std::to_string(id_len) + " is over 255");
  m.identity.model_id.assign(reinterpret_cast<const char*>(in + me::kModelId), id_len);
  if (m.identity.model_id.find('\0') != std::string::npos)
    return Status::Corruption("model id holds a NUL byte");
  if (!format::AllZero({in + me::kModelId + id_len, me::kModelIdCapacity - id_len}))
    return Status::Corruption("nonzero bytes after the model id");
  for (uint32_t s = 0; s < me::kMaxStreams; ++s) {
    const uint8_t* d = in + me::kDescriptors + s * me::kDescriptorBytes;
    if (s >= streams) {
      if (!format::AllZero({d, me::kDescriptorBytes})) return Status::Corruption("unused stream descriptor " + std::to_string(s) + " is not zero");
      continue;
    }
    StreamSpec spec;
    const char* name = reinterpret_cast<const char*>(d + format::sd::kName);
    size_t len = strnlen(name, format::sd::kNameCapacity);
    if (len >= format::sd::kNameCapacity)
      return Status::Corruption("stream " + std::to_string(s) + ": name is not terminated");
    if (!format::AllZero({d + len, format::sd::kNameCapacity - len}))
      return Status::Corruption("stream " + std::to_string(s) + ": nonzero bytes after the name");
    spec.name.assign(name, len);
    uint8_t dt = d[format::sd::kDtype];
    if (!IsValidDtype(dt)) return Status::Corruption("stream " + std::to_string(s) + ": invalid dtype " + std::to_string(dt));
    // nvfp4 (6) only in a pack that says so (1.2): a pack without the flag
    // holds the dtypes of .kv 2.1 (1..5).
    if (IsNvfp4(static_cast<Dtype>(dt)) && !(required_flags & kFlagNvfp4))
      return Status::Corruption("stream " + std::to_string(s) + ": dtype nvfp4 (6) without the NVFP4 required flag");
    spec.dtype = static_cast<Dtype>(dt);
    if (!format::AllZero({d + format::sd::kDtype + 1, format::sd::kRowsPerToken - format::sd::kDtype - 1}) ||
        !format::AllZero({d + format::sd::kRowWidth + 4, me::kDescriptorBytes - format::sd::kRowWidth - 4}))
      return Status::Corruption("stream " + std::to_string(s) + ": nonzero reserved bytes");
    spec.rows_per_token = LoadU32(d + format::sd::kRowsPerToken);
    spec.row_width = LoadU32(d + format::sd::kRowWidth);
    m.geometry.streams.push_back(std::move(spec));
  }
  if (layer_sets) KVFILE_RETURN_IF_ERROR(format::DecodeLayerSets(in + kModelEntryBytes, kModelEntryBytes, &m.geometry));
  Status st = m.geometry.Validate();
  if (!st.ok()) return Status::Corruption(st.message());
  m.payload_bytes_per_token = PayloadBytesPerToken(m.geometry);
  if (m.chunk_tokens < 1 || m.chunk_tokens > kMaxChunkTokens ||
      m.payload_bytes_per_token * m.chunk_tokens > kMaxChunkPayload)
    return Status::Corruption("chunk_tokens " + std::to_string(m.chunk_tokens) +
                              " is outside 1..65536 or makes a chunk larger than 1 GiB");
  *out = std::move(m);
  return Status::OK();
}

}  // namespace kvfile::pack
