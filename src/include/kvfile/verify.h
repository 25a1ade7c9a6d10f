// SPDX-License-Identifier: Apache-2.0
// Verification of a whole .kv file, for `kvfile verify` and `repair`.
//
// Read-only: it never modifies the file. Every finding is reported with the
// chunk and byte offset it concerns; a torn tail (what a crash leaves) is a
// warning, everything else that is wrong is an error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvfile/export.h"
#include "kvfile/file.h"
#include "kvfile/status.h"

namespace kvfile {

struct VerifyOptions {
  FileSystem* fs = nullptr;  // nullptr: FileSystem::Default()
  bool quick = false;        // headers and structure only, no payload reads
  // Workers that read and check chunks (1: the calling thread alone; each
  // further worker opens the file once more). Findings are the same and in
  // the same order whatever the count.
  unsigned threads = 1;
};

// What a finding is about, for a caller that acts on it (Repair does:
// kvfile/repair.h). Values are stable and only ever added to (the C API's
// kvfile_finding_kind mirrors them); a caller must accept a kind it does
// not know.
enum class VerifyFindingKind : uint8_t {
  // The file cannot be opened at all: its header, commit record or chunk
  // structure is damaged (the only finding then; `opened` is false).
  kUnreadable = 0,
  // One of the two commit slots is damaged; the other is in use. `offset`
  // is the slot's; `kvfile repair` rewrites it.
  kCommitSlot = 1,
  // A committed chunk fails its checks (`chunk`, `offset`: the chunk).
  kDamagedChunk = 2,
  // A torn tail: bytes after the last valid chunk that are not a whole
  // chunk (what a crash leaves; a warning). `offset` is where they begin.
  kTornTail = 3,
  // Like a torn tail, but a valid chunk follows the damage (an error:
  // damage before the end, or writes of a crash in sync mode none that
  // reached the disk out of order). `offset` is where the damage begins.
  kDamageBeforeEnd = 4,
  // The file ends inside its committed data (shorter than its commit
  // record says): acknowledged tokens are gone. `offset` is the file's end.
  kCommittedDataMissing = 5,
};

// "unreadable", "commit slot", "damaged chunk", "torn tail", "damage before
// the end", "committed data missing"; "unknown" for a value not listed.
KVFILE_EXPORT const char* VerifyFindingKindName(VerifyFindingKind kind);

struct VerifyFinding {
  bool error = true;    // false: a warning (a torn tail)
  int64_t chunk = -1;   // chunk index, or -1
  int64_t offset = -1;  // file offset, or -1
  std::string message;
  VerifyFindingKind kind = VerifyFindingKind::kUnreadable;
};

struct KVFILE_EXPORT VerifyReport {
  bool opened = false;  // the header was readable
  uint16_t major = 0, minor = 0;
  uint64_t tokens = 0, chunks = 0, bytes = 0;
  uint64_t torn_tail_bytes = 0;
  uint64_t valid_end = 0;
  // The file is shorter than its commit record (an error finding says
  // where): acknowledged data is gone; only repair --force cuts the file.
  bool committed_data_missing = false;
  std::vector<VerifyFinding> findings;

  bool HasErrors() const;
  bool HasWarnings() const;
};

// Fills *report. Returns non-OK only when the file cannot be examined at all
// for a reason that is not its content (missing, permission, I/O error);
// damage is reported in the findings.
KVFILE_EXPORT Status VerifyFile(const std::string& path, const VerifyOptions& options, VerifyReport* report);

}  // namespace kvfile
