// SPDX-License-Identifier: Apache-2.0
// The commit slots: choice, decoding and the writer's commit (see commit_log.h).
#include "writer/commit_log.h"

#include <cstdint>
#include <vector>

namespace kvfile::internal {

using namespace kvfile::format;

uint64_t CommitSlotOffset(uint64_t sequence) { return kCommitSlotOffset[CommitSlotIndex(sequence)]; }

bool ReadCommitSlots(std::span<const uint8_t> fixed, uint64_t salt, CommitSlots* out) {
  bool have = false;
  for (int i = 0; i < 2; ++i) {
    CommitRecord c;
    Status st = DecodeCommitRecord(
        std::span<const uint8_t, kCommitSlotSize>(fixed.data() + kCommitSlotOffset[i], kCommitSlotSize), &c);
    if (st.ok() && c.salt != salt) st = Status::Corruption("commit slot salt mismatch");
    if (st.ok() && CommitSlotIndex(c.sequence) != i)
      st = Status::Corruption("commit sequence " + std::to_string(c.sequence) + " in the wrong slot");
    out->valid[i] = st.ok();
    out->sequence[i] = st.ok() ? c.sequence : 0;
    out->reason[i] = st.ok() ? std::string() : st.message();
    if (!st.ok()) {
      out->errors[i] = "commit slot " + std::to_string(i) + " at offset " + std::to_string(kCommitSlotOffset[i]) +
                       ": " + st.message();
      continue;
    }
    out->errors[i].clear();
    if (!have || c.sequence > out->newest.sequence) {
      out->newest = c;
      out->active_slot = i;
      have = true;
    }
  }
  return have;
}

CommitRecord EncodeInitialSlots(uint64_t salt, uint32_t epoch, std::span<uint8_t> fixed) {
  CommitRecord c;
  c.salt = salt;
  c.epoch = epoch;
  for (uint64_t seq = 1; seq <= 2; ++seq) {
    c.sequence = seq;
    EncodeCommitRecord(c, std::span<uint8_t, kCommitSlotSize>(fixed.data() + CommitSlotOffset(seq), kCommitSlotSize));
  }
  return c;  // sequence 2 is the newest
}

Status CommitLog::BumpEpoch(const std::string& path, uint32_t current, uint32_t* next) {
  if (current == UINT32_MAX)
    return Status::Unsupported(path + ": the epoch counter is exhausted; rewrite the file with kvfile convert");
  *next = current + 1;
  return Status::OK();
}

Status CommitLog::Write(File& file, CommitRecord next) {
  if (data_unsynced_) {
    KVFILE_RETURN_IF_ERROR(file.Sync());
    data_unsynced_ = false;
  }
  next.sequence = durable_.sequence + 1;
  std::vector<uint8_t> slot(kCommitSlotSize);
  EncodeCommitRecord(next, std::span<uint8_t, kCommitSlotSize>(slot.data(), kCommitSlotSize));
  written_end_ = next.end;
  Status st = file.WriteAt(CommitSlotOffset(next.sequence), slot.data(), slot.size());
  if (st.ok()) st = file.Sync();
  if (!st.ok()) return st;
  durable_ = next;
  return Status::OK();
}

}  // namespace kvfile::internal
