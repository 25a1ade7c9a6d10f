// SPDX-License-Identifier: Apache-2.0
// Exhaustive codec sweeps (CTest label `long`):
//
//  1. The element conversion over every finite f32 bit pattern, in increasing
//     bit-pattern order (4,278,190,080 values): the zlib crc32 of the code
//     sequence must equal the reference digest of tests/vectors/README.md, and
//     every vector path must give the scalar reference's code for every value.
//  2. QuantizeRows of >= 10^8 random f32 elements per kind (plus random bf16
//     and f16 rows), every vector ISA against the scalar reference, bit for bit.
//
// Uses two threads (the machine this runs on in CI has two cores).

#include <gtest/gtest.h>
#include <zlib.h>

#include <bit>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "codec/codec_internal.h"
#include "kvfile/codec.h"

namespace kvfile::codec {
namespace {

using internal::Kernels;

const char* KindName(Dtype k) { return k == Dtype::kE4M3 ? "e4m3" : "e5m2"; }

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// ---- 1. Every finite f32 ----

constexpr size_t kChunk = size_t{1} << 16;

struct RangeResult {
  uLong crc = 0;            // crc32 of the codes of the range, from the vector path
  uint64_t count = 0;       // values covered
  uint64_t mismatches = 0;  // vector path != scalar reference
  uint32_t first_mismatch = 0;
};

// Encodes the f32 patterns [begin, end) with `fast` (crc over its codes) and
// with the scalar reference, comparing every code.
void SweepRange(Dtype kind, const Kernels* fast, uint32_t begin, uint32_t end, RangeResult* out) {
  std::vector<float> x(kChunk);
  std::vector<uint8_t> codes(kChunk);
  std::vector<uint8_t> ref(kChunk);
  uLong crc = crc32(0L, Z_NULL, 0);
  for (uint64_t base = begin; base < end; base += kChunk) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, end - base));
    for (size_t i = 0; i < n; ++i) x[i] = std::bit_cast<float>(static_cast<uint32_t>(base + i));
    fast->encode_scaled(kind, x.data(), n, codes.data());
    crc = crc32(crc, codes.data(), static_cast<uInt>(n));
    if (fast != &internal::kScalarKernels) {
      internal::kScalarKernels.encode_scaled(kind, x.data(), n, ref.data());
      if (std::memcmp(codes.data(), ref.data(), n) != 0) {
        for (size_t i = 0; i < n; ++i) {
          if (codes[i] != ref[i]) {
            if (out->mismatches == 0) out->first_mismatch = std::bit_cast<uint32_t>(x[i]);
            ++out->mismatches;
          }
        }
      }
    }
    out->count += n;
  }
  out->crc = crc;
}

// The digest of all finite f32 patterns through the `isa` kernels: the
// positive patterns [0, 0x7F800000) on one thread, the negative ones
// [0x80000000, 0xFF800000) on another, joined with crc32_combine.
void CheckDigest(Dtype kind, Isa isa, uint32_t want) {
  const Kernels* k = &internal::KernelsFor(isa);
  const auto t0 = std::chrono::steady_clock::now();
  RangeResult pos, neg;
  std::thread t([&] { SweepRange(kind, k, 0x00000000u, 0x7F800000u, &pos); });
  SweepRange(kind, k, 0x80000000u, 0xFF800000u, &neg);
  t.join();
  const uLong crc = crc32_combine(pos.crc, neg.crc, static_cast<z_off_t>(neg.count));
  std::printf("%s via %s: %" PRIu64 " values, crc32 %08lx, %.1f s\n", KindName(kind), IsaName(isa),
              pos.count + neg.count, crc, Seconds(t0));
  EXPECT_EQ(pos.count + neg.count, 4278190080u);
  EXPECT_EQ(crc, uLong{want}) << KindName(kind) << " via " << IsaName(isa);
  EXPECT_EQ(pos.mismatches + neg.mismatches, 0u)
      << IsaName(isa) << " differs from the scalar reference, first at f32 0x" << std::hex
      << (pos.mismatches ? pos.first_mismatch : neg.first_mismatch);
}

constexpr uint32_t kE4M3Digest = 0xdee326fau;
constexpr uint32_t kE5M2Digest = 0x770f73f6u;

// The fastest path: its digest, and every one of its codes against the scalar
// reference (so the scalar reference has the same digest).
TEST(EveryFiniteF32, E4M3) { CheckDigest(Dtype::kE4M3, Isa::kBest, kE4M3Digest); }
TEST(EveryFiniteF32, E5M2) { CheckDigest(Dtype::kE5M2, Isa::kBest, kE5M2Digest); }

