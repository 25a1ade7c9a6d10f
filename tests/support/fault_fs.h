// SPDX-License-Identifier: Apache-2.0
// FaultFs: an in-memory FileSystem for tests that records every operation
// the library performs, injects errors on chosen operations, and builds the
// on-disk states a crash (power cut) could leave after any operation prefix.
//
// The library runs its real code paths against it; only the bottom of the
// file interface is simulated.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kvfile/file.h"

namespace kvfile::testing {

struct FsOp {
  enum Kind { kCreate, kWrite, kSync, kTruncate, kRename, kRemove, kSyncDir };
  Kind kind;
  std::string path;   // kRename: from
  std::string path2;  // kRename: to
  uint64_t offset = 0;
  std::vector<uint8_t> data;  // kWrite
  uint64_t size = 0;          // kTruncate
  uint64_t inode = 0;         // kCreate, kWrite, kSync, kTruncate: which file
};

// Names to file contents: what a FaultFs holds, or what a crash leaves.
using DiskImage = std::map<std::string, std::vector<uint8_t>>;

class FaultFs : public FileSystem {
 public:
  FaultFs() = default;
  explicit FaultFs(const DiskImage& image);

  Status Open(const std::string& path, OpenMode mode, std::unique_ptr<File>* out) override;
  Status Rename(const std::string& from, const std::string& to, bool replace) override;
  Status Remove(const std::string& path) override;
  Status SyncDir(const std::string& dir) override;
  Status Exists(const std::string& path, bool* exists) override;
  Status PathId(const std::string& path, FileId* id) override;

  // The operations so far, in order (reads are not recorded).
  const std::vector<FsOp>& log() const { return log_; }
  DiskImage Image() const;

  // Fault injection: the `nth` (0-based) operation of `kind` from now on
  // fails with errno `err`; with `persistent`, every later one fails too.
  void FailOn(FsOp::Kind kind, int nth, int err, bool persistent);
  void ClearFaults() { faults_.clear(); }

  struct Node {
    uint64_t id = 0;
    std::vector<uint8_t> data;
    const void* lock_owner = nullptr;
  };

 private:
  friend class FaultFile;
  Status MaybeFail(FsOp::Kind kind, const std::string& what);
  void Record(FsOp op) { log_.push_back(std::move(op)); }

  std::map<std::string, std::shared_ptr<Node>> names_;
  uint64_t next_inode_ = 1;
  std::vector<FsOp> log_;
  struct Fault {
    FsOp::Kind kind;
    int remaining;  // operations of that kind to let through first
    int err;
    bool persistent;
    bool spent;
  };
  std::vector<Fault> faults_;
};

// One crash state: a disk image and how it was made.
struct CrashState {
  DiskImage image;
  std::string description;
};

// Calls `visit` for every crash state after the first `prefix` operations
// of `log` (a log that began on an empty FaultFs): unsynced writes of each file kept, dropped, zeroed, or filled
// with garbage (all together, and each one alone); the last unsynced write
// torn at every 512-byte boundary with the rest zeros, garbage or old
// bytes; directory changes since the last directory sync kept or lost.
// Returns the number of states visited.
size_t EnumerateCrashStates(const std::vector<FsOp>& log, size_t prefix,
                            const std::function<void(const CrashState&)>& visit);

}  // namespace kvfile::testing
