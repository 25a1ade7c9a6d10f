// SPDX-License-Identifier: Apache-2.0
// The row drivers and dispatch of the vector codec paths, written once over
// per-ISA primitives. Included only by codec_avx2.cc and codec_avx512.cc:
// everything here is in an unnamed namespace, so each of them compiles its
// own copy with its own -m flags (see codec_internal.h for why that matters).
//
// A primitives struct P provides, as static member templates:
//   template <Dtype kDt> float RowAmax(const unsigned char* row, size_t n);
//     the largest |x| of a row, or a negative value if it holds a NaN or Inf;
//   template <Dtype kKind, Dtype kDt>
//   void QuantizeRow(const unsigned char* row, size_t width, float scale, uint8_t* codes);
//     the codes of x / scale for one row;
//   template <Dtype kKind, Dtype kDt, bool kMerged>
//   void DequantizeRow(const uint8_t* codes, size_t width, float factor, unsigned char* out);
//     one decoded row; factor is scale * 2^120 (e4m3) or 2^112 (e5m2) when
//     kMerged, else the scale (see DequantizeRowsT);
//   template <Dtype kKind> void EncodeScaled(const float* x, size_t n, uint8_t* codes);
//   template <Dtype kSrc, Dtype kDst> void Convert(const void* src, size_t n, void* dst);
//   size_t FindInvalidCode(Dtype, const uint8_t*, size_t);
//   size_t FindNonFinite(Dtype, const void*, size_t);
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "codec/codec_internal.h"
#include "kvfile/codec.h"

