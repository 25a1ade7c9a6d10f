// The io_uring backend of the file interface (liburing): reads, writes and
// fdatasync go through a ring; the rest (open, flock, ftruncate, fstat and the
// directory operations) are the same system calls as the POSIX backend.
//
// Ring ownership: one ring per open File (kQueueDepth submission entries, the
// kernel's default of twice that for completions), set up in Open and torn
// down by the destructor after every queued operation has completed. A File
// is used by one thread at a time, so its ring needs no lock; it may move
// from thread to thread, so the ring is not IORING_SETUP_SINGLE_ISSUER and
// keeps the default (signal-driven) task work. Per-File rings keep one
// file's queued writes and fsyncs independent of every other file's, and
// cost one file descriptor and a few pages each.
//
// ReadAt/WriteAt/Sync submit one operation at a time and wait for it, with
// the POSIX backend's loop around it: a short transfer is finished by
// submitting the rest, -EINTR/-EAGAIN are resubmitted, a read returning 0
// before n bytes is kCorruption. They (and Truncate/Size) first wait for
// every queued write, so they see the file as the POSIX backend would; a
// failure of a queued write found then is kept for WaitWrites.
//
// SubmitWrite queues without waiting: the write is split into 8 MiB SQEs,
// grouped into link chains of up to kChainWrites writes (IOSQE_IO_LINK in
// order), and with sync_after the last chain ends with a linked
// IORING_FSYNC_DATASYNC fsync. The fsync must also follow every write queued
// earlier (not linked to it), so a chain holding an fsync gets IOSQE_IO_DRAIN
// when anything else is still in flight. A write overlapping a queued write
// that has not finished waits for it, so overlapping writes land in order.
//
// Every in-flight SQE has an entry in ops_ (user_data -> chain and part);
// every chain not yet finished is in chains_ (by submission order). A chain
// is judged once all its completions are in: if a part failed with a real
// error (EIO, ENOSPC, ...) the chain's first error is kept for WaitWrites and
// nothing is retried. Otherwise the parts not done - the remainder of a short
// write, writes and the fsync cancelled (-ECANCELED) because the short write
// broke the link, -EINTR/-EAGAIN - are submitted again as a new chain in the
// same order. When writes are resubmitted, the fsyncs of later chains may
// already have run without them, so each of those is run again too (after
// its own completion arrives, with IOSQE_IO_DRAIN so that it follows the
// rewritten bytes). A thread that queued writes may exit before they are
// waited for: the kernel then fails its pending requests with -ECANCELED or
// -EFAULT, and they are resubmitted from the waiting thread (-EFAULT only
// counts as that when the thread reaping is not the one that submitted).
// Resubmission without progress gives up after kMaxStalls rounds.
//
// Fault injection (io_fault_hook.h, for tests): the hook is asked before
// each read, write and fsync SQE is prepared (so its count is of SQEs, each
// resubmission included), and its fault shows in that SQE's completion. A
// faked short count prepares the SQE with fewer bytes, so the kernel
// transfers exactly what the completion reports, and the SQEs linked after
// it in the chain are cancelled (-ECANCELED), as after a real short write. A
// faked error prepares the SQE on fd -1: it fails for real (-EBADF) without
// touching the file and the kernel cancels what is linked after it; its
// -EBADF is reported as the faked errno. Nothing else changes, and with no
// fault armed the hook costs one relaxed atomic load per SQE.
//
// SubmitWrite fails only when the ring itself does (then WaitWrites must
// still be called before the buffers are reused); a queued write's failure
// is returned by the next WaitWrites, once, and does not stop later writes.
#include <fcntl.h>
#include <liburing.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "file_backends.h"
#include "io_fault_hook.h"

