// SPDX-License-Identifier: Apache-2.0
// WriteBehind (see write_behind.h): sync_file_range on a second descriptor.
#include "writer/write_behind.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace kvfile::internal {

WriteBehind::~WriteBehind() { Release(); }

void WriteBehind::Release() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  tried_ = true;
}

void WriteBehind::Start(File& file, const std::string& path, uint64_t offset, uint64_t n) {
  if (!tried_) {
    tried_ = true;
    FileId want;
    if (!file.Id(&want).ok()) return;
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return;
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_dev) != want.device ||
        static_cast<uint64_t>(st.st_ino) != want.inode) {
      ::close(fd);
      return;
    }
    fd_ = fd;
  }
  if (fd_ < 0 || n == 0) return;
  if (::sync_file_range(fd_, static_cast<off_t>(offset), static_cast<off_t>(n), SYNC_FILE_RANGE_WRITE) != 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

}  // namespace kvfile::internal
