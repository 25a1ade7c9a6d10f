// SPDX-License-Identifier: Apache-2.0
// Unit tests of the per-chunk fan-out (src/reader/parallel_chunks.h): worker counts,
// every chunk run exactly once, which failure is reported, no chunk started
// after a failure, the checked per-worker files, and ChunkWorkers' threads
// kept between calls (and started anew in a forked child); and of the
// worker pool beneath ForEachChunk and the CLI's per-file loops
// (kvfile/parallel.h): every index once, and no index started once `stop`
// says so.

#include "reader/parallel_chunks.h"

#include "kvfile/parallel.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace kvfile::internal {
namespace {

TEST(ParallelChunks, WorkerCount) {
  EXPECT_EQ(WorkerCount(0, 10, 16), 1u);   // at least one
  EXPECT_EQ(WorkerCount(4, 10, 16), 4u);
  EXPECT_EQ(WorkerCount(8, 3, 16), 3u);    // at most one per chunk
  EXPECT_EQ(WorkerCount(64, 100, 16), 16u);  // at most max
  EXPECT_EQ(WorkerCount(8, 0, 16), 1u);    // no chunk: still one
}

TEST(ParallelChunks, EveryChunkRunsOnceOnTheWorkersAsked) {
  for (unsigned workers : {1u, 2u, 3u, 8u}) {
    std::vector<std::atomic<int>> runs(50);
    std::mutex mu;
    std::set<unsigned> seen_workers;
    std::set<std::thread::id> threads;
    Status st = ForEachChunk(7, 50, workers, [&](unsigned w, size_t chunk) {
      ++runs[chunk];
      std::lock_guard<std::mutex> lock(mu);
      seen_workers.insert(w);
      threads.insert(std::this_thread::get_id());
      return Status::OK();
    });
    ASSERT_TRUE(st.ok()) << st.ToString();
    for (size_t i = 0; i < runs.size(); ++i) EXPECT_EQ(runs[i].load(), i < 7 ? 0 : 1) << "chunk " << i;
    for (unsigned w : seen_workers) EXPECT_LT(w, workers);
    EXPECT_TRUE(seen_workers.count(0) == 1 || workers > 1);
    EXPECT_LE(threads.size(), workers);
  }
}

TEST(ParallelChunks, OneWorkerRunsOnTheCallingThreadInOrder) {
  std::vector<size_t> order;
  const std::thread::id caller = std::this_thread::get_id();
  Status st = ForEachChunk(2, 6, 1, [&](unsigned w, size_t chunk) {
    EXPECT_EQ(w, 0u);
    EXPECT_EQ(std::this_thread::get_id(), caller);
    order.push_back(chunk);
    return Status::OK();
  });
  EXPECT_TRUE(st.ok());
  EXPECT_EQ(order, (std::vector<size_t>{2, 3, 4, 5}));
  EXPECT_TRUE(ForEachChunk(5, 5, 4, [](unsigned, size_t) { return Status::Corruption("ran"); }).ok());
}

TEST(ParallelChunks, AFailureStopsLaterChunks) {
  std::vector<size_t> order;
  Status st = ForEachChunk(0, 10, 1, [&](unsigned, size_t chunk) {
    order.push_back(chunk);
    return chunk == 3 ? Status::Corruption("chunk 3") : Status::OK();
  });
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_EQ(st.message(), "chunk 3");
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3}));
}

TEST(ParallelChunks, TheLowestFailedChunkIsReported) {
  // Chunks 1 and 2 both fail, on two workers, in either order: the result
  // is chunk 1's whichever failure came first.
  for (bool lower_fails_first : {false, true}) {
    for (int round = 0; round < 20; ++round) {
      std::atomic<bool> two_started{false}, one_failed{false}, two_failed{false};
      Status st = ForEachChunk(0, 3, 3, [&](unsigned, size_t chunk) {
        if (chunk == 2) {
          two_started = true;
          if (lower_fails_first)
            while (!one_failed) std::this_thread::yield();
          two_failed = true;
          return Status::IOError("chunk 2");
        }
        if (chunk == 1) {
          while (!two_started) std::this_thread::yield();
          if (!lower_fails_first)
            while (!two_failed) std::this_thread::yield();
          one_failed = true;
          return Status::Corruption("chunk 1");
        }
        return Status::OK();
      });
      EXPECT_EQ(st.code(), Status::Code::kCorruption) << lower_fails_first;
      EXPECT_EQ(st.message(), "chunk 1");
    }
  }
}

