// SPDX-License-Identifier: Apache-2.0
// Wire constants of the .kv container, shared by every reader and writer.
//
// spec/FORMAT.md is normative; this file is its machine-readable summary. Any
// change here that alters bytes on disk is a format change and needs a new
// major or minor version (see "Compatibility" in the spec).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvfile/dtype.h"

namespace kvfile::format {

// ---- File magic and versions ------------------------------------------------
// "\x89KVF\r\n\x1a\n": a high byte to catch 7-bit transfers, CR LF and LF to
// catch newline translation, ^Z to stop `type` on Windows (the PNG idea).
inline constexpr uint8_t kFileMagic[8] = {0x89, 'K', 'V', 'F', '\r', '\n', 0x1A, '\n'};
inline constexpr uint16_t kMajorV1 = 1;  // raw rows, no scales (spec/FORMAT.md, "v1")
inline constexpr uint16_t kMajorV2 = 2;  // fp8 codes + per-row f32 scales
inline constexpr uint16_t kMinorV2 = 1;  // the minor version this library writes
inline constexpr uint16_t kMinorNvfp4 = 2;  // ... for a file with an nvfp4 stream (2.2)
inline constexpr uint16_t kMinorLayerSets = 3;  // ... for a file with a stream absent from some layer (2.3)

// ---- Header flags -----------------------------------------------------------------
// Required flag bit 0 (version 2.1): chunk headers carry append_end
// (ch::kAppendEnd), and the data past the commit record ends at the last
// append end (spec/FORMAT.md 5.4). Required, not optional: a 2.0 reader
// would take the field for nonzero reserved bytes and call the file damaged.
inline constexpr uint64_t kFlagAppendEnds = uint64_t{1} << 0;
// Required flag bit 1 (version 2.2): at least one stream is nvfp4 (dtype 6);
// set exactly when one is, so that a 2.0 or 2.1 reader refuses the file as
// unsupported rather than as damaged.
inline constexpr uint64_t kFlagNvfp4 = uint64_t{1} << 1;
// Required flag bit 2 (version 2.3): a stream is absent from some layer;
// the header's layer sets (hdr::kLayerSets) say where each stream is, and
// chunks hold sections only for (layer, stream) pairs present. Set exactly
// when a stream has a layer list, so a 2.2 reader refuses the file as
// unsupported rather than reading its chunks with the wrong layout.
inline constexpr uint64_t kFlagLayerSets = uint64_t{1} << 2;
inline constexpr uint64_t kKnownRequiredFlags = kFlagAppendEnds | kFlagNvfp4 | kFlagLayerSets;

// ---- Fixed regions ------------------------------------------------------------
inline constexpr uint64_t kBlockSize = 4096;        // header size and chunk alignment
inline constexpr uint64_t kHeaderOffset = 0;
inline constexpr uint64_t kHeaderSize = 4096;
inline constexpr uint64_t kCommitSlotOffset[2] = {4096, 8192};
inline constexpr uint64_t kCommitSlotSize = 4096;
inline constexpr uint64_t kDataOffset = 12288;      // the first chunk starts here
inline constexpr uint64_t kSectionAlign = 64;       // alignment of sections inside a chunk

// ---- File header (offset 0, 4096 bytes) ---------------------------------------
namespace hdr {
inline constexpr size_t kMagic = 0;              // u8[8]
inline constexpr size_t kMajor = 8;              // u16
inline constexpr size_t kMinor = 10;             // u16
inline constexpr size_t kHeaderBytes = 12;       // u32, = 4096
inline constexpr size_t kRequiredFlags = 16;     // u64, unknown bit => refuse
inline constexpr size_t kOptionalFlags = 24;     // u64, unknown bits ignored
inline constexpr size_t kSalt = 32;              // u64, random per file, nonzero
inline constexpr size_t kFingerprint = 40;       // u64, supplied by the writer
inline constexpr size_t kLayerCount = 48;        // u32
inline constexpr size_t kStreamCount = 52;       // u32
inline constexpr size_t kChunkTokens = 56;       // u32, the writer's nominal tokens per chunk
inline constexpr size_t kDataOffsetField = 60;   // u32, = 12288
inline constexpr size_t kModelIdLength = 64;     // u32, bytes used in model_id
inline constexpr size_t kModelId = 128;          // u8[256], UTF-8, zero padded
inline constexpr size_t kModelIdCapacity = 256;
inline constexpr size_t kStreams = 384;          // StreamDescriptor[16]
inline constexpr size_t kStreamDescriptorSize = 64;
inline constexpr size_t kMaxStreams = 16;
// With kFlagLayerSets: u8[128] per stream descriptor, bit l (byte l / 8,
// bit l % 8) set when the stream is present in layer l; reserved otherwise.
inline constexpr size_t kLayerSets = 1408;
inline constexpr size_t kLayerSetBytes = 128;
inline constexpr size_t kLayerSetsEnd = kLayerSets + kMaxStreams * kLayerSetBytes;  // 3456
inline constexpr size_t kChecksum = 4088;        // u64 XXH3-64 of bytes [0, 4088)
}  // namespace hdr

// Stream descriptor: one 64-byte entry of the header's stream table.
namespace sd {
inline constexpr size_t kName = 0;               // u8[32], NUL padded
inline constexpr size_t kNameCapacity = 32;      // at most 31 name bytes + NUL
inline constexpr size_t kDtype = 32;             // u8, a Dtype value
inline constexpr size_t kRowsPerToken = 36;      // u32
inline constexpr size_t kRowWidth = 40;          // u32
}  // namespace sd

// Storage dtypes: the public kvfile::Dtype (kvfile/dtype.h); its values
// are the bytes written to disk.
using kvfile::Dtype;
using kvfile::DtypeName;
using kvfile::ElementSize;
using kvfile::CodeBytes;
using kvfile::IsFp8;
using kvfile::IsNvfp4;
using kvfile::IsQuantized;
using kvfile::IsValidDtype;
using kvfile::DtypeInfo;
using kvfile::DtypePart;
using kvfile::FindDtype;
using kvfile::PartBytes;
using kvfile::ParseDtype;
using kvfile::Quantization;

// ---- Commit slot (offsets 4096 and 8192, 4096 bytes each) -----------------------
namespace cs {
inline constexpr uint8_t kMagic[4] = {'K', 'V', 'C', 'M'};
inline constexpr size_t kMagicField = 0;         // u8[4]
inline constexpr size_t kSequence = 8;           // u64, newest valid slot wins
inline constexpr size_t kSalt = 16;              // u64, = header salt
inline constexpr size_t kEpoch = 24;             // u32
inline constexpr size_t kCommittedTokens = 32;   // u64
inline constexpr size_t kCommittedEnd = 40;      // u64, byte offset, multiple of 4096
inline constexpr size_t kCommittedChunks = 48;   // u64
inline constexpr size_t kChecksum = 4088;        // u64 XXH3-64 of bytes [0, 4088)
}  // namespace cs

// ---- Chunk header (first 64 bytes of every chunk) ------------------------------------
namespace ch {
inline constexpr uint8_t kMagic[4] = {'K', 'V', 'C', 'K'};
inline constexpr size_t kMagicField = 0;         // u8[4]
inline constexpr size_t kTokenCount = 4;         // u32, >= 1
inline constexpr size_t kSalt = 8;               // u64, = header salt
inline constexpr size_t kFirstToken = 16;        // u64
inline constexpr size_t kChunkOffset = 24;       // u64, this chunk's own file offset
inline constexpr size_t kChunkBytes = 32;        // u64, whole chunk, multiple of 4096
inline constexpr size_t kEpoch = 40;             // u32
inline constexpr size_t kAppendEnd = 44;         // u32, 0..token_count (kFlagAppendEnds files; else reserved)
inline constexpr size_t kHeaderSize = 64;
// After the header: section_checksums u64[sections] (one per (layer, stream)
// pair present, layers * streams without layer sets), token_ids u32[token_count],
// head_checksum u64, zero padding to a multiple of 64 (the "head"); then the sections.
}  // namespace ch

// ---- Limits ---------------------------------------------------------------------------
inline constexpr uint32_t kMaxLayers = 1024;
inline constexpr uint32_t kMaxRowsPerToken = 1024;
inline constexpr uint32_t kMaxRowWidth = 65536;
inline constexpr uint32_t kMaxChunkTokens = 65536;
inline constexpr uint64_t kMaxChunkBytes = uint64_t{1} << 30;  // 1 GiB
inline constexpr uint64_t kMaxTokenId = 0xFFFFFFFFu;          // token ids are u32

}  // namespace kvfile::format
