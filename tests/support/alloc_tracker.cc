// SPDX-License-Identifier: Apache-2.0
// The replaced global operator new and delete (see alloc_tracker.h). Every
// form of operator new allocates with malloc, so that every delete can free.
#include "support/alloc_tracker.h"

#include <atomic>
#include <cstdlib>
#include <new>

// GCC sees operator delete's free() of memory that came from "operator new".
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace {

std::atomic<bool> g_tracking{false};
std::atomic<size_t> g_largest{0};
std::atomic<size_t> g_total{0};
std::atomic<size_t> g_count{0};

void Record(size_t n) {
  if (!g_tracking.load(std::memory_order_relaxed)) return;
  g_total.fetch_add(n, std::memory_order_relaxed);
  g_count.fetch_add(1, std::memory_order_relaxed);
  size_t cur = g_largest.load(std::memory_order_relaxed);
  while (n > cur && !g_largest.compare_exchange_weak(cur, n)) {
  }
}

}  // namespace

void* operator new(size_t n) {
  Record(n);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
// The nothrow form too (std::stable_sort's temporary buffer uses it).
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  Record(n);
  return std::malloc(n ? n : 1);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace kvfile::testing {

void StartAllocTracking() {
  g_largest = 0;
  g_total = 0;
  g_count = 0;
  g_tracking = true;
}

AllocStats StopAllocTracking() {
  g_tracking = false;
  return {g_largest.load(), g_total.load(), g_count.load()};
}

}  // namespace kvfile::testing
