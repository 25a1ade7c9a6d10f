// SPDX-License-Identifier: Apache-2.0
// ParallelFor: the worker pool of kvfile's parallel loops (kvfile/parallel.h).
#include "kvfile/parallel.h"

#include <atomic>
#include <system_error>
#include <thread>
#include <vector>

namespace kvfile {

void ParallelFor(size_t begin, size_t end, unsigned workers,
                 const std::function<void(unsigned worker, size_t i)>& task, const std::function<bool()>& stop) {
  std::atomic<size_t> next{begin};
  auto work = [&](unsigned worker) {
    while (!(stop && stop())) {
      size_t i = next.fetch_add(1);
      if (i >= end) break;
      task(worker, i);
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
}

}  // namespace kvfile
