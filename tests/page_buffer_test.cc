// SPDX-License-Identifier: Apache-2.0
// Tests of the library's mmap-backed buffers (src/io/page_buffer.h): PageBuffer
// keeps its contents across growth (mremap may move it) and hands out zeros
// in every newly exposed byte, including bytes an earlier, larger size
// wrote; PageArray on top of it; PageAllocator/PageVector below and above
// the size where allocations switch from operator new to mappings.
#include "io/page_buffer.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

namespace kvfile::internal {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

uint8_t Pattern(size_t i, uint8_t seed) { return static_cast<uint8_t>((i * 131 + seed) ^ (i >> 9)); }

void Fill(PageBuffer& b, size_t from, size_t to, uint8_t seed) {
  for (size_t i = from; i < to; ++i) b.data()[i] = Pattern(i, seed);
}

// Index of the first byte of [from, to) that is not the pattern, or `to`.
size_t FirstNotPattern(const PageBuffer& b, size_t from, size_t to, uint8_t seed) {
  for (size_t i = from; i < to; ++i)
    if (b.data()[i] != Pattern(i, seed)) return i;
  return to;
}

size_t FirstNonZero(const uint8_t* p, size_t from, size_t to) {
  for (size_t i = from; i < to; ++i)
    if (p[i] != 0) return i;
  return to;
}

TEST(PageBuffer, StartsEmpty) {
  PageBuffer b;
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(b.size(), 0u);
  ASSERT_TRUE(b.Resize(0));
  EXPECT_EQ(b.size(), 0u);
}

// Growth from every starting size to a larger one keeps the old bytes and
// zeroes the new ones: within the capacity, past it (mremap), from 4 KiB
// pages to huge-page capacity, and between huge-page capacities.
TEST(PageBuffer, GrowthKeepsContentsAndZeroesNewBytes) {
  const std::vector<std::pair<size_t, size_t>> steps = {
      {1, 100},           {100, 4096},        {4096, 4097},    {1000, 5 * 4096 + 3},
      {5000, 3 * kMiB},   {3 * kMiB, 3 * kMiB + 1}, {3 * kMiB, 9 * kMiB + 17}, {2 * kMiB, 2 * kMiB + 4096},
  };
  for (auto [from, to] : steps) {
    SCOPED_TRACE(std::to_string(from) + " -> " + std::to_string(to));
    PageBuffer b;
    ASSERT_TRUE(b.Resize(from));
    ASSERT_NE(b.data(), nullptr);
    EXPECT_EQ(b.size(), from);
    EXPECT_EQ(FirstNonZero(b.data(), 0, from), from);
    Fill(b, 0, from, 7);
    ASSERT_TRUE(b.Resize(to));
    EXPECT_EQ(b.size(), to);
    EXPECT_EQ(FirstNotPattern(b, 0, from, 7), from);
    EXPECT_EQ(FirstNonZero(b.data(), from, to), to);
    Fill(b, 0, to, 9);  // every byte writable
    EXPECT_EQ(FirstNotPattern(b, 0, to, 9), to);
  }
}

// Many small steps: the capacity grows geometrically and the mapping moves
// now and then; nothing written is ever lost.
TEST(PageBuffer, RepeatedGrowth) {
  PageBuffer b;
  size_t size = 0;
  for (size_t next = 10; next <= 5 * kMiB; next = next * 3 / 2 + 1000) {
    ASSERT_TRUE(b.Resize(next));
    ASSERT_EQ(FirstNotPattern(b, 0, size, 3), size) << "after growing to " << next;
    ASSERT_EQ(FirstNonZero(b.data(), size, next), next) << "after growing to " << next;
    Fill(b, size, next, 3);
    size = next;
  }
}

// Growth when the addresses after the mapping are taken: mremap must move
// it, and the contents go along.
TEST(PageBuffer, GrowthThatMustMoveTheMapping) {
  for (size_t grow_to : {size_t{5000}, 3 * kMiB}) {
    SCOPED_TRACE(grow_to);
    PageBuffer b;
    ASSERT_TRUE(b.Resize(100));  // one 4 KiB page (page_buffer.cc: small sizes round to 4 KiB)
    Fill(b, 0, 100, 6);
    // A page right after the buffer's; if something is mapped there
    // already, the move is forced all the same.
    void* want = b.data() + 4096;
    void* blocker = ::mmap(want, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    bool placed = blocker == want;
    if (blocker != MAP_FAILED && !placed) ::munmap(blocker, 4096);  // a kernel without NOREPLACE put it elsewhere
    const uint8_t* before = b.data();
    ASSERT_TRUE(b.Resize(grow_to));
    EXPECT_NE(b.data(), before);
    EXPECT_EQ(FirstNotPattern(b, 0, 100, 6), 100u);
    EXPECT_EQ(FirstNonZero(b.data(), 100, grow_to), grow_to);
    Fill(b, 0, grow_to, 8);
    EXPECT_EQ(FirstNotPattern(b, 0, grow_to, 8), grow_to);
    if (placed) ::munmap(blocker, 4096);
  }
}

TEST(PageBuffer, ShrinkThenGrowExposesZeros) {
  for (size_t big : {size_t{10000}, 3 * kMiB}) {
    SCOPED_TRACE(big);
    PageBuffer b;
    ASSERT_TRUE(b.Resize(big));
    Fill(b, 0, big, 1);
    ASSERT_TRUE(b.Resize(100));
    EXPECT_EQ(b.size(), 100u);
    EXPECT_EQ(FirstNotPattern(b, 0, 100, 1), 100u);
    // Within the old size: the bytes written earlier read as zeros again.
    ASSERT_TRUE(b.Resize(big / 2));
    EXPECT_EQ(FirstNotPattern(b, 0, 100, 1), 100u);
    EXPECT_EQ(FirstNonZero(b.data(), 100, big / 2), big / 2);
    Fill(b, 100, big / 2, 2);
    // Down again, then past the largest size so far and past the capacity.
    ASSERT_TRUE(b.Resize(50));
    ASSERT_TRUE(b.Resize(big * 3));
    EXPECT_EQ(b.size(), big * 3);
    EXPECT_EQ(FirstNotPattern(b, 0, 50, 1), 50u);
    EXPECT_EQ(FirstNonZero(b.data(), 50, big * 3), big * 3);
    // To zero and back.
    Fill(b, 0, big * 3, 4);
    ASSERT_TRUE(b.Resize(0));
    EXPECT_EQ(b.size(), 0u);
    ASSERT_TRUE(b.Resize(big));
    EXPECT_EQ(FirstNonZero(b.data(), 0, big), big);
  }
}

TEST(PageBuffer, ImpossibleSizeFailsAndLeavesTheBufferAlone) {
  PageBuffer b;
  ASSERT_TRUE(b.Resize(5000));
  Fill(b, 0, 5000, 5);
  const uint8_t* data = b.data();
  for (size_t n : {SIZE_MAX / 2, SIZE_MAX - 1000, SIZE_MAX}) {
    SCOPED_TRACE(n);
    EXPECT_FALSE(b.Resize(n));
    EXPECT_EQ(b.size(), 5000u);
    EXPECT_EQ(b.data(), data);
    EXPECT_EQ(FirstNotPattern(b, 0, 5000, 5), 5000u);
  }
  PageBuffer empty;
  EXPECT_FALSE(empty.Resize(SIZE_MAX - 1000));
  EXPECT_EQ(empty.size(), 0u);
  EXPECT_EQ(empty.data(), nullptr);
}

TEST(PageBuffer, MoveConstructionAndAssignment) {
  PageBuffer a;
  ASSERT_TRUE(a.Resize(3 * kMiB));
  Fill(a, 0, 3 * kMiB, 11);
  uint8_t* data = a.data();

  PageBuffer b(std::move(a));
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state is specified here
  EXPECT_EQ(a.size(), 0u);
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(b.size(), 3 * kMiB);
  EXPECT_EQ(FirstNotPattern(b, 0, 3 * kMiB, 11), 3 * kMiB);

  // The moved-from buffer is empty and usable: fresh zeros.
  ASSERT_TRUE(a.Resize(8192));
  EXPECT_EQ(FirstNonZero(a.data(), 0, 8192), 8192u);
  Fill(a, 0, 8192, 12);

  // Assignment over a buffer that holds a mapping (which it unmaps).
  PageBuffer c;
  ASSERT_TRUE(c.Resize(100));
  c = std::move(b);
  EXPECT_EQ(b.data(), nullptr);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(b.size(), 0u);
  EXPECT_EQ(c.data(), data);
  EXPECT_EQ(c.size(), 3 * kMiB);
  EXPECT_EQ(FirstNotPattern(c, 0, 3 * kMiB, 11), 3 * kMiB);

  // The target carries the source's history: bytes the source wrote before
  // a shrink are zeros when grown again.
  ASSERT_TRUE(a.Resize(10));
  c = std::move(a);
  EXPECT_EQ(c.size(), 10u);
  EXPECT_EQ(FirstNotPattern(c, 0, 10, 12), 10u);
  ASSERT_TRUE(c.Resize(8192));
  EXPECT_EQ(FirstNonZero(c.data(), 10, 8192), 8192u);

  // Self-assignment (through a reference, as real code would reach it)
  // keeps the buffer.
  PageBuffer& alias = c;
  c = std::move(alias);
  EXPECT_EQ(c.size(), 8192u);
  EXPECT_EQ(FirstNotPattern(c, 0, 10, 12), 10u);

  // Assignment into an empty buffer, and of an empty one.
  PageBuffer d;
  d = std::move(c);
  EXPECT_EQ(d.size(), 8192u);
  d = PageBuffer();
  EXPECT_EQ(d.data(), nullptr);
  EXPECT_EQ(d.size(), 0u);
}

struct Triple {
  uint32_t a, b, c;
};

TEST(PageArray, ResizeKeepsElementsAndZeroesNewOnes) {
  PageArray<Triple> arr;
  EXPECT_EQ(arr.size(), 0u);
  ASSERT_TRUE(arr.Resize(1000));
  EXPECT_EQ(arr.size(), 1000u);
  for (size_t i = 0; i < 1000; ++i) {
    ASSERT_EQ(arr[i].a | arr[i].b | arr[i].c, 0u) << i;
    arr[i] = {static_cast<uint32_t>(i), static_cast<uint32_t>(i * 3), 0xFFFFFFFFu};
  }
  // Past a huge page: the elements survive the move.
  const size_t big = 3 * kMiB / sizeof(Triple);
  ASSERT_TRUE(arr.Resize(big));
  EXPECT_EQ(arr.size(), big);
  EXPECT_EQ(arr.data(), &arr[0]);
  for (size_t i = 0; i < 1000; ++i) {
    ASSERT_EQ(arr[i].a, i);
    ASSERT_EQ(arr[i].b, i * 3);
    ASSERT_EQ(arr[i].c, 0xFFFFFFFFu);
  }
  EXPECT_EQ(FirstNonZero(reinterpret_cast<const uint8_t*>(arr.data()), 1000 * sizeof(Triple),
                         big * sizeof(Triple)),
            big * sizeof(Triple));
  // Shrink and grow: the dropped elements come back as zeros.
  ASSERT_TRUE(arr.Resize(10));
  ASSERT_TRUE(arr.Resize(1000));
  EXPECT_EQ(arr[9].b, 27u);
  for (size_t i = 10; i < 1000; ++i) ASSERT_EQ(arr[i].a | arr[i].b | arr[i].c, 0u) << i;
}

TEST(PageVector, PushBackAcrossTheMappingThreshold) {
  // 64-bit values: the vector's storage passes kSmallAllocation (operator
  // new below, mappings above) and 2 MiB (huge pages advised) while it grows.
  PageVector<uint64_t> v;
  const size_t n = 3 * kMiB / sizeof(uint64_t);
  bool crossed = false;
  for (size_t i = 0; i < n; ++i) {
    size_t cap = v.capacity();
    v.push_back(i * 0x9E3779B97F4A7C15ull);
    if (v.capacity() != cap && cap * sizeof(uint64_t) < kSmallAllocation &&
        v.capacity() * sizeof(uint64_t) >= kSmallAllocation) {
      crossed = true;
      for (size_t j = 0; j <= i; ++j) ASSERT_EQ(v[j], j * 0x9E3779B97F4A7C15ull) << j;
    }
  }
  EXPECT_TRUE(crossed);
  ASSERT_EQ(v.size(), n);
  for (size_t j = 0; j < n; ++j) ASSERT_EQ(v[j], j * 0x9E3779B97F4A7C15ull) << j;

  // Copies, and shrinking back below the threshold (memory given back with
  // the size it was allocated with).
  PageVector<uint64_t> copy = v;
  EXPECT_TRUE(copy == v);
  v.resize(10);
  v.shrink_to_fit();
  ASSERT_EQ(v.size(), 10u);
  for (size_t j = 0; j < 10; ++j) EXPECT_EQ(v[j], j * 0x9E3779B97F4A7C15ull);
  EXPECT_EQ(copy.size(), n);
  EXPECT_EQ(copy[n - 1], (n - 1) * 0x9E3779B97F4A7C15ull);

  // A reserved vector of structs, as the scan's tables are.
  PageVector<Triple> t;
  t.reserve(kSmallAllocation / sizeof(Triple) + 1);
  for (uint32_t i = 0; i < 50000; ++i) t.push_back({i, ~i, i * 7});
  for (uint32_t i = 0; i < 50000; ++i) {
    ASSERT_EQ(t[i].a, i);
    ASSERT_EQ(t[i].b, ~i);
    ASSERT_EQ(t[i].c, i * 7);
  }
}

TEST(PageAllocator, AllocatesWritableMemoryOfEverySizeAndRefusesTooMuch) {
  for (size_t bytes : {size_t{1}, kSmallAllocation - 1, kSmallAllocation, kSmallAllocation + 1, 2 * kMiB,
                       5 * kMiB + 3}) {
    SCOPED_TRACE(bytes);
    auto* p = static_cast<uint8_t*>(AllocatePages(bytes));
    ASSERT_NE(p, nullptr);
    std::memset(p, 0x5C, bytes);
    EXPECT_EQ(p[0], 0x5C);
    EXPECT_EQ(p[bytes - 1], 0x5C);
    FreePages(p, bytes);
  }
  FreePages(nullptr, 100);
  FreePages(nullptr, 10 * kMiB);
  PageAllocator<uint64_t> a;
  EXPECT_THROW(a.allocate(SIZE_MAX / sizeof(uint64_t) + 1), std::bad_alloc);
  EXPECT_THROW(a.allocate(SIZE_MAX / sizeof(uint64_t) / 2), std::bad_alloc);
  EXPECT_THROW(AllocatePages(SIZE_MAX - 1000), std::bad_alloc);
}

}  // namespace
}  // namespace kvfile::internal
