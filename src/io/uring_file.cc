// SPDX-License-Identifier: Apache-2.0
// The io_uring backend of the file interface (liburing): reads, writes and
// fdatasync go through a ring; the rest (open, flock, ftruncate, fstat and the
// directory operations) are the same system calls as the POSIX backend.
//
// Three parts: the ring (uring_ring.h: submission, completion, the kernel's
// retries), the write-chain scheduler (write_chain_scheduler.h: the queued
// writes and fsyncs as pure logic, everything from "SubmitWrite queues" to
// "Resubmission without progress" below) and this file, the File adapter:
// the synchronous operations, the syscall filter, and the routing of
// completions to their owner.
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
// grouped into link chains of up to 8 writes (Limits::chain_writes) (IOSQE_IO_LINK in
// order), and with sync_after the last chain ends with a linked
// IORING_FSYNC_DATASYNC fsync. The fsync must also follow every write queued
// earlier (not linked to it), so a chain holding an fsync gets IOSQE_IO_DRAIN
// when anything else is still in flight. A write overlapping a queued write
// that has not finished waits for it, so overlapping writes land in order.
//
// Every in-flight SQE has an entry in the scheduler's ops_ (user_data -> chain and part);
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
// Fault injection (syscall_filter.h, for tests): in a file system made
// with a SyscallFilter, the filter is asked before each read, write and
// fsync SQE is prepared (so its count is of SQEs, each
// resubmission included), and its fault shows in that SQE's completion. A
// faked short count prepares the SQE with fewer bytes, so the kernel
// transfers exactly what the completion reports, and the SQEs linked after
// it in the chain are cancelled (-ECANCELED), as after a real short write. A
// faked error prepares the SQE on fd -1: it fails for real (-EBADF) without
// touching the file and the kernel cancels what is linked after it; its
// -EBADF is reported as the faked errno. Nothing else changes, and without
// a filter the check costs one null pointer test per SQE.
//
// SubmitWrite fails only when the ring itself does (then WaitWrites must
// still be called before the buffers are reused); a queued write's failure
// is returned by the next WaitWrites, once, and does not stop later writes.
#include <fcntl.h>
#include <liburing.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "io/file_backends.h"
#include "io/syscall_filter.h"
#include "io/uring_ring.h"
#include "writer/write_chain_scheduler.h"

namespace kvfile {
namespace {

using internal::ChainOp;
using internal::UringRing;
using internal::WriteChainScheduler;

constexpr unsigned kQueueDepth = 64;       // SQ entries; also the in-flight cap
constexpr size_t kSyncChunk = 1u << 30;    // bytes per ReadAt/WriteAt SQE
constexpr int kMaxStalls = 1000;           // resubmissions without progress
constexpr uint64_t kSyncUserData = ~uint64_t{0};
// ReadBatch's reads: kBatchUserData + index. Queued writes count up from 1
// and never get near it.
constexpr uint64_t kBatchUserData = uint64_t{1} << 62;

constexpr WriteChainScheduler::Limits kChainLimits{
    .queue_depth = kQueueDepth, .write_bytes = 8u << 20, .chain_writes = 8, .max_stalls = kMaxStalls};

bool Retryable(int res) { return res == -EINTR || res == -EAGAIN; }

class UringFile final : public File, private internal::ChainIo {
 public:
  UringFile(std::string path, int fd, internal::SyscallFilter* filter)
      : path_(std::move(path)),
        fd_(fd),
        filter_(filter),
        ring_(path_, [this](uint64_t ud, int res) { OnCompletion(ud, res); }),
        chains_(path_, this, kChainLimits) {}
  UringFile(const UringFile&) = delete;
  UringFile& operator=(const UringFile&) = delete;

  ~UringFile() override {
    if (ring_.ready()) {
      Drain();  // the kernel must be done with the callers' buffers
      ring_.Close();
    }
    ::close(fd_);
  }

