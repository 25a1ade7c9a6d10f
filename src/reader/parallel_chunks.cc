// SPDX-License-Identifier: Apache-2.0
// Per-chunk fan-out over threads (see parallel_chunks.h).
#include "reader/parallel_chunks.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <semaphore>
#include <system_error>
#include <thread>

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
  // Threads of the one worker pool (kvfile/parallel.h), each draining the
  // queue as the kept workers of ChunkWorkers do.
  ChunkQueue queue(begin, end, task);
  ParallelFor(0, std::max(workers, 1u), workers, [&](unsigned worker, size_t) { queue.Work(worker); });
  return queue.Result();
}

// What the pool's threads share with the caller of Run. Each thread sleeps
// on a semaphore of its own, released for each call it may take part in:
// only the threads a call asks for wake, and none contends with another for
// a lock. A call is open until the caller has run out of chunks; a thread
// joins it only while it is open (a thread the scheduler wakes late finds it
// closed and sleeps again: the caller never waits for a thread that has not
// started on the call), and the caller waits only for the threads that
// joined. One atomic word holds the call's state: its number, how many
// threads it asks for, whether it is closed and how many threads are in it.
// The last thread to leave a closed call releases `done`.
struct ChunkWorkers::State {
  static constexpr uint64_t kInside = 0xffff;  // threads working on the call
  static constexpr uint64_t kClosed = uint64_t{1} << 16;
  static constexpr unsigned kAskedShift = 17;  // 15 bits: threads the call asks for
  static constexpr unsigned kCallShift = 32;
  std::vector<std::unique_ptr<std::counting_semaphore<>>> wake;  // one per thread
  std::binary_semaphore done{0};
  std::atomic<uint64_t> call{kClosed};
  ChunkQueue* queue = nullptr;  // the open call's, published by the store that opens it
  std::atomic<bool> stop{false};
  uint32_t calls = 0;  // the caller's count

  // Thread `index`'s life: worker index + 1 of each call it joins.
  void Loop(unsigned index, std::counting_semaphore<>* own) {
    for (;;) {
      own->acquire();
      if (stop.load(std::memory_order_acquire)) return;
      uint64_t c = call.load(std::memory_order_acquire);
      bool joined = false;
      while (!joined && !(c & kClosed) && index < ((c >> kAskedShift) & 0x7fff))
        joined = call.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire);
      if (!joined) continue;  // the call closed before this thread woke
      queue->Work(index + 1);
      c = call.fetch_sub(1, std::memory_order_acq_rel);
      if ((c & kClosed) && (c & kInside) == 1) done.release();
    }
  }

  // Opens a call of `queue` asking for threads [0, threads), and wakes them.
  void Open(ChunkQueue* q, unsigned threads) {
    queue = q;
    call.store(uint64_t{++calls} << kCallShift | uint64_t{threads} << kAskedShift, std::memory_order_release);
    for (unsigned i = 0; i < threads; ++i) wake[i]->release();
  }

  // Closes the call and waits for the threads working on it.
  void Close() {
    if ((call.fetch_or(kClosed, std::memory_order_acq_rel) & kInside) != 0) done.acquire();
    queue = nullptr;
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
  state_->stop.store(true, std::memory_order_release);
  for (size_t i = 0; i < threads_.size(); ++i) state_->wake[i]->release();
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
  // The state is the parent's threads' too, as they were at the fork: it is
  // left as it is (not destroyed) and a new one made.
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
      if (state_->wake.size() <= index) state_->wake.push_back(std::make_unique<std::counting_semaphore<>>(0));
      threads_.emplace_back(
          [state = state_.get(), index, own = state_->wake[index].get()] { state->Loop(index, own); });
      pid_ = getpid();
      ++threads_started_;
    } catch (const std::system_error&) {
      break;  // no thread to be had: the workers started so far share the job
    }
  }
  ChunkQueue queue(begin, end, task);
  const auto helpers = static_cast<unsigned>(std::min<size_t>(threads_.size(), workers - 1));
  if (helpers > 0) state_->Open(&queue, helpers);
  queue.Work(0);
  if (helpers > 0) state_->Close();
  return queue.Result();
}

}  // namespace kvfile::internal
