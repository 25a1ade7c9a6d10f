// SPDX-License-Identifier: Apache-2.0
// PageBuffer: a large, reusable byte buffer mapped directly from the kernel,
// with transparent huge pages advised.
//
// Why not std::vector: on the virtual machines kvfile is measured on, the
// first touch of fresh 4 KiB pages runs at 0.1-0.3 GB/s, slower than the
// disk, so a 16 MiB staging buffer or a table of chunk checksums costs more
// to fault in than to fill. Huge pages fault in at several GB/s. The buffers
// that hold chunks (writer staging, reader and verify scratch, the upgrade's
// slices) and the scan's per-chunk tables live in these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace kvfile::internal {

class PageBuffer {
 public:
  PageBuffer() = default;
  PageBuffer(PageBuffer&& other) noexcept;
  PageBuffer& operator=(PageBuffer&& other) noexcept;
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;
  ~PageBuffer();

  // Makes size() == n, keeping the first min(n, old size) bytes; new bytes
  // are zero and already faulted in. Capacity only grows. False (and the
  // buffer unchanged) when the kernel has no memory for it.
  bool Resize(size_t n);
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t used_ = 0;      // the largest size so far: bytes that may not be zero
  size_t capacity_ = 0;  // bytes mapped, a multiple of the page size
};

// A growable array of trivially copyable T in a PageBuffer.
template <typename T>
class PageArray {
 public:
  bool Resize(size_t n) { return buf_.Resize(n * sizeof(T)); }
  size_t size() const { return buf_.size() / sizeof(T); }
  T* data() const { return reinterpret_cast<T*>(buf_.data()); }
  T& operator[](size_t i) const { return data()[i]; }

 private:
  PageBuffer buf_;
};

// Memory for PageAllocator: below kSmallAllocation bytes from operator new,
// above it mapped (huge pages advised for 2 MiB and more) and faulted in
// with one call. Throws std::bad_alloc as operator new does.
inline constexpr size_t kSmallAllocation = size_t{64} << 10;
void* AllocatePages(size_t bytes);
void FreePages(void* p, size_t bytes);

// For the scan's tables (chunks, tokens, section checksums), which reach
// megabytes for long sessions and are built on every open.
template <typename T>
struct PageAllocator {
  using value_type = T;
  PageAllocator() = default;
  template <typename U>
  PageAllocator(const PageAllocator<U>&) {}
  T* allocate(size_t n) {
    if (n > SIZE_MAX / sizeof(T)) throw std::bad_alloc();
    return static_cast<T*>(AllocatePages(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) { FreePages(p, n * sizeof(T)); }
  friend bool operator==(const PageAllocator&, const PageAllocator&) { return true; }
};

template <typename T>
using PageVector = std::vector<T, PageAllocator<T>>;

}  // namespace kvfile::internal
