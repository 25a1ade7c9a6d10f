// SPDX-License-Identifier: Apache-2.0
// Makes the NVFP4 reference vectors in tests/vectors/ from NVIDIA's host
// conversions (cuda_fp4.hpp, cuda_fp8.hpp), independently of kvfile's codec.
// Not part of the build; see tests/vectors/README.md for how to run it.
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

uint8_t Fp4(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest) & 0xF);
}
uint8_t E4m3(float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); }
float E4m3Value(uint8_t c) {
  __half_raw h = __nv_cvt_fp8_to_halfraw(c, __NV_E4M3);
  return __half2float(__half(h));
}
float Fp4Value(uint8_t c) {
  __half_raw h = __nv_cvt_fp4_to_halfraw(c, __NV_E2M1);
  return __half2float(__half(h));
}
float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
void Write(const std::string& dir, const char* name, const void* data, size_t n) {
  const std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(data, 1, n, f) != n || std::fclose(f) != 0) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
}
std::vector<uint8_t> Read(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(1);
  }
  std::vector<uint8_t> out;
  uint8_t buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.insert(out.end(), buf, buf + n);
  std::fclose(f);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s TESTS_VECTORS_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];

  // Element tables over every bf16 and f16 pattern, and the 16 code values.
  std::vector<uint8_t> from_bf16(65536), from_f16(65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    from_bf16[h] = Fp4(FromBits(h << 16));
    __half_raw r;
    r.x = static_cast<unsigned short>(h);
    from_f16[h] = Fp4(__half2float(__half(r)));
  }
  float to_f32[16];
  for (uint8_t c = 0; c < 16; ++c) to_f32[c] = Fp4Value(c);
  Write(dir, "e2m1_from_bf16.bin", from_bf16.data(), from_bf16.size());
  Write(dir, "e2m1_from_f16.bin", from_f16.data(), from_f16.size());
  Write(dir, "e2m1_to_f32.bin", to_f32, sizeof to_f32);

  // Every finite f32, in increasing bit-pattern order: crc32 of the codes.
  uLong crc = crc32(0L, Z_NULL, 0);
  std::vector<uint8_t> buf;
  buf.reserve(1 << 24);
  for (uint64_t b = 0; b <= 0xFFFFFFFFull; ++b) {
    if (((b >> 23) & 0xFF) == 0xFF) continue;
    buf.push_back(Fp4(FromBits(static_cast<uint32_t>(b))));
    if (buf.size() == buf.capacity()) {
      crc = crc32(crc, buf.data(), static_cast<uInt>(buf.size()));
      buf.clear();
    }
  }
  crc = crc32(crc, buf.data(), static_cast<uInt>(buf.size()));
  std::printf("e2m1 over every finite f32: crc32 %08lx\n", crc);

  // The whole rule on the KV-like rows of rows_bf16.bin (4,096 x 128).
  const std::vector<uint8_t> raw = Read(dir + "/rows_bf16.bin");
  const size_t width = 128, rows = raw.size() / (2 * width);
  std::vector<uint8_t> packed(rows * width / 2), blocks(rows * width / 16);
  std::vector<float> scales(rows);
  for (size_t r = 0; r < rows; ++r) {
    float x[128];
    for (size_t i = 0; i < width; ++i) {
      uint16_t h;
      std::memcpy(&h, &raw[2 * (r * width + i)], 2);
      x[i] = FromBits(static_cast<uint32_t>(h) << 16);
    }
    float amax = 0;
    for (float v : x) amax = std::fmax(amax, std::fabs(v));
    float scale = amax == 0 ? 1.0f : amax / 2688.0f;
    if (scale < 0x1p-126f) scale = 0x1p-126f;
    scales[r] = scale;
    for (size_t b = 0; b < width / 16; ++b) {
      float bmax = 0;
      for (size_t i = 0; i < 16; ++i) bmax = std::fmax(bmax, std::fabs(x[b * 16 + i]));
      const float relative = bmax / scale;
      const uint8_t bc = E4m3(relative / 6.0f);
      blocks[r * (width / 16) + b] = bc;
      const float divisor = E4m3Value(bc) * scale;
      for (size_t i = 0; i < 16; ++i) {
        const size_t e = b * 16 + i;
        uint32_t bits;
        std::memcpy(&bits, &x[e], 4);
        const uint8_t c = divisor == 0 ? static_cast<uint8_t>((bits >> 31) << 3) : Fp4(x[e] / divisor);
        packed[r * width / 2 + e / 2] |= static_cast<uint8_t>(c << ((e % 2) * 4));
      }
    }
  }
  Write(dir, "rows_nvfp4_codes.bin", packed.data(), packed.size());
  Write(dir, "rows_nvfp4_block_scales.bin", blocks.data(), blocks.size());
  Write(dir, "rows_nvfp4_scales.bin", scales.data(), scales.size() * 4);
  std::printf("%zu rows written\n", rows);
  return 0;
}
