// SPDX-License-Identifier: Apache-2.0
// The worker pool of kvfile's parallel loops: the library's per-chunk
// reads and checks (Reader::ReadMany, VerifyFile) and the kvfile CLI's
// per-file loops (verify and convert of many files).
#pragma once

#include <cstddef>
#include <functional>

#include "kvfile/export.h"

namespace kvfile {

// Runs task(worker, i) once for each i in [begin, end) on `workers`
// workers (0 counts as 1): worker 0 is the calling thread, each other one a
// new thread; one that cannot be started leaves its share to the rest.
// Workers take the next index in order. Before it takes an index a worker
// asks `stop` (when set): once that returns true, no further index is
// started and the ones under way finish. `task` must not throw; the call
// returns when every worker has finished.
KVFILE_EXPORT void ParallelFor(size_t begin, size_t end, unsigned workers,
                               const std::function<void(unsigned worker, size_t i)>& task,
                               const std::function<bool()>& stop = {});

}  // namespace kvfile
