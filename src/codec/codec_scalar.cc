// SPDX-License-Identifier: Apache-2.0
// Scalar reference kernels: the row rule of spec/CODEC.md applied one element
// at a time with the element conversions of codec.cc. Written to be obviously
// correct; the vector kernels must produce the same bytes.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "codec/codec_internal.h"
#include "kvfile/codec.h"

namespace kvfile::codec::internal {
namespace {

// The i-th element of a raw block as f32 (exact for every dtype).
template <Dtype kDt>
float LoadElement(const void* src, size_t i) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  if constexpr (kDt == Dtype::kF32) {
    float x;
    std::memcpy(&x, bytes + i * 4, 4);
    return x;
  } else {
    uint16_t h;
    std::memcpy(&h, bytes + i * 2, 2);
    if constexpr (kDt == Dtype::kBF16) {
      // Bf16ToF32, written out so that it inlines: the bf16 bits are the top
      // half of the f32 bits.
      const uint32_t bits = static_cast<uint32_t>(h) << 16;
      float x;
      std::memcpy(&x, &bits, 4);
      return x;
    } else {
      return F16ToF32(h);
    }
  }
}

float LoadElement(Dtype dtype, const void* src, size_t i) {
  switch (dtype) {
    case Dtype::kBF16:
      return LoadElement<Dtype::kBF16>(src, i);
    case Dtype::kF16:
      return LoadElement<Dtype::kF16>(src, i);
    default:
      return LoadElement<Dtype::kF32>(src, i);
  }
}

// Writes f32 `x` as the i-th element of a raw block, rounding to nearest even
// and clamping to the dtype's finite range.
template <Dtype kDt>
void StoreElement(void* dst, size_t i, float x) {
  auto* bytes = static_cast<unsigned char*>(dst);
  if constexpr (kDt == Dtype::kF32) {
    std::memcpy(bytes + i * 4, &x, 4);
  } else {
    const uint16_t h = kDt == Dtype::kBF16 ? F32ToBf16(x) : F32ToF16(x);
    std::memcpy(bytes + i * 2, &h, 2);
  }
}

void StoreElement(Dtype dtype, void* dst, size_t i, float x) {
  switch (dtype) {
    case Dtype::kBF16:
      return StoreElement<Dtype::kBF16>(dst, i, x);
    case Dtype::kF16:
      return StoreElement<Dtype::kF16>(dst, i, x);
    default:
      return StoreElement<Dtype::kF32>(dst, i, x);
  }
}

bool IsFinite(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  return (bits & 0x7FFFFFFFu) < kF32InfBits;
}

float Abs(float x) { return std::fabs(x); }

template <Dtype kDt>
bool QuantizeRowsT(Dtype kind, const void* src, size_t rows, size_t width, uint8_t* codes,
                   float* scales, size_t* bad_row) {
  for (size_t r = 0; r < rows; ++r) {
    const size_t base = r * width;
    // 1. amax over the row, refusing NaN and Inf.
    float amax = 0.0f;
    for (size_t i = 0; i < width; ++i) {
      const float x = LoadElement<kDt>(src, base + i);
      if (!IsFinite(x)) {
        *bad_row = r;
        return false;
      }
      if (Abs(x) > amax) amax = Abs(x);
    }
    // 2. The scale (1.0 for an all-zero row; then x / 1.0 keeps each zero's sign).
    const float scale = RowScale(amax, kind);
    std::memcpy(scales + r, &scale, sizeof scale);
    // 3. Each code from an IEEE f32 division by the scale.
    for (size_t i = 0; i < width; ++i) {
      const float x = LoadElement<kDt>(src, base + i);
      codes[base + i] = EncodeElement(x / scale, kind);
    }
  }
  return true;
}

bool QuantizeRowsScalar(Dtype kind, Dtype src_dtype, const void* src, size_t rows, size_t width,
                        uint8_t* codes, float* scales, size_t* bad_row) {
  switch (src_dtype) {
    case Dtype::kBF16:
      return QuantizeRowsT<Dtype::kBF16>(kind, src, rows, width, codes, scales, bad_row);
    case Dtype::kF16:
      return QuantizeRowsT<Dtype::kF16>(kind, src, rows, width, codes, scales, bad_row);
    default:
      return QuantizeRowsT<Dtype::kF32>(kind, src, rows, width, codes, scales, bad_row);
  }
}

template <Dtype kDt>
void DequantizeRowsT(Dtype kind, const uint8_t* codes, const float* scales, size_t rows,
                     size_t width, void* dst) {
  for (size_t r = 0; r < rows; ++r) {
    float scale;
    std::memcpy(&scale, scales + r, sizeof scale);
    const size_t base = r * width;
    for (size_t i = 0; i < width; ++i) {
      float v = DecodeElement(codes[base + i], kind) * scale;
      if constexpr (kDt == Dtype::kF32) {
        // The f32 multiply itself may overflow: clamp to the largest finite
        // f32 like the narrower dtypes. (bf16 / f16 clamp in the conversion.)
        if (std::isinf(v)) v = std::copysign(0x1.fffffep127f, v);
      }
      StoreElement<kDt>(dst, base + i, v);
    }
  }
}

void DequantizeRowsScalar(Dtype kind, const uint8_t* codes, const float* scales, size_t rows,
                          size_t width, Dtype dst_dtype, void* dst) {
  switch (dst_dtype) {
    case Dtype::kBF16:
      return DequantizeRowsT<Dtype::kBF16>(kind, codes, scales, rows, width, dst);
    case Dtype::kF16:
      return DequantizeRowsT<Dtype::kF16>(kind, codes, scales, rows, width, dst);
    default:
      return DequantizeRowsT<Dtype::kF32>(kind, codes, scales, rows, width, dst);
  }
}

size_t FindInvalidCodeScalar(Dtype kind, const uint8_t* codes, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (IsNonFiniteCode(codes[i], kind)) return i;
  }
  return n;
}

void ConvertRawScalar(Dtype src_dtype, const void* src, size_t n, Dtype dst_dtype, void* dst) {
  if (src_dtype == dst_dtype) {
    std::memmove(dst, src, n * ElementSize(src_dtype));
    return;
  }
  for (size_t i = 0; i < n; ++i) StoreElement(dst_dtype, dst, i, LoadElement(src_dtype, src, i));
}

size_t FindNonFiniteScalar(Dtype dtype, const void* src, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (!IsFinite(LoadElement(dtype, src, i))) return i;
  }
  return n;
}

}  // namespace

const Kernels kScalarKernels = {
    QuantizeRowsScalar,    DequantizeRowsScalar, FindInvalidCodeScalar,
    EncodeScaledReference, ConvertRawScalar,     FindNonFiniteScalar,
};

}  // namespace kvfile::codec::internal
