// SPDX-License-Identifier: Apache-2.0
// Per-chunk fan-out over threads, shared by Reader::ReadMany and VerifyFile:
// how many workers a call gets, one checked File per worker, and the loop
// that hands chunks out to the workers in order.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvfile/file.h"
#include "kvfile/status.h"

namespace kvfile::internal {

// The number of workers for `chunks` chunks when `asked` are asked for:
// at least 1, at most one per chunk and at most `max`.
unsigned WorkerCount(unsigned asked, size_t chunks, size_t max);

// Appends `count` further read handles of `path` to *files (a File serves
// one thread at a time, so each worker reads through its own), each checked
// to be the same file as `original`. Another file there gives
// Status::Failed(path + ": the file was replaced " + when).
Status OpenWorkerFiles(FileSystem& fs, const std::string& path, File& original, unsigned count,
                       const std::string& when, std::vector<std::unique_ptr<File>>* files);

// Runs task(worker, chunk) once for every chunk in [begin, end) on
// `workers` workers: worker 0 is the calling thread, each other one a new
// thread (one that cannot be started leaves its share to the rest). Workers
// take the next chunk in order. After a task fails no further chunk is
// started; the result is the failure of the lowest chunk that failed, or OK.
Status ForEachChunk(size_t begin, size_t end, unsigned workers,
                    const std::function<Status(unsigned worker, size_t chunk)>& task);

}  // namespace kvfile::internal
