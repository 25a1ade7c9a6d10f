// SPDX-License-Identifier: Apache-2.0
// The commit log: the two commit slots (spec/FORMAT.md, "Commit slots") and
// the one rule for them: a record with sequence number s lives in slot
// s % 2, so each new record overwrites the older one and the newest valid
// record wins. Readers (ReadCommitSlots) and the writer (CommitLog) both go
// through here.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "kvfile/file.h"
#include "format/header.h"

namespace kvfile::internal {

// The slot (0 or 1) that holds the record with this sequence number.
inline int CommitSlotIndex(uint64_t sequence) { return static_cast<int>(sequence % 2); }
// Its offset in the file.
uint64_t CommitSlotOffset(uint64_t sequence);

struct CommitSlots {
  format::CommitRecord newest;             // the newest valid record
  int active_slot = 0;                     // the slot holding it
  std::array<std::string, 2> errors;       // why a slot is not valid; empty when it is
  std::array<bool, 2> valid = {false, false};
  std::array<uint64_t, 2> sequence = {0, 0};  // of a valid slot, else 0
  std::array<std::string, 2> reason;        // the decode error alone; empty when valid
};

// Decodes both slots of a file's first kDataOffset bytes (`fixed`) and
// picks the newest valid record: a valid record carries the header's salt
// and sits in its sequence's slot. False when neither slot is valid.
bool ReadCommitSlots(std::span<const uint8_t> fixed, uint64_t salt, CommitSlots* out);

// Fills both slots of a new file's fixed region with the empty state at
// `epoch` (sequences 1 and 2) and returns the newest of them.
format::CommitRecord EncodeInitialSlots(uint64_t salt, uint32_t epoch, std::span<uint8_t> fixed);

// The writer's side: the last durable record, and the order of writes that
// makes a commit crash safe (data synced, then the record into the older
// slot, synced).
class CommitLog {
 public:
  // The durable record found by a scan, or written by a create.
  void Reset(const format::CommitRecord& durable) { durable_ = durable; }
  const format::CommitRecord& durable() const { return durable_; }
  // The end of the last record written to a slot, durable or not: after a
  // failed sync the file may hold it.
  uint64_t written_end() const { return written_end_; }

  // Chunk bytes were written (or may sit unsynced in the page cache): the
  // next commit syncs the data first.
  void DataWritten() { data_unsynced_ = true; }
  // A sync of the file covered every write so far.
  void DataSynced() { data_unsynced_ = false; }

  // The one epoch rule (spec/FORMAT.md 5.3): a rewind, a recovery that
  // finds a cut last chunk of the current epoch, and an upgrade (its new
  // file) each go on at the epoch after the current one, *next. There is
  // none after UINT32_MAX: kUnsupported, naming `path` (the file must be
  // rewritten whole, which starts again at epoch 1).
  static Status BumpEpoch(const std::string& path, uint32_t current, uint32_t* next);

  // Syncs unsynced data, then writes `next` with the next sequence number
  // into its slot and syncs again. On success `next` is the durable record.
  Status Write(File& file, format::CommitRecord next);

 private:
  format::CommitRecord durable_;
  uint64_t written_end_ = 0;
  bool data_unsynced_ = false;
};

}  // namespace kvfile::internal
