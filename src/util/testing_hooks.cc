// SPDX-License-Identifier: Apache-2.0
// The process-wide state of the test hooks (testing_hooks.h).
#include "util/testing_hooks.h"

#include <atomic>

namespace kvfile::hooks {

namespace {
std::atomic<uint64_t> g_writer_salt{0};
}  // namespace

void SetWriterSalt(uint64_t salt) { g_writer_salt.store(salt, std::memory_order_relaxed); }
uint64_t WriterSalt() { return g_writer_salt.load(std::memory_order_relaxed); }

}  // namespace kvfile::hooks