TEST(ParallelFor, EveryIndexRunsOnceOnTheWorkersAsked) {
  for (unsigned workers : {0u, 1u, 2u, 5u}) {
    std::vector<std::atomic<int>> runs(40);
    std::mutex mu;
    std::set<unsigned> seen;
    ParallelFor(3, 40, workers, [&](unsigned w, size_t i) {
      ++runs[i];
      std::lock_guard<std::mutex> lock(mu);
      seen.insert(w);
    });
    for (size_t i = 0; i < runs.size(); ++i) EXPECT_EQ(runs[i].load(), i < 3 ? 0 : 1) << "index " << i;
    for (unsigned w : seen) EXPECT_LT(w, std::max(workers, 1u));
  }
}

// `stop` is asked before each index: once it says so (a signal, in the
// CLI), no further index starts, and the ones under way finish.
TEST(ParallelFor, NoIndexStartsOnceStopSaysSo) {
  std::vector<size_t> order;
  std::atomic<bool> stopped{false};
  ParallelFor(
      0, 10, 1,
      [&](unsigned w, size_t i) {
        EXPECT_EQ(w, 0u);
        order.push_back(i);
        if (i == 4) stopped = true;
      },
      [&] { return stopped.load(); });
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3, 4}));
  // With several workers: the index under way on another worker finishes
  // (its count is whole), and nothing past the stop begins.
  std::atomic<int> begun{0}, finished{0};
  std::atomic<bool> stop{false};
  ParallelFor(
      0, 1000, 4,
      [&](unsigned, size_t i) {
        ++begun;
        if (i == 10) stop = true;
        ++finished;
      },
      [&] { return stop.load(); });
  EXPECT_EQ(begun.load(), finished.load());
  EXPECT_LT(begun.load(), 1000);
  EXPECT_TRUE(stop.load());
}

// Runs chunks [0, workers) on `workers` workers, each chunk waiting until
// every worker has one, so that each worker takes exactly one; returns the
// thread of each worker.
std::map<unsigned, std::thread::id> ThreadOfEachWorker(ChunkWorkers& pool, unsigned workers) {
  std::mutex mu;
  std::map<unsigned, std::thread::id> threads;
  std::atomic<unsigned> arrived{0};
  Status st = pool.Run(0, workers, workers, [&](unsigned w, size_t) {
    {
      std::lock_guard<std::mutex> lock(mu);
      threads[w] = std::this_thread::get_id();
    }
    ++arrived;
    while (arrived < workers) std::this_thread::yield();
    return Status::OK();
  });
  EXPECT_TRUE(st.ok()) << st.ToString();
  return threads;
}

TEST(ChunkWorkers, ThreadsAreStartedOnceAndKeptBetweenCalls) {
  ChunkWorkers pool;
  EXPECT_EQ(pool.threads_started(), 0u);
  const auto first = ThreadOfEachWorker(pool, 4);
  ASSERT_EQ(first.size(), 4u);
  EXPECT_EQ(first.at(0), std::this_thread::get_id());  // worker 0 is the caller
  EXPECT_EQ(std::set<std::thread::id>({first.at(1), first.at(2), first.at(3), first.at(0)}).size(), 4u);
  EXPECT_EQ(pool.threads_started(), 3u);
  for (int call = 0; call < 5; ++call) EXPECT_EQ(ThreadOfEachWorker(pool, 4), first) << "call " << call;
  EXPECT_EQ(ThreadOfEachWorker(pool, 2), (std::map<unsigned, std::thread::id>{{0, first.at(0)}, {1, first.at(1)}}));
  EXPECT_EQ(pool.threads_started(), 3u);
  // More workers: the kept threads, and new ones for the rest.
  const auto more = ThreadOfEachWorker(pool, 6);
  EXPECT_EQ(pool.threads_started(), 5u);
  for (unsigned w = 0; w < 4; ++w) EXPECT_EQ(more.at(w), first.at(w)) << "worker " << w;
}

