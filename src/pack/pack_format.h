// SPDX-License-Identifier: Apache-2.0
// Wire constants and table codecs of the .kvpack format (spec/PACK.md), the
// one place that knows its byte layout; PackWriter and PackReader share it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "format/framing.h"
#include "kvfile/pack.h"
#include "kvfile/status.h"

namespace kvfile::pack {

// "\x89KVP\r\n\x1a\n": the .kv magic's idea with P for pack.
inline constexpr uint8_t kMagic[8] = {0x89, 'K', 'V', 'P', '\r', '\n', 0x1A, '\n'};
inline constexpr uint16_t kMajor = 1;
inline constexpr uint16_t kMinor = 0;
// Required flag bit 0 (pack 1.1): model entries carry layer sets (a stream
// absent from some layer, spec/PACK.md 3); set exactly when a model has one.
inline constexpr uint64_t kFlagLayerSets = 1;
inline constexpr uint16_t kMinorLayerSets = 1;
// Required flag bit 1 (pack 1.2): a model has an nvfp4 stream (dtype 6,
// spec/PACK.md 3); set exactly when one has. A pack with it is 1.2.
inline constexpr uint64_t kFlagNvfp4 = 2;
inline constexpr uint16_t kMinorNvfp4 = 2;
inline constexpr uint64_t kKnownRequiredFlags = kFlagLayerSets | kFlagNvfp4;

// ---- Header (offset 0) ----
inline constexpr size_t kHeaderBytes = 128;
namespace hdr {
inline constexpr size_t kMagicField = 0;       // u8[8]
inline constexpr size_t kMajorField = 8;       // u16
inline constexpr size_t kMinorField = 10;      // u16
inline constexpr size_t kHeaderBytesField = 12;  // u32 = 128
inline constexpr size_t kRequiredFlags = 16;   // u64
inline constexpr size_t kOptionalFlags = 24;   // u64
inline constexpr size_t kDataEnd = 32;         // u64
inline constexpr size_t kModelCount = 40;      // u64
inline constexpr size_t kChunkCount = 48;      // u64
inline constexpr size_t kMemberCount = 56;     // u64
inline constexpr size_t kNamesBytes = 64;      // u64
inline constexpr size_t kModelsChecksum = 72;  // u64
inline constexpr size_t kChunksChecksum = 80;  // u64
inline constexpr size_t kNamesChecksum = 88;   // u64
inline constexpr size_t kIndexChecksum = 96;   // u64
inline constexpr size_t kFileBytes = 104;      // u64
inline constexpr size_t kReserved = 112;       // u64, zero
inline constexpr size_t kChecksum = 120;       // u64 XXH3-64 of [0, 120)
}  // namespace hdr
// The header's frame (format/framing.h): magic, version 1, flags, the
// reserved u64 and the checksum.
inline constexpr format::FrameVersion kVersions[] = {{kMajor, kKnownRequiredFlags}};
inline constexpr format::ByteRange kHeaderReserved[] = {{hdr::kReserved, hdr::kChecksum}};
inline constexpr format::FrameSpec kFrame = {kMagic, kHeaderBytes, kVersions, true, kHeaderReserved};

// ---- Model table entry ----
inline constexpr size_t kModelEntryBytes = 1304;
// With kFlagLayerSets every entry is followed by the layer sets of its
// streams (FORMAT.md 3.2's 16 x 128 bytes).
inline constexpr size_t kLayerSetsEntryBytes = kModelEntryBytes + 2048;
inline constexpr size_t ModelEntryBytes(bool layer_sets) { return layer_sets ? kLayerSetsEntryBytes : kModelEntryBytes; }
namespace me {
inline constexpr size_t kFingerprint = 0;   // u64
inline constexpr size_t kLayers = 8;        // u32
inline constexpr size_t kStreams = 12;      // u32
inline constexpr size_t kChunkTokens = 16;  // u32
inline constexpr size_t kModelIdLength = 20;  // u32
inline constexpr size_t kModelId = 24;      // u8[256]
inline constexpr size_t kModelIdCapacity = 256;
inline constexpr size_t kDescriptors = 280;  // 16 x 64, FORMAT.md 3.1
inline constexpr size_t kDescriptorBytes = 64;
inline constexpr size_t kMaxStreams = 16;
}  // namespace me

// ---- Chunk table entry ----
inline constexpr size_t kChunkEntryBytes = 48;
namespace ce {
inline constexpr size_t kOffset = 0;       // u64
inline constexpr size_t kFirstToken = 8;   // u64
inline constexpr size_t kTokenCount = 16;  // u32
inline constexpr size_t kModel = 20;       // u32
inline constexpr size_t kChainHash = 24;   // u64
inline constexpr size_t kPayloadChecksum = 32;  // u64
inline constexpr size_t kReserved = 40;    // u64, zero
}  // namespace ce

// ---- Member index entry ----
inline constexpr size_t kIndexEntryBytes = 64;
namespace ie {
inline constexpr size_t kNameOffset = 0;     // u64
inline constexpr size_t kNameLength = 8;     // u32
inline constexpr size_t kModel = 12;         // u32
inline constexpr size_t kTokenCount = 16;    // u64
inline constexpr size_t kRecordOffset = 24;  // u64
inline constexpr size_t kRecordChecksum = 32;  // u64
inline constexpr size_t kSourceChunkTokens = 40;  // u32
inline constexpr size_t kSourceVersion = 44;  // u32: major << 16 | minor
inline constexpr size_t kReserved = 48;      // u8[16], zero
}  // namespace ie

// ---- Limits ----
inline constexpr size_t kMaxNameBytes = 4096;
inline constexpr size_t kMaxNameComponentBytes = 255;  // NAME_MAX: each component must be creatable
inline constexpr uint64_t kMaxChunkPayload = uint64_t{1} << 30;
inline constexpr uint32_t kMaxChunkTokens = 65536;
inline constexpr uint64_t kMaxEntries = uint64_t{1} << 32;  // chunk ids and member counts are < 2^32

// Payload bytes per token of a geometry (spec/PACK.md section 4).
uint64_t PayloadBytesPerToken(const Geometry& g);
// The chain hash of `tokens` (u32 little-endian) after `previous`.
uint64_t ChainHash(uint64_t previous, std::span<const uint32_t> tokens);
// spec/PACK.md section 5, the name set: "" when every member can be
// written under one directory, else what stops it, naming the members: no
// name may be a leading directory of another ("a.kv" and "a.kv/b.kv"), and
// no two may be equal. O(n log n): the names are sorted with '/' before
// every other byte, which puts each name straight before the names it is a
// directory of, and neighbours are compared.
std::string NameSetConflict(std::vector<std::string_view> names);

void EncodeModel(const PackModel& m, uint8_t* out, bool layer_sets = false);  // ModelEntryBytes(layer_sets)
// Checks every rule of spec/PACK.md section 3 that one entry can break
// (an nvfp4 stream only with kFlagNvfp4 in `required_flags`); messages name
// the entry's stream.
Status DecodeModel(const uint8_t* in, PackModel* out, uint64_t required_flags = 0);
// True when a stream of `g` is nvfp4: its pack needs kFlagNvfp4.
bool HasNvfp4(const Geometry& g);

}  // namespace kvfile::pack