namespace kvfile {
namespace {

constexpr unsigned kQueueDepth = 64;       // SQ entries; also the in-flight cap
constexpr size_t kAsyncChunk = 8u << 20;   // bytes per queued write SQE
constexpr size_t kChainWrites = 8;         // write SQEs per link chain
constexpr size_t kSyncChunk = 1u << 30;    // bytes per ReadAt/WriteAt SQE
constexpr int kMaxStalls = 1000;           // resubmissions without progress
constexpr uint64_t kSyncUserData = ~uint64_t{0};
// ReadBatch's reads: kBatchUserData + index. Queued writes count up from 1
// and never get near it.
constexpr uint64_t kBatchUserData = uint64_t{1} << 62;

bool Retryable(int res) { return res == -EINTR || res == -EAGAIN; }

std::atomic<uint64_t> g_chain_resubmissions{0};

pid_t ThisThread() {
  thread_local const pid_t tid = ::gettid();
  return tid;
}

class UringFile final : public File {
 public:
  UringFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  UringFile(const UringFile&) = delete;
  UringFile& operator=(const UringFile&) = delete;

  ~UringFile() override {
    if (ring_ready_) {
      Drain();  // the kernel must be done with the callers' buffers
      io_uring_queue_exit(&ring_);
    }
    ::close(fd_);
  }

  Status Init() {
    int r = io_uring_queue_init(kQueueDepth, &ring_, 0);
    if (r < 0) return ErrnoStatus(path_ + ": io_uring_queue_init", -r);
    ring_ready_ = true;
    return Status::OK();
  }

  Status ReadAt(uint64_t offset, void* buf, size_t n) override {
    KVFILE_RETURN_IF_ERROR(DrainForSyncOp());
    auto* p = static_cast<uint8_t*>(buf);
    int stalls = 0;
    while (n > 0) {
      unsigned len = static_cast<unsigned>(std::min(n, kSyncChunk));
      int res = 0;
      KVFILE_RETURN_IF_ERROR(RunOne(Kind::kRead, offset, p, len, &res));
      if (res < 0) {
        if (Retryable(res) && ++stalls < kMaxStalls) continue;
        return ErrnoStatus(path_ + ": read at offset " + std::to_string(offset), -res);
      }
      if (res == 0)
        return Status::Corruption(path_ + ": unexpected end of file at offset " +
                                  std::to_string(offset));
      stalls = 0;
      size_t got = std::min(static_cast<size_t>(res), n);
      p += got;
      n -= got;
      offset += got;
    }
    return Status::OK();
  }

  // Up to kQueueDepth reads per submission; a read that comes back short,
  // interrupted or at end of file is finished (or reported) by ReadAt.
  Status ReadBatch(std::span<const ReadRequest> requests) override {
    KVFILE_RETURN_IF_ERROR(DrainForSyncOp());
    for (size_t base = 0; base < requests.size(); base += kQueueDepth) {
      size_t count = std::min<size_t>(kQueueDepth, requests.size() - base);
      batch_results_.assign(count, 0);
      batch_pending_ = 0;
      for (size_t i = 0; i < count; ++i) {
        const ReadRequest& r = requests[base + i];
        if (r.n == 0 || r.n > kSyncChunk) continue;  // nothing to do, or ReadAt's job below
        io_uring_sqe* sqe = nullptr;
        KVFILE_RETURN_IF_ERROR(GetSqe(&sqe));
        auto len = static_cast<unsigned>(r.n);
        const int fd = FaultedFd(Kind::kRead, kBatchUserData + i, &len);
        io_uring_prep_read(sqe, fd, r.buf, len, r.offset);
        io_uring_sqe_set_data64(sqe, kBatchUserData + i);
        ++batch_pending_;
      }
      KVFILE_RETURN_IF_ERROR(Submit());
      while (batch_pending_ > 0) KVFILE_RETURN_IF_ERROR(ReapOne());
      for (size_t i = 0; i < count; ++i) {
        const ReadRequest& r = requests[base + i];
        int res = batch_results_[i];
        if (res < 0 && !Retryable(res))
          return ErrnoStatus(path_ + ": read at offset " + std::to_string(r.offset), -res);
        size_t got = res > 0 ? std::min(static_cast<size_t>(res), r.n) : 0;
        if (got < r.n)
          KVFILE_RETURN_IF_ERROR(ReadAt(r.offset + got, static_cast<uint8_t*>(r.buf) + got, r.n - got));
      }
    }
    return Status::OK();
  }

