// The POSIX backend of the file interface: pread/pwrite/fdatasync, flock.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "file_backends.h"

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

namespace {

class PosixFile final : public File {
 public:
  PosixFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixFile() override { ::close(fd_); }

  Status ReadAt(uint64_t offset, void* buf, size_t n) override {
    auto* p = static_cast<uint8_t*>(buf);
    while (n > 0) {
      ssize_t r = ::pread(fd_, p, n, static_cast<off_t>(offset));
      if (r < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(path_ + ": read at offset " + std::to_string(offset), errno);
      }
      if (r == 0)
        return Status::Corruption(path_ + ": unexpected end of file at offset " +
                                  std::to_string(offset));
      p += r;
      n -= static_cast<size_t>(r);
      offset += static_cast<uint64_t>(r);
    }
    return Status::OK();
  }

  Status WriteAt(uint64_t offset, const void* buf, size_t n) override {
    const auto* p = static_cast<const uint8_t*>(buf);
    while (n > 0) {
      ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
      if (w < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(path_ + ": write at offset " + std::to_string(offset), errno);
      }
      p += w;
      n -= static_cast<size_t>(w);
      offset += static_cast<uint64_t>(w);
    }
    return Status::OK();
  }

  Status Sync() override {
    if (::fdatasync(fd_) != 0) return ErrnoStatus(path_ + ": fdatasync", errno);
    return Status::OK();
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

  Status LockExclusive() override {
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK)
        return Status::Busy(path_ + ": another writer has the file open");
      return ErrnoStatus(path_ + ": lock", errno);
    }
    return Status::OK();
  }

  const char* backend() const override { return "posix"; }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  int fd_;
};

class PosixFileSystem final : public FileSystem {
 public:
  Status Open(const std::string& path, OpenMode mode, std::unique_ptr<File>* out) override {
    int flags = O_CLOEXEC;
    switch (mode) {
      case OpenMode::kRead: flags |= O_RDONLY; break;
      case OpenMode::kReadWrite: flags |= O_RDWR; break;
      case OpenMode::kCreateExclusive: flags |= O_RDWR | O_CREAT | O_EXCL; break;
    }
    int fd;
    do {
      fd = ::open(path.c_str(), flags, 0644);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return ErrnoStatus(path, errno);
    struct stat st;
    if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
      ::close(fd);
      return Status::InvalidArgument(path + ": is a directory");
    }
    *out = std::make_unique<PosixFile>(path, fd);
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

  Status SyncDir(const std::string& dir) override {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(dir + ": open directory", errno);
    int rc = ::fsync(fd);
    int err = errno;
    ::close(fd);
    if (rc != 0) return ErrnoStatus(dir + ": fsync directory", err);
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
};

}  // namespace

namespace internal {
FileSystem* PosixFileSystemInstance() {
  static PosixFileSystem* fs = new PosixFileSystem();
  return fs;
}
}  // namespace internal

}  // namespace kvfile
