// SPDX-License-Identifier: Apache-2.0
// What the library's own parts reach behind the Reader's API: more readers
// of one open file, for more threads (a Reader serves one thread at a time).
#pragma once

#include <memory>

#include "kvfile/reader.h"

namespace kvfile::internal {

struct ReaderAccess {
  // Another reader of the file `r` opened, with r's committed state (its
  // scan, shared, not taken again: a file appended to, rewound or replaced
  // since gives the same tokens and chunks) read through a handle of its
  // own, checked to be the same file (OpenWorkerFiles: a file renamed over
  // the path since gives Status::Failed("PATH: the file was replaced since it
  // was opened")).
  static Status Share(const Reader& r, std::unique_ptr<Reader>* out);
  // The worker threads r's ReadMany and ReadManyCodes have started since it
  // was opened (they are kept between calls).
  static uint64_t WorkerThreadsStarted(const Reader& r);
};

}  // namespace kvfile::internal
