// SPDX-License-Identifier: Apache-2.0
// The backends' fault hook (see io_fault_hook.h).
#include "io/io_fault_hook.h"

#include <mutex>
#include <utility>

namespace kvfile::internal {

std::atomic<bool> g_io_faults_armed{false};

namespace {

struct Armed {
  std::mutex mu;
  std::vector<IoFault> faults;
  uint64_t counted[4] = {0, 0, 0, 0};  // by IoFault::Op
  uint64_t injected = 0;
};

Armed& State() {
  static Armed* const state = new Armed();  // never destroyed: usable at exit
  return *state;
}

}  // namespace

void SetIoFaults(std::vector<IoFault> faults) {
  Armed& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  s.faults = std::move(faults);
  for (uint64_t& c : s.counted) c = 0;
  s.injected = 0;
  g_io_faults_armed.store(true, std::memory_order_relaxed);
}

void ClearIoFaults() {
  Armed& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  g_io_faults_armed.store(false, std::memory_order_relaxed);
  s.faults.clear();
}

uint64_t IoFaultsInjected() {
  Armed& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.injected;
}

uint64_t IoOpsCounted(IoFault::Op op) {
  Armed& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.counted[op];
}

bool TakeIoFaultSlow(IoFault::Op op, size_t requested, ssize_t* result) {
  Armed& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!g_io_faults_armed.load(std::memory_order_relaxed)) return false;
  const uint64_t index = s.counted[op]++;
  for (const IoFault& f : s.faults) {
    if (f.op != op || f.nth < 0) continue;
    const auto nth = static_cast<uint64_t>(f.nth);
    if (f.persistent ? index < nth : index != nth) continue;
    if (f.result == IoFault::kShort) {
      // Only a transfer of two bytes or more can come back short.
      if (op == IoFault::kSync || op == IoFault::kSyncDir || requested < 2) return false;
      *result = static_cast<ssize_t>(requested / 2);
    } else if (f.result < 0) {
      *result = f.result;
    } else {
      continue;  // not a fault this hook knows how to inject
    }
    ++s.injected;
    return true;
  }
  return false;
}

}  // namespace kvfile::internal
