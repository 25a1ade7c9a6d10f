// SPDX-License-Identifier: Apache-2.0
// The test programs' writer salt (testing_hooks.h).
#include "support/testing_hooks.h"

#include <atomic>

#include "writer/writer_impl.h"

namespace kvfile::hooks {

namespace {
std::atomic<uint64_t> g_writer_salt{0};
}  // namespace

void SetWriterSalt(uint64_t salt) { g_writer_salt.store(salt, std::memory_order_relaxed); }
uint64_t WriterSalt() { return g_writer_salt.load(std::memory_order_relaxed); }

Status CreateWriter(const std::string& path, const Geometry& geometry, const ModelIdentity& identity,
                    const WriterOptions& options, std::unique_ptr<Writer>* out) {
  return internal::WriterAccess::Create(path, geometry, identity, options, WriterSalt(), out);
}

}  // namespace kvfile::hooks
