// SPDX-License-Identifier: Apache-2.0
// Per-chunk fan-out over threads (see parallel_chunks.h).
#include "reader/parallel_chunks.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>

#include "kvfile/parallel.h"

namespace kvfile::internal {

unsigned WorkerCount(unsigned asked, size_t chunks, size_t max) {
  return static_cast<unsigned>(std::clamp<size_t>(asked, 1, std::clamp<size_t>(chunks, 1, max)));
}

Status OpenWorkerFiles(FileSystem& fs, const std::string& path, File& original, unsigned count,
                       const std::string& when, std::vector<std::unique_ptr<File>>* files) {
  if (count == 0) return Status::OK();
  FileId id;
  KVFILE_RETURN_IF_ERROR(original.Id(&id));
  for (unsigned i = 0; i < count; ++i) {
    std::unique_ptr<File> f;
    KVFILE_RETURN_IF_ERROR(fs.Open(path, OpenMode::kRead, &f));
    FileId other;
    KVFILE_RETURN_IF_ERROR(f->Id(&other));
    if (!(other == id)) return Status::Failed(path + ": the file was replaced " + when);
    files->push_back(std::move(f));
  }
  return Status::OK();
}

Status ForEachChunk(size_t begin, size_t end, unsigned workers,
                    const std::function<Status(unsigned worker, size_t chunk)>& task) {
  std::atomic<bool> failed{false};
  std::mutex error_mu;
  size_t error_chunk = SIZE_MAX;
  Status error;
  ParallelFor(
      begin, end, workers,
      [&](unsigned worker, size_t chunk) {
        Status st = task(worker, chunk);
        if (st.ok()) return;
        std::lock_guard<std::mutex> lock(error_mu);
        if (chunk < error_chunk) {
          error_chunk = chunk;
          error = std::move(st);
        }
        failed = true;
      },
      [&] { return failed.load(std::memory_order_relaxed); });
  return error;
}

}  // namespace kvfile::internal
