// SPDX-License-Identifier: Apache-2.0
// Wire constants and codecs of the prefix index file (spec/INDEX.md): the
// one place that knows its byte layout; the writer, the reader and the
// directory refresh share it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "format/framing.h"
#include "kvfile/prefix_index.h"
#include "kvfile/status.h"

namespace kvfile::index {

// "\x89KVI\r\n\x1a\n": the .kv magic's idea with I for index.
inline constexpr uint8_t kMagic[8] = {0x89, 'K', 'V', 'I', '\r', '\n', 0x1A, '\n'};
inline constexpr uint16_t kMajor = 1;
inline constexpr uint16_t kMinor = 0;
// Entries per block; every block but the last holds exactly this many.
inline constexpr uint32_t kRestartInterval = 16;
inline constexpr uint32_t kMaxRestartInterval = 1024;
inline constexpr uint32_t kMaxPathBytes = 4096;
inline constexpr uint32_t kMaxModelIdBytes = 255;

// ---- Header (offset 0) ----
inline constexpr size_t kHeaderBytes = 128;
namespace hdr {
inline constexpr size_t kMagicField = 0;         // u8[8]
inline constexpr size_t kMajorField = 8;         // u16
inline constexpr size_t kMinorField = 10;        // u16
inline constexpr size_t kHeaderBytesField = 12;  // u32 = 128
inline constexpr size_t kEntryCount = 16;        // u64
inline constexpr size_t kRestartInterval = 24;   // u32
inline constexpr size_t kReserved0 = 28;         // u32, zero
inline constexpr size_t kBlocksBytes = 32;       // u64: blocks lie at [128, 128 + this)
inline constexpr size_t kBlockCount = 40;        // u64
inline constexpr size_t kBlockTableChecksum = 48;  // u64
inline constexpr size_t kGroupCount = 56;        // u64
inline constexpr size_t kGroupTableChecksum = 64;  // u64
inline constexpr size_t kDirectoryDigest = 72;   // u64
inline constexpr size_t kFileBytes = 80;         // u64
inline constexpr size_t kSkipped = 88;           // u64: .kv files left out (unreadable)
inline constexpr size_t kReserved = 96;          // u64[3], zero
inline constexpr size_t kChecksum = 120;         // u64 XXH3-64 of [0, 120)
}  // namespace hdr
// The header's frame (format/framing.h): magic, version 1, no flags, the
// reserved bytes and the checksum.
inline constexpr format::FrameVersion kVersions[] = {{kMajor, 0}};
inline constexpr format::ByteRange kHeaderReserved[] = {{hdr::kReserved0, hdr::kReserved0 + 4},
                                                        {hdr::kReserved, hdr::kChecksum}};
inline constexpr format::FrameSpec kFrame = {kMagic, kHeaderBytes, kVersions, false, kHeaderReserved};

// ---- Block table entry (after the blocks) ----
inline constexpr size_t kBlockEntryBytes = 24;
namespace be {
inline constexpr size_t kOffset = 0;    // u64
inline constexpr size_t kBytes = 8;     // u32
inline constexpr size_t kEntries = 12;  // u32
inline constexpr size_t kChecksum = 16;  // u64 XXH3-64 of the block's bytes
}  // namespace be

// ---- Group table entry (after the block table) ----
inline constexpr size_t kGroupEntryBytes = 24;
namespace ge {
inline constexpr size_t kFingerprint = 0;  // u64
inline constexpr size_t kFirst = 8;        // u64: index of the group's first entry
inline constexpr size_t kCount = 16;       // u64
}  // namespace ge

// ---- Entry (inside a block), followed by its suffix tokens (u32 each),
// its path and its model id ----
inline constexpr size_t kEntryFixedBytes = 64;
namespace en {
inline constexpr size_t kShared = 0;        // u32: tokens shared with the previous entry of the block
inline constexpr size_t kSuffixCount = 4;   // u32
inline constexpr size_t kPathBytes = 8;     // u32
inline constexpr size_t kModelIdBytes = 12;  // u32
inline constexpr size_t kFingerprint = 16;  // u64
inline constexpr size_t kSize = 24;         // u64
inline constexpr size_t kMtime = 32;        // i64 ns
inline constexpr size_t kCtime = 40;        // i64 ns
inline constexpr size_t kDevice = 48;       // u64
inline constexpr size_t kInode = 56;        // u64
}  // namespace en

struct Header {
  uint64_t entry_count = 0;
  uint32_t restart_interval = kRestartInterval;
  uint64_t blocks_bytes = 0;
  uint64_t block_count = 0;
  uint64_t block_table_checksum = 0;
  uint64_t group_count = 0;
  uint64_t group_table_checksum = 0;
  uint64_t directory_digest = 0;
  uint64_t file_bytes = 0;
  uint64_t skipped = 0;
};

struct BlockRef {
  uint64_t offset = 0;
  uint32_t bytes = 0;
  uint32_t entries = 0;
  uint64_t checksum = 0;
};

struct Group {
  uint64_t fingerprint = 0;
  uint64_t first = 0;
  uint64_t count = 0;
};

void EncodeHeader(const Header& h, uint8_t* out);
// Checks the frame (format/framing.h: magic, version, checksum, size
// field, reserved bytes), then the restart interval.
Status DecodeHeader(const std::string& path, const uint8_t* in, Header* h);

void EncodeBlockRef(const BlockRef& b, uint8_t* out);
BlockRef DecodeBlockRef(const uint8_t* in);
void EncodeGroup(const Group& g, uint8_t* out);
Group DecodeGroup(const uint8_t* in);

// Appends `e` to a block, front-coded against `previous` (nullptr: the
// block's first entry).
void EncodeEntry(const PrefixEntry& e, const PrefixEntry* previous, std::vector<uint8_t>* block);
// Decodes a whole block of `count` entries, checking that it is consumed
// exactly, that the first entry shares nothing, and that entries come in
// strictly increasing index order. `where` names the block in messages.
Status DecodeBlock(const std::string& where, std::span<const uint8_t> block, uint32_t count,
                   std::vector<PrefixEntry>* entries);

// Three-way comparison in index order (fingerprint, tokens, path).
int CompareEntries(const PrefixEntry& a, const PrefixEntry& b);
// Length of the common prefix of two token sequences.
uint64_t CommonPrefix(std::span<const uint32_t> a, std::span<const uint32_t> b);

// Tokens of new entries a refresh sorts in memory before it spills them to
// a temporary run file (0: the default, 16 Mi); for tests.
void SetRunTokensForTesting(uint64_t tokens);

}  // namespace kvfile::index
