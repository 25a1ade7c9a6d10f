// SPDX-License-Identifier: Apache-2.0
// The io_uring backend's write-chain scheduler (see write_chain_scheduler.h;
// the rules it follows are described at the top of uring_file.cc).
#include "writer/write_chain_scheduler.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

namespace kvfile::internal {

namespace {

bool Retryable(int res) { return res == -EINTR || res == -EAGAIN; }

std::atomic<uint64_t> g_chain_resubmissions{0};

pid_t ThisThread() {
  thread_local const pid_t tid = ::gettid();
  return tid;
}

}  // namespace

uint64_t WriteChainScheduler::Resubmissions() { return g_chain_resubmissions.load(std::memory_order_relaxed); }

Status WriteChainScheduler::SubmitWrite(uint64_t offset, const void* buf, size_t n, bool sync_after) {
  if (!ring_error_.ok()) return ring_error_;
  if (n == 0 && !sync_after) return Status::OK();
  const auto* p = static_cast<const uint8_t*>(buf);
  // Overlapping queued writes would race: let the earlier ones finish.
  while (n > 0 && OverlapsQueuedWrite(offset, n)) {
    KVFILE_RETURN_IF_ERROR(FlushRetries());
    if (!OverlapsQueuedWrite(offset, n)) break;
    KVFILE_RETURN_IF_ERROR(io_->Reap());
  }
  if (n == 0) {
    Chain c;
    c.parts.push_back(Part{.fsync = true, .offset = offset});
    return Enqueue(std::move(c));
  }
  const uint64_t first_offset = offset;
  while (n > 0) {
    Chain c;
    for (size_t k = 0; k < limits_.chain_writes && n > 0; ++k) {
      size_t len = std::min(n, limits_.write_bytes);
      c.parts.push_back(Part{.offset = offset, .data = p, .len = len});
      p += len;
      n -= len;
      offset += len;
    }
    if (n == 0 && sync_after) c.parts.push_back(Part{.fsync = true, .after_write = true, .offset = first_offset});
    KVFILE_RETURN_IF_ERROR(Enqueue(std::move(c)));
  }
  return Status::OK();
}

Status WriteChainScheduler::WaitWrites() {
  Drain();
  Status st = std::move(first_error_);
  first_error_ = Status::OK();
  if (st.ok() && !ring_error_.ok()) return ring_error_;
  return st;
}

void WriteChainScheduler::Drain() {
  while (ring_error_.ok()) {
    if (!FlushRetries().ok() || chains_.empty()) return;
    if (!io_->Reap().ok()) return;
  }
}

Status WriteChainScheduler::NoProgress(uint64_t offset) const {
  return Status::IOError(path_ + ": write at offset " + std::to_string(offset) + ": no bytes written");
}

std::string WriteChainScheduler::FsyncWhat(const Part& part) const {
  if (!part.after_write) return path_ + ": fdatasync";
  return path_ + ": fdatasync after write at offset " + std::to_string(part.offset);
}

bool WriteChainScheduler::OverlapsQueuedWrite(uint64_t offset, size_t n) const {
  for (const auto& [seq, c] : chains_)
    for (const Part& part : c.parts)
      if (!part.fsync && !part.done && part.offset < offset + n && offset < part.offset + part.len) return true;
  return false;
}

size_t WriteChainScheduler::PartsLeft(const Chain& c) {
  return static_cast<size_t>(std::count_if(c.parts.begin(), c.parts.end(), [](const Part& p) { return !p.done; }));
}

// Queues a new chain once there is room for it, after every resubmission.
Status WriteChainScheduler::Enqueue(Chain c) {
  const uint64_t seq = next_seq_++;
  const size_t need = c.parts.size();
  chains_.emplace(seq, std::move(c));
  for (;;) {
    KVFILE_RETURN_IF_ERROR(FlushRetries());
    if (ops_.size() + need <= limits_.queue_depth) break;
    KVFILE_RETURN_IF_ERROR(io_->Reap());
  }
  return SubmitChain(seq);
}

// Submits the chains waiting to be resubmitted, oldest first.
Status WriteChainScheduler::FlushRetries() {
  while (!retry_.empty()) {
    auto it = chains_.find(retry_.front());
    if (it == chains_.end()) {
      retry_.pop_front();
      continue;
    }
    if (ops_.size() + PartsLeft(it->second) > limits_.queue_depth) {
      KVFILE_RETURN_IF_ERROR(io_->Reap());
      continue;
    }
    const uint64_t seq = retry_.front();
    retry_.pop_front();
    KVFILE_RETURN_IF_ERROR(SubmitChain(seq));
  }
  return Status::OK();
}

// Hands every part of chain seq that is not done to the ChainIo, linked.
Status WriteChainScheduler::SubmitChain(uint64_t seq) {
  Chain& c = chains_.at(seq);
  const size_t count = PartsLeft(c);
  bool has_fsync = false;
  for (const Part& part : c.parts) has_fsync |= part.fsync && !part.done;
  // An fsync must follow every write queued before it, linked or not.
  const bool drain = has_fsync && !ops_.empty();
  c.submitter = ThisThread();
  size_t k = 0;
  for (size_t i = 0; i < c.parts.size(); ++i) {
    Part& part = c.parts[i];
    if (part.done) continue;
    ChainOp op{.user_data = next_user_data_++,
               .fsync = part.fsync,
               .offset = part.offset,
               .data = part.data,
               .len = part.len,
               .first_in_chain = k == 0,
               .link = k + 1 < count,
               .drain = k == 0 && drain};
    ++k;
    KVFILE_RETURN_IF_ERROR(io_->Prepare(op));
    ops_.emplace(op.user_data, std::make_pair(seq, i));
    part.in_flight = true;
    ++c.outstanding;
  }
  return io_->Submit();  // may complete (and erase) the chain: c is not used after
}

void WriteChainScheduler::Complete(uint64_t ud, int res) {
  auto op = ops_.find(ud);
  if (op == ops_.end()) return;
  const auto [seq, idx] = op->second;
  ops_.erase(op);
  auto it = chains_.find(seq);
  if (it == chains_.end()) return;
  Chain& c = it->second;
  Part& part = c.parts[idx];
  part.in_flight = false;
  --c.outstanding;
  // -ECANCELED: the link broke (a short write, -EINTR...) or the thread
  // that submitted it exited. -EFAULT from a thread other than this one:
  // the kernel fails the requests of an exiting thread with -EFAULT (a
  // really bad buffer fails again when resubmitted from this thread).
  const bool retry = Retryable(res) || res == -ECANCELED || (res == -EFAULT && c.submitter != ThisThread());
  if (retry && res < 0 && res != -ECANCELED) c.last_errno = -res;
  if (part.fsync) {
    if (res == 0) {
      c.progress = true;
      part.done = !part.reissue;
    } else if (!retry && c.error.ok()) {
      c.error = ErrnoStatus(FsyncWhat(part), -res);
    }
    part.reissue = false;
  } else if (res > 0) {
    size_t put = std::min(static_cast<size_t>(res), part.len);
    part.data += put;
    part.len -= put;
    part.offset += put;
    part.done = part.len == 0;
    c.progress = true;
  } else if (res == 0) {
    if (c.error.ok()) c.error = NoProgress(part.offset);
  } else if (!retry && c.error.ok()) {
    c.error = ErrnoStatus(path_ + ": write at offset " + std::to_string(part.offset), -res);
  }
  if (c.outstanding == 0) FinishChain(it);
}

// All of a chain's completions are in: done, failed, or to be resubmitted.
void WriteChainScheduler::FinishChain(std::map<uint64_t, Chain>::iterator it) {
  const uint64_t seq = it->first;
  Chain& c = it->second;
  if (!c.error.ok()) {
    Record(c.error);
    chains_.erase(it);
    return;
  }
  bool writes_left = false;
  for (const Part& part : c.parts) writes_left |= !part.fsync && !part.done;
  if (writes_left) {
    // The chain's fsync (cancelled, or run early) must follow the rest.
    for (Part& part : c.parts)
      if (part.fsync) part.done = false;
  }
  if (PartsLeft(c) == 0) {
    chains_.erase(it);
    return;
  }
  if (c.progress) {
    c.stalls = 0;
  } else if (++c.stalls >= limits_.max_stalls) {
    // Name the operation that made no progress, and why.
    std::string what = path_;
    for (const Part& part : c.parts)
      if (!part.done) {
        what = part.fsync ? FsyncWhat(part) : path_ + ": write at offset " + std::to_string(part.offset);
        break;
      }
    std::string why = c.last_errno ? std::string(": ") + std::strerror(c.last_errno) : "";
    Record(Status::IOError(what + why + " (io_uring kept interrupting or cancelling it)"));
    chains_.erase(it);
    return;
  }
  c.progress = false;
  if (writes_left) {
    // Later fsyncs may have run before these bytes: run each again.
    for (auto later = std::next(it); later != chains_.end(); ++later)
      for (Part& part : later->second.parts)
        if (part.fsync) {
          if (part.in_flight)
            part.reissue = true;
          else
            part.done = false;
        }
  }
  retry_.push_back(seq);
  g_chain_resubmissions.fetch_add(1, std::memory_order_relaxed);
}

void WriteChainScheduler::Record(const Status& st) {
  if (first_error_.ok()) first_error_ = st;
}

void WriteChainScheduler::RingFailed(const Status& st) {
  ring_error_ = st;
  Record(st);
  ops_.clear();
  chains_.clear();
  retry_.clear();
}

}  // namespace kvfile::internal
