// SPDX-License-Identifier: Apache-2.0
// Measurement primitives of `kvfile bench` (see bench_support.h).
#include "bench_support.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <utility>

namespace kvfile::bench {

namespace {

constexpr size_t kIoBlock = 8u << 20;

Status Errno(const std::string& what, int err) {
  return Status::IOError(what + ": " + std::strerror(err));
}

// Reads "<key>: <n> kB" from /proc/self/status, in bytes; -1 if absent.
int64_t ProcStatusBytes(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  size_t key_len = std::strlen(key);
  while (std::getline(in, line))
    if (line.compare(0, key_len, key) == 0 && line.size() > key_len && line[key_len] == ':')
      return std::stoll(line.substr(key_len + 1)) * 1024;
  return -1;
}

// Closes the descriptor when it goes out of scope.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Summary Summarize(std::vector<double> values) {
  Summary s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  size_t n = values.size();
  s.median = n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
  s.min = values.front();
  s.max = values.back();
  return s;
}

BigBuffer::BigBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    size_ = 0;
    return;
  }
  ::madvise(p, bytes, MADV_HUGEPAGE);
  data_ = static_cast<uint8_t*>(p);
  // Touch every page now (a write, so the kernel backs it for real).
  for (size_t i = 0; i < bytes; i += 4096) data_[i] = 0;
}

BigBuffer::BigBuffer(BigBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

BigBuffer& BigBuffer::operator=(BigBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) ::munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

BigBuffer::~BigBuffer() {
  if (data_) ::munmap(data_, size_);
}

void PeakMemory::Start() {
  std::ofstream reset("/proc/self/clear_refs");
  reset << "5";
  reset.flush();
  start_rss_ = reset ? ProcStatusBytes("VmRSS") : -1;
}

int64_t PeakMemory::ExtraBytes() const {
  if (start_rss_ < 0) return -1;
  int64_t hwm = ProcStatusBytes("VmHWM");
  return hwm < 0 ? -1 : std::max<int64_t>(0, hwm - start_rss_);
}

Status DropFromPageCache(const std::string& path, double* resident_fraction) {
  Fd f{::open(path.c_str(), O_RDONLY)};
  if (f.fd < 0) return Errno(path + ": open", errno);
  if (::fdatasync(f.fd) != 0) return Errno(path + ": fdatasync", errno);
  int err = ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED);
  if (err != 0) return Errno(path + ": posix_fadvise", err);
  struct stat st;
  if (::fstat(f.fd, &st) != 0) return Errno(path + ": stat", errno);
  size_t size = static_cast<size_t>(st.st_size);
  *resident_fraction = 0;
  if (size == 0) return Status::OK();
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, f.fd, 0);
  if (map == MAP_FAILED) return Errno(path + ": mmap", errno);
  size_t pages = (size + 4095) / 4096;
  std::vector<unsigned char> resident(pages);
  int rc = ::mincore(map, size, resident.data());
  ::munmap(map, size);
  if (rc != 0) return Errno(path + ": mincore", errno);
  size_t in_cache = 0;
  for (unsigned char r : resident) in_cache += r & 1;
  *resident_fraction = static_cast<double>(in_cache) / static_cast<double>(pages);
  return Status::OK();
}

Status WarmPageCache(const std::string& path) {
  std::vector<uint8_t> buf(kIoBlock);
  Fd f{::open(path.c_str(), O_RDONLY)};
  if (f.fd < 0) return Errno(path + ": open", errno);
  ssize_t n;
  while ((n = ::read(f.fd, buf.data(), buf.size())) > 0) {
  }
  return n < 0 ? Errno(path + ": read", errno) : Status::OK();
}

Status RawWrite(const std::string& path, const uint8_t* data, size_t data_size, size_t n) {
  ::unlink(path.c_str());
  Fd f{::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644)};
  if (f.fd < 0) return Errno(path + ": open", errno);
  for (size_t done = 0; done < n;) {
    size_t from = done % data_size;
    size_t len = std::min({kIoBlock, n - done, data_size - from});
    ssize_t w = ::pwrite(f.fd, data + from, len, static_cast<off_t>(done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return Errno(path + ": write at offset " + std::to_string(done), w < 0 ? errno : EIO);
    done += static_cast<size_t>(w);
  }
  if (::fdatasync(f.fd) != 0) return Errno(path + ": fdatasync", errno);
  return Status::OK();
}

Status RawRead(const std::string& path, uint8_t* dst, size_t n) {
  Fd f{::open(path.c_str(), O_RDONLY)};
  if (f.fd < 0) return Errno(path + ": open", errno);
  for (size_t done = 0; done < n;) {
    ssize_t r = ::pread(f.fd, dst + done, std::min(kIoBlock, n - done), static_cast<off_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return Errno(path + ": read at offset " + std::to_string(done), r < 0 ? errno : EIO);
    done += static_cast<size_t>(r);
  }
  return Status::OK();
}

Status RawCopy(const std::string& from, const std::string& to, std::vector<uint8_t>* scratch) {
  scratch->resize(kIoBlock);
  ::unlink(to.c_str());
  Fd in{::open(from.c_str(), O_RDONLY)};
  if (in.fd < 0) return Errno(from + ": open", errno);
  Fd out{::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644)};
  if (out.fd < 0) return Errno(to + ": open", errno);
  for (;;) {
    ssize_t r = ::read(in.fd, scratch->data(), scratch->size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Errno(from + ": read", errno);
    if (r == 0) break;
    for (ssize_t put = 0; put < r;) {
      ssize_t w = ::write(out.fd, scratch->data() + put, static_cast<size_t>(r - put));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return Errno(to + ": write", w < 0 ? errno : EIO);
      put += w;
    }
  }
  if (::fdatasync(out.fd) != 0) return Errno(to + ": fdatasync", errno);
  return Status::OK();
}

uint64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

}  // namespace kvfile::bench
