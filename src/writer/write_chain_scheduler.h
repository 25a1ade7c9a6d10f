// SPDX-License-Identifier: Apache-2.0
// WriteChainScheduler: the io_uring backend's queued writes as pure logic.
// It decides which write and fsync operations to submit, in which linked
// chains and with which flags, and what to do with each completion (short
// writes, -EINTR/-EAGAIN, cancellations, real errors); a ChainIo carries
// the operations out (the ring in uring_file.cc, a script in
// tests/uring_scheduler_test.cc). The rules are described at the top of
// uring_file.cc.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvfile/status.h"

namespace kvfile::internal {

// One operation the scheduler wants submitted: a write of [data, data+len)
// at offset, or an fdatasync.
struct ChainOp {
  uint64_t user_data = 0;  // from 1 up; the completion names it
  bool fsync = false;
  uint64_t offset = 0;
  const uint8_t* data = nullptr;
  size_t len = 0;
  bool first_in_chain = false;
  bool link = false;   // IOSQE_IO_LINK: the next op of the chain waits for this one
  bool drain = false;  // IOSQE_IO_DRAIN: runs after everything submitted before
};

// What the scheduler runs on.
class ChainIo {
 public:
  virtual ~ChainIo() = default;
  // Queues one op; the ops of a chain come in order, then Submit().
  virtual Status Prepare(const ChainOp& op) = 0;
  virtual Status Submit() = 0;
  // Waits for at least one completion and hands every completion ready to
  // WriteChainScheduler::Complete.
  virtual Status Reap() = 0;
};

class WriteChainScheduler {
 public:
  struct Limits {
    size_t queue_depth = 64;         // ops in flight at most
    size_t write_bytes = 8u << 20;   // bytes per write op
    size_t chain_writes = 8;         // write ops per linked chain
    int max_stalls = 1000;           // resubmissions of a chain without progress
  };

  WriteChainScheduler(std::string path, ChainIo* io, Limits limits) : path_(std::move(path)), io_(io), limits_(limits) {}

  // Queues a write of buf[0, n) at offset (none when n is 0), followed when
  // sync_after by an fdatasync that covers it and every write before it.
  Status SubmitWrite(uint64_t offset, const void* buf, size_t n, bool sync_after);
  // Waits for every queued op; returns the first failure since the last
  // call (once), or the ring's failure.
  Status WaitWrites();
  // Waits for every queued op (resubmitting what must be).
  void Drain();

  // A completion of one of this scheduler's ops (others are ignored).
  void Complete(uint64_t user_data, int res);
  // The ring failed: nothing queued can be trusted to complete. Every later
  // call fails with `st`.
  void RingFailed(const Status& st);
  const Status& ring_error() const { return ring_error_; }

  size_t ops_in_flight() const { return ops_.size(); }
  // Chains resubmitted so far, by every scheduler of the process.
  static uint64_t Resubmissions();

 private:
  // One op of a chain: a write (of what is left of it) or an fsync.
  struct Part {
    bool fsync = false;
    bool after_write = false;  // fsync: queued by a SubmitWrite with bytes
    uint64_t offset = 0;       // write: next byte; fsync: the SubmitWrite's offset
    const uint8_t* data = nullptr;
    size_t len = 0;  // write: bytes still to write
    bool done = false;
    bool in_flight = false;
    bool reissue = false;  // in-flight fsync that must run again once it completes
  };

  // Ops submitted together, linked in order.
  struct Chain {
    std::vector<Part> parts;
    size_t outstanding = 0;  // parts in flight
    Status error;            // first real failure among the parts
    bool progress = false;   // since the chain was last (re)submitted
    int stalls = 0;          // resubmissions in a row without progress
    pid_t submitter = 0;     // thread that last submitted the chain
    int last_errno = 0;      // the last retryable error seen (not -ECANCELED)
  };

  Status NoProgress(uint64_t offset) const;
  std::string FsyncWhat(const Part& part) const;
  bool OverlapsQueuedWrite(uint64_t offset, size_t n) const;
  static size_t PartsLeft(const Chain& c);
  Status Enqueue(Chain c);
  Status FlushRetries();
  Status SubmitChain(uint64_t seq);
  void FinishChain(std::map<uint64_t, Chain>::iterator it);
  void Record(const Status& st);

  std::string path_;
  ChainIo* io_;
  Limits limits_;
  std::map<uint64_t, Chain> chains_;  // unfinished chains, by submission order
  std::unordered_map<uint64_t, std::pair<uint64_t, size_t>> ops_;  // in flight: user_data -> (chain, part)
  std::deque<uint64_t> retry_;  // chains waiting to be resubmitted
  uint64_t next_seq_ = 1;
  uint64_t next_user_data_ = 1;
  Status first_error_;  // for WaitWrites
  Status ring_error_;   // the ring is unusable
};

}  // namespace kvfile::internal
