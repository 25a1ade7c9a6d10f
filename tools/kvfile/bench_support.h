// SPDX-License-Identifier: Apache-2.0
// What `kvfile bench` measures with: a clock, medians, pre-faulted buffers,
// the peak-memory probe, the page-cache dropper, and the raw I/O a user
// would write instead of using kvfile (the machine's limits).
//
// The raw paths are plain POSIX on purpose: they are the baseline, what an
// engine that dumps its KV with pwrite/pread and an fsync gets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvfile/status.h"

namespace kvfile::bench {

double Now();  // seconds, monotonic

struct Summary {
  double median = 0, min = 0, max = 0;
};
Summary Summarize(std::vector<double> values);

// A large buffer that is mapped with transparent huge pages advised and
// touched before use: first touch of fresh 4 KiB pages is slower than any
// path measured here, so no timed loop may pay for it.
class BigBuffer {
 public:
  BigBuffer() = default;
  explicit BigBuffer(size_t bytes);
  BigBuffer(BigBuffer&& other) noexcept;
  BigBuffer& operator=(BigBuffer&& other) noexcept;
  BigBuffer(const BigBuffer&) = delete;
  BigBuffer& operator=(const BigBuffer&) = delete;
  ~BigBuffer();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool ok() const { return data_ != nullptr || size_ == 0; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Peak resident memory of one path: Start() resets the kernel's high-water
// mark (/proc/self/clear_refs) and notes the resident size; ExtraBytes() is
// how far the high-water mark rose above it. Buffers the bench holds for
// every path (the session in memory) are resident before Start() and are
// not counted. Unavailable (returns -1) where the kernel refuses the reset.
class PeakMemory {
 public:
  void Start();
  int64_t ExtraBytes() const;

 private:
  int64_t start_rss_ = -1;
};

// Asks the kernel to drop the file's clean pages (posix_fadvise DONTNEED
// after fdatasync) and reports the fraction still resident after (mincore).
// A cold read is only claimed when that fraction is small.
Status DropFromPageCache(const std::string& path, double* resident_fraction);
// Reads the whole file once so that it is in the page cache.
Status WarmPageCache(const std::string& path);

// Writes n bytes sequentially in 8 MiB pwrites into a new file, then
// fdatasync: the durable sequential write limit. The bytes come from
// data[0, data_size), over and over if n is larger.
Status RawWrite(const std::string& path, const uint8_t* data, size_t data_size, size_t n);
// Reads the first n bytes of the file sequentially in 8 MiB preads.
Status RawRead(const std::string& path, uint8_t* dst, size_t n);
// Copies a file (read + write + fdatasync, 8 MiB blocks) into a new file.
Status RawCopy(const std::string& from, const std::string& to, std::vector<uint8_t>* scratch);

uint64_t FileSize(const std::string& path);

}  // namespace kvfile::bench
