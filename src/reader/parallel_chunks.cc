// SPDX-License-Identifier: Apache-2.0
// Per-chunk fan-out over threads (see parallel_chunks.h).
#include "reader/parallel_chunks.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <system_error>
#include <thread>

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
  std::atomic<size_t> next{begin};
  std::atomic<bool> failed{false};
  std::mutex error_mu;
  size_t error_chunk = SIZE_MAX;
  Status error;
  auto work = [&](unsigned worker) {
    while (!failed.load(std::memory_order_relaxed)) {
      size_t chunk = next.fetch_add(1);
      if (chunk >= end) break;
      Status st = task(worker, chunk);
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (chunk < error_chunk) {
          error_chunk = chunk;
          error = std::move(st);
        }
        failed = true;
      }
    }
  };
  std::vector<std::thread> threads;
  for (unsigned w = 1; w < workers; ++w) {
    try {
      threads.emplace_back(work, w);
    } catch (const std::system_error&) {
      break;  // no thread to be had: the workers started so far finish the job
    }
  }
  work(0);
  for (auto& t : threads) t.join();
  return error;
}

}  // namespace kvfile::internal
