// SPDX-License-Identifier: Apache-2.0
// The scalar reference of the NVFP4 codec (spec/CODEC.md, section 14): each
// function is one step of the specification, in its order.
#include "codec/nvfp4.h"

#include <cfloat>
#include <cmath>
#include <cstring>

#include "kvfile/codec.h"

namespace kvfile::codec::nvfp4 {
namespace {

uint32_t Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

}  // namespace

uint8_t EncodeE2M1(float x) {
  if (std::isnan(x)) return 0x7;
  const uint8_t sign = static_cast<uint8_t>((Bits(x) >> 31) << 3);
  const float a = std::fabs(x);
  // The midpoints between consecutive magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6;
  // a tie goes to the even code (codes 0, 2, 4 and 6 are even).
  uint8_t m;
  if (a <= 0.25f) {
    m = 0;
  } else if (a < 0.75f) {
    m = 1;
  } else if (a <= 1.25f) {
    m = 2;
  } else if (a < 1.75f) {
    m = 3;
  } else if (a <= 2.5f) {
    m = 4;
  } else if (a < 3.5f) {
    m = 5;
  } else if (a <= 5.0f) {
    m = 6;
  } else {
    m = 7;  // 6, and saturation of everything larger (Inf included)
  }
  return static_cast<uint8_t>(sign | m);
}

float DecodeE2M1(uint8_t code) {
  static constexpr float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMagnitude[code & 0x7];
  return (code & 0x8) ? -m : m;
}

float DecodeScaled(uint8_t code, float divisor) {
  const float value = DecodeE2M1(code);
  return (code & 0x7) == 0 ? value : value * divisor;
}

float RowScale(float amax) {
  if (amax == 0.0f) return 1.0f;
  const float scale = amax / kRowRange;
  constexpr float kFltMin = 0x1p-126f;
  return scale < kFltMin ? kFltMin : scale;
}

uint8_t BlockScaleCode(float block_amax, float row_scale) {
  const float relative = block_amax / row_scale;
  return EncodeElement(relative / kE2M1Max, Dtype::kE4M3);
}

float BlockDivisor(uint8_t block_code, float row_scale) {
  return DecodeElement(block_code, Dtype::kE4M3) * row_scale;
}

bool QuantizeRow(const float* x, size_t n, uint8_t* packed, uint8_t* block_scales,
                 float* row_scale) {
  float amax = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return false;
    amax = std::fmax(amax, std::fabs(x[i]));
  }
  const float scale = RowScale(amax);
  *row_scale = scale;
  for (size_t b = 0; b < n / kBlock; ++b) {
    const float* block = x + b * kBlock;
    float block_amax = 0.0f;
    for (size_t i = 0; i < kBlock; ++i) block_amax = std::fmax(block_amax, std::fabs(block[i]));
    const uint8_t code = BlockScaleCode(block_amax, scale);
    block_scales[b] = code;
    const float divisor = BlockDivisor(code, scale);
    for (size_t i = 0; i < kBlock; i += 2) {
      uint8_t pair[2];
      for (size_t j = 0; j < 2; ++j) {
        const float v = block[i + j];
        // A zero block scale: every element is a zero with its own sign.
        pair[j] = divisor == 0.0f ? static_cast<uint8_t>((Bits(v) >> 31) << 3)
                                  : EncodeE2M1(v / divisor);
      }
      packed[(b * kBlock + i) / 2] = static_cast<uint8_t>(pair[0] | (pair[1] << 4));
    }
  }
  return true;
}

void DequantizeRow(const uint8_t* packed, const uint8_t* block_scales, float row_scale, size_t n,
                   float* out) {
  for (size_t b = 0; b < n / kBlock; ++b) {
    const float divisor = BlockDivisor(block_scales[b], row_scale);
    for (size_t i = 0; i < kBlock; ++i) {
      const size_t e = b * kBlock + i;
      const uint8_t code = static_cast<uint8_t>((packed[e / 2] >> ((e % 2) * 4)) & 0xF);
      out[e] = DecodeScaled(code, divisor);
    }
  }
}

namespace internal {
namespace {
bool QuantizeRowWidened(Dtype src_dtype, const void* src, size_t n, uint8_t* packed,
                        uint8_t* block_scales, float* row_scale, float* scratch) {
  ConvertRaw(src_dtype, src, n, Dtype::kF32, scratch);
  return QuantizeRow(scratch, n, packed, block_scales, row_scale);
}
void DequantizeRowNarrowed(const uint8_t* packed, const uint8_t* block_scales, float row_scale,
                           size_t n, Dtype dst_dtype, void* out, float* scratch) {
  float* f = dst_dtype == Dtype::kF32 ? static_cast<float*>(out) : scratch;
  DequantizeRow(packed, block_scales, row_scale, n, f);
  for (size_t i = 0; i < n; ++i) {
    if (std::isinf(f[i])) f[i] = std::copysign(FLT_MAX, f[i]);
  }
  if (dst_dtype != Dtype::kF32) ConvertRaw(Dtype::kF32, f, n, dst_dtype, out);
}
}  // namespace
const Kernels kScalarKernels = {QuantizeRowWidened, DequantizeRowNarrowed};
}  // namespace internal

size_t FindInvalidBlockScale(const uint8_t* block_scales, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (block_scales[i] >= 0x7F) return i;
  }
  return n;
}

}  // namespace kvfile::codec::nvfp4
