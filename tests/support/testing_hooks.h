// SPDX-License-Identifier: Apache-2.0
// What the library's own tests reach behind the public API, from the test
// library (kvfile_test_hooks; never in libkvfile): a fixed salt for the
// files they create (golden bytes), one chunk's full check, and the I/O
// fault injector (io_faults.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kvfile/reader.h"
#include "kvfile/status.h"
#include "kvfile/writer.h"

namespace kvfile::hooks {

// The salt CreateWriter gives the next files it makes, in this test
// program: 0 (the default) draws a random one per file as the format
// requires, as Writer::Create always does.
void SetWriterSalt(uint64_t salt);
uint64_t WriterSalt();

// Writer::Create with WriterSalt() (internal::WriterAccess::Create).
Status CreateWriter(const std::string& path, const Geometry& geometry, const ModelIdentity& identity,
                    const WriterOptions& options, std::unique_ptr<Writer>* out);

struct ReaderAccess {
  // Reads and checks every byte of chunk `index` (all sections, codes and
  // scales), as verify does.
  static Status VerifyChunk(Reader& r, size_t index) { return r.VerifyChunk(index); }
};

}  // namespace kvfile::hooks