// The other vector path, when it is not the best one, gets the same sweep.
TEST(EveryFiniteF32, Avx2WhenNotBest) {
  if (BestIsa() == Isa::kAvx2 || !IsaSupported(Isa::kAvx2)) {
    GTEST_SKIP() << "avx2 is the best path here (already swept) or is unsupported";
  }
  CheckDigest(Dtype::kE4M3, Isa::kAvx2, kE4M3Digest);
  CheckDigest(Dtype::kE5M2, Isa::kAvx2, kE5M2Digest);
}

// ---- 2. Random rows ----

// A small fast generator (xorshift64*), deterministic across platforms.
struct Rng {
  uint64_t s;
  uint64_t operator()() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1DULL;
  }
};

// Fills `row` with f32 bit patterns: magnitudes from one random "top" binade
// (anywhere from the subnormals to near FLT_MAX) down ~`span` binades, zero
// rows, rows of signed zeros with a few values, and raw random finite patterns.
void RandomF32Row(Rng& rng, uint32_t* row, size_t width) {
  const uint64_t mode = rng() % 16;
  const uint32_t top = static_cast<uint32_t>(rng() % 255);  // biased exponent 0..254
  const uint32_t span = 1 + static_cast<uint32_t>(rng() % 48);
  for (size_t i = 0; i < width; ++i) {
    const uint64_t r = rng();
    const uint32_t sign = static_cast<uint32_t>(r >> 63) << 31;
    uint32_t b;
    if (mode == 0) {  // all zeros of both signs
      b = sign;
    } else if (mode == 1) {  // mostly zeros, a few values
      b = (r % 7 == 0) ? (sign | (top << 23) | static_cast<uint32_t>(r >> 8 & 0x7FFFFF)) : sign;
    } else if (mode == 2) {  // raw random finite patterns
      b = static_cast<uint32_t>(r);
      if ((b & 0x7F800000u) == 0x7F800000u) b &= 0xBFFFFFFFu;
    } else {
      const uint32_t drop = static_cast<uint32_t>((r >> 32) % span);
      const uint32_t e = top > drop ? top - drop : 0;  // 0: subnormal
      b = sign | (e << 23) | static_cast<uint32_t>(r & 0x7FFFFF);
      if ((r >> 40) % 97 == 0) b = sign;  // sprinkled signed zeros
    }
    row[i] = b;
  }
}

// Random 16-bit rows: finite bf16 or f16 patterns around a random top.
void Random16Row(Rng& rng, Dtype dt, uint16_t* row, size_t width) {
  const bool bf = dt == Dtype::kBF16;
  const uint32_t exp_max = bf ? 254 : 30;
  const uint32_t mant_bits = bf ? 7 : 10;
  const uint32_t top = static_cast<uint32_t>(rng() % (exp_max + 1));
  const uint32_t span = 1 + static_cast<uint32_t>(rng() % 24);
  const bool zeros = rng() % 20 == 0;
  for (size_t i = 0; i < width; ++i) {
    const uint64_t r = rng();
    const uint32_t sign = static_cast<uint32_t>(r >> 63) << 15;
    const uint32_t drop = static_cast<uint32_t>((r >> 32) % span);
    const uint32_t e = top > drop ? top - drop : 0;
    const uint32_t m = static_cast<uint32_t>(r) & ((1u << mant_bits) - 1);
    row[i] = static_cast<uint16_t>(zeros ? sign : (sign | (e << mant_bits) | m));
  }
}

constexpr size_t kWidths[] = {1,  3,  7,   8,   15,  16,  17,  31,   32,
                              33, 64, 100, 127, 128, 129, 256, 1000, 4096};

struct RandomResult {
  uint64_t elements = 0;
  uint64_t rows = 0;
  uint64_t failures = 0;
  std::string first_failure;
};

