// SPDX-License-Identifier: Apache-2.0
// Standard input spooled to a temporary file without a name (see
// stdin_copy.h).
#include "stdin_copy.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "unnamed_file.h"

namespace kvfile::cli {

StdinCopy::~StdinCopy() {
  if (fd_ >= 0) ::close(fd_);
  if (!path_.empty()) ::unlink(path_.c_str());
}

Status StdinCopy::Copy(std::string* path) {
  if (ProcFdAvailable()) {
    KVFILE_RETURN_IF_ERROR(CreateUnnamedFile("-", &fd_));
  } else {
    std::string name = TempDirectory() + "/kvfile-stdin-XXXXXX";
    fd_ = ::mkostemp(name.data(), O_CLOEXEC);
    if (fd_ < 0) return Status::IOError("-: cannot create a temporary copy like " + name + ": " + std::strerror(errno));
    path_ = name;
  }
  const std::string copy = path_.empty() ? ReopenPath(fd_) : path_;
  std::vector<char> buf(1 << 20);
  for (;;) {
    ssize_t n = ::read(STDIN_FILENO, buf.data(), buf.size());
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IOError("-: reading standard input: " + std::string(std::strerror(errno)));
    }
    for (ssize_t done = 0; done < n;) {
      ssize_t w = ::write(fd_, buf.data() + done, static_cast<size_t>(n - done));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0)
        return Status::IOError("-: copying standard input to a temporary file in " + TempDirectory() + ": " +
                               std::strerror(errno));
      done += w;
    }
  }
  *path = copy;
  return Status::OK();
}

Status NameStdin(const Status& st, const std::string& copy) { return RenamePath(st, copy, "-"); }

Status RenamePath(const Status& st, const std::string& copy, const std::string& to) {
  // The message with every occurrence of `copy` as `to` (built anew: GCC 12
  // reports a false -Wrestrict for replace() in place).
  const std::string text = st.message();
  const std::string_view from(text);
  std::string m;
  size_t pos = 0;
  for (size_t at; !copy.empty() && (at = from.find(copy, pos)) != std::string_view::npos; pos = at + copy.size()) {
    m.append(from.substr(pos, at - pos));
    m.append(to);
  }
  m.append(from.substr(pos));
  using C = Status::Code;
  switch (st.code()) {
    case C::kOk: return st;
    case C::kCorruption: return Status::Corruption(m);
    case C::kMismatch: return Status::Mismatch(m);
    case C::kNonFinite: return Status::NonFinite(m);
    case C::kInvalidArgument: return Status::InvalidArgument(m);
    case C::kNotFound: return Status::NotFound(m);
    case C::kIOError: return Status::IOError(m);
    case C::kUnsupported: return Status::Unsupported(m);
    case C::kBusy: return Status::Busy(m);
    case C::kFailed: return Status::Failed(m);
  }
  return st;
}

}  // namespace kvfile::cli
