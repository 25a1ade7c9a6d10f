// SPDX-License-Identifier: Apache-2.0
// UringRing: submission and completion over liburing (see uring_ring.h).
#include "io/uring_ring.h"

#include <time.h>

#include <cerrno>

namespace kvfile::internal {

void UringRing::Close() {
  if (ready_) io_uring_queue_exit(&ring_);
  ready_ = false;
}

Status UringRing::Failure(const char* op, int err) const { return ErrnoStatus(what_ + ": " + op, err); }

Status UringRing::Init(unsigned entries) {
  int r = io_uring_queue_init(entries, &ring_, 0);
  if (r < 0) return Failure("io_uring_queue_init", -r);
  ready_ = true;
  return Status::OK();
}

Status UringRing::GetSqe(io_uring_sqe** out) {
  for (int tries = 0; tries < 2; ++tries) {
    if ((*out = io_uring_get_sqe(&ring_)) != nullptr) return Status::OK();
    KVFILE_RETURN_IF_ERROR(Submit());
  }
  return Failure("io_uring_get_sqe", EBUSY);
}

Status UringRing::Submit() {
  for (int tries = 0; io_uring_sq_ready(&ring_) > 0;) {
    int r = io_uring_submit(&ring_);
    if (r > 0 || r == -EINTR) continue;
    if ((r == 0 || r == -EAGAIN || r == -EBUSY) && ++tries < 10000) {
      // Out of kernel resources for now: take what has completed, pause.
      DeliverReady();
      struct timespec pause = {0, 100000};
      ::nanosleep(&pause, nullptr);
      continue;
    }
    return Failure("io_uring_submit", r < 0 ? -r : EBUSY);
  }
  return Status::OK();
}

Status UringRing::WaitAndDeliver() {
  io_uring_cqe* cqe = nullptr;
  int r;
  do {
    r = io_uring_wait_cqe(&ring_, &cqe);
  } while (r == -EINTR);
  if (r < 0) return Failure("io_uring_wait_cqe", -r);
  DeliverReady();
  return Status::OK();
}

void UringRing::DeliverReady() {
  io_uring_cqe* cqe = nullptr;
  while (io_uring_peek_cqe(&ring_, &cqe) == 0 && cqe != nullptr) {
    const uint64_t ud = cqe->user_data;
    const int res = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    handler_(ud, res);
  }
}

}  // namespace kvfile::internal
