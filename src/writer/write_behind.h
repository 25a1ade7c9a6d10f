// SPDX-License-Identifier: Apache-2.0
// WriteBehind: asks the kernel to start writing a file's finished ranges to
// its device while the writer goes on (sync_file_range with
// SYNC_FILE_RANGE_WRITE), so that the disk works while the CPU prepares the
// next chunk and the sync at the end finds little left to do. A hint, not a
// guarantee: what is durable is still what the writer's syncs made durable.
//
// It opens the file's path once, read-only, and acts only if that is the
// very file the writer has open (same device and inode), so a file system
// that is not the kernel's (an in-memory one, a test's) gets no hint. Any
// failure only ends the hints.
#pragma once

#include <cstdint>
#include <string>

#include "kvfile/file.h"

namespace kvfile::internal {

class WriteBehind {
 public:
  WriteBehind() = default;
  WriteBehind(const WriteBehind&) = delete;
  WriteBehind& operator=(const WriteBehind&) = delete;
  ~WriteBehind();

  // Starts writeback of [offset, offset + n) of `file`, which `path` names
  // now (a writer's file may have been created under another name), whose
  // bytes there are all written (none still queued).
  void Start(File& file, const std::string& path, uint64_t offset, uint64_t n);
  // Closes the second descriptor (the writer closes its file); hints stop.
  void Release();

 private:
  int fd_ = -1;
  bool tried_ = false;
};

}  // namespace kvfile::internal
