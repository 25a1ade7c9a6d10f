// SPDX-License-Identifier: Apache-2.0
// Per-chunk fan-out over threads, shared by Reader::ReadMany and VerifyFile:
// how many workers a call gets, one checked File per worker, and the loop
// that hands chunks out to the workers in order (on threads started for the
// call, or on a pool's threads kept between calls).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
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

// ForEachChunk on threads kept between calls: worker 0 is the calling
// thread, worker w > 0 the pool's thread w - 1, started by the first call
// that needs it and kept until the pool is destroyed, so a later call starts
// no thread (a Reader's ReadMany and ReadManyCodes: a read of a few chunks
// costs the wake-up of the threads it asks for, not their start; a thread
// that wakes after the caller has run out of chunks stays out of the call
// and does not delay it). Run calls must not overlap (the owner's calls are
// serialized). In a process forked from the one that started the threads
// they do not exist: the pool forgets them (their memory is left, not
// joined) and starts its own.
class ChunkWorkers {
 public:
  ChunkWorkers();
  ChunkWorkers(const ChunkWorkers&) = delete;
  ChunkWorkers& operator=(const ChunkWorkers&) = delete;
  ~ChunkWorkers();  // stops and joins the threads

  // ForEachChunk's contract, on `workers` workers; a thread that cannot be
  // started leaves its share to the rest.
  Status Run(size_t begin, size_t end, unsigned workers,
             const std::function<Status(unsigned worker, size_t chunk)>& task);
  // The threads this pool has started since it was made (a test's view of
  // the reuse).
  uint64_t threads_started() const { return threads_started_; }

 private:
  struct State;
  void Forget();  // after a fork: drop the threads without joining them
  void Stop();
  std::unique_ptr<State> state_;
  std::vector<std::thread> threads_;
  pid_t pid_ = 0;  // the process that started threads_
  uint64_t threads_started_ = 0;
};

}  // namespace kvfile::internal
