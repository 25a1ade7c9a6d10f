// SPDX-License-Identifier: Apache-2.0
// Per-chunk fan-out over threads (see parallel_chunks.h).
#include "reader/parallel_chunks.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
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

namespace {

// One call's chunks, handed out in order to the workers that Work on them.
// After a task fails no further chunk is started; the lowest failed chunk's
// status is kept.
class ChunkQueue {
 public:
  using Task = std::function<Status(unsigned worker, size_t chunk)>;
  ChunkQueue(size_t begin, size_t end, const Task& task) : next_(begin), end_(end), task_(task) {}

  void Work(unsigned worker) {
    while (!failed_.load(std::memory_order_relaxed)) {
      size_t chunk = next_.fetch_add(1);
      if (chunk >= end_) break;
      Status st = task_(worker, chunk);
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(error_mu_);
        if (chunk < error_chunk_) {
          error_chunk_ = chunk;
          error_ = std::move(st);
        }
        failed_ = true;
      }
    }
  }
  // Once every worker has returned from Work.
  Status Result() { return std::move(error_); }

 private:
  std::atomic<size_t> next_;
  const size_t end_;
  const Task& task_;
  std::atomic<bool> failed_{false};
  std::mutex error_mu_;
  size_t error_chunk_ = SIZE_MAX;
  Status error_;
};

}  // namespace

Status ForEachChunk(size_t begin, size_t end, unsigned workers,
                    const std::function<Status(unsigned worker, size_t chunk)>& task) {
  ChunkQueue queue(begin, end, task);
  std::vector<std::thread> threads;
  for (unsigned w = 1; w < workers; ++w) {
    try {
      threads.emplace_back([&queue, w] { queue.Work(w); });
    } catch (const std::system_error&) {
      break;  // no thread to be had: the workers started so far finish the job
    }
  }
  queue.Work(0);
  for (auto& t : threads) t.join();
  return queue.Result();
}

// What the pool's threads share with the caller of Run: the current call
// (generation, its queue, how many threads take part) and the count of
// those still working on it.
struct ChunkWorkers::State {
  std::mutex mu;
  std::condition_variable wake;  // a new call, or stop
  std::condition_variable done;  // running reached 0
  uint64_t generation = 0;
  ChunkQueue* queue = nullptr;
  unsigned taking_part = 0;  // threads [0, taking_part) work on the current call
  unsigned running = 0;      // of those, the ones not finished
  bool stop = false;

  // Thread `index`'s life; `seen`: the generation when it was started.
  void Loop(unsigned index, uint64_t seen) {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      wake.wait(lock, [&] { return stop || generation != seen; });
      if (stop) return;
      seen = generation;
      if (index >= taking_part) continue;
      ChunkQueue* q = queue;
      lock.unlock();
      q->Work(index + 1);
      lock.lock();
      if (--running == 0) done.notify_one();
    }
  }
};

ChunkWorkers::ChunkWorkers() : state_(std::make_unique<State>()) {}

ChunkWorkers::~ChunkWorkers() {
  if (!threads_.empty() && pid_ != getpid())
    Forget();
  else
    Stop();
}

void ChunkWorkers::Stop() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->wake.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void ChunkWorkers::Forget() {
  for (auto& t : threads_) {
    try {
      t.detach();
    } catch (const std::system_error&) {
      // a thread the kernel does not know: nothing to detach
    }
  }
  threads_.clear();
  // The parent's threads may have held the mutex when the process forked:
  // the state is left as it is (not destroyed) and a new one made.
  static_cast<void>(state_.release());
  state_ = std::make_unique<State>();
}

Status ChunkWorkers::Run(size_t begin, size_t end, unsigned workers,
                         const std::function<Status(unsigned worker, size_t chunk)>& task) {
  if (!threads_.empty() && pid_ != getpid()) Forget();
  workers = std::max(workers, 1u);
  while (threads_.size() + 1 < workers) {
    try {
      const auto index = static_cast<unsigned>(threads_.size());
      threads_.emplace_back([state = state_.get(), index, seen = state_->generation] { state->Loop(index, seen); });
      pid_ = getpid();
      ++threads_started_;
    } catch (const std::system_error&) {
      break;  // no thread to be had: the workers started so far share the job
    }
  }
  ChunkQueue queue(begin, end, task);
  const auto helpers = static_cast<unsigned>(std::min<size_t>(threads_.size(), workers - 1));
  if (helpers > 0) {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      ++state_->generation;
      state_->queue = &queue;
      state_->taking_part = helpers;
      state_->running = helpers;
    }
    state_->wake.notify_all();
  }
  queue.Work(0);
  if (helpers > 0) {
    std::unique_lock<std::mutex> lock(state_->mu);
    state_->done.wait(lock, [&] { return state_->running == 0; });
    state_->queue = nullptr;
  }
  return queue.Result();
}

}  // namespace kvfile::internal
