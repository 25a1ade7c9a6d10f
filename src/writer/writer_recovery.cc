// SPDX-License-Identifier: Apache-2.0
// Recovery at a writable open of an existing file (spec/RECOVERY.md,
// "Opening for append"): adopt what the scan found, cut the torn tail,
// recommit; and the cut back to the last commit after an I/O error.
#include "writer/writer_impl.h"

namespace kvfile {

using namespace kvfile::format;

// Recovery at a writable open (spec/RECOVERY.md, "Opening for append").
Status Writer::Impl::Recover(const internal::ScanResult& scan) {
  // Whatever an earlier writer left past the commit record may still sit
  // in the page cache: the next commit must sync it first.
  log.DataWritten();
  log.Reset(scan.commit);
  tokens.assign(scan.tokens.begin(), scan.tokens.end());
  disk_tokens = scan.tokens.size();
  for (const auto& c : scan.chunks) chunks.push_back({c.info.offset, c.info.bytes, c.info.first_token});
  end = scan.tail.valid_end;
  append_end = disk_append_end = disk_tokens;
  if (scan.tail.torn_tail_bytes > 0) {
    // Nothing in the tail was acknowledged: the commit record does not
    // cover it (or, cut inside committed data, it is a partial chunk that
    // cannot be read). Cut it off, durably, before anything is appended.
    recovery.truncated_bytes = scan.tail.torn_tail_bytes;
    recovery.torn_reason = scan.tail.torn_reason;
    Status st = file->Truncate(end);
    if (st.ok()) st = file->Sync();
    if (!st.ok()) return Fail(st);
  }
  if (scan.tail.committed_data_missing) {
    // Writer::Open let it through (drop_missing_committed): the record must
    // vouch for the kept prefix only, before anything is appended.
    recovery.dropped_committed_tokens = scan.tail.committed_tokens_missing;
    return CommitDurably(/*force=*/true);
  }
  recovery.recommitted_chunks = chunks.size() - scan.commit.chunks;
  recovery.slot_rewritten = !scan.slot_errors[0].empty() || !scan.slot_errors[1].empty();
  recovery.dropped_after_damage = scan.tail.valid_data_follows;
  // A last chunk cut by the commit record must be followed by chunks of a
  // newer epoch (FORMAT.md 5.3). The library's rewinds always bump the
  // epoch, but a file from elsewhere may cut without: bump it now.
  if (!scan.chunks.empty()) {
    const ChunkInfo& last = scan.chunks.back().info;
    if (last.live_tokens < last.stored_tokens && last.epoch == log.durable().epoch) {
      CommitRecord next = log.durable();
      KVFILE_RETURN_IF_ERROR(internal::CommitLog::BumpEpoch(path, next.epoch, &next.epoch));
      next.tokens = disk_tokens;
      next.end = end;
      next.chunks = chunks.size();
      return WriteCommit(next);
    }
  }
  if (recovery.recommitted_chunks > 0 || recovery.slot_rewritten) {
    // The next commit goes to the slot that is not active: the damaged one
    // if there is one.
    KVFILE_RETURN_IF_ERROR(CommitDurably(/*force=*/true));
  }
  return Status::OK();
}

// After an I/O error: cuts the file back to its last commit record (best
// effort), so that whole chunks written since, the failed append's among
// them, cannot be taken for acknowledged data. A record whose write was
// attempted may be on disk although its sync failed: nothing it covers is
// cut (RECOVERY.md, "Errors").
void Writer::Impl::CutBackAfterFailure() {
  if (!file) return;
  (void)file->WaitWrites();
  uint64_t keep = std::max(log.durable().end, log.written_end());
  if (keep < end && file->Truncate(keep).ok()) (void)file->Sync();
}

}  // namespace kvfile