namespace kvfile::codec::internal {
namespace {

// Per-kind constants of the vector element encoder and decoder (spec/CODEC.md,
// "Implementation notes").
template <Dtype kKind>
struct KindTraits {
  static constexpr bool kE4 = kKind == Dtype::kE4M3;
  // 23 - mantissa bits: how many low f32 fraction bits the rounding drops.
  static constexpr int kShift = kE4 ? 20 : 21;
  // Added before the shift: half an fp8 ulp minus one (the lsb completes the
  // tie-to-even), minus the exponent rebias (127 - bias) << 23.
  static constexpr int kRoundBias = ((1 << (kShift - 1)) - 1) - (kE4 ? (120 << 23) : (112 << 23));
  static constexpr int kMaxCode = kE4 ? kE4M3MaxCode : kE5M2MaxCode;
  static constexpr int kMinNormalBits = kE4 ? 0x3C800000 : 0x38800000;     // 2^-6, 2^-14
  static constexpr int kMagicBits = kE4 ? 0x46800000 : 0x43000000;         // 2^14, 2^7
  static constexpr int kDecodePow2Bits = kE4 ? (247 << 23) : (239 << 23);  // 2^120, 2^112
  static constexpr float kDecodePow2 = kE4 ? 0x1p120f : 0x1p112f;
};

template <Dtype kDt>
constexpr size_t kElemSize = kDt == Dtype::kF32 ? 4 : 2;

template <class P, Dtype kKind, Dtype kDt>
bool QuantizeRowsT(const void* src, size_t rows, size_t width, uint8_t* codes, float* scales,
                   size_t* bad_row) {
  const auto* in = static_cast<const unsigned char*>(src);
  constexpr size_t es = kElemSize<kDt>;
  // The amax and scale of the next row are computed before the current row
  // is encoded: that gives the out-of-order core independent work to overlap
  // with the current row's chain of reduction -> division -> encode.
  float next_amax = rows > 0 ? P::template RowAmax<kDt>(in, width) : 0.0f;
  float next_scale = next_amax >= 0.0f ? RowScale(next_amax, kKind) : 1.0f;
  for (size_t r = 0; r < rows; ++r) {
    const unsigned char* row = in + r * width * es;
    if (next_amax < 0.0f) {
      *bad_row = r;
      return false;
    }
    const float scale = next_scale;
    if (r + 1 < rows) {
      next_amax = P::template RowAmax<kDt>(row + width * es, width);
      next_scale = next_amax >= 0.0f ? RowScale(next_amax, kKind) : 1.0f;
    }
    std::memcpy(scales + r, &scale, sizeof scale);
    P::template QuantizeRow<kKind, kDt>(row, width, scale, codes + r * width);
  }
  return true;
}

template <class P>
bool QuantizeRowsWith(Dtype kind, Dtype src_dtype, const void* src, size_t rows, size_t width,
                      uint8_t* codes, float* scales, size_t* bad_row) {
  constexpr Dtype e4 = Dtype::kE4M3, e5 = Dtype::kE5M2;
  const bool is_e4 = kind == e4;
  switch (src_dtype) {
    case Dtype::kBF16:
      return is_e4 ? QuantizeRowsT<P, e4, Dtype::kBF16>(src, rows, width, codes, scales, bad_row)
                   : QuantizeRowsT<P, e5, Dtype::kBF16>(src, rows, width, codes, scales, bad_row);
    case Dtype::kF16:
      return is_e4 ? QuantizeRowsT<P, e4, Dtype::kF16>(src, rows, width, codes, scales, bad_row)
                   : QuantizeRowsT<P, e5, Dtype::kF16>(src, rows, width, codes, scales, bad_row);
    default:
      return is_e4 ? QuantizeRowsT<P, e4, Dtype::kF32>(src, rows, width, codes, scales, bad_row)
                   : QuantizeRowsT<P, e5, Dtype::kF32>(src, rows, width, codes, scales, bad_row);
  }
}

// Rows whose scale is below 2^8 take the merged path: scale * 2^120 (2^112)
// is exact there, so one multiply by it rounds like the two of the other path.
template <class P, Dtype kKind, Dtype kDt>
void DequantizeRowsT(const uint8_t* codes, const float* scales, size_t rows, size_t width,
                     void* dst) {
  auto* out = static_cast<unsigned char*>(dst);
  constexpr size_t es = kElemSize<kDt>;
  for (size_t r = 0; r < rows; ++r) {
    float scale;
    std::memcpy(&scale, scales + r, sizeof scale);
    const uint8_t* in = codes + r * width;
    unsigned char* o = out + r * width * es;
    if (scale < 256.0f) {
      P::template DequantizeRow<kKind, kDt, true>(in, width, scale * KindTraits<kKind>::kDecodePow2, o);
    } else {
      P::template DequantizeRow<kKind, kDt, false>(in, width, scale, o);
    }
  }
}

template <class P>
void DequantizeRowsWith(Dtype kind, const uint8_t* codes, const float* scales, size_t rows,
                        size_t width, Dtype dst_dtype, void* dst) {
  constexpr Dtype e4 = Dtype::kE4M3, e5 = Dtype::kE5M2;
  const bool is_e4 = kind == e4;
  switch (dst_dtype) {
    case Dtype::kBF16:
      return is_e4 ? DequantizeRowsT<P, e4, Dtype::kBF16>(codes, scales, rows, width, dst)
                   : DequantizeRowsT<P, e5, Dtype::kBF16>(codes, scales, rows, width, dst);
    case Dtype::kF16:
      return is_e4 ? DequantizeRowsT<P, e4, Dtype::kF16>(codes, scales, rows, width, dst)
                   : DequantizeRowsT<P, e5, Dtype::kF16>(codes, scales, rows, width, dst);
    default:
      return is_e4 ? DequantizeRowsT<P, e4, Dtype::kF32>(codes, scales, rows, width, dst)
                   : DequantizeRowsT<P, e5, Dtype::kF32>(codes, scales, rows, width, dst);
  }
}

template <class P>
void EncodeScaledWith(Dtype kind, const float* x, size_t n, uint8_t* codes) {
  if (kind == Dtype::kE4M3) {
    P::template EncodeScaled<Dtype::kE4M3>(x, n, codes);
  } else {
    P::template EncodeScaled<Dtype::kE5M2>(x, n, codes);
  }
}

template <class P>
void ConvertRawWith(Dtype src_dtype, const void* src, size_t n, Dtype dst_dtype, void* dst) {
  if (src_dtype == dst_dtype) {
    std::memmove(dst, src, n * ElementSize(src_dtype));
    return;
  }
  switch (src_dtype) {
    case Dtype::kBF16:
      if (dst_dtype == Dtype::kF16) return P::template Convert<Dtype::kBF16, Dtype::kF16>(src, n, dst);
      return P::template Convert<Dtype::kBF16, Dtype::kF32>(src, n, dst);
    case Dtype::kF16:
      if (dst_dtype == Dtype::kBF16) return P::template Convert<Dtype::kF16, Dtype::kBF16>(src, n, dst);
      return P::template Convert<Dtype::kF16, Dtype::kF32>(src, n, dst);
    default:
      if (dst_dtype == Dtype::kBF16) return P::template Convert<Dtype::kF32, Dtype::kBF16>(src, n, dst);
      return P::template Convert<Dtype::kF32, Dtype::kF16>(src, n, dst);
  }
}

// The kernel set of the primitives P.
template <class P>
constexpr Kernels MakeKernels() {
  return {QuantizeRowsWith<P>, DequantizeRowsWith<P>, P::FindInvalidCode,
          EncodeScaledWith<P>, ConvertRawWith<P>,     P::FindNonFinite};
}

}  // namespace
}  // namespace kvfile::codec::internal
