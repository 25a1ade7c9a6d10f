// SPDX-License-Identifier: Apache-2.0
// The NVFP4 codec on one core (docs/performance.md, "NVFP4 encode and
// decode"): 32,768 rows of 1,024 elements of normal values with outlier
// channels and row magnitudes 2^-20 .. 2^19, encoded from and decoded to
// the source dtype on one instruction-set path, against a memcpy of the same
// bytes in the same process. Thread CPU time; each figure is the median of
// the runs; the three measurements alternate within each run.
//
//   nvfp4_bench [--isa scalar|avx2|avx512] [--dtype bf16|f16|f32] [--runs N]
#include <time.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvfile/codec.h"

namespace {

using kvfile::Dtype;
using kvfile::codec::Isa;

constexpr size_t kRows = 32768;
constexpr size_t kWidth = 1024;
constexpr size_t kElems = kRows * kWidth;

double ThreadSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Usage() {
  std::fprintf(stderr, "usage: nvfp4_bench [--isa scalar|avx2|avx512] [--dtype bf16|f16|f32] [--runs N]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Isa isa = kvfile::codec::BestIsa();
  Dtype dtype = Dtype::kBF16;
  int runs = 9;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--isa") {
      isa = value == "scalar"   ? Isa::kScalar
            : value == "avx2"   ? Isa::kAvx2
            : value == "avx512" ? Isa::kAvx512
                                : Isa::kBest;
      if (isa == Isa::kBest) return Usage();
    } else if (flag == "--dtype") {
      dtype = value == "bf16"  ? Dtype::kBF16
              : value == "f16" ? Dtype::kF16
              : value == "f32" ? Dtype::kF32
                               : Dtype::kE4M3;  // not a source dtype: refused below
      if (dtype == Dtype::kE4M3) return Usage();
    } else if (flag == "--runs") {
      runs = std::atoi(value.c_str());
      if (runs < 1) return Usage();
    } else {
      return Usage();
    }
  }
  if (argc % 2 == 0) return Usage();
  if (!kvfile::codec::IsaSupported(isa)) {
    std::fprintf(stderr, "nvfp4_bench: %s is not supported here\n", kvfile::codec::IsaName(isa));
    return 2;
  }
  std::vector<float> f32(kElems);
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t r = 0; r < kRows; ++r) {
    const float row_scale = std::ldexp(1.0f, static_cast<int>(r % 40) - 20);
    for (size_t i = 0; i < kWidth; ++i) {
      float x = normal(rng) * row_scale;
      if (i % 37 == 5) x *= 20.0f;  // outlier channels
      f32[r * kWidth + i] = x;
    }
  }
  const size_t bytes = kElems * kvfile::ElementSize(dtype);
  std::vector<uint8_t> src(bytes), copy(bytes), out(bytes);
  kvfile::codec::ConvertRaw(Dtype::kF32, f32.data(), kElems, dtype, src.data());
  std::vector<uint8_t> packed(kElems / 2), blocks(kElems / 16);
  std::vector<float> scales(kRows);
  std::memset(copy.data(), 1, bytes);
  std::memset(out.data(), 1, bytes);
  std::vector<double> t_copy, t_enc, t_dec;
  for (int run = 0; run < runs; ++run) {
    double t0 = ThreadSeconds();
    std::memcpy(copy.data(), src.data(), bytes);
    double t1 = ThreadSeconds();
    t_copy.push_back(t1 - t0);
    size_t bad = 0;
    t0 = ThreadSeconds();
    if (!kvfile::codec::QuantizeNvfp4Rows(dtype, src.data(), kRows, kWidth, packed.data(), blocks.data(),
                                          scales.data(), &bad, isa)) {
      std::fprintf(stderr, "nvfp4_bench: row %zu refused\n", bad);
      return 1;
    }
    t1 = ThreadSeconds();
    t_enc.push_back(t1 - t0);
    t0 = ThreadSeconds();
    kvfile::codec::DequantizeNvfp4Rows(packed.data(), blocks.data(), scales.data(), kRows, kWidth, dtype,
                                       out.data(), isa);
    t1 = ThreadSeconds();
    t_dec.push_back(t1 - t0);
  }
  const double gb = static_cast<double>(bytes) * 1e-9;
  const double copy_gbs = gb / Median(t_copy), enc_gbs = gb / Median(t_enc), dec_gbs = gb / Median(t_dec);
  // Bytes of the source dtype per second of thread CPU time.
  std::printf("%s %s: memcpy %.2f GB/s, encode %.2f GB/s (%.2fx), decode %.2f GB/s (%.2fx), medians of %d\n",
              kvfile::codec::IsaName(isa), dtype == Dtype::kBF16 ? "bf16" : dtype == Dtype::kF16 ? "f16" : "f32",
              copy_gbs, enc_gbs, enc_gbs / copy_gbs, dec_gbs, dec_gbs / copy_gbs, runs);
  // A checksum of the outputs, so that a change can be compared byte for byte.
  uint64_t h = 1469598103934665603ull;
  for (uint8_t b : packed) h = (h ^ b) * 1099511628211ull;
  for (uint8_t b : blocks) h = (h ^ b) * 1099511628211ull;
  std::printf("output hash %016llx\n", static_cast<unsigned long long>(h));
  return 0;
}