  Status WriteAt(uint64_t offset, const void* buf, size_t n) override {
    KVFILE_RETURN_IF_ERROR(DrainForSyncOp());
    // RunOne only writes through its buffer for Kind::kRead.
    auto* p = const_cast<uint8_t*>(static_cast<const uint8_t*>(buf));
    int stalls = 0;
    while (n > 0) {
      unsigned len = static_cast<unsigned>(std::min(n, kSyncChunk));
      int res = 0;
      KVFILE_RETURN_IF_ERROR(RunOne(Kind::kWrite, offset, p, len, &res));
      if (res < 0) {
        if (Retryable(res) && ++stalls < kMaxStalls) continue;
        return ErrnoStatus(path_ + ": write at offset " + std::to_string(offset), -res);
      }
      if (res == 0) return NoProgress(offset);
      stalls = 0;
      size_t put = std::min(static_cast<size_t>(res), n);
      p += put;
      n -= put;
      offset += put;
    }
    return Status::OK();
  }

  Status Sync() override {
    KVFILE_RETURN_IF_ERROR(DrainForSyncOp());
    for (int stalls = 0;;) {
      int res = 0;
      KVFILE_RETURN_IF_ERROR(RunOne(Kind::kFsync, 0, nullptr, 0, &res));
      if (res == 0) return Status::OK();
      if (Retryable(res) && ++stalls < kMaxStalls) continue;
      return ErrnoStatus(path_ + ": fdatasync", -res);
    }
  }

  Status Truncate(uint64_t size) override {
    Drain();
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0)
      return ErrnoStatus(path_ + ": truncate to " + std::to_string(size), errno);
    return Status::OK();
  }

  Status Size(uint64_t* size) override {
    Drain();
    struct stat st;
    if (::fstat(fd_, &st) != 0) return ErrnoStatus(path_ + ": stat", errno);
    *size = static_cast<uint64_t>(st.st_size);
    return Status::OK();
  }

  Status LockExclusive() override { return internal::LockFd(fd_, path_); }
  Status Id(FileId* id) override { return internal::FdId(fd_, path_, id); }
  Status NextData(uint64_t from, uint64_t* next) override {
    Drain();
    return internal::FdNextData(fd_, path_, from, next);
  }

  Status SubmitWrite(uint64_t offset, const void* buf, size_t n, bool sync_after) override {
    if (!ring_error_.ok()) return ring_error_;
    if (n == 0 && !sync_after) return Status::OK();
    const auto* p = static_cast<const uint8_t*>(buf);
    // Overlapping queued writes would race: let the earlier ones finish.
    while (n > 0 && OverlapsQueuedWrite(offset, n)) {
      KVFILE_RETURN_IF_ERROR(FlushRetries());
      if (!OverlapsQueuedWrite(offset, n)) break;
      KVFILE_RETURN_IF_ERROR(ReapOne());
    }
    if (n == 0) {
      Chain c;
      c.parts.push_back(Part{.fsync = true, .offset = offset});
      return Enqueue(std::move(c));
    }
    const uint64_t first_offset = offset;
    while (n > 0) {
      Chain c;
      for (size_t k = 0; k < kChainWrites && n > 0; ++k) {
        size_t len = std::min(n, kAsyncChunk);
        c.parts.push_back(Part{.offset = offset, .data = p, .len = len});
        p += len;
        n -= len;
        offset += len;
      }
      if (n == 0 && sync_after)
        c.parts.push_back(Part{.fsync = true, .after_write = true, .offset = first_offset});
      KVFILE_RETURN_IF_ERROR(Enqueue(std::move(c)));
    }
    return Status::OK();
  }

