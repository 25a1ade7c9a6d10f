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

struct VerifyFinding {
  bool error = true;    // false: a warning (a torn tail)
  int64_t chunk = -1;   // chunk index, or -1
  int64_t offset = -1;  // file offset, or -1
  std::string message;
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
