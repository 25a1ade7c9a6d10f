// SPDX-License-Identifier: Apache-2.0
// PageBuffer (see page_buffer.h): mmap, madvise(MADV_HUGEPAGE), mremap.
#include "io/page_buffer.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace kvfile::internal {

namespace {

constexpr size_t kHugePage = size_t{2} << 20;

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels refuse it and pages fault on first use
#endif

// Maps `bytes` (a multiple of the page size), advises huge pages for large
// mappings and faults every page in with one call, not one trap per page.
void* MapPages(size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  if (bytes >= kHugePage) ::madvise(p, bytes, MADV_HUGEPAGE);
  ::madvise(p, bytes, MADV_POPULATE_WRITE);
  return p;
}

// Small buffers are rounded to 4 KiB pages, large ones to huge pages (so
// the kernel can back the whole mapping with them).
size_t RoundCapacity(size_t n) {
  size_t page = n >= kHugePage ? kHugePage : 4096;
  return (n + page - 1) / page * page;
}

}  // namespace

PageBuffer::PageBuffer(PageBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      used_(std::exchange(other.used_, 0)),
      capacity_(std::exchange(other.capacity_, 0)) {}

PageBuffer& PageBuffer::operator=(PageBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) ::munmap(data_, capacity_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    used_ = std::exchange(other.used_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

PageBuffer::~PageBuffer() {
  if (data_) ::munmap(data_, capacity_);
}

bool PageBuffer::Resize(size_t n) {
  if (n > capacity_) {
    size_t cap = RoundCapacity(std::max(n, capacity_ + capacity_ / 2));
    void* p;
    if (data_) {
      p = ::mremap(data_, capacity_, cap, MREMAP_MAYMOVE);
      if (p == MAP_FAILED) return false;
      if (cap >= kHugePage) ::madvise(p, cap, MADV_HUGEPAGE);
      ::madvise(static_cast<uint8_t*>(p) + capacity_, cap - capacity_, MADV_POPULATE_WRITE);
    } else {
      p = MapPages(cap);
      if (p == nullptr) return false;
    }
    data_ = static_cast<uint8_t*>(p);
    capacity_ = cap;
  }
  // Bytes past the old size may hold what an earlier, larger size left
  // (fresh pages are zero already): the promise is zeros.
  if (n > size_ && used_ > size_) std::memset(data_ + size_, 0, std::min(n, used_) - size_);
  size_ = n;
  used_ = std::max(used_, n);
  return true;
}

void* AllocatePages(size_t bytes) {
  if (bytes < kSmallAllocation) return ::operator new(bytes);
  void* p = MapPages(RoundCapacity(bytes));
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void FreePages(void* p, size_t bytes) {
  if (p == nullptr) return;
  if (bytes < kSmallAllocation) {
    ::operator delete(p);
    return;
  }
  ::munmap(p, RoundCapacity(bytes));
}

}  // namespace kvfile::internal
