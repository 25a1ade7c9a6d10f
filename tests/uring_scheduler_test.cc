// SPDX-License-Identifier: Apache-2.0
// Tests of the io_uring write-chain scheduler (src/writer/write_chain_scheduler.h)
// against scripted completions, no kernel ring: a fake ChainIo records the
// ops the scheduler submits (offsets, lengths, link and drain flags) and
// completes them as a script says: in order or not, with short writes,
// -EINTR/-EAGAIN, real errors in the middle of a chain. Like the kernel, a
// linked op after one that failed or came back short is cancelled.
#include "writer/write_chain_scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <vector>

namespace kvfile::internal {
namespace {

// A ChainIo whose kernel is a script. Submitted ops wait in `queue_`; each
// Reap() completes every op queued so far, with the result `result(op)`
// gives (default: the whole write, fsync 0). Ops linked after a failed or
// short one are cancelled (-ECANCELED), as io_uring does. With `reverse`
// the completions of independent chains arrive newest chain first, as far
// as the kernel allows: a chain's ops complete in order, and a chain
// submitted with IOSQE_IO_DRAIN completes after everything before it.
class ScriptedIo : public ChainIo {
 public:
  WriteChainScheduler* sched = nullptr;
  std::function<int(const ChainOp&)> result;  // nullptr: success
  bool reverse = false;
  std::vector<ChainOp> submitted;  // every op, in submission order
  std::map<uint64_t, int> results;  // user_data -> the result delivered
  int reaps = 0;
  size_t max_in_flight = 0;

  Status Prepare(const ChainOp& op) override {
    prepared_.push_back(op);
    return Status::OK();
  }
  Status Submit() override {
    for (const ChainOp& op : prepared_) {
      submitted.push_back(op);
      queue_.push_back(op);
    }
    prepared_.clear();
    max_in_flight = std::max(max_in_flight, queue_.size());
    return Status::OK();
  }
  Status Reap() override {
    ++reaps;
    EXPECT_FALSE(queue_.empty()) << "Reap with nothing in flight would block forever";
    if (queue_.empty()) return Status::IOError("nothing in flight");
    // Decide every result first (cancellation follows the chain's order),
    // then deliver in the chosen order.
    std::vector<std::pair<uint64_t, int>> done;
    bool cancel = false;
    for (const ChainOp& op : queue_) {
      if (op.first_in_chain) cancel = false;
      int res;
      if (cancel) {
        res = -ECANCELED;
      } else {
        res = result ? result(op) : (op.fsync ? 0 : static_cast<int>(op.len));
        const bool broke = res < 0 || (!op.fsync && static_cast<size_t>(res) < op.len);
        if (broke && op.link) cancel = true;
      }
      results[op.user_data] = res;
      done.emplace_back(op.user_data, res);
    }
    std::vector<std::pair<uint64_t, int>> order;
    if (!reverse) {
      order = done;
    } else {
      // Segments end before each draining op; within a segment, chains
      // newest first, each chain's ops in order.
      std::vector<std::vector<std::vector<std::pair<uint64_t, int>>>> segments;
      for (size_t i = 0; i < queue_.size(); ++i) {
        const ChainOp& op = queue_[i];
        if (segments.empty() || op.drain) segments.emplace_back();
        if (op.first_in_chain) segments.back().emplace_back();
        segments.back().back().push_back(done[i]);
      }
      for (auto& seg : segments)
        for (auto chain = seg.rbegin(); chain != seg.rend(); ++chain) order.insert(order.end(), chain->begin(), chain->end());
    }
    queue_.clear();
    for (auto [ud, res] : order) sched->Complete(ud, res);
    return Status::OK();
  }

