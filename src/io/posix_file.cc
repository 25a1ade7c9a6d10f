// SPDX-License-Identifier: Apache-2.0
// The POSIX backend of the file interface: pread/pwrite/fdatasync, flock.
//
// pread/pwrite loop until every byte is transferred (a short count is
// followed by the rest); EINTR, and EAGAIN (which a regular file opened
// without O_NONBLOCK should never return, but some file systems do), are
// retried, up to kMaxRetries times in a row without progress, then returned
// as the error: a persistent interruption fails instead of hanging. A
// fdatasync failing with EINTR or EAGAIN is retried the same way (it
// reported no write-back error, so the retry loses nothing); any other
// fdatasync error is returned at once and never retried. In a file system
// made with a SyscallFilter (syscall_filter.h), each of these system calls
// first asks the filter, which tests use to fake errors and short counts.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "io/file_backends.h"
#include "io/syscall_filter.h"

namespace kvfile {

std::string DirName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

Status File::SubmitWrite(uint64_t offset, const void* buf, size_t n, bool sync_after) {
  KVFILE_RETURN_IF_ERROR(WriteAt(offset, buf, n));
  if (sync_after) return Sync();
  return Status::OK();
}

Status File::WaitWrites() { return Status::OK(); }

Status File::NextData(uint64_t from, uint64_t* next) {
  *next = from;
  return Status::OK();
}

Status File::ReadBatch(std::span<const ReadRequest> requests) {
  for (const ReadRequest& r : requests) KVFILE_RETURN_IF_ERROR(ReadAt(r.offset, r.buf, r.n));
  return Status::OK();
}

Status FileSystem::Stat(const std::string& path, PathInfo* info) {
  *info = PathInfo{};
  KVFILE_RETURN_IF_ERROR(Exists(path, &info->exists));
  if (!info->exists) return Status::OK();
  KVFILE_RETURN_IF_ERROR(PathId(path, &info->id));
  info->regular = true;
  info->mode = 0644;
  info->links = 1;
  return Status::OK();
}

Status FileSystem::ResolveSymlinks(const std::string& path, std::string* target) {
  *target = path;
  return Status::OK();
}

Status FileSystem::CopyAttributes(const PathInfo&, const std::string&) { return Status::OK(); }

Status FileSystem::ListDir(const std::string&, std::vector<std::string>* names) {
  names->clear();
  return Status::OK();
}

namespace {

using internal::IoCall;
using internal::SyscallFilter;

// EINTR/EAGAIN in a row, without a byte transferred, before giving up.
constexpr int kMaxRetries = 1000;

bool Retryable(int err) { return err == EINTR || err == EAGAIN; }

// What the filter (if any) makes of one call of `n` bytes: false for a
// faked failure (errno set to it), else true with *n the bytes to transfer
// (a faked short count is a real transfer of fewer bytes).
bool Filter(SyscallFilter* filter, IoCall::Op call, size_t* n) {
  ssize_t fake = 0;
  if (filter == nullptr || !filter->Intercept(call, *n, &fake)) return true;
  if (fake < 0) {
    errno = static_cast<int>(-fake);
    return false;
  }
  *n = static_cast<size_t>(fake);
  return true;
}

// One pwrite/pread/fdatasync as the filter lets it run: the system call's
// return value and errno, faked or real.
ssize_t PwriteOnce(SyscallFilter* filter, int fd, const void* p, size_t n, uint64_t offset) {
  if (!Filter(filter, IoCall::kWrite, &n)) return -1;
  return ::pwrite(fd, p, n, static_cast<off_t>(offset));
}

ssize_t PreadOnce(SyscallFilter* filter, int fd, void* p, size_t n, uint64_t offset) {
  if (!Filter(filter, IoCall::kRead, &n)) return -1;
  return ::pread(fd, p, n, static_cast<off_t>(offset));
}

int FdatasyncOnce(SyscallFilter* filter, int fd) {
  size_t none = 0;  // a sync moves no bytes: only a faked failure counts
  if (!Filter(filter, IoCall::kSync, &none)) return -1;
  return ::fdatasync(fd);
}

// `dir` as a message names it: "." (the directory of a bare file name) by
// the current directory's full path.
std::string ShownDir(const std::string& dir) {
  if (dir != ".") return dir;
  std::string cwd(4096, '\0');
  if (::getcwd(cwd.data(), cwd.size()) == nullptr) return dir;
  cwd.resize(std::strlen(cwd.c_str()));
  return cwd;
}

class PosixFile final : public File {
 public:
  PosixFile(std::string path, int fd, SyscallFilter* filter) : path_(std::move(path)), fd_(fd), filter_(filter) {}
  ~PosixFile() override { ::close(fd_); }