  Status WaitWrites() override {
    Drain();
    Status st = std::move(first_error_);
    first_error_ = Status::OK();
    if (st.ok() && !ring_error_.ok()) return ring_error_;
    return st;
  }

  const char* backend() const override { return "io_uring"; }
  const std::string& path() const override { return path_; }

 private:
  enum class Kind { kRead, kWrite, kFsync };

  // One SQE of a chain: a write (of what is left of it) or an fsync.
  struct Part {
    bool fsync = false;
    bool after_write = false;  // fsync: queued by a SubmitWrite with bytes
    uint64_t offset = 0;       // write: next byte; fsync: the SubmitWrite's offset
    const uint8_t* data = nullptr;
    size_t len = 0;            // write: bytes still to write
    bool done = false;
    bool in_flight = false;
    bool reissue = false;  // in-flight fsync that must run again once it completes
  };

  // SQEs submitted together, linked in order.
  struct Chain {
    std::vector<Part> parts;
    size_t outstanding = 0;  // parts in flight
    Status error;            // first real failure among the parts
    bool progress = false;   // since the chain was last (re)submitted
    int stalls = 0;          // resubmissions in a row without progress
    pid_t submitter = 0;     // thread that last submitted the chain
    int last_errno = 0;      // the last retryable error seen (not -ECANCELED)
  };

  Status NoProgress(uint64_t offset) const {
    return Status::IOError(path_ + ": write at offset " + std::to_string(offset) +
                           ": no bytes written");
  }

  bool OverlapsQueuedWrite(uint64_t offset, size_t n) const {
    for (const auto& [seq, c] : chains_)
      for (const Part& part : c.parts)
        if (!part.fsync && !part.done && part.offset < offset + n && offset < part.offset + part.len)
          return true;
    return false;
  }

  static size_t PartsLeft(const Chain& c) {
    return static_cast<size_t>(
        std::count_if(c.parts.begin(), c.parts.end(), [](const Part& p) { return !p.done; }));
  }

  // Queues a new chain once there is room for it, after every resubmission.
  Status Enqueue(Chain c) {
    const uint64_t seq = next_seq_++;
    const size_t need = c.parts.size();
    chains_.emplace(seq, std::move(c));
    for (;;) {
      KVFILE_RETURN_IF_ERROR(FlushRetries());
      if (ops_.size() + need <= kQueueDepth) break;
      KVFILE_RETURN_IF_ERROR(ReapOne());
    }
    return SubmitChain(seq);
  }

  // Submits the chains waiting to be resubmitted, oldest first.
  Status FlushRetries() {
    while (!retry_.empty()) {
      auto it = chains_.find(retry_.front());
      if (it == chains_.end()) {
        retry_.pop_front();
        continue;
      }
      if (ops_.size() + PartsLeft(it->second) > kQueueDepth) {
        KVFILE_RETURN_IF_ERROR(ReapOne());
        continue;
      }
      const uint64_t seq = retry_.front();
      retry_.pop_front();
      KVFILE_RETURN_IF_ERROR(SubmitChain(seq));
    }
    return Status::OK();
  }

