// SPDX-License-Identifier: Apache-2.0
// What the library's own tests reach behind the public API: a fixed salt
// for new files (golden bytes), one chunk's full check, and the I/O fault
// hook (io_fault_hook.h). Not installed, not exported from libkvfile.so.
#pragma once

#include <cstddef>
#include <cstdint>

#include "io/io_fault_hook.h"
#include "kvfile/reader.h"
#include "kvfile/status.h"

namespace kvfile::hooks {

// The salt Writer::Create gives the next files it makes, process-wide: 0
// (the default) draws a random one per file as the format requires.
void SetWriterSalt(uint64_t salt);
uint64_t WriterSalt();

struct ReaderAccess {
  // Reads and checks every byte of chunk `index` (all sections, codes and
  // scales), as verify does.
  static Status VerifyChunk(Reader& r, size_t index) { return r.VerifyChunk(index); }
  // The worker threads r's ReadMany and ReadManyCodes have started since it
  // was opened (they are kept between calls).
  static uint64_t WorkerThreadsStarted(const Reader& r);
};

}  // namespace kvfile::hooks
