// SPDX-License-Identifier: Apache-2.0
// Measuring the allocations of a piece of code in a test.
//
// alloc_tracker.cc replaces the global operator new and delete of the test
// binary it is linked into, so link it only into tests that measure memory
// (target kvfile_alloc_tracker).
#pragma once

#include <cstddef>

namespace kvfile::testing {

struct AllocStats {
  size_t largest = 0;  // the largest single allocation
  size_t total = 0;    // bytes allocated, summed (an upper bound of the peak)
  size_t count = 0;    // number of allocations
};

// Counts the allocations of every thread between Start and Stop.
void StartAllocTracking();
AllocStats StopAllocTracking();

}  // namespace kvfile::testing
