// SPDX-License-Identifier: Apache-2.0
// Status: the result of every fallible kvfile operation.
//
// kvfile never lets an exception cross its public API and never aborts on bad
// input. Every operation that can fail returns a Status: OK, or a code saying
// whose fault the failure is plus one readable line saying what and where
// ("chunk 3 at offset 12288: payload checksum mismatch in layer 5 stream 'k'").
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "kvfile/export.h"

namespace kvfile {

class [[nodiscard]] KVFILE_EXPORT Status {
 public:
  // The codes split failures by who must act: the data (kCorruption,
  // kMismatch, kNonFinite) or the caller/environment (the rest). The CLI maps
  // the first group to exit status 1 and the second to exit status 2.
  enum class Code {
    kOk = 0,
    kCorruption,       // the file's bytes are damaged or not a kvfile
    kMismatch,         // valid file, but not the model/geometry the caller expected
    kNonFinite,        // input rows hold NaN or Inf
    kInvalidArgument,  // the caller asked for something impossible
    kNotFound,         // a path does not exist
    kIOError,          // the operating system refused (EIO, ENOSPC, EACCES, ...)
    kUnsupported,      // a valid file of a version or feature this build cannot handle
    kBusy,             // another writer holds the file
    kFailed,           // the object is unusable after an earlier fatal error
  };

  Status() = default;
  static Status OK() { return Status(); }
  static Status Corruption(std::string msg) { return Status(Code::kCorruption, std::move(msg)); }
  static Status Mismatch(std::string msg) { return Status(Code::kMismatch, std::move(msg)); }
  static Status NonFinite(std::string msg) { return Status(Code::kNonFinite, std::move(msg)); }
  static Status InvalidArgument(std::string msg) {
    return Status(Code::kInvalidArgument, std::move(msg));
  }
  static Status NotFound(std::string msg) { return Status(Code::kNotFound, std::move(msg)); }
  static Status IOError(std::string msg) { return Status(Code::kIOError, std::move(msg)); }
  static Status Unsupported(std::string msg) { return Status(Code::kUnsupported, std::move(msg)); }
  static Status Busy(std::string msg) { return Status(Code::kBusy, std::move(msg)); }
  static Status Failed(std::string msg) { return Status(Code::kFailed, std::move(msg)); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // True when the data, not the caller or the machine, is at fault.
  bool IsDataError() const {
    return code_ == Code::kCorruption || code_ == Code::kMismatch || code_ == Code::kNonFinite ||
           code_ == Code::kUnsupported;
  }
  // "corruption: <message>" style text, for logs.
  std::string ToString() const;

  // Returns a copy whose message is prefixed with `context: `.
  Status WithContext(std::string_view context) const;

 private:
  Status(Code code, std::string msg) : code_(code), message_(std::move(msg)) {}
  Code code_ = Code::kOk;
  std::string message_;
};

// Builds a Status from an errno value: ENOENT -> kNotFound, the rest -> kIOError.
KVFILE_EXPORT Status ErrnoStatus(std::string_view what, int err);

}  // namespace kvfile

// Propagates a non-OK status to the caller.
#define KVFILE_RETURN_IF_ERROR(expr)          \
  do {                                        \
    ::kvfile::Status _kvfile_st = (expr);     \
    if (!_kvfile_st.ok()) return _kvfile_st;  \
  } while (0)
