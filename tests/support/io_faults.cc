// SPDX-License-Identifier: Apache-2.0
// The tests' fault injector (io_faults.h).
#include "support/io_faults.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <utility>

#include "io/file_backends.h"

namespace kvfile::hooks {

namespace {

class Injector final : public internal::SyscallFilter {
 public:
  bool Intercept(internal::IoCall::Op op, size_t requested, ssize_t* result) override {
    if (!armed.load(std::memory_order_relaxed)) [[likely]]
      return false;
    std::lock_guard<std::mutex> lock(mu);
    if (!armed.load(std::memory_order_relaxed)) return false;
    const uint64_t index = counted[op]++;
    for (const IoFault& f : faults) {
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
        continue;  // not a fault this injector knows how to inject
      }
      ++injected;
      return true;
    }
    return false;
  }

  std::atomic<bool> armed{false};
  std::mutex mu;
  std::vector<IoFault> faults;
  uint64_t counted[4] = {0, 0, 0, 0};  // by IoFault::Op
  uint64_t injected = 0;
};

Injector& State() {
  static Injector* const state = new Injector();  // never destroyed: usable at exit
  return *state;
}

}  // namespace

void SetIoFaults(std::vector<IoFault> faults) {
  Injector& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  s.faults = std::move(faults);
  for (uint64_t& c : s.counted) c = 0;
  s.injected = 0;
  s.armed.store(true, std::memory_order_relaxed);
}

void ClearIoFaults() {
  Injector& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  s.armed.store(false, std::memory_order_relaxed);
  s.faults.clear();
}

uint64_t IoFaultsInjected() {
  Injector& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.injected;
}

uint64_t IoOpsCounted(IoFault::Op op) {
  Injector& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.counted[op];
}

bool TakeIoFault(IoFault::Op op, size_t requested, ssize_t* result) {
  return State().Intercept(op, requested, result);
}

FileSystem* FaultablePosix() {
  static FileSystem* const fs = internal::NewPosixFileSystem(&State()).release();
  return fs;
}

Status FaultableUring(FileSystem** out) {
  static FileSystem* fs = nullptr;  // never destroyed, like the POSIX one
  static const Status made = [] {
    std::unique_ptr<FileSystem> uring;
    Status st = internal::NewUringFileSystem(&uring, &State());
    fs = uring.release();
    return st;
  }();
  *out = fs;
  return made;
}

}  // namespace kvfile::hooks