  // Puts every part of chain seq that is not done into the ring, linked.
  Status SubmitChain(uint64_t seq) {
    Chain& c = chains_.at(seq);
    const size_t count = PartsLeft(c);
    bool has_fsync = false;
    for (const Part& part : c.parts) has_fsync |= part.fsync && !part.done;
    // An fsync must follow every write queued before it, linked or not.
    const bool drain = has_fsync && !ops_.empty();
    c.submitter = ThisThread();
    size_t k = 0;
    bool cancel_rest = false;  // a faked short write: the link breaks after it
    for (size_t i = 0; i < c.parts.size(); ++i) {
      Part& part = c.parts[i];
      if (part.done) continue;
      io_uring_sqe* sqe = nullptr;
      KVFILE_RETURN_IF_ERROR(GetSqe(&sqe));
      const uint64_t ud = next_user_data_++;
      auto len = static_cast<unsigned>(part.len);
      int fd = -1;
      if (cancel_rest) {
        // Not run, as behind a real short write: the first of the rest
        // fails on fd -1 (reported as cancelled), the kernel cancels the others.
        injected_[ud] = -ECANCELED;
      } else {
        fd = FaultedFd(part.fsync ? Kind::kFsync : Kind::kWrite, ud, &len);
        cancel_rest = !part.fsync && len < part.len;
      }
      if (part.fsync) {
        io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC);
      } else {
        io_uring_prep_write(sqe, fd, part.data, len, part.offset);
      }
      unsigned flags = 0;
      if (++k < count) flags |= IOSQE_IO_LINK;
      if (k == 1 && drain) flags |= IOSQE_IO_DRAIN;
      io_uring_sqe_set_flags(sqe, flags);
      io_uring_sqe_set_data64(sqe, ud);
      ops_.emplace(ud, std::make_pair(seq, i));
      part.in_flight = true;
      ++c.outstanding;
    }
    return Submit();  // may complete (and erase) the chain: c is not used after
  }

  Status GetSqe(io_uring_sqe** out) {
    for (int tries = 0; tries < 2; ++tries) {
      if ((*out = io_uring_get_sqe(&ring_)) != nullptr) return Status::OK();
      KVFILE_RETURN_IF_ERROR(Submit());
    }
    return RingFailure("io_uring_get_sqe", EBUSY);
  }

  // Hands every prepared SQE to the kernel.
  Status Submit() {
    for (int tries = 0; io_uring_sq_ready(&ring_) > 0;) {
      int r = io_uring_submit(&ring_);
      if (r > 0 || r == -EINTR) continue;
      if ((r == 0 || r == -EAGAIN || r == -EBUSY) && ++tries < 10000) {
        // Out of kernel resources for now: take what has completed, pause.
        ReapReady();
        struct timespec pause = {0, 100000};
        ::nanosleep(&pause, nullptr);
        continue;
      }
      return RingFailure("io_uring_submit", r < 0 ? -r : EBUSY);
    }
    return Status::OK();
  }

  // Waits for at least one completion, then handles every completion ready.
  Status ReapOne() {
    io_uring_cqe* cqe = nullptr;
    int r;
    do {
      r = io_uring_wait_cqe(&ring_, &cqe);
    } while (r == -EINTR);
    if (r < 0) return RingFailure("io_uring_wait_cqe", -r);
    ReapReady();
    return Status::OK();
  }

