// SPDX-License-Identifier: Apache-2.0
// Status formatting and the errno mapping.
#include "kvfile/status.h"

#include <cerrno>
#include <cstring>

namespace kvfile {

namespace {
const char* CodeName(Status::Code code) {
  switch (code) {
    case Status::Code::kOk: return "ok";
    case Status::Code::kCorruption: return "corruption";
    case Status::Code::kMismatch: return "mismatch";
    case Status::Code::kNonFinite: return "non-finite input";
    case Status::Code::kInvalidArgument: return "invalid argument";
    case Status::Code::kNotFound: return "not found";
    case Status::Code::kIOError: return "I/O error";
    case Status::Code::kUnsupported: return "unsupported";
    case Status::Code::kBusy: return "busy";
    case Status::Code::kFailed: return "failed";
  }
  return "unknown";
}
}  // namespace

std::string Status::ToString() const {
  if (ok()) return "ok";
  return std::string(CodeName(code_)) + ": " + message_;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, std::string(context) + ": " + message_);
}

Status ErrnoStatus(std::string_view what, int err) {
  std::string msg = std::string(what) + ": " + std::strerror(err);
  if (err == ENOENT) return Status::NotFound(std::move(msg));
  return Status::IOError(std::move(msg));
}

}  // namespace kvfile
