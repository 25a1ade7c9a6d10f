// SPDX-License-Identifier: Apache-2.0
// Fault injection at the system-call level of the two real file backends,
// for tests; part of the test library (kvfile_test_hooks), never of
// libkvfile. It is a SyscallFilter (src/io/syscall_filter.h) given to the
// file systems FaultablePosix() and FaultableUring() make: the POSIX
// backend asks it before each pread, pwrite, fdatasync and directory
// fsync; the io_uring backend before preparing each read, write and fsync
// SQE (the fault is then reported by that SQE's completion). Other file
// systems, FileSystem::Default() among them, never see it.
//
// A test arms a list of faults with SetIoFaults; from then on every
// operation of each kind (write, read, sync) through those file systems is
// counted, from 0, and the Nth one (or, when persistent, the Nth and every
// later one) is replaced by the fault's result:
//   - a negative errno (-EINTR, -EAGAIN, -EIO, -ENOSPC, ...): the operation
//     does not touch the file and fails with that errno;
//   - IoFault::kShort (write and read only): the operation transfers only
//     half of the requested bytes (rounded down), for real. A request of a
//     single byte cannot be short: it runs unchanged (and the fault, if
//     once, is spent).
// Every retry of an operation is an operation of its own: a once -EINTR on
// write 3 makes write 3 fail and its retry, write 4, succeed.
//
// The injector is thread-safe (a mutex guards the counters), but a test
// should arm and clear it while no other thread does I/O.
#pragma once

#include <sys/types.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "io/syscall_filter.h"
#include "kvfile/file.h"

namespace kvfile::hooks {

struct IoFault {
  using Op = internal::IoCall::Op;
  static constexpr Op kWrite = internal::IoCall::kWrite;
  static constexpr Op kRead = internal::IoCall::kRead;
  static constexpr Op kSync = internal::IoCall::kSync;
  static constexpr Op kSyncDir = internal::IoCall::kSyncDir;
  // result: half of the requested bytes (a real short transfer).
  static constexpr int kShort = INT_MIN;

  Op op = kWrite;
  int nth = 0;              // which operation of kind `op` (0 = the first)
  int result = kShort;      // a negative errno, or kShort
  bool persistent = false;  // also every later operation of kind `op`
};

// Replaces the armed faults (and restarts the counts at 0).
void SetIoFaults(std::vector<IoFault> faults);
// Disarms the injector; the file systems behave as without it.
void ClearIoFaults();

// How many operations have been replaced since the last SetIoFaults, and
// how many of kind `op` were counted (faulted or not).
uint64_t IoFaultsInjected();
uint64_t IoOpsCounted(IoFault::Op op);

// What the file systems below ask before an operation of `requested` bytes
// (0 for a sync). False: run it as usual. True: *result is what to do
// instead, a negative errno or a byte count in [1, requested) to transfer.
bool TakeIoFault(IoFault::Op op, size_t requested, ssize_t* result);

// The POSIX backend, its system calls through the armed faults (one per
// process, never destroyed).
FileSystem* FaultablePosix();
// The io_uring backend, likewise; on failure (this process cannot use
// io_uring) *out is nullptr and why is returned.
Status FaultableUring(FileSystem** out);

}  // namespace kvfile::hooks
