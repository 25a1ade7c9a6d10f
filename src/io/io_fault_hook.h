// SPDX-License-Identifier: Apache-2.0
// Fault injection at the system-call level of the two real file backends,
// for tests: the POSIX backend asks the hook before each pread, pwrite and
// fdatasync; the io_uring backend before preparing each read, write and
// fsync SQE (the fault is then reported by that SQE's completion).
//
// A test arms a list of faults with SetIoFaults; from then on every
// operation of each kind (write, read, sync) is counted, process-wide and
// from 0, and the Nth one (or, when persistent, the Nth and every later one)
// is replaced by the fault's result:
//   - a negative errno (-EINTR, -EAGAIN, -EIO, -ENOSPC, ...): the operation
//     does not touch the file and fails with that errno;
//   - IoFault::kShort (write and read only): the operation transfers only
//     half of the requested bytes (rounded down), for real. A request of a
//     single byte cannot be short: it runs unchanged (and the fault, if
//     once, is spent).
// Every retry of an operation is an operation of its own: a once -EINTR on
// write 3 makes write 3 fail and its retry, write 4, succeed.
//
// When nothing is armed a backend pays one relaxed atomic load per
// operation. The hook is thread-safe (a mutex guards the counters), but a
// test should arm and clear it while no other thread does I/O.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvfile::internal {

struct IoFault {
  enum Op { kWrite, kRead, kSync, kSyncDir };  // kSyncDir: the fsync of a directory (POSIX backend)
  // result: half of the requested bytes (a real short transfer).
  static constexpr int kShort = INT_MIN;

  Op op = kWrite;
  int nth = 0;              // which operation of kind `op` (0 = the first)
  int result = kShort;      // a negative errno, or kShort
  bool persistent = false;  // also every later operation of kind `op`
};

// Replaces the armed faults (and restarts the counts at 0).
void SetIoFaults(std::vector<IoFault> faults);
// Disarms the hook; the backends behave as without it.
void ClearIoFaults();

// How many operations have been replaced since the last SetIoFaults, and
// how many of kind `op` were counted (faulted or not).
uint64_t IoFaultsInjected();
uint64_t IoOpsCounted(IoFault::Op op);

extern std::atomic<bool> g_io_faults_armed;
bool TakeIoFaultSlow(IoFault::Op op, size_t requested, ssize_t* result);

// Called by a backend just before an operation of `requested` bytes (0 for
// a sync). False: run it as usual. True: *result is what to do instead, a
// negative errno or a byte count in [1, requested) to transfer.
inline bool TakeIoFault(IoFault::Op op, size_t requested, ssize_t* result) {
  if (!g_io_faults_armed.load(std::memory_order_relaxed)) [[likely]]
    return false;
  return TakeIoFaultSlow(op, requested, result);
}

}  // namespace kvfile::internal