  Status Init() { return ring_.Init(kQueueDepth); }
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
        KVFILE_RETURN_IF_ERROR(Ring(ring_.GetSqe(&sqe)));
        auto len = static_cast<unsigned>(r.n);
        const int fd = FaultedFd(Kind::kRead, kBatchUserData + i, &len);
        io_uring_prep_read(sqe, fd, r.buf, len, r.offset);
        io_uring_sqe_set_data64(sqe, kBatchUserData + i);
        ++batch_pending_;
      }
      KVFILE_RETURN_IF_ERROR(Submit());
      while (batch_pending_ > 0) KVFILE_RETURN_IF_ERROR(Reap());
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
    return chains_.SubmitWrite(offset, buf, n, sync_after);
  }

  Status WaitWrites() override { return chains_.WaitWrites(); }

  const char* backend() const override { return "io_uring"; }
  const std::string& path() const override { return path_; }

 private:
  enum class Kind { kRead, kWrite, kFsync };

  Status NoProgress(uint64_t offset) const {
    return Status::IOError(path_ + ": write at offset " + std::to_string(offset) + ": no bytes written");
  }

  // The ring's failures: nothing queued can be trusted to complete.
  Status Ring(Status st) {
    if (!st.ok()) {
      chains_.RingFailed(st);
      injected_.clear();
    }
    return st;
  }

  // internal::ChainIo: the scheduler's ops go into the ring, through the
  // filter (if any). A faked short write cancels the rest of its chain.
  Status Prepare(const ChainOp& op) override {
    io_uring_sqe* sqe = nullptr;
    KVFILE_RETURN_IF_ERROR(Ring(ring_.GetSqe(&sqe)));
    if (op.first_in_chain) cancel_rest_ = false;
    auto len = static_cast<unsigned>(op.len);
    int fd = -1;
    if (cancel_rest_) {
      // Not run, as behind a real short write: the first of the rest
      // fails on fd -1 (reported as cancelled), the kernel cancels the others.
      injected_[op.user_data] = -ECANCELED;
    } else {
      fd = FaultedFd(op.fsync ? Kind::kFsync : Kind::kWrite, op.user_data, &len);
      cancel_rest_ = !op.fsync && len < op.len;
    }
    if (op.fsync) {
      io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC);
    } else {
      io_uring_prep_write(sqe, fd, op.data, len, op.offset);
    }
    unsigned flags = 0;
    if (op.link) flags |= IOSQE_IO_LINK;
    if (op.drain) flags |= IOSQE_IO_DRAIN;
    io_uring_sqe_set_flags(sqe, flags);
    io_uring_sqe_set_data64(sqe, op.user_data);
    return Status::OK();
  }
  Status Submit() override { return Ring(ring_.Submit()); }
  Status Reap() override { return Ring(ring_.WaitAndDeliver()); }

  // Every completion: a synchronous op's, a batch read's, or the scheduler's.
  void OnCompletion(uint64_t ud, int res) {
    if (!injected_.empty()) res = InjectedResult(ud, res);
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
    chains_.Complete(ud, res);
  }

  // The filter's say on an SQE about to be prepared for `kind` with
  // *len bytes (see the top of this file): the fd to prepare it with, and
  // *len shortened for a faked short count.
  int FaultedFd(Kind kind, uint64_t ud, unsigned* len) {
    if (filter_ == nullptr) return fd_;
    const auto op = kind == Kind::kRead    ? internal::IoCall::kRead
                    : kind == Kind::kWrite ? internal::IoCall::kWrite
                                           : internal::IoCall::kSync;
    ssize_t fake = 0;
    if (!filter_->Intercept(op, kind == Kind::kFsync ? 0 : *len, &fake)) return fd_;
    if (fake > 0) {
      *len = static_cast<unsigned>(fake);
      return fd_;
    }
    injected_[ud] = static_cast<int>(fake);
    return -1;
  }

  // The result to report for a completion the filter had a say in: the
  // faked errno for the -EBADF of an SQE prepared on fd -1. Any other result
  // (-ECANCELED: cancelled by an earlier failure in its link) is real.
  int InjectedResult(uint64_t ud, int res) {
    auto it = injected_.find(ud);
    if (it == injected_.end()) return res;
    if (res == -EBADF) res = it->second;
    injected_.erase(it);
    return res;
  }

  // Waits for every queued write and fsync (resubmitting what must be).
  void Drain() { chains_.Drain(); }

  Status DrainForSyncOp() {
    Drain();
    return chains_.ring_error();
  }

  // Runs one read, write or fsync and waits for its result (after Drain).
  Status RunOne(Kind kind, uint64_t offset, uint8_t* p, unsigned len, int* res) {
    io_uring_sqe* sqe = nullptr;
    KVFILE_RETURN_IF_ERROR(Ring(ring_.GetSqe(&sqe)));
    const int fd = FaultedFd(kind, kSyncUserData, &len);
    switch (kind) {
      case Kind::kRead: io_uring_prep_read(sqe, fd, p, len, offset); break;
      case Kind::kWrite: io_uring_prep_write(sqe, fd, p, len, offset); break;
      case Kind::kFsync: io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC); break;
    }
    io_uring_sqe_set_data64(sqe, kSyncUserData);
    sync_done_ = false;
    KVFILE_RETURN_IF_ERROR(Submit());
    while (!sync_done_) KVFILE_RETURN_IF_ERROR(Reap());
    *res = sync_res_;
    return Status::OK();
  }

  std::string path_;
  int fd_;
  internal::SyscallFilter* filter_;  // nullptr: none
  UringRing ring_;
  WriteChainScheduler chains_;
  std::unordered_map<uint64_t, int> injected_;  // user_data -> faked result (tests)
  bool cancel_rest_ = false;  // a faked short write: the rest of its chain is cancelled
  bool sync_done_ = false;
  int sync_res_ = 0;
  std::vector<int> batch_results_;  // ReadBatch: result of each read in flight
  size_t batch_pending_ = 0;
};

