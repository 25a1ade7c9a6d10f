// SPDX-License-Identifier: Apache-2.0
// spec/CODEC.md 14.4 decoded on an NVIDIA GPU, against kvfile's CPU decode:
// every E2M1 code under every valid E4M3 block scale (0x00..0x7E) and a set
// of extreme row scales (FLT_MAX and its neighbours, FLT_MAX/448 and the
// next float, where the block divisor overflows to +Inf, the smallest
// normal scales, and random valid ones). The kernel takes the codes' and
// block scales' values from NVIDIA's device conversions (cuda_fp4.h,
// cuda_fp8.h) and follows 14.4: D = DEC_e4m3(B) * S, a zero code the zero
// of its sign, otherwise DEC4 * D, each one f32 multiplication rounded to
// nearest (no FMA, no flush to zero), then clamped to +-FLT_MAX (section 7).
// Prints the number of f32 outputs that differ from
// codec::DequantizeNvfp4Rows on each CPU path (exit 1 if any). Not part of the
// build: run on a GPU machine, linked against the library (docs/testing.md).
//
//   nvcc -O2 -std=c++20 -fmad=false -ftz=false -Isrc/include nvfp4_cuda_check.cu libkvfile.a -lxxhash -luring -lz
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kvfile/codec.h"

namespace {

constexpr int kBlocks = 0x7F, kBlock = 16, kWidth = kBlocks * kBlock;

__global__ void Decode(const uint8_t* packed, const uint8_t* blocks, const float* scales, int rows, float* out) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= rows * kWidth) return;
  int r = i / kWidth, e = i % kWidth;
  uint8_t byte = packed[i / 2];
  uint8_t code = (e % 2 == 0) ? (byte & 0xF) : (byte >> 4);
  float v = __half2float(__half(__nv_cvt_fp4_to_halfraw(code, __NV_E2M1)));
  float b = __half2float(__half(__nv_cvt_fp8_to_halfraw(blocks[r * kBlocks + e / kBlock], __NV_E4M3)));
  float d = __fmul_rn(b, scales[r]);
  float x = (v == 0.0f) ? v : __fmul_rn(v, d);
  if (isinf(x)) x = copysignf(FLT_MAX, x);
  out[i] = x;
}

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

}  // namespace

int main() {
  std::vector<float> scales = {FromBits(0x7F7FFFFF), FromBits(0x7F7FFFFE), FromBits(0x7F000000), FLT_MAX / 448.0f,
                               std::nextafter(FLT_MAX / 448.0f, INFINITY), FLT_MAX / 2688.0f, std::ldexp(1.0f, 120),
                               1.0f, 0.37f, FromBits(0x00800000), FromBits(0x00800001)};
  std::mt19937 rng(27);
  for (int i = 0; i < 1000; ++i) scales.push_back(FromBits(0x00800000u + rng() % (0x7F7FFFFFu - 0x00800000u + 1)));
  const int rows = static_cast<int>(scales.size());
  std::vector<uint8_t> packed(size_t(rows) * kWidth / 2), blocks(size_t(rows) * kBlocks);
  for (int r = 0; r < rows; ++r)
    for (int b = 0; b < kBlocks; ++b) {
      blocks[size_t(r) * kBlocks + b] = static_cast<uint8_t>(b);
      for (int j = 0; j < 8; ++j) packed[(size_t(r) * kBlocks + b) * 8 + j] = static_cast<uint8_t>(2 * j | (2 * j + 1) << 4);
    }
  const size_t n = size_t(rows) * kWidth;
  uint8_t *d_packed, *d_blocks;
  float *d_scales, *d_out;
  if (cudaMalloc(&d_packed, packed.size()) || cudaMalloc(&d_blocks, blocks.size()) ||
      cudaMalloc(&d_scales, rows * sizeof(float)) || cudaMalloc(&d_out, n * sizeof(float))) {
    std::printf("cuda: cannot allocate\n");
    return 2;
  }
  cudaMemcpy(d_packed, packed.data(), packed.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(d_blocks, blocks.data(), blocks.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(d_scales, scales.data(), rows * sizeof(float), cudaMemcpyHostToDevice);
  Decode<<<static_cast<unsigned>((n + 255) / 256), 256>>>(d_packed, d_blocks, d_scales, rows, d_out);
  std::vector<float> gpu(n);
  if (cudaMemcpy(gpu.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) {
    std::printf("cuda: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 2;
  }
  int failed = 0;
  using kvfile::codec::Isa;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!kvfile::codec::IsaSupported(isa)) {
      std::printf("%s: not supported on this CPU\n", kvfile::codec::IsaName(isa));
      continue;
    }
    std::vector<float> cpu(n);
    kvfile::codec::DequantizeNvfp4Rows(packed.data(), blocks.data(), scales.data(), rows, kWidth, kvfile::Dtype::kF32,
                                       cpu.data(), isa);
    size_t diff = 0, zeros = 0;
    for (size_t i = 0; i < n; ++i) {
      if (std::memcmp(&cpu[i], &gpu[i], 4) != 0 && diff++ < 3) {
        uint32_t a, b;
        std::memcpy(&a, &cpu[i], 4);
        std::memcpy(&b, &gpu[i], 4);
        std::printf("  row scale %a, block 0x%02zx, code 0x%zx: cpu 0x%08x gpu 0x%08x\n", scales[i / kWidth],
                    (i % kWidth) / kBlock, i % kBlock, a, b);
      }
      if (gpu[i] == 0) ++zeros;
    }
    std::printf("%s: %zu f32 outputs (%d row scales x %d block scales x 16 codes), %zu differ from the GPU; %zu zeros\n",
                kvfile::codec::IsaName(isa), n, rows, kBlocks, diff, zeros);
    failed |= diff != 0;
  }
  return failed;
}