// Quantizes `total` random elements of `dt` with every supported vector ISA
// and the scalar reference; counts rows whose codes or scale differ.
// With `short_rows`, widths are 1..8 and `total` counts rows, not elements:
// per-row work (amax, the scale division, the zero-row rule) dominates.
void RandomSweep(Dtype kind, Dtype dt, uint64_t total, uint64_t seed, RandomResult* res,
                 bool short_rows = false) {
  Rng rng{seed * 0x9E3779B97F4A7C15ULL + 1};
  const size_t block = 1 << 20;  // elements per batch
  std::vector<uint32_t> src32(dt == Dtype::kF32 ? block : 0);
  std::vector<uint16_t> src16(dt == Dtype::kF32 ? 0 : block);
  const void* src = dt == Dtype::kF32 ? static_cast<const void*>(src32.data()) : src16.data();
  std::vector<uint8_t> ref_codes(block), codes(block);
  std::vector<float> ref_scales(block), scales(block);
  size_t wi = static_cast<size_t>(seed);
  while ((short_rows ? res->rows : res->elements) < total) {
    const size_t width = short_rows ? 1 + wi++ % 8 : kWidths[wi++ % std::size(kWidths)];
    const size_t rows = block / width;
    for (size_t r = 0; r < rows; ++r) {
      if (dt == Dtype::kF32) {
        RandomF32Row(rng, src32.data() + r * width, width);
      } else {
        Random16Row(rng, dt, src16.data() + r * width, width);
      }
    }
    size_t bad = 0;
    const bool ok = internal::kScalarKernels.quantize_rows(
        kind, dt, src, rows, width, ref_codes.data(), ref_scales.data(), &bad);
    if (!ok) {
      ++res->failures;
      res->first_failure = "generator produced a non-finite row";
      return;
    }
    for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
      if (!IsaSupported(isa)) continue;
      const bool ok2 = internal::KernelsFor(isa).quantize_rows(kind, dt, src, rows, width,
                                                               codes.data(), scales.data(), &bad);
      const bool same = ok2 && std::memcmp(codes.data(), ref_codes.data(), rows * width) == 0 &&
                        std::memcmp(scales.data(), ref_scales.data(), rows * 4) == 0;
      if (!same) {
        if (res->failures++ == 0) {
          res->first_failure = std::string(IsaName(isa)) + " width " + std::to_string(width);
        }
      }
    }
    res->elements += rows * width;
    res->rows += rows;
  }
}

void CheckRandom(Dtype kind, Dtype dt, uint64_t total) {
  const auto t0 = std::chrono::steady_clock::now();
  RandomResult a, b;
  const uint64_t seed = (kind == Dtype::kE4M3 ? 100 : 200) + static_cast<uint64_t>(dt);
  std::thread t([&] { RandomSweep(kind, dt, total / 2, seed, &a); });
  RandomSweep(kind, dt, total - total / 2, seed + 1000, &b);
  t.join();
  std::printf("%s from dtype %d: %" PRIu64 " random elements, %.1f s\n", KindName(kind),
              static_cast<int>(dt), a.elements + b.elements, Seconds(t0));
  EXPECT_GE(a.elements + b.elements, total);
  EXPECT_EQ(a.failures + b.failures, 0u) << a.first_failure << b.first_failure;
}

// 10^8 random f32 rows (widths 1-8), both kinds together, on two threads.
TEST(RandomRows, HundredMillionShortF32Rows) {
  const auto t0 = std::chrono::steady_clock::now();
  RandomResult a, b;
  std::thread t([&] { RandomSweep(Dtype::kE4M3, Dtype::kF32, 50'000'000, 7, &a, true); });
  RandomSweep(Dtype::kE5M2, Dtype::kF32, 50'000'000, 8, &b, true);
  t.join();
  std::printf("%" PRIu64 " random short f32 rows (%" PRIu64 " elements), %.1f s\n", a.rows + b.rows,
              a.elements + b.elements, Seconds(t0));
  EXPECT_GE(a.rows + b.rows, 100'000'000u);
  EXPECT_EQ(a.failures + b.failures, 0u) << a.first_failure << b.first_failure;
}

TEST(RandomRows, E4M3FromF32) { CheckRandom(Dtype::kE4M3, Dtype::kF32, 100'000'000); }
TEST(RandomRows, E5M2FromF32) { CheckRandom(Dtype::kE5M2, Dtype::kF32, 100'000'000); }
TEST(RandomRows, E4M3FromBf16) { CheckRandom(Dtype::kE4M3, Dtype::kBF16, 25'000'000); }
TEST(RandomRows, E5M2FromBf16) { CheckRandom(Dtype::kE5M2, Dtype::kBF16, 25'000'000); }
TEST(RandomRows, E4M3FromF16) { CheckRandom(Dtype::kE4M3, Dtype::kF16, 25'000'000); }
TEST(RandomRows, E5M2FromF16) { CheckRandom(Dtype::kE5M2, Dtype::kF16, 25'000'000); }

}  // namespace
}  // namespace kvfile::codec