  Status ReadAt(uint64_t offset, void* buf, size_t n) override {
    auto* p = static_cast<uint8_t*>(buf);
    int retries = 0;
    while (n > 0) {
      ssize_t r = PreadOnce(filter_, fd_, p, n, offset);
      if (r < 0) {
        const int err = errno;
        if (Retryable(err) && ++retries < kMaxRetries) continue;
        return ErrnoStatus(path_ + ": read at offset " + std::to_string(offset), err);
      }
      if (r == 0)
        return Status::Corruption(path_ + ": unexpected end of file at offset " +
                                  std::to_string(offset));
      retries = 0;
      p += r;
      n -= static_cast<size_t>(r);
      offset += static_cast<uint64_t>(r);
    }
    return Status::OK();
  }

  Status WriteAt(uint64_t offset, const void* buf, size_t n) override {
    const auto* p = static_cast<const uint8_t*>(buf);
    int retries = 0;
    while (n > 0) {
      ssize_t w = PwriteOnce(filter_, fd_, p, n, offset);
      if (w < 0) {
        const int err = errno;
        if (Retryable(err) && ++retries < kMaxRetries) continue;
        return ErrnoStatus(path_ + ": write at offset " + std::to_string(offset), err);
      }
      // Would loop forever: say so instead (the io_uring backend does too).
      if (w == 0)
        return Status::IOError(path_ + ": write at offset " + std::to_string(offset) +
                               ": no bytes written");
      retries = 0;
      p += w;
      n -= static_cast<size_t>(w);
      offset += static_cast<uint64_t>(w);
    }
    return Status::OK();
  }

  Status Sync() override {
    for (int retries = 0;;) {
      if (FdatasyncOnce(filter_, fd_) == 0) return Status::OK();
      const int err = errno;
      if (Retryable(err) && ++retries < kMaxRetries) continue;
      return ErrnoStatus(path_ + ": fdatasync", err);
    }
  }

  Status Truncate(uint64_t size) override {
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0)
      return ErrnoStatus(path_ + ": truncate to " + std::to_string(size), errno);
    return Status::OK();
  }

  Status Size(uint64_t* size) override {
    struct stat st;
    if (::fstat(fd_, &st) != 0) return ErrnoStatus(path_ + ": stat", errno);
    *size = static_cast<uint64_t>(st.st_size);
    return Status::OK();
  }

  Status LockExclusive() override { return internal::LockFd(fd_, path_); }
  Status Id(FileId* id) override { return internal::FdId(fd_, path_, id); }
  Status NextData(uint64_t from, uint64_t* next) override { return internal::FdNextData(fd_, path_, from, next); }

  const char* backend() const override { return "posix"; }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  int fd_;
  SyscallFilter* filter_;  // nullptr: none
};

class PosixFileSystem final : public FileSystem {
 public:
  explicit PosixFileSystem(SyscallFilter* filter) : filter_(filter) {}

  Status Open(const std::string& path, OpenMode mode, std::unique_ptr<File>* out) override {
    int fd;
    KVFILE_RETURN_IF_ERROR(internal::OpenFd(path, mode, &fd));
    *out = std::make_unique<PosixFile>(path, fd, filter_);
    return Status::OK();
  }

  Status Rename(const std::string& from, const std::string& to, bool replace) override {
    unsigned flags = replace ? 0 : RENAME_NOREPLACE;
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), flags) != 0)
      return ErrnoStatus("rename " + from + " -> " + to, errno);
    return Status::OK();
  }

  Status Remove(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return ErrnoStatus(path + ": remove", errno);
    return Status::OK();
  }

  // Errors name the directory; the directory of a bare file name (".") by
  // its full path, so that the message says which directory it was.
  Status SyncDir(const std::string& dir) override {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(ShownDir(dir) + ": open directory", errno);
    ssize_t fake = 0;
    int rc = 0;
    if (filter_ != nullptr && filter_->Intercept(IoCall::kSyncDir, 0, &fake) && fake < 0) {
      rc = -1;
      errno = static_cast<int>(-fake);
    } else {
      rc = ::fsync(fd);
    }
    int err = errno;
    ::close(fd);
    if (rc != 0) return ErrnoStatus(ShownDir(dir) + ": fsync directory", err);
    return Status::OK();
  }

  Status PathId(const std::string& path, FileId* id) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return ErrnoStatus(path, errno);
    *id = {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
    return Status::OK();
  }

  Status Stat(const std::string& path, PathInfo* info) override {
    *info = PathInfo{};
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      if (errno == ENOENT) return Status::OK();
      return ErrnoStatus(path, errno);
    }
    info->exists = true;
    info->regular = S_ISREG(st.st_mode);
    info->id = {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
    info->mode = st.st_mode & 07777;
    info->uid = st.st_uid;
    info->gid = st.st_gid;
    info->links = st.st_nlink;
    return Status::OK();
  }

  // Follows the chain link by link (a relative link is relative to its own
  // directory), so that a dangling link resolves to the path it names.
  Status ResolveSymlinks(const std::string& path, std::string* target) override {
    std::string p = path;
    for (int hops = 0; hops < 40; ++hops) {
      struct stat st;
      if (::lstat(p.c_str(), &st) != 0) {
        if (errno == ENOENT) break;
        return ErrnoStatus(p, errno);
      }
      if (!S_ISLNK(st.st_mode)) break;
      std::string link(static_cast<size_t>(st.st_size > 0 ? st.st_size : 4096) + 1, '\0');
      ssize_t n = ::readlink(p.c_str(), link.data(), link.size());
      if (n < 0) return ErrnoStatus(p + ": readlink", errno);
      if (static_cast<size_t>(n) >= link.size()) return Status::IOError(p + ": symlink changed while reading it");
      link.resize(static_cast<size_t>(n));
      p = link.starts_with('/') || p.find('/') == std::string::npos ? link : DirName(p) + "/" + link;
      if (hops == 39) return ErrnoStatus(path, ELOOP);
    }
    *target = p;
    return Status::OK();
  }

  // Owner and group first: chown may clear the set-user-id bits, which the
  // chmod after it restores.
  Status CopyAttributes(const PathInfo& like, const std::string& path) override {
    if (::chown(path.c_str(), like.uid, like.gid) != 0)
      return ErrnoStatus(path + ": chown to " + std::to_string(like.uid) + ":" + std::to_string(like.gid), errno);
    if (::chmod(path.c_str(), static_cast<mode_t>(like.mode)) != 0) return ErrnoStatus(path + ": chmod", errno);
    return Status::OK();
  }

  Status ListDir(const std::string& dir, std::vector<std::string>* names) override {
    names->clear();
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return ErrnoStatus(dir + ": open directory", errno);
    errno = 0;
    while (const dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name != "." && name != "..") names->push_back(std::move(name));
    }
    int err = errno;
    ::closedir(d);
    if (err != 0) return ErrnoStatus(dir + ": read directory", err);
    return Status::OK();
  }

  Status Exists(const std::string& path, bool* exists) override {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0) {
      *exists = true;
      return Status::OK();
    }
    if (errno == ENOENT) {
      *exists = false;
      return Status::OK();
    }
    return ErrnoStatus(path, errno);
  }

 private:
  SyscallFilter* filter_;  // nullptr: none
};

}  // namespace

