// SPDX-License-Identifier: Apache-2.0
// Rewind: keep the first n tokens of the sequence, durably (see RewindTo).
#include "writer/writer_impl.h"

namespace kvfile {

using namespace kvfile::format;

// Rewind (spec/RECOVERY.md, "Rewind"): the new commit record, with a new
// epoch, is the single write that switches from the old sequence to the
// rewound one; the truncation after it only reclaims space.
Status Writer::Impl::RewindTo(uint64_t n) {
  if (n > tokens.size())
    return Status::InvalidArgument(path + ": cannot rewind to " + std::to_string(n) +
                                   " tokens; the file has " + std::to_string(tokens.size()));
  // A rewind ends any open append: its n tokens are what the file holds.
  append_open = false;
  append_end = n;
  if (n >= disk_tokens) {
    // Only staged tokens go: nothing on disk changes. Rewound to the end
    // of the chunks on disk, those hold finished appends only now, which
    // no later chunk head could say.
    builder.KeepStaged(static_cast<uint32_t>(n - disk_tokens));
    tokens.resize(n);
    if (n == disk_tokens) disk_append_end = n;
    return Status::OK();
  }
  KVFILE_RETURN_IF_ERROR(WaitInFlight());
  // Keep the chunks holding tokens [0, n); the last kept one may be cut.
  size_t keep = 0;
  while (keep < chunks.size() && chunks[keep].first_token < n) ++keep;
  uint64_t new_end = keep == 0 ? kDataOffset : chunks[keep - 1].offset + chunks[keep - 1].bytes;
  // The kept chunks may not be durable yet (sync mode none): WriteCommit
  // syncs them before the record that vouches for them.
  CommitRecord next = log.durable();
  KVFILE_RETURN_IF_ERROR(internal::CommitLog::BumpEpoch(path, next.epoch, &next.epoch));
  next.tokens = n;
  next.end = new_end;
  next.chunks = keep;
  KVFILE_RETURN_IF_ERROR(WriteCommit(next));
  chunks.resize(keep);
  tokens.resize(n);
  disk_tokens = disk_append_end = n;
  end = new_end;
  builder.KeepStaged(0);
  Status st = file->Truncate(new_end);
  if (st.ok()) st = file->Sync();
  if (!st.ok()) return Fail(st);
  return Status::OK();
}

}  // namespace kvfile
