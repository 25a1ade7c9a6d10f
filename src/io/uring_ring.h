// SPDX-License-Identifier: Apache-2.0
// UringRing: one io_uring submission/completion queue pair (liburing), with
// the retries the kernel asks for: a full submission queue is submitted
// and asked again, an io_uring_submit the kernel cannot take now pauses and
// tries again, waits interrupted by signals wait again. Completions go to
// a handler as (user_data, result). Knows nothing of files or chains.
#pragma once

#include <liburing.h>

#include <cstdint>
#include <functional>
#include <string>

#include "kvfile/status.h"

namespace kvfile::internal {

class UringRing {
 public:
  using Handler = std::function<void(uint64_t user_data, int res)>;

  // `what` names the ring's owner in messages ("<path>: io_uring_submit: ...").
  UringRing(std::string what, Handler handler) : what_(std::move(what)), handler_(std::move(handler)) {}
  UringRing(const UringRing&) = delete;
  UringRing& operator=(const UringRing&) = delete;
  ~UringRing() { Close(); }
  // Tears the ring down. The owner must have waited for every operation.
  void Close();

  Status Init(unsigned entries);
  bool ready() const { return ready_; }

  // A free submission entry (submitting the prepared ones if the queue is full).
  Status GetSqe(io_uring_sqe** out);
  // Hands every prepared entry to the kernel.
  Status Submit();
  // Waits for at least one completion, then hands every completion ready
  // to the handler.
  Status WaitAndDeliver();

 private:
  void DeliverReady();
  Status Failure(const char* op, int err) const;

  std::string what_;
  Handler handler_;
  io_uring ring_{};
  bool ready_ = false;
};

}  // namespace kvfile::internal