  void ReapReady() {
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(&ring_, &cqe) == 0 && cqe != nullptr) {
      const uint64_t ud = cqe->user_data;
      int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      if (!injected_.empty()) res = InjectedResult(ud, res);
      Complete(ud, res);
    }
  }

  // The fault hook's say on an SQE about to be prepared for `kind` with
  // *len bytes (see the top of this file): the fd to prepare it with, and
  // *len shortened for a faked short count.
  int FaultedFd(Kind kind, uint64_t ud, unsigned* len) {
    const auto op = kind == Kind::kRead    ? internal::IoFault::kRead
                    : kind == Kind::kWrite ? internal::IoFault::kWrite
                                           : internal::IoFault::kSync;
    ssize_t fake = 0;
    if (!internal::TakeIoFault(op, kind == Kind::kFsync ? 0 : *len, &fake)) return fd_;
    if (fake > 0) {
      *len = static_cast<unsigned>(fake);
      return fd_;
    }
    injected_[ud] = static_cast<int>(fake);
    return -1;
  }

  // The result to report for a completion the fault hook had a say in: the
  // faked errno for the -EBADF of an SQE prepared on fd -1. Any other result
  // (-ECANCELED: cancelled by an earlier failure in its link) is real.
  int InjectedResult(uint64_t ud, int res) {
    auto it = injected_.find(ud);
    if (it == injected_.end()) return res;
    if (res == -EBADF) res = it->second;
    injected_.erase(it);
    return res;
  }

  void Complete(uint64_t ud, int res) {
    if (ud == kSyncUserData) {
      sync_res_ = res;
      sync_done_ = true;
      return;
    }
    if (ud >= kBatchUserData && ud - kBatchUserData < batch_results_.size()) {
      batch_results_[ud - kBatchUserData] = res;
      --batch_pending_;
      return;
    }
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
    const bool retry = Retryable(res) || res == -ECANCELED ||
                       (res == -EFAULT && c.submitter != ThisThread());
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

  std::string FsyncWhat(const Part& part) const {
    if (!part.after_write) return path_ + ": fdatasync";
    return path_ + ": fdatasync after write at offset " + std::to_string(part.offset);
  }

  // All of a chain's completions are in: done, failed, or to be resubmitted.
  void FinishChain(std::map<uint64_t, Chain>::iterator it) {
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
    } else if (++c.stalls >= kMaxStalls) {
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

  void Record(const Status& st) {
    if (first_error_.ok()) first_error_ = st;
  }

  // The ring itself failed: nothing queued can be trusted to complete.
  Status RingFailure(const char* what, int err) {
    ring_error_ = ErrnoStatus(path_ + ": " + what, err);
    Record(ring_error_);
    ops_.clear();
    chains_.clear();
    retry_.clear();
    injected_.clear();
    return ring_error_;
  }

  // Waits for every queued write and fsync (resubmitting what must be).
  void Drain() {
    while (ring_error_.ok()) {
      if (!FlushRetries().ok() || chains_.empty()) return;
      if (!ReapOne().ok()) return;
    }
  }

  Status DrainForSyncOp() {
    Drain();
    return ring_error_;
  }

  // Runs one read, write or fsync and waits for its result (after Drain).
  Status RunOne(Kind kind, uint64_t offset, uint8_t* p, unsigned len, int* res) {
    io_uring_sqe* sqe = nullptr;
    KVFILE_RETURN_IF_ERROR(GetSqe(&sqe));
    const int fd = FaultedFd(kind, kSyncUserData, &len);
    switch (kind) {
      case Kind::kRead: io_uring_prep_read(sqe, fd, p, len, offset); break;
      case Kind::kWrite: io_uring_prep_write(sqe, fd, p, len, offset); break;
      case Kind::kFsync: io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC); break;
    }
    io_uring_sqe_set_data64(sqe, kSyncUserData);
    sync_done_ = false;
    KVFILE_RETURN_IF_ERROR(Submit());
    while (!sync_done_) KVFILE_RETURN_IF_ERROR(ReapOne());
    *res = sync_res_;
    return Status::OK();
  }

  std::string path_;
  int fd_;
  io_uring ring_{};
  bool ring_ready_ = false;

  std::map<uint64_t, Chain> chains_;  // unfinished chains, by submission order
  std::unordered_map<uint64_t, std::pair<uint64_t, size_t>> ops_;  // in flight: user_data -> (chain, part)
  std::deque<uint64_t> retry_;        // chains waiting to be resubmitted
  std::unordered_map<uint64_t, int> injected_;  // user_data -> faked result (tests)
  uint64_t next_seq_ = 1;
  uint64_t next_user_data_ = 1;
  Status first_error_;  // for WaitWrites
  Status ring_error_;   // the ring is unusable
  bool sync_done_ = false;
  int sync_res_ = 0;
  std::vector<int> batch_results_;  // ReadBatch: result of each read in flight
  size_t batch_pending_ = 0;
};

class UringFileSystem final : public FileSystem {
 public:
  Status Open(const std::string& path, OpenMode mode, std::unique_ptr<File>* out) override {
    int fd;
    KVFILE_RETURN_IF_ERROR(internal::OpenFd(path, mode, &fd));
    auto file = std::make_unique<UringFile>(path, fd);  // owns fd from here
    KVFILE_RETURN_IF_ERROR(file->Init());
    *out = std::move(file);
    return Status::OK();
  }

