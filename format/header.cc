// SPDX-License-Identifier: Apache-2.0
// Encoding and decoding of the file header, commit slots and chunk headers.
#include "format/header.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "format/endian.h"

namespace kvfile::format {

namespace {

std::string At(size_t offset) { return " (header offset " + std::to_string(offset) + ")"; }

// Byte ranges of the header that must be zero (reserved).
constexpr ByteRange kHeaderReserved[] = {
    {68, hdr::kModelId},  // after model_id_length up to model_id
    {hdr::kLayerSetsEnd, hdr::kChecksum},
};
// Reserved unless the file sets kFlagLayerSets.
constexpr ByteRange kLayerSetRange[] = {{hdr::kLayerSets, hdr::kLayerSetsEnd}};

// The frame of the header (format/framing.h). Its reserved bytes are
// checked after the counts (salt, data offset, model id length, stream
// count), as they always were: so the frame lists none.
constexpr FrameVersion kVersions[] = {{kMajorV2, kKnownRequiredFlags}, {kMajorV1, 0}};
constexpr FrameSpec kFrame = {kFileMagic, kHeaderSize, kVersions, true, {}};
static_assert(hdr::kMagic == frame::kMagic && hdr::kMajor == frame::kMajor && hdr::kMinor == frame::kMinor &&
              hdr::kHeaderBytes == frame::kHeaderBytes && hdr::kRequiredFlags == frame::kRequiredFlags &&
              hdr::kOptionalFlags == frame::kOptionalFlags && hdr::kChecksum == kHeaderSize - 8);
static_assert(hdr::kLayerSets == hdr::kStreams + hdr::kMaxStreams * hdr::kStreamDescriptorSize);
static_assert(hdr::kLayerSetBytes * 8 == kMaxLayers);
static_assert(cs::kChecksum == kCommitSlotSize - 8);

}  // namespace

Status ValidateFileHeader(const FileHeader& h) {
  KVFILE_RETURN_IF_ERROR(h.geometry.Validate());
  if (h.identity.model_id.size() >= hdr::kModelIdCapacity)
    return Status::InvalidArgument("model id is " + std::to_string(h.identity.model_id.size()) +
                                   " bytes; at most 255 allowed");
  if (h.identity.model_id.find('\0') != std::string::npos)
    return Status::InvalidArgument("model id contains a NUL byte");
  if (h.chunk_tokens == 0 || h.chunk_tokens > kMaxChunkTokens)
    return Status::InvalidArgument("chunk tokens " + std::to_string(h.chunk_tokens) +
                                   " outside 1.." + std::to_string(kMaxChunkTokens));
  if (h.salt == 0) return Status::InvalidArgument("salt must be nonzero");
  if ((h.required_flags & ~kKnownRequiredFlags) != 0 || (h.major == kMajorV1 && h.required_flags != 0))
    return Status::InvalidArgument("unknown required flags");
  if (h.major == kMajorV2) {
    // v2 streams may be fp8, nvfp4 or raw; the NVFP4 flag is set exactly
    // when one is nvfp4.
    bool nvfp4 = false;
    for (const StreamSpec& s : h.geometry.streams) nvfp4 = nvfp4 || IsNvfp4(s.dtype);
    if (nvfp4 != ((h.required_flags & kFlagNvfp4) != 0))
      return Status::InvalidArgument(nvfp4 ? "an nvfp4 stream without the NVFP4 required flag"
                                           : "the NVFP4 required flag without an nvfp4 stream");
    const bool sets = h.geometry.HasLayerSets();
    if (sets != ((h.required_flags & kFlagLayerSets) != 0))
      return Status::InvalidArgument(sets ? "a stream absent from some layer without the LAYER_SETS required flag"
                                          : "the LAYER_SETS required flag with every stream in every layer");
  } else if (h.major == kMajorV1) {
    if (h.geometry.HasLayerSets()) return Status::InvalidArgument("v1 files keep every stream in every layer");
    for (const StreamSpec& s : h.geometry.streams)
      if (IsQuantized(s.dtype))
        return Status::InvalidArgument("stream '" + s.name + "': v1 files store raw rows only");
  } else {
    return Status::InvalidArgument("unknown major version " + std::to_string(h.major));
  }
  return Status::OK();
}

void EncodeFileHeader(const FileHeader& h, std::span<uint8_t, kHeaderSize> out) {
  uint8_t* p = out.data();
  EncodeFrame(kFrame, {h.major, h.minor, h.required_flags, h.optional_flags}, out);
  StoreU64(p + hdr::kSalt, h.salt);
  StoreU64(p + hdr::kFingerprint, h.identity.fingerprint);
  StoreU32(p + hdr::kLayerCount, h.geometry.layers);
  StoreU32(p + hdr::kStreamCount, static_cast<uint32_t>(h.geometry.streams.size()));
  StoreU32(p + hdr::kChunkTokens, h.chunk_tokens);
  StoreU32(p + hdr::kDataOffsetField, static_cast<uint32_t>(kDataOffset));
  StoreU32(p + hdr::kModelIdLength, static_cast<uint32_t>(h.identity.model_id.size()));
  std::memcpy(p + hdr::kModelId, h.identity.model_id.data(), h.identity.model_id.size());
  for (size_t i = 0; i < h.geometry.streams.size(); ++i) {
    const StreamSpec& s = h.geometry.streams[i];
    uint8_t* d = p + hdr::kStreams + i * hdr::kStreamDescriptorSize;
    std::memcpy(d + sd::kName, s.name.data(), s.name.size());
    d[sd::kDtype] = static_cast<uint8_t>(s.dtype);
    StoreU32(d + sd::kRowsPerToken, s.rows_per_token);
    StoreU32(d + sd::kRowWidth, s.row_width);
  }
  if (h.required_flags & kFlagLayerSets) EncodeLayerSets(h.geometry, p + hdr::kLayerSets);
  SealRecord(out);
}

void EncodeLayerSets(const Geometry& g, uint8_t* out) {
  std::memset(out, 0, hdr::kMaxStreams * hdr::kLayerSetBytes);
  for (uint32_t s = 0; s < g.streams.size(); ++s)
    for (uint32_t l = 0; l < g.layers; ++l)
      if (g.InLayer(l, s)) out[s * hdr::kLayerSetBytes + l / 8] |= static_cast<uint8_t>(1u << (l % 8));
}

Status DecodeLayerSets(const uint8_t* in, size_t at, Geometry* g) {
  for (uint32_t s = 0; s < hdr::kMaxStreams; ++s) {
    const uint8_t* bits = in + s * hdr::kLayerSetBytes;
    const std::string where = " (offset " + std::to_string(at + s * hdr::kLayerSetBytes) + ")";
    std::vector<uint32_t> layers;
    for (uint32_t l = 0; l < kMaxLayers; ++l) {
      if (!(bits[l / 8] >> (l % 8) & 1)) continue;
      if (s >= g->streams.size()) return Status::Corruption("unused layer set " + std::to_string(s) + " is not zero" + where);
      if (l >= g->layers)
        return Status::Corruption("stream '" + g->streams[s].name + "' is in layer " + std::to_string(l) + " of " +
                                  std::to_string(g->layers) + where);
      layers.push_back(l);
    }
    if (s >= g->streams.size()) continue;
    if (layers.empty()) return Status::Corruption("stream '" + g->streams[s].name + "' is in no layer" + where);
    if (layers.size() == g->layers) layers.clear();  // every layer
    g->streams[s].layers = std::move(layers);
  }
  return Status::OK();
}

Status DecodeFileHeader(std::span<const uint8_t, kHeaderSize> in, FileHeader* out) {
  const uint8_t* p = in.data();
  const FrameCheck frame = ParseFrame(kFrame, in);
  switch (frame.fault) {
    case FrameFault::kNone:
      break;
    case FrameFault::kMagic:
      return Status::Corruption("not a kvfile: bad magic at offset 0");
    case FrameFault::kMajor:
      return Status::Unsupported("format major version " + std::to_string(frame.fields.major) +
                                 " is not supported (this build reads 1 and 2)");
    case FrameFault::kChecksum:
      return Status::Corruption("file header checksum mismatch" + At(frame.at));
    case FrameFault::kHeaderBytes:
      return Status::Corruption("header size field is not 4096" + At(frame.at));
    case FrameFault::kRequiredFlags: {
      // Unknown required bits, or any in a v1 file (v1 defines none).
      char hex[24];
      std::snprintf(hex, sizeof hex, "0x%llx", static_cast<unsigned long long>(frame.fields.required_flags));
      return Status::Unsupported(std::string("unknown required flags ") + hex + " (written by a newer kvfile?)");
    }
    case FrameFault::kReserved:
      return Status::Corruption("reserved header bytes are not zero" + At(frame.at));
  }
  FileHeader h;
  h.major = frame.fields.major;
  h.minor = frame.fields.minor;
  h.required_flags = frame.fields.required_flags;
  h.optional_flags = frame.fields.optional_flags;
  h.salt = LoadU64(p + hdr::kSalt);
  if (h.salt == 0) return Status::Corruption("salt is zero" + At(hdr::kSalt));
  h.identity.fingerprint = LoadU64(p + hdr::kFingerprint);
  h.geometry.layers = LoadU32(p + hdr::kLayerCount);
  uint32_t stream_count = LoadU32(p + hdr::kStreamCount);
  h.chunk_tokens = LoadU32(p + hdr::kChunkTokens);
  if (LoadU32(p + hdr::kDataOffsetField) != kDataOffset)
    return Status::Corruption("data offset field is not 12288" + At(hdr::kDataOffsetField));
  uint32_t model_len = LoadU32(p + hdr::kModelIdLength);
  if (model_len >= hdr::kModelIdCapacity)
    return Status::Corruption("model id length " + std::to_string(model_len) + " exceeds 255" +
                              At(hdr::kModelIdLength));
  if (stream_count == 0 || stream_count > hdr::kMaxStreams)
    return Status::Corruption("stream count " + std::to_string(stream_count) + " outside 1..16" +
                              At(hdr::kStreamCount));
  if (std::optional<ByteRange> r = FirstNonzero(kHeaderReserved, in))
    return Status::Corruption("reserved header bytes are not zero" + At(r->begin));
  h.identity.model_id.assign(reinterpret_cast<const char*>(p + hdr::kModelId), model_len);
  if (!AllZero(in.subspan(hdr::kModelId + model_len, hdr::kModelIdCapacity - model_len)) ||
      h.identity.model_id.find('\0') != std::string::npos)
    return Status::Corruption("model id padding is not zero" + At(hdr::kModelId));
  for (uint32_t i = 0; i < hdr::kMaxStreams; ++i) {
    size_t base = hdr::kStreams + i * hdr::kStreamDescriptorSize;
    auto desc = in.subspan(base, hdr::kStreamDescriptorSize);
    if (i >= stream_count) {
      if (!AllZero(desc)) return Status::Corruption("unused stream descriptor is not zero" + At(base));
      continue;
    }
    const uint8_t* d = desc.data();
    size_t name_len = 0;
    while (name_len < sd::kNameCapacity && d[name_len] != 0) ++name_len;
    StreamSpec s;
    s.name.assign(reinterpret_cast<const char*>(d), name_len);
    if (!AllZero(desc.subspan(name_len, sd::kNameCapacity - name_len)))
      return Status::Corruption("stream name padding is not zero" + At(base));
    if (!IsValidDtype(d[sd::kDtype]))
      return Status::Corruption("stream " + std::to_string(i) + " has unknown dtype " +
                                std::to_string(d[sd::kDtype]) + At(base + sd::kDtype));
    s.dtype = static_cast<Dtype>(d[sd::kDtype]);
    if (!AllZero(desc.subspan(sd::kDtype + 1, sd::kRowsPerToken - sd::kDtype - 1)) ||
        !AllZero(desc.subspan(sd::kRowWidth + 4, hdr::kStreamDescriptorSize - sd::kRowWidth - 4)))
      return Status::Corruption("reserved stream descriptor bytes are not zero" + At(base));
    s.rows_per_token = LoadU32(d + sd::kRowsPerToken);
    s.row_width = LoadU32(d + sd::kRowWidth);
    h.geometry.streams.push_back(std::move(s));
  }
  if (h.required_flags & kFlagLayerSets) {
    KVFILE_RETURN_IF_ERROR(DecodeLayerSets(p + hdr::kLayerSets, hdr::kLayerSets, &h.geometry));
  } else if (std::optional<ByteRange> r = FirstNonzero(kLayerSetRange, in)) {
    return Status::Corruption("reserved header bytes are not zero" + At(r->begin));
  }
  Status st = ValidateFileHeader(h);
  if (!st.ok()) return Status::Corruption("invalid header: " + st.message());
  *out = std::move(h);
  return Status::OK();
}

void EncodeCommitRecord(const CommitRecord& c, std::span<uint8_t, kCommitSlotSize> out) {
  uint8_t* p = out.data();
  std::memset(p, 0, kCommitSlotSize);
  std::memcpy(p + cs::kMagicField, cs::kMagic, sizeof cs::kMagic);
  StoreU64(p + cs::kSequence, c.sequence);
  StoreU64(p + cs::kSalt, c.salt);
  StoreU32(p + cs::kEpoch, c.epoch);
  StoreU64(p + cs::kCommittedTokens, c.tokens);
  StoreU64(p + cs::kCommittedEnd, c.end);
  StoreU64(p + cs::kCommittedChunks, c.chunks);
  SealRecord(out);
}

Status DecodeCommitRecord(std::span<const uint8_t, kCommitSlotSize> in, CommitRecord* out) {
  const uint8_t* p = in.data();
  if (std::memcmp(p + cs::kMagicField, cs::kMagic, sizeof cs::kMagic) != 0)
    return Status::Corruption("bad commit slot magic");
  if (!RecordChecksumMatches(in)) return Status::Corruption("commit slot checksum mismatch");
  if (!AllZero(in.subspan(4, 4)) || !AllZero(in.subspan(cs::kEpoch + 4, 4)) ||
      !AllZero(in.subspan(cs::kCommittedChunks + 8, cs::kChecksum - cs::kCommittedChunks - 8)))
    return Status::Corruption("reserved commit slot bytes are not zero");
  CommitRecord c;
  c.sequence = LoadU64(p + cs::kSequence);
  c.salt = LoadU64(p + cs::kSalt);
  c.epoch = LoadU32(p + cs::kEpoch);
  c.tokens = LoadU64(p + cs::kCommittedTokens);
  c.end = LoadU64(p + cs::kCommittedEnd);
  c.chunks = LoadU64(p + cs::kCommittedChunks);
  if (c.sequence == 0) return Status::Corruption("commit sequence is zero");
  if (c.epoch == 0) return Status::Corruption("commit epoch is zero");
  if (c.end < kDataOffset || c.end % kBlockSize != 0)
    return Status::Corruption("committed end " + std::to_string(c.end) +
                              " is not a block boundary at or after 12288");
  if (c.chunks > (c.end - kDataOffset) / kBlockSize || c.chunks > c.tokens ||
      (c.chunks == 0) != (c.tokens == 0) || (c.chunks == 0) != (c.end == kDataOffset))
    return Status::Corruption("commit record counts are inconsistent");
  *out = c;
  return Status::OK();
}

void EncodeChunkHeader(const ChunkHeader& c, std::span<uint8_t, ch::kHeaderSize> out) {
  uint8_t* p = out.data();
  std::memset(p, 0, ch::kHeaderSize);
  std::memcpy(p + ch::kMagicField, ch::kMagic, sizeof ch::kMagic);
  StoreU32(p + ch::kTokenCount, c.token_count);
  StoreU64(p + ch::kSalt, c.salt);
  StoreU64(p + ch::kFirstToken, c.first_token);
  StoreU64(p + ch::kChunkOffset, c.chunk_offset);
  StoreU64(p + ch::kChunkBytes, c.chunk_bytes);
  StoreU32(p + ch::kEpoch, c.epoch);
  StoreU32(p + ch::kAppendEnd, c.append_end);
}

Status DecodeChunkHeader(std::span<const uint8_t, ch::kHeaderSize> in, bool append_ends, ChunkHeader* out) {
  const uint8_t* p = in.data();
  if (std::memcmp(p + ch::kMagicField, ch::kMagic, sizeof ch::kMagic) != 0)
    return Status::Corruption("bad chunk magic");
  size_t reserved_from = append_ends ? ch::kAppendEnd + 4 : ch::kEpoch + 4;
  if (!AllZero(in.subspan(reserved_from, ch::kHeaderSize - reserved_from)))
    return Status::Corruption("reserved chunk header bytes are not zero");
  ChunkHeader c;
  c.token_count = LoadU32(p + ch::kTokenCount);
  c.salt = LoadU64(p + ch::kSalt);
  c.first_token = LoadU64(p + ch::kFirstToken);
  c.chunk_offset = LoadU64(p + ch::kChunkOffset);
  c.chunk_bytes = LoadU64(p + ch::kChunkBytes);
  c.epoch = LoadU32(p + ch::kEpoch);
  c.append_end = append_ends ? LoadU32(p + ch::kAppendEnd) : 0;
  if (c.token_count == 0 || c.token_count > kMaxChunkTokens)
    return Status::Corruption("chunk token count " + std::to_string(c.token_count) +
                              " outside 1..65536");
  if (c.append_end > c.token_count)
    return Status::Corruption("chunk append end " + std::to_string(c.append_end) + " exceeds its " +
                              std::to_string(c.token_count) + " tokens");
  if (c.chunk_bytes == 0 || c.chunk_bytes % kBlockSize != 0 || c.chunk_bytes > kMaxChunkBytes)
    return Status::Corruption("chunk size " + std::to_string(c.chunk_bytes) +
                              " is not a multiple of 4096 up to 1 GiB");
  *out = c;
  return Status::OK();
}

}  // namespace kvfile::format
