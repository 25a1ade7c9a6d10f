// SPDX-License-Identifier: Apache-2.0
// Encoding and decoding of the fixed-size records of a .kv file: the file
// header, the two commit slots and the 64-byte chunk header.
//
// Decoders check everything that can be checked without I/O (magic, checksum,
// reserved bytes, limits) and return a Status naming the failing field; they
// never trust a count or size before it is checked.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "format/framing.h"
#include "format/geometry.h"
#include "format/kv_format.h"
#include "kvfile/status.h"

namespace kvfile::format {

struct FileHeader {
  uint16_t major = kMajorV2;
  uint16_t minor = kMinorV2;
  uint64_t required_flags = 0;
  uint64_t optional_flags = 0;
  uint64_t salt = 0;
  uint32_t chunk_tokens = 0;
  ModelIdentity identity;
  Geometry geometry;
};

// Writes exactly kHeaderSize bytes. The header must already be valid
// (ValidateFileHeader); encoding an invalid one is a programming error.
void EncodeFileHeader(const FileHeader& h, std::span<uint8_t, kHeaderSize> out);
// Checks the frame (format/framing.h), then the fields, reserved bytes and
// limits.
Status DecodeFileHeader(std::span<const uint8_t, kHeaderSize> in, FileHeader* out);
Status ValidateFileHeader(const FileHeader& h);

struct CommitRecord {
  uint64_t sequence = 0;  // larger wins; slot index = sequence % 2
  uint64_t salt = 0;
  uint32_t epoch = 0;
  uint64_t tokens = 0;    // committed token count
  uint64_t end = kDataOffset;  // committed bytes end here (end of the last committed chunk)
  uint64_t chunks = 0;    // committed chunk count

  bool operator==(const CommitRecord&) const = default;
};

void EncodeCommitRecord(const CommitRecord& c, std::span<uint8_t, kCommitSlotSize> out);
Status DecodeCommitRecord(std::span<const uint8_t, kCommitSlotSize> in, CommitRecord* out);

struct ChunkHeader {
  uint32_t token_count = 0;
  uint64_t salt = 0;
  uint64_t first_token = 0;
  uint64_t chunk_offset = 0;
  uint64_t chunk_bytes = 0;
  uint32_t epoch = 0;
  // Files with kFlagAppendEnds: how many of the chunk's tokens lead up to
  // the end of the last append that ends inside it (1..token_count), or 0
  // when no append ends inside it. Always 0 in other files.
  uint32_t append_end = 0;
};

void EncodeChunkHeader(const ChunkHeader& c, std::span<uint8_t, ch::kHeaderSize> out);
// Checks magic, reserved bytes and the plain limits of each field; the
// append_end field is read only where the file header sets kFlagAppendEnds
// (`append_ends`), else it is reserved. The head checksum, which also covers
// these 64 bytes, is checked by the caller once the whole head is read (see
// ChunkLayout).
Status DecodeChunkHeader(std::span<const uint8_t, ch::kHeaderSize> in, bool append_ends, ChunkHeader* out);

// The layer sets of `g`'s streams as FORMAT.md 3.2 lays them out: 16 bitmaps
// of hdr::kLayerSetBytes (a stream in every layer gets every bit below
// g.layers, an unused descriptor none). A pack's model entry holds the same
// bytes (spec/PACK.md 3).
void EncodeLayerSets(const Geometry& g, uint8_t* out);
// Reads them back into g->streams[*].layers (g->layers and the streams must
// be set); refuses set bits past the layer count or in an unused
// descriptor, and a stream in no layer. `at` is the offset of the bitmaps
// in the containing record, for the error text.
Status DecodeLayerSets(const uint8_t* in, size_t at, Geometry* g);

}  // namespace kvfile::format