  // Directory operations are the POSIX backend's.
  Status Rename(const std::string& from, const std::string& to, bool replace) override {
    return internal::PosixFileSystemInstance()->Rename(from, to, replace);
  }
  Status Remove(const std::string& path) override {
    return internal::PosixFileSystemInstance()->Remove(path);
  }
  Status SyncDir(const std::string& dir) override {
    return internal::PosixFileSystemInstance()->SyncDir(dir);
  }
  Status Exists(const std::string& path, bool* exists) override {
    return internal::PosixFileSystemInstance()->Exists(path, exists);
  }
  Status PathId(const std::string& path, FileId* id) override {
    return internal::PosixFileSystemInstance()->PathId(path, id);
  }
  Status Stat(const std::string& path, PathInfo* info) override {
    return internal::PosixFileSystemInstance()->Stat(path, info);
  }
  Status ResolveSymlinks(const std::string& path, std::string* target) override {
    return internal::PosixFileSystemInstance()->ResolveSymlinks(path, target);
  }
  Status CopyAttributes(const PathInfo& like, const std::string& path) override {
    return internal::PosixFileSystemInstance()->CopyAttributes(like, path);
  }
  Status ListDir(const std::string& dir, std::vector<std::string>* names) override {
    return internal::PosixFileSystemInstance()->ListDir(dir, names);
  }
};

// Can this process set up a ring, and does the kernel have the operations
// this backend uses, and does a submission round trip work (seccomp may
// allow io_uring_setup but not io_uring_enter)?
Status ProbeUring() {
  io_uring ring{};
  int r = io_uring_queue_init(kQueueDepth, &ring, 0);
  if (r < 0) return ErrnoStatus("io_uring unavailable: io_uring_queue_init", -r);
  Status st;
  if (io_uring_probe* probe = io_uring_get_probe_ring(&ring)) {
    if (!io_uring_opcode_supported(probe, IORING_OP_READ) ||
        !io_uring_opcode_supported(probe, IORING_OP_WRITE) ||
        !io_uring_opcode_supported(probe, IORING_OP_FSYNC))
      st = Status::Unsupported("io_uring unavailable: the kernel lacks read, write or fsync");
    io_uring_free_probe(probe);
  } else {
    st = Status::Unsupported("io_uring unavailable: the kernel cannot list its operations");
  }
  if (st.ok()) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    io_uring_prep_nop(sqe);
    do {
      r = io_uring_submit(&ring);
    } while (r == -EINTR);
    if (r < 0) st = ErrnoStatus("io_uring unavailable: io_uring_submit", -r);
  }
  if (st.ok()) {
    io_uring_cqe* cqe = nullptr;
    do {
      r = io_uring_wait_cqe(&ring, &cqe);
    } while (r == -EINTR);
    if (r < 0) {
      st = ErrnoStatus("io_uring unavailable: io_uring_wait_cqe", -r);
    } else {
      if (cqe->res < 0) st = ErrnoStatus("io_uring unavailable: nop", -cqe->res);
      io_uring_cqe_seen(&ring, cqe);
    }
  }
  io_uring_queue_exit(&ring);
  return st;
}

}  // namespace

namespace internal {

Status NewUringFileSystem(std::unique_ptr<FileSystem>* out) {
  KVFILE_RETURN_IF_ERROR(ProbeUring());
  *out = std::make_unique<UringFileSystem>();
  return Status::OK();
}

Status UringFileSystemInstance(FileSystem** out) {
  struct Probed {
    Status status;
    FileSystem* fs = nullptr;  // never destroyed, like the POSIX instance
  };
  static const Probed probed = [] {
    Probed p;
    std::unique_ptr<FileSystem> fs;
    p.status = NewUringFileSystem(&fs);
    if (p.status.ok()) p.fs = fs.release();
    return p;
  }();
  *out = probed.fs;
  return probed.status;
}

uint64_t UringChainResubmissions() {
  return g_chain_resubmissions.load(std::memory_order_relaxed);
}

}  // namespace internal

}  // namespace kvfile