TEST(ChunkWorkers, EveryChunkOnceAndTheLowestFailureAfterWhichThePoolServesOn) {
  ChunkWorkers pool;
  for (unsigned workers : {3u, 1u, 8u, 3u}) {
    std::vector<std::atomic<int>> runs(50);
    Status st = pool.Run(7, 50, workers, [&](unsigned w, size_t chunk) {
      EXPECT_LT(w, workers);
      ++runs[chunk];
      return Status::OK();
    });
    ASSERT_TRUE(st.ok()) << st.ToString();
    for (size_t i = 0; i < runs.size(); ++i) EXPECT_EQ(runs[i].load(), i < 7 ? 0 : 1) << "chunk " << i;
  }
  EXPECT_EQ(pool.threads_started(), 7u);
  // Chunks 1 and 2 fail, chunk 2 first: chunk 1's failure is the result.
  std::atomic<bool> two_failed{false};
  Status st = pool.Run(0, 3, 3, [&](unsigned, size_t chunk) {
    if (chunk == 2) {
      two_failed = true;
      return Status::IOError("chunk 2");
    }
    if (chunk == 1) {
      while (!two_failed) std::this_thread::yield();
      return Status::Corruption("chunk 1");
    }
    return Status::OK();
  });
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_EQ(st.message(), "chunk 1");
  std::atomic<int> ran{0};
  EXPECT_TRUE(pool.Run(0, 20, 8, [&](unsigned, size_t) {
                    ++ran;
                    return Status::OK();
                  }).ok());
  EXPECT_EQ(ran.load(), 20);
  EXPECT_EQ(pool.threads_started(), 7u);
}

// A child forked after the pool started its threads has none of them: its
// calls start threads of its own (they would wait forever for the parent's)
// and its destructor does not join the parent's. The child's alarm ends a
// child that hangs (SIGALRM: the test fails, it does not hang).
TEST(ChunkWorkers, AForkedChildStartsThreadsOfItsOwn) {
  auto pool = std::make_unique<ChunkWorkers>();
  const auto parent = ThreadOfEachWorker(*pool, 3);
  ASSERT_EQ(pool->threads_started(), 2u);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    alarm(30);
    int failed = 0;
    std::atomic<int> ran{0};
    Status st = pool->Run(0, 12, 3, [&](unsigned, size_t) {
      ++ran;
      return Status::OK();
    });
    if (!st.ok() || ran != 12) failed |= 1;
    if (pool->threads_started() != 4) failed |= 2;
    if (ThreadOfEachWorker(*pool, 3).size() != 3) failed |= 4;
    pool.reset();  // joins the child's threads
    _exit(failed);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child was ended by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(ThreadOfEachWorker(*pool, 3), parent);  // the parent's pool is as it was
  // A child that only destroys the pool it inherited.
  child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    alarm(30);
    pool.reset();
    _exit(0);
  }
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child was ended by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

class WorkerFilesTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("parallel_chunks_test." + std::to_string(getpid()) + "." +
            testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "f").string();
    std::ofstream(path_) << "abc";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(WorkerFilesTest, OpensTheSameFile) {
  FileSystem* fs = FileSystem::Default();
  std::unique_ptr<File> original;
  ASSERT_TRUE(fs->Open(path_, OpenMode::kRead, &original).ok());
  std::vector<std::unique_ptr<File>> files;
  ASSERT_TRUE(OpenWorkerFiles(*fs, path_, *original, 3, "while testing", &files).ok());
  ASSERT_EQ(files.size(), 3u);
  FileId id, other;
  ASSERT_TRUE(original->Id(&id).ok());
  for (auto& f : files) {
    ASSERT_TRUE(f->Id(&other).ok());
    EXPECT_TRUE(other == id);
  }
  ASSERT_TRUE(OpenWorkerFiles(*fs, path_, *original, 0, "while testing", &files).ok());
  EXPECT_EQ(files.size(), 3u);
}

TEST_F(WorkerFilesTest, AReplacedFileIsRefused) {
  FileSystem* fs = FileSystem::Default();
  std::unique_ptr<File> original;
  ASSERT_TRUE(fs->Open(path_, OpenMode::kRead, &original).ok());
  const std::string other = (dir_ / "g").string();
  std::ofstream(other) << "abc";
  std::filesystem::rename(other, path_);
  std::vector<std::unique_ptr<File>> files;
  Status st = OpenWorkerFiles(*fs, path_, *original, 2, "while testing", &files);
  EXPECT_EQ(st.code(), Status::Code::kFailed);
  EXPECT_EQ(st.message(), path_ + ": the file was replaced while testing");
  EXPECT_TRUE(files.empty());
}

}  // namespace
}  // namespace kvfile::internal