namespace internal {

Status NotRegularFile(const std::string& path, unsigned mode) {
  const char* what = S_ISDIR(mode)    ? "a directory"
                     : S_ISFIFO(mode) ? "a FIFO"
                     : S_ISCHR(mode)  ? "a character device"
                     : S_ISBLK(mode)  ? "a block device"
                     : S_ISSOCK(mode) ? "a socket"
                                      : "a special file";
  return Status::InvalidArgument(path + ": not a regular file (" + what + ")");
}

// O_NONBLOCK so that opening a FIFO never waits for a writer (O_NOCTTY: a
// terminal never becomes the controlling one); anything but a regular file
// is then refused, and the flag is cleared again. A socket cannot be
// opened at all (ENXIO): it is refused by what stat says it is.
Status OpenFd(const std::string& path, OpenMode mode, int* out) {
  int flags = O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
  switch (mode) {
    case OpenMode::kRead: flags |= O_RDONLY; break;
    case OpenMode::kReadWrite: flags |= O_RDWR; break;
    case OpenMode::kCreateExclusive: flags |= O_RDWR | O_CREAT | O_EXCL; break;
  }
  int fd;
  do {
    fd = ::open(path.c_str(), flags, 0644);
  } while (fd < 0 && errno == EINTR);
  struct stat st;
  if (fd < 0) {
    int err = errno;
    if (err == ENXIO && ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) return NotRegularFile(path, st.st_mode);
    return ErrnoStatus(path, err);
  }
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus(path + ": stat", err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return NotRegularFile(path, st.st_mode);
  }
  if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus(path + ": fcntl", err);
  }
  *out = fd;
  return Status::OK();
}

Status LockFd(int fd, const std::string& path) {
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) return Status::Busy(path + ": another writer has the file open");
    return ErrnoStatus(path + ": lock", errno);
  }
  return Status::OK();
}

Status FdId(int fd, const std::string& path, FileId* id) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus(path + ": stat", errno);
  *id = {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
  return Status::OK();
}

Status FdNextData(int fd, const std::string& path, uint64_t from, uint64_t* next) {
  off_t at = ::lseek(fd, static_cast<off_t>(from), SEEK_DATA);
  if (at >= 0) {
    *next = std::max(from, static_cast<uint64_t>(at));
    return Status::OK();
  }
  if (errno != ENXIO) {
    *next = from;  // EINVAL: the file system cannot tell; every byte may be data
    return Status::OK();
  }
  // ENXIO: no data at or after `from` (a hole to the end, or past the end).
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus(path + ": stat", errno);
  *next = std::max(from, static_cast<uint64_t>(st.st_size));
  return Status::OK();
}

FileSystem* PosixFileSystemInstance() {
  static PosixFileSystem* fs = new PosixFileSystem(nullptr);
  return fs;
}

std::unique_ptr<FileSystem> NewPosixFileSystem(SyscallFilter* filter) {
  return std::make_unique<PosixFileSystem>(filter);
}
}  // namespace internal

}  // namespace kvfile