class UringFileSystem final : public FileSystem {
 public:
  // Directory operations are the POSIX backend's (with the same filter).
  explicit UringFileSystem(internal::SyscallFilter* filter) : filter_(filter) {
    if (filter == nullptr) {
      dirs_ = internal::PosixFileSystemInstance();
    } else {
      own_dirs_ = internal::NewPosixFileSystem(filter);
      dirs_ = own_dirs_.get();
    }
  }

  Status Open(const std::string& path, OpenMode mode, std::unique_ptr<File>* out) override {
    int fd;
    KVFILE_RETURN_IF_ERROR(internal::OpenFd(path, mode, &fd));
    auto file = std::make_unique<UringFile>(path, fd, filter_);  // owns fd from here
    KVFILE_RETURN_IF_ERROR(file->Init());
    *out = std::move(file);
    return Status::OK();
  }

  Status Rename(const std::string& from, const std::string& to, bool replace) override {
    return dirs_->Rename(from, to, replace);
  }
  Status Remove(const std::string& path) override { return dirs_->Remove(path); }
  Status SyncDir(const std::string& dir) override { return dirs_->SyncDir(dir); }
  Status Exists(const std::string& path, bool* exists) override { return dirs_->Exists(path, exists); }
  Status PathId(const std::string& path, FileId* id) override { return dirs_->PathId(path, id); }
  Status Stat(const std::string& path, PathInfo* info) override { return dirs_->Stat(path, info); }
  Status ResolveSymlinks(const std::string& path, std::string* target) override {
    return dirs_->ResolveSymlinks(path, target);
  }
  Status CopyAttributes(const PathInfo& like, const std::string& path) override {
    return dirs_->CopyAttributes(like, path);
  }
  Status ListDir(const std::string& dir, std::vector<std::string>* names) override {
    return dirs_->ListDir(dir, names);
  }

 private:
  internal::SyscallFilter* filter_;  // nullptr: none
  std::unique_ptr<FileSystem> own_dirs_;
  FileSystem* dirs_;
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

Status NewUringFileSystem(std::unique_ptr<FileSystem>* out, SyscallFilter* filter) {
  KVFILE_RETURN_IF_ERROR(ProbeUring());
  *out = std::make_unique<UringFileSystem>(filter);
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

uint64_t UringChainResubmissions() { return WriteChainScheduler::Resubmissions(); }

}  // namespace internal

}  // namespace kvfile
