// SPDX-License-Identifier: Apache-2.0
// What a scan of a .kv file finds, as the Reader reports it: the chunk
// table, the state past the valid chunks, the commit record in force and
// the state of both commit slots (spec/FORMAT.md sections 4 and 5).
#pragma once

#include <cstdint>
#include <string>

namespace kvfile {

struct ChunkInfo {
  uint64_t offset = 0;       // file offset of the chunk
  uint64_t bytes = 0;        // whole chunk, padding included
  uint64_t first_token = 0;
  uint32_t stored_tokens = 0;  // tokens the chunk holds
  uint32_t live_tokens = 0;    // of those, the ones in the sequence (< stored after a rewind)
  uint32_t epoch = 0;
  bool committed = false;    // inside the region the commit record vouches for
  uint64_t head_checksum = 0;
};

// What open found beyond the valid chunks.
struct TailInfo {
  uint64_t valid_end = 0;         // end of the last valid chunk
  uint64_t file_size = 0;
  uint64_t torn_tail_bytes = 0;   // file_size - valid_end
  std::string torn_reason;        // why the first byte past valid_end was not a chunk
  // A valid, uncommitted chunk of this file and epoch starts after the
  // damage (at valid_data_offset): either a crash with writes reaching the
  // disk out of order, or damage. The reader returns the tokens before
  // valid_end either way; verify reports it.
  bool valid_data_follows = false;
  uint64_t valid_data_offset = 0;
  // The file is shorter than its commit record says: it was cut inside the
  // committed region. The reader returns the whole chunks before the cut
  // (valid_end); torn_reason names the chunk the file ends in or before.
  // Verify reports it as an error and a Writer refuses to open the file
  // (kvfile repair --force cuts it to the prefix). What the commit record
  // vouched for that is no longer readable:
  bool committed_data_missing = false;
  uint64_t committed_chunks_missing = 0;
  uint64_t committed_tokens_missing = 0;  // commit record's count minus the tokens kept (0 if more are kept: a rewound chunk)
  uint64_t committed_bytes_missing = 0;   // commit record's end minus the file size
};

// The commit record in force: the newest valid commit slot (spec/FORMAT.md 4).
struct CommitInfo {
  uint64_t sequence = 0;  // larger wins; the slot index is sequence % 2
  uint32_t epoch = 0;
  uint64_t tokens = 0;    // committed token count
  uint64_t end = 0;       // committed bytes end here (end of the last committed chunk)
  uint64_t chunks = 0;    // committed chunk count
};

// One of the two commit slots as found on disk.
struct CommitSlotState {
  bool valid = false;
  uint64_t sequence = 0;  // when valid
  std::string error;      // when not valid: why ("commit slot checksum mismatch", ...)
};

}  // namespace kvfile
