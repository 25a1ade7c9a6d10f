// SPDX-License-Identifier: Apache-2.0
// Micro-benchmarks of the fp8 codec: QuantizeRows bf16 -> e4m3 and
// DequantizeRows e4m3 -> bf16 on each instruction-set path, over a 16 MiB bf16
// block of 128-wide rows, against a memcpy of the same block. Throughput is
// reported in bytes of bf16 per second.
//
//   codec_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true

#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kvfile/codec.h"

namespace {

using kvfile::Dtype;
using kvfile::codec::Isa;

constexpr size_t kBlockBytes = size_t{16} << 20;  // 16 MiB of bf16
constexpr size_t kWidth = 128;
constexpr size_t kElems = kBlockBytes / 2;
constexpr size_t kRows = kElems / kWidth;

// Buffers built (and so pre-faulted) once, outside every timed loop: KV-like
// rows, roughly Gaussian values with a few large channels.
struct Block {
  std::vector<uint16_t> bf16 = std::vector<uint16_t>(kElems);
  std::vector<uint8_t> codes = std::vector<uint8_t>(kElems);
  std::vector<float> scales = std::vector<float>(kRows);
  std::vector<uint16_t> out = std::vector<uint16_t>(kElems);
  std::vector<uint16_t> copy = std::vector<uint16_t>(kElems);

  Block() {
    std::mt19937 rng(42);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (size_t r = 0; r < kRows; ++r) {
      const float row_scale = std::exp2(static_cast<float>(static_cast<int>(rng() % 16)) - 8.0f);
      for (size_t i = 0; i < kWidth; ++i) {
        float x = normal(rng) * row_scale;
        if (i % 37 == 5) x *= 20.0f;  // outlier channels
        bf16[r * kWidth + i] = kvfile::codec::F32ToBf16(x);
      }
    }
    size_t bad = 0;
    kvfile::codec::QuantizeRows(Dtype::kE4M3, Dtype::kBF16, bf16.data(), kRows, kWidth,
                                codes.data(), scales.data(), &bad);
    std::memset(out.data(), 1, kBlockBytes);
    std::memset(copy.data(), 1, kBlockBytes);
  }
};

Block& TheBlock() {
  static Block block;
  return block;
}

bool SkipUnsupported(benchmark::State& state, Isa isa) {
  if (kvfile::codec::IsaSupported(isa)) return false;
  state.SkipWithError("instruction set not supported on this CPU");
  return true;
}

void BM_QuantizeBf16ToE4M3(benchmark::State& state, Isa isa) {
  if (SkipUnsupported(state, isa)) return;
  Block& b = TheBlock();
  for (auto _ : state) {
    size_t bad = 0;
    const bool ok = kvfile::codec::QuantizeRows(Dtype::kE4M3, Dtype::kBF16, b.bf16.data(), kRows,
                                                kWidth, b.codes.data(), b.scales.data(), &bad, isa);
    benchmark::DoNotOptimize(ok);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(kBlockBytes));
}

void BM_DequantizeE4M3ToBf16(benchmark::State& state, Isa isa) {
  if (SkipUnsupported(state, isa)) return;
  Block& b = TheBlock();
  for (auto _ : state) {
    kvfile::codec::DequantizeRows(Dtype::kE4M3, b.codes.data(), b.scales.data(), kRows, kWidth,
                                  Dtype::kBF16, b.out.data(), isa);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(kBlockBytes));
}

void BM_Memcpy(benchmark::State& state) {
  Block& b = TheBlock();
  for (auto _ : state) {
    std::memcpy(b.copy.data(), b.bf16.data(), kBlockBytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(kBlockBytes));
}

BENCHMARK(BM_Memcpy)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_QuantizeBf16ToE4M3, scalar, Isa::kScalar)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_QuantizeBf16ToE4M3, avx2, Isa::kAvx2)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_QuantizeBf16ToE4M3, avx512, Isa::kAvx512)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_DequantizeE4M3ToBf16, scalar, Isa::kScalar)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_DequantizeE4M3ToBf16, avx2, Isa::kAvx2)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_DequantizeE4M3ToBf16, avx512, Isa::kAvx512)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
