// SPDX-License-Identifier: Apache-2.0
// Scanning a .kv file: header, commit slots and the chain of chunk heads.
//
// Both the Reader and a writable open start here. The scan trusts nothing:
// every chunk must carry the file's salt, its own offset, a head checksum
// that matches, and continue the token sequence of the chunk before it
// (spec/FORMAT.md, "Chunk chain"). Damage inside the committed region is an
// error; past it, the first chunk that does not check out ends the valid
// data. Whether a valid chunk of the same file and epoch follows it is
// recorded in TailInfo (torn tail, or damage before the end).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kvfile/file.h"
#include "format/chunk_layout.h"
#include "format/header.h"
#include "kvfile/file_state.h"
#include "io/page_buffer.h"

namespace kvfile::internal {

struct ScannedChunk {
  ChunkInfo info;
  uint32_t append_end = 0;  // the chunk header's field (FORMAT.md 5.1), 0 in 2.0 files
};

struct ScanResult {
  format::FileHeader header;
  format::CommitRecord commit;       // the newest valid commit slot
  int active_slot = 0;
  std::array<std::string, 2> slot_errors;  // empty when the slot is valid
  std::array<CommitSlotState, 2> slots;    // each slot as found (the error without the slot's offset)
  PageVector<ScannedChunk> chunks;
  PageVector<uint32_t> tokens;       // live tokens, in order
  // Every chunk's section checksums (Geometry::SectionCount() of them), chunk after
  // chunk: one table, not one allocation per chunk (open stays cheap).
  PageVector<uint64_t> section_checksums;
  size_t sections = 0;               // Geometry::SectionCount()
  TailInfo tail;

  const uint64_t* SectionChecksums(size_t chunk) const { return section_checksums.data() + chunk * sections; }
};

// Caches one ChunkLayout per distinct token count.
class LayoutCache {
 public:
  explicit LayoutCache(const format::Geometry* g) : geometry_(g) {}
  Status Get(uint32_t token_count, const format::ChunkLayout** out);

 private:
  // A layout is a few dozen bytes per section; the cache stays small.
  static constexpr size_t kMaxCachedLayouts = 8;
  const format::Geometry* geometry_;
  std::map<uint32_t, format::ChunkLayout> layouts_;
};

// Where a failed scan found the damage (for verify's report).
struct DamageLocation {
  int64_t chunk = -1;   // chunk index, or -1 outside chunks
  int64_t offset = -1;  // file offset, or -1 if unknown
};

// Reads and checks everything but the committed chunks' payloads. Chunks
// past the committed region are accepted only after every byte of them has
// been checked. On failure, *where (if given) says where the damage is.
Status ScanFile(File& file, ScanResult* out, DamageLocation* where = nullptr);

// Checks what checksums cannot, in the rows of tokens [first, first +
// count) of one section held in memory (`section` points at its first
// byte; the chunk's first token is for messages): no non-finite code and
// every scale valid in an fp8 section, every block and row scale valid in an
// nvfp4 one, no non-finite value in a raw one.
Status CheckSectionValues(const format::StreamSpec& spec, const format::SectionLayout& sec,
                          const uint8_t* section, uint64_t chunk_first_token, uint32_t first, uint32_t count);

// Checks that the padding of a section (after its rows and, for fp8 and
// nvfp4, after its scale arrays; the last section's up to the chunk's end) is zero, as written.
// The checksum covers these bytes too, but a reader checks the zeros itself
// so that no byte of the format is accepted on the checksum's word alone.
// `section` points at the section's first byte; `chunk_offset` is the
// chunk's file offset, for the message.
Status CheckSectionPadding(const format::SectionLayout& sec, const uint8_t* section, uint64_t chunk_offset);

// Reads and checks every byte of chunk `c`: its head checksum, and each
// section's checksum (against `section_checksums`, the chunk's entries of
// ScanResult::section_checksums), zero padding and values. `buf` is
// scratch (one section at a time).
Status ReadAndCheckChunk(File& file, const format::Geometry& g, LayoutCache& layouts,
                         const ScannedChunk& c, const uint64_t* section_checksums, PageBuffer* buf);

// ScanFile, taken again (twice more at most) when it fails on damage or
// finds the file cut while the commit slots changed under it: a rewind or
// repair by another process in the middle of a scan makes the chunks
// disagree with the record it read, and the next scan reads the new state.
Status ScanSettledFile(File& file, ScanResult* out, DamageLocation* where = nullptr);

// A read of bytes up to `read_end` of a file scanned as `scan` failed with
// a data error (`error`): tells damage from a file changed under the
// reader. When the commit slots now hold a record of another epoch (a
// rewind, spec/RECOVERY.md section 5) or the file ends before `read_end`
// (a repair or a tool cut it), the bytes read were not the ones the scan
// vouched for: the result is Status::Busy("PATH: changed while being read
// (rewound or repaired by another process); read it again"). Otherwise,
// or when the slots cannot be read, `error` itself.
Status ExplainReadFailure(File& file, const ScanResult& scan, uint64_t read_end, const std::string& path,
                          Status error);

// "chunk 3 at offset 12288"
std::string ChunkWhere(size_t index, uint64_t offset);

}  // namespace kvfile::internal
