// SPDX-License-Identifier: Apache-2.0
// The seam the two real file backends leave for fault injection. A file
// system made with a SyscallFilter (NewPosixFileSystem, NewUringFileSystem
// in file_backends.h) asks it before each system call of its kinds: the
// POSIX backend before each pread, pwrite, fdatasync and directory fsync;
// the io_uring backend before preparing each read, write and fsync SQE
// (its answer then shows in that SQE's completion). A file system made
// without one, FileSystem::Default() and the backends' instances among
// them, asks nothing: the check is one null pointer test per call.
//
// The filter belongs to the file system it was given to, not to the
// process: nothing here is global or mutable from outside. The library has
// no filter of its own; the tests' fault injector (tests/support/io_faults.h)
// is one.
#pragma once

#include <sys/types.h>

#include <cstddef>

namespace kvfile::internal {

struct IoCall {
  enum Op { kWrite, kRead, kSync, kSyncDir };  // kSyncDir: the fsync of a directory (POSIX backend)
};

class SyscallFilter {
 public:
  virtual ~SyscallFilter() = default;
  // Called just before an operation of `requested` bytes (0 for a sync),
  // from any thread that does I/O through the file system. False: run it
  // as usual. True: *result is what to do instead, a negative errno or a
  // byte count in [1, requested) to transfer.
  virtual bool Intercept(IoCall::Op op, size_t requested, ssize_t* result) = 0;
};

}  // namespace kvfile::internal