 private:
  std::vector<ChainOp> prepared_;
  std::deque<ChainOp> queue_;
};

// Small limits so a few bytes make several ops and chains.
constexpr WriteChainScheduler::Limits kLimits{.queue_depth = 8, .write_bytes = 100, .chain_writes = 3, .max_stalls = 5};

struct Fixture {
  ScriptedIo io;
  WriteChainScheduler sched{"/f", &io, kLimits};
  std::vector<uint8_t> buf = std::vector<uint8_t>(4096);
  Fixture() { io.sched = &sched; }
  const uint8_t* at(size_t i) const { return buf.data() + i; }
};

// How many times each byte was written, by the results delivered.
std::map<uint64_t, int> WrittenBytes(const ScriptedIo& io) {
  std::map<uint64_t, int> count;
  for (const ChainOp& op : io.submitted) {
    const int res = io.results.at(op.user_data);
    if (!op.fsync && res > 0)
      for (int b = 0; b < res; ++b) ++count[op.offset + static_cast<uint64_t>(b)];
  }
  return count;
}

TEST(UringScheduler, SplitsAWriteIntoLinkedChainsEndingInAnFsync) {
  Fixture f;
  ASSERT_TRUE(f.sched.SubmitWrite(1000, f.at(0), 450, /*sync_after=*/true).ok());
  // 450 bytes: writes of 100, 100, 100 (chain 1), then 100, 50 and the fsync (chain 2).
  const auto& s = f.io.submitted;
  ASSERT_EQ(s.size(), 6u);
  const uint64_t offsets[] = {1000, 1100, 1200, 1300, 1400};
  const size_t lens[] = {100, 100, 100, 100, 50};
  for (int i = 0; i < 5; ++i) {
    EXPECT_FALSE(s[i].fsync);
    EXPECT_EQ(s[i].offset, offsets[i]);
    EXPECT_EQ(s[i].len, lens[i]);
    EXPECT_EQ(s[i].data, f.at(offsets[i] - 1000));
  }
  EXPECT_TRUE(s[0].first_in_chain && s[0].link && s[1].link && !s[2].link);
  EXPECT_TRUE(s[3].first_in_chain && s[3].link && s[4].link);
  EXPECT_TRUE(s[5].fsync && !s[5].link && !s[5].first_in_chain);
  // Chain 2 holds the fsync, which must follow chain 1 too (not linked to
  // it, still in flight): chain 2 drains.
  for (int i = 0; i < 6; ++i) EXPECT_EQ(s[i].drain, i == 3) << i;
  EXPECT_TRUE(f.sched.WaitWrites().ok());
  EXPECT_EQ(f.sched.ops_in_flight(), 0u);
}

TEST(UringScheduler, AnFsyncAloneDrainsWhatIsInFlight) {
  Fixture f;
  ASSERT_TRUE(f.sched.SubmitWrite(0, f.at(0), 50, false).ok());
  ASSERT_TRUE(f.sched.SubmitWrite(50, nullptr, 0, /*sync_after=*/true).ok());
  ASSERT_EQ(f.io.submitted.size(), 2u);
  EXPECT_TRUE(f.io.submitted[1].fsync);
  EXPECT_TRUE(f.io.submitted[1].drain);  // must follow the unlinked write before it
  EXPECT_TRUE(f.sched.WaitWrites().ok());
  // With nothing in flight, no drain.
  ASSERT_TRUE(f.sched.SubmitWrite(0, nullptr, 0, true).ok());
  EXPECT_FALSE(f.io.submitted[2].drain);
  EXPECT_TRUE(f.sched.WaitWrites().ok());
}

TEST(UringScheduler, ShortWriteResubmitsTheRestInOrder) {
  Fixture f;
  int calls = 0;
  f.io.result = [&](const ChainOp& op) {
    ++calls;
    if (calls == 2) return 30;  // the second write comes back short
    return op.fsync ? 0 : static_cast<int>(op.len);
  };
  ASSERT_TRUE(f.sched.SubmitWrite(0, f.at(0), 250, true).ok());
  ASSERT_TRUE(f.sched.WaitWrites().ok());
  const auto& s = f.io.submitted;
  // One chain: 100, 100 (short: 30), 50 and the fsync; the last two cancelled.
  ASSERT_GE(s.size(), 4u);
  EXPECT_EQ(f.io.results.at(s[2].user_data), -ECANCELED);
  EXPECT_EQ(f.io.results.at(s[3].user_data), -ECANCELED);
  // The rest goes again as a new chain: w1's remainder, w2, then the fsync.
  std::vector<ChainOp> retry(s.begin() + 4, s.end());
  ASSERT_EQ(retry.size(), 3u);
  EXPECT_EQ(retry[0].offset, 130u);
  EXPECT_EQ(retry[0].len, 70u);
  EXPECT_EQ(retry[0].data, f.at(130));
  EXPECT_TRUE(retry[0].first_in_chain && retry[0].link);
  EXPECT_EQ(retry[1].offset, 200u);
  EXPECT_EQ(retry[1].len, 50u);
  EXPECT_TRUE(retry[2].fsync);
  EXPECT_GT(WriteChainScheduler::Resubmissions(), 0u);
}

TEST(UringScheduler, InterruptedOpsAreRetriedUntilDone) {
  for (int err : {EINTR, EAGAIN}) {
    SCOPED_TRACE(err);
    Fixture f;
    int writes = 0, fsyncs = 0;
    f.io.result = [&](const ChainOp& op) {
      if (op.fsync) return ++fsyncs == 1 ? -err : 0;  // the first fsync that runs
      return ++writes == 1 ? -err : static_cast<int>(op.len);  // the first write
    };
    ASSERT_TRUE(f.sched.SubmitWrite(0, f.at(0), 200, true).ok());
    EXPECT_TRUE(f.sched.WaitWrites().ok());
    // Round 1: w0 interrupted, w1 and the fsync cancelled. Round 2: w0, w1,
    // the fsync interrupted. Round 3: the fsync alone.
    ASSERT_EQ(f.io.submitted.size(), 7u);
    EXPECT_EQ(f.io.results.at(f.io.submitted[0].user_data), -err);
    EXPECT_EQ(f.io.results.at(f.io.submitted[1].user_data), -ECANCELED);
    EXPECT_TRUE(f.io.submitted[6].fsync);
    EXPECT_EQ(f.io.results.at(f.io.submitted[6].user_data), 0);
    auto bytes = WrittenBytes(f.io);
    ASSERT_EQ(bytes.size(), 200u);
    for (auto [b, n] : bytes) EXPECT_EQ(n, 1) << b;
  }
}

TEST(UringScheduler, RealErrorMidChainIsReportedOnceAndNotRetried) {
  Fixture f;
  f.io.result = [&](const ChainOp& op) {
    if (!op.fsync && op.offset == 1100) return -EIO;
    return op.fsync ? 0 : static_cast<int>(op.len);
  };
  ASSERT_TRUE(f.sched.SubmitWrite(1000, f.at(0), 300, true).ok());
  Status st = f.sched.WaitWrites();
  EXPECT_EQ(st.code(), Status::Code::kIOError);
  EXPECT_EQ(st.message(), "/f: write at offset 1100: Input/output error");
  EXPECT_EQ(f.io.submitted.size(), 4u);  // three writes and the fsync, once
  EXPECT_TRUE(f.sched.WaitWrites().ok());  // reported once
  // Later writes still go.
  f.io.result = nullptr;
  ASSERT_TRUE(f.sched.SubmitWrite(0, f.at(0), 10, false).ok());
  EXPECT_TRUE(f.sched.WaitWrites().ok());
}

TEST(UringScheduler, FailedFsyncNamesTheWriteItFollows) {
  Fixture f;
  f.io.result = [](const ChainOp& op) { return op.fsync ? -ENOSPC : static_cast<int>(op.len); };
  ASSERT_TRUE(f.sched.SubmitWrite(4096, f.at(0), 20, true).ok());
  EXPECT_EQ(f.sched.WaitWrites().message(), "/f: fdatasync after write at offset 4096: No space left on device");
}

TEST(UringScheduler, ZeroByteWriteIsAnError) {
  Fixture f;
  f.io.result = [](const ChainOp& op) { return op.fsync ? 0 : 0; };
  ASSERT_TRUE(f.sched.SubmitWrite(0, f.at(0), 20, false).ok());
  EXPECT_EQ(f.sched.WaitWrites().message(), "/f: write at offset 0: no bytes written");
}

// Chains A and B complete newest first; A's write comes back short after
// the fsync queued behind both (chain C, draining) has been submitted: the
// rest of A is written again, and C's fsync, which may have run before
// those bytes, runs again after them.
TEST(UringScheduler, OutOfOrderCompletionsAndRerunOfLaterFsyncs) {
  Fixture f;
  f.io.reverse = true;
  f.io.result = [&](const ChainOp& op) {
    if (!op.fsync && op.offset == 0) return 10;  // A's first attempt: short
    return op.fsync ? 0 : static_cast<int>(op.len);
  };
  ASSERT_TRUE(f.sched.SubmitWrite(0, f.at(0), 100, false).ok());     // A
  ASSERT_TRUE(f.sched.SubmitWrite(100, f.at(100), 50, false).ok());  // B
  ASSERT_TRUE(f.sched.SubmitWrite(150, nullptr, 0, true).ok());      // C
  ASSERT_EQ(f.io.submitted.size(), 3u);
  EXPECT_TRUE(f.io.submitted[2].drain);
  ASSERT_TRUE(f.sched.WaitWrites().ok());
  const auto& s = f.io.submitted;
  ASSERT_EQ(s.size(), 5u);
  EXPECT_FALSE(s[3].fsync);
  EXPECT_EQ(s[3].offset, 10u);
  EXPECT_EQ(s[3].len, 90u);
  EXPECT_EQ(s[3].data, f.at(10));
  EXPECT_TRUE(s[4].fsync);
  EXPECT_TRUE(s[4].drain);  // after A's rest, which is in flight
  auto bytes = WrittenBytes(f.io);
  ASSERT_EQ(bytes.size(), 150u);
  for (auto [b, n] : bytes) EXPECT_EQ(n, 1) << b;
}

TEST(UringScheduler, GivesUpAfterTooManyRoundsWithoutProgress) {
  Fixture f;
  f.io.result = [](const ChainOp&) { return -EAGAIN; };
  ASSERT_TRUE(f.sched.SubmitWrite(0, f.at(0), 20, false).ok());
  Status st = f.sched.WaitWrites();
  EXPECT_EQ(st.message(),
            "/f: write at offset 0: Resource temporarily unavailable (io_uring kept interrupting or cancelling it)");
  EXPECT_EQ(f.io.submitted.size(), static_cast<size_t>(kLimits.max_stalls));
}

TEST(UringScheduler, KeepsWithinTheQueueDepth) {
  Fixture f;
  // 20 writes of 100 bytes: 7 chains of at most 3, 8 ops in flight at most.
  ASSERT_TRUE(f.sched.SubmitWrite(0, f.at(0), 2000, true).ok());
  EXPECT_LE(f.io.max_in_flight, kLimits.queue_depth);
  EXPECT_GT(f.io.reaps, 0);
  EXPECT_TRUE(f.sched.WaitWrites().ok());
  EXPECT_EQ(f.io.submitted.size(), 21u);
}

TEST(UringScheduler, OverlappingWriteWaitsForTheEarlierOne) {
  Fixture f;
  ASSERT_TRUE(f.sched.SubmitWrite(0, f.at(0), 100, false).ok());
  EXPECT_EQ(f.io.reaps, 0);
  ASSERT_TRUE(f.sched.SubmitWrite(200, f.at(200), 100, false).ok());  // no overlap
  EXPECT_EQ(f.io.reaps, 0);
  ASSERT_TRUE(f.sched.SubmitWrite(50, f.at(50), 100, false).ok());  // overlaps the first
  EXPECT_EQ(f.io.reaps, 1);
  EXPECT_TRUE(f.sched.WaitWrites().ok());
}

TEST(UringScheduler, RingFailureFailsEverythingAfter) {
  Fixture f;
  ASSERT_TRUE(f.sched.SubmitWrite(0, f.at(0), 100, false).ok());
  f.sched.RingFailed(Status::IOError("/f: io_uring_wait_cqe: Bad address"));
  EXPECT_EQ(f.sched.ops_in_flight(), 0u);
  EXPECT_EQ(f.sched.SubmitWrite(0, f.at(0), 10, false).message(), "/f: io_uring_wait_cqe: Bad address");
  EXPECT_EQ(f.sched.WaitWrites().message(), "/f: io_uring_wait_cqe: Bad address");
  EXPECT_EQ(f.sched.WaitWrites().message(), "/f: io_uring_wait_cqe: Bad address");
}

}  // namespace
}  // namespace kvfile::internal
