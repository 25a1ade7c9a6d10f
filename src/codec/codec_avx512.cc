// SPDX-License-Identifier: Apache-2.0
// AVX-512 (F, BW, VL, DQ) + F16C kernels. Compiled with -mavx512f -mavx512bw
// -mavx512vl -mavx512dq -mavx2 -mf16c and only ever called after the dispatcher
// in codec.cc has checked those features. Bit-identical to codec_scalar.cc.
//
// The row drivers and dispatch are the shared ones of row_drivers.h; this
// file holds the AVX-512 primitives they run on. Everything here has internal
// linkage (see codec_internal.h for why).

// GCC 12's AVX-512 headers build their "undefined" vectors with a
// self-initialization that -Wuninitialized reports at every use (GCC bug
// 105593, fixed in 12.3/13). The warning points into the header, so silence it
// for the header only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#ifndef __clang__  // clang has no such group (and no such bug)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>
#include <cstring>

#include "codec/codec_internal.h"
#include "codec/row_drivers.h"
#include "kvfile/codec.h"

namespace kvfile::codec::internal {
namespace {

// ---- Constants ----

__m512i Set32(int v) { return _mm512_set1_epi32(v); }
__m512i Set16(int v) { return _mm512_set1_epi16(static_cast<short>(v)); }

// vpternlog immediate for a | (b & c).
constexpr int kOrAnd = 0xF8;

__mmask16 TailMask16(size_t n) { return static_cast<__mmask16>((1u << n) - 1u); }
__mmask32 TailMask32(size_t n) { return static_cast<__mmask32>((1ull << n) - 1u); }
__mmask64 TailMask64(size_t n) { return n >= 64 ? ~__mmask64{0} : ((__mmask64{1} << n) - 1u); }

// ---- The element encoder ----

// fp8 magnitude codes (0 .. max code, one per 32-bit lane) of 16 f32 values
// that are >= +0 and not NaN (spec/CODEC.md, "Implementation notes"):
//  - normal range: round the f32 pattern to the fp8 mantissa width with
//    integer adds (half ulp - 1, plus the kept lsb for ties to even), shift,
//    the rebias folded into the add; the input is first raised to the
//    smallest normal so that this never goes negative;
//  - subnormal range: adding 2^14 (e4m3) or 2^7 (e5m2), whose ulp is the fp8
//    subnormal step, rounds q to a multiple of the step (RNE), and the
//    difference of the bit patterns counts the steps.
// For q below the smallest normal the first gives the smallest normal code
// and the second the right one; above it the second is always at least the
// first. So the code is the minimum of the two.
// kSaturate: clamp to the largest finite code. QuantizeRows does not need it:
// its quotients are at most M * (1 + 2^-23), which rounds to M.
template <Dtype kKind, bool kSaturate>
__m512i EncodeMagnitude(__m512 q) {
  using T = KindTraits<kKind>;
  const __m512i bits = _mm512_castps_si512(q);
  const __m512i m = _mm512_max_epi32(bits, Set32(T::kMinNormalBits));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(m, T::kShift), Set32(1));
  __m512i normal = _mm512_add_epi32(_mm512_add_epi32(m, Set32(T::kRoundBias)), lsb);
  normal = _mm512_srli_epi32(normal, T::kShift);
  if constexpr (kSaturate) normal = _mm512_min_epi32(normal, Set32(T::kMaxCode));
  const __m512i magic = Set32(T::kMagicBits);
  const __m512 sum = _mm512_add_ps(q, _mm512_castsi512_ps(magic));
  const __m512i sub = _mm512_sub_epi32(_mm512_castps_si512(sum), magic);
  return _mm512_min_epi32(normal, sub);
}

// Full codes of any 16 f32 values (sign, NaN -> 0x7F, saturation).
template <Dtype kKind>
__m512i EncodeAny(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i abs = _mm512_and_si512(bits, Set32(0x7FFFFFFF));
  __m512i code = EncodeMagnitude<kKind, true>(_mm512_castsi512_ps(abs));
  code = _mm512_ternarylogic_epi32(code, _mm512_srli_epi32(bits, 24), Set32(0x80), kOrAnd);
  const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(abs, Set32(static_cast<int>(kF32InfBits)));
  return _mm512_mask_blend_epi32(is_nan, code, Set32(kNanCode));
}

// ---- Row amax ----

// Largest 16-bit lane of a vector.
uint16_t ReduceMaxU16(__m512i v) {
  __m256i m = _mm256_max_epu16(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
  __m128i x = _mm_max_epu16(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  // minpos finds the smallest lane: apply it to the complement.
  x = _mm_minpos_epu16(_mm_xor_si128(x, _mm_set1_epi32(-1)));
  return static_cast<uint16_t>(~_mm_cvtsi128_si32(x));
}

// The largest |x| of a row of n elements as an f32, or a negative value if
// the row holds a NaN or Inf. Works on the integer bits: for finite values of
// one sign the bit patterns are ordered like the magnitudes.
template <Dtype kDt>
float RowAmax(const unsigned char* p, size_t n) {
  if constexpr (kDt == Dtype::kF32) {
    const __m512i abs_mask = Set32(0x7FFFFFFF);
    __m512i m0 = _mm512_setzero_si512();
    __m512i m1 = _mm512_setzero_si512();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
      m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_loadu_si512(p + 4 * i), abs_mask));
      m1 = _mm512_max_epu32(m1, _mm512_and_si512(_mm512_loadu_si512(p + 4 * i + 64), abs_mask));
    }
    for (; i < n; i += 16) {
      const size_t rem = n - i;
      const __mmask16 k = rem >= 16 ? __mmask16(0xFFFF) : TailMask16(rem);
      m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_maskz_loadu_epi32(k, p + 4 * i), abs_mask));
    }
    const uint32_t amax_bits = _mm512_reduce_max_epu32(_mm512_max_epu32(m0, m1));
    if (amax_bits >= kF32InfBits) return -1.0f;
    float amax;
    std::memcpy(&amax, &amax_bits, 4);
    return amax;
  } else {
    const __m512i abs_mask = Set16(0x7FFF);
    __m512i m0 = _mm512_setzero_si512();
    __m512i m1 = _mm512_setzero_si512();
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
      m0 = _mm512_max_epu16(m0, _mm512_and_si512(_mm512_loadu_si512(p + 2 * i), abs_mask));
      m1 = _mm512_max_epu16(m1, _mm512_and_si512(_mm512_loadu_si512(p + 2 * i + 64), abs_mask));
    }
    for (; i < n; i += 32) {
      const size_t rem = n - i;
      const __mmask32 k = rem >= 32 ? ~__mmask32{0} : TailMask32(rem);
      m0 = _mm512_max_epu16(m0, _mm512_and_si512(_mm512_maskz_loadu_epi16(k, p + 2 * i), abs_mask));
    }
    const uint16_t amax_bits = ReduceMaxU16(_mm512_max_epu16(m0, m1));
    if constexpr (kDt == Dtype::kBF16) {
      if (amax_bits >= 0x7F80) return -1.0f;
      const uint32_t f = static_cast<uint32_t>(amax_bits) << 16;
      float amax;
      std::memcpy(&amax, &f, 4);
      return amax;
    } else {
      if (amax_bits >= 0x7C00) return -1.0f;
      return _cvtsh_ss(amax_bits);
    }
  }
}

// ---- Quantize ----

// Codes of 32 consecutive elements (k selects the ones present) divided by
// the row scale, as 16-bit lanes: |x| is divided and encoded and the sign bit
// of x put back on the code. For bf16 the lanes are in element order; for f16
// and f32 they are in the order of _mm512_packs_epi32 of elements 0-15 and
// 16-31: 64-bit group j holds elements 4(j/2) + 16(j%2) .. +3.
template <Dtype kKind, Dtype kDt>
__m512i QuantizeWords32(const unsigned char* p, __mmask32 k, __m512 sv) {
  __m512i words;
  if constexpr (kDt == Dtype::kF32) {
    const __m512i u0 = _mm512_maskz_loadu_epi32(static_cast<__mmask16>(k), p);
    const __m512i u1 = _mm512_maskz_loadu_epi32(static_cast<__mmask16>(k >> 16), p + 64);
    const __m512i abs_mask = Set32(0x7FFFFFFF);
    const __m512 a0 = _mm512_castsi512_ps(_mm512_and_si512(u0, abs_mask));
    const __m512 a1 = _mm512_castsi512_ps(_mm512_and_si512(u1, abs_mask));
    words = _mm512_packs_epi32(EncodeMagnitude<kKind, false>(_mm512_div_ps(a0, sv)),
                               EncodeMagnitude<kKind, false>(_mm512_div_ps(a1, sv)));
    // The sign halves of the inputs, packed the same way.
    const __m512i signs = _mm512_packs_epi32(_mm512_srai_epi32(u0, 16), _mm512_srai_epi32(u1, 16));
    return _mm512_ternarylogic_epi32(words, _mm512_srli_epi16(signs, 8), Set16(0x80), kOrAnd);
  } else {
    const __m512i v = _mm512_maskz_loadu_epi16(k, p);
    const __m512i a = _mm512_and_si512(v, Set16(0x7FFF));
    __m512i signs = v;
    if constexpr (kDt == Dtype::kBF16) {
      // Interleaving with zeros makes the f32 patterns of elements 0-3, 8-11,
      // ... (lo) and 4-7, 12-15, ... (hi); packing them restores the order.
      const __m512i zero = _mm512_setzero_si512();
      const __m512 lo = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, a));
      const __m512 hi = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, a));
      words = _mm512_packs_epi32(EncodeMagnitude<kKind, false>(_mm512_div_ps(lo, sv)),
                                 EncodeMagnitude<kKind, false>(_mm512_div_ps(hi, sv)));
    } else {
      const __m512 x0 = _mm512_cvtph_ps(_mm512_castsi512_si256(a));
      const __m512 x1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(a, 1));
      words = _mm512_packs_epi32(EncodeMagnitude<kKind, false>(_mm512_div_ps(x0, sv)),
                                 EncodeMagnitude<kKind, false>(_mm512_div_ps(x1, sv)));
      signs = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 4, 1, 5, 2, 6, 3, 7), v);
    }
    return _mm512_ternarylogic_epi32(words, _mm512_srli_epi16(signs, 8), Set16(0x80), kOrAnd);
  }
}

// 32 codes from QuantizeWords32 as 32 bytes in element order.
template <Dtype kDt>
__m256i WordsToBytes32(__m512i w) {
  if constexpr (kDt != Dtype::kBF16) {
    w = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), w);
  }
  return _mm512_cvtepi16_epi8(w);
}

// 64 codes from two QuantizeWords32 results as 64 bytes in element order:
// one saturating pack (the codes fit a byte) and one dword permutation.
// packus puts, in 128-bit lane l, 8 bytes of w0 then 8 bytes of w1: dwords
// 4l, 4l+1 from w0 and 4l+2, 4l+3 from w1.
template <Dtype kDt>
__m512i WordsToBytes64(__m512i w0, __m512i w1) {
  const __m512i packed = _mm512_packus_epi16(w0, w1);
  __m512i idx;
  if constexpr (kDt == Dtype::kBF16) {
    // w0/w1 in element order: output dword 2l+h of block b is dword 4l+2b+h.
    idx = _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
  } else {
    // Output group g (4 elements) of block b: packs put it in 64-bit group
    // 2(g%4) + g/4 of w_b, i.e. packed dword 4(g%4) + 2b + g/4.
    idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  }
  return _mm512_permutexvar_epi32(idx, packed);
}

// The codes of one row divided by its scale.
template <Dtype kKind, Dtype kDt>
void QuantizeRow(const unsigned char* row, size_t width, float scale, uint8_t* out) {
  constexpr size_t es = kElemSize<kDt>;
  const __m512 sv = _mm512_set1_ps(scale);
  constexpr __mmask32 kAll = ~__mmask32{0};
  size_t i = 0;
  for (; i + 64 <= width; i += 64) {
    const __m512i w0 = QuantizeWords32<kKind, kDt>(row + i * es, kAll, sv);
    const __m512i w1 = QuantizeWords32<kKind, kDt>(row + (i + 32) * es, kAll, sv);
    _mm512_storeu_si512(out + i, WordsToBytes64<kDt>(w0, w1));
  }
  for (; i < width; i += 32) {
    const __mmask32 k = width - i >= 32 ? kAll : TailMask32(width - i);
    const __m256i b = WordsToBytes32<kDt>(QuantizeWords32<kKind, kDt>(row + i * es, k, sv));
    _mm256_mask_storeu_epi8(out + i, k, b);
  }
}

// ---- Rounding f32 into bf16 / f16 (RNE, clamped to the finite range) ----

// bf16 patterns (low halves of the 32-bit lanes) of 16 non-negative, non-NaN
// f32 values. kClamp: clamp the bits to 0x7F7F7FFF first, which makes every
// value that would round to Inf (and Inf itself) round to 0x7F7F instead.
template <bool kClamp>
__m512i RoundToBf16Magnitude(__m512i bits) {
  if constexpr (kClamp) bits = _mm512_min_epu32(bits, Set32(0x7F7F7FFF));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), Set32(1));
  return _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, Set32(0x7FFF)), lsb), 16);
}

// bf16 patterns of any 16 f32 values: clamped, signed, NaN kept as quiet NaN.
__m512i ToBf16Any(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i abs = _mm512_and_si512(bits, Set32(0x7FFFFFFF));
  const __m512i hi = _mm512_srli_epi32(bits, 16);
  __m512i r = RoundToBf16Magnitude<true>(abs);
  r = _mm512_ternarylogic_epi32(r, hi, Set32(0x8000), kOrAnd);
  const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(abs, Set32(static_cast<int>(kF32InfBits)));
  return _mm512_mask_or_epi32(r, is_nan, hi, Set32(0x0040));
}

// f16 patterns of 16 f32 values. min/max return their second operand when
// one is NaN, so a NaN reaches the conversion, which keeps it as a quiet NaN.
__m256i ToF16(__m512 v) {
  v = _mm512_max_ps(_mm512_set1_ps(-65504.0f), _mm512_min_ps(_mm512_set1_ps(65504.0f), v));
  return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// ---- Dequantize ----

// |table[code]| * scale for 16 codes in 32-bit lanes. The code's exponent
// and mantissa fields placed at the top of an f32 fraction give an f32 equal
// to |table[code]| times 2^-120 (e4m3) or 2^-112 (e5m2), subnormal codes
// included, so multiplying by 2^120 (2^112) is exact and the multiply by the
// scale is the only rounding. kMerged: `sv` already holds scale * 2^120 (exact
// when scale < 2^8), one multiply instead of two, same single rounding.
template <Dtype kKind, bool kMerged>
__m512 ScaledMagnitude(__m512i fields_bits, __m512 sv) {
  using T = KindTraits<kKind>;
  __m512 t = _mm512_castsi512_ps(fields_bits);
  if constexpr (!kMerged) t = _mm512_mul_ps(t, _mm512_castsi512_ps(Set32(T::kDecodePow2Bits)));
  return _mm512_mul_ps(t, sv);
}

// 32 codes -> 32 bf16, fields taken from 16-bit code lanes interleaved with
// zeros (elements 0-3, 8-11, ... and 4-7, 12-15, ...), packed back in order.
template <Dtype kKind, bool kMerged>
__m512i DecodeBf16x32(__m256i raw, __m512 sv) {
  using T = KindTraits<kKind>;
  const __m512i w = _mm512_cvtepu8_epi16(raw);
  // (c & 0x7F) << (kShift - 16) in each 16-bit lane.
  const __m512i f =
      _mm512_and_si512(_mm512_slli_epi16(w, T::kShift - 16), Set16(0x7F << (T::kShift - 16)));
  const __m512i zero = _mm512_setzero_si512();
  const __m512 lo = ScaledMagnitude<kKind, kMerged>(_mm512_unpacklo_epi16(zero, f), sv);
  const __m512 hi = ScaledMagnitude<kKind, kMerged>(_mm512_unpackhi_epi16(zero, f), sv);
  // Products of a merged row cannot overflow bf16 (scale < 2^8), so no clamp.
  const __m512i r = _mm512_packus_epi32(RoundToBf16Magnitude<!kMerged>(_mm512_castps_si512(lo)),
                                        RoundToBf16Magnitude<!kMerged>(_mm512_castps_si512(hi)));
  return _mm512_ternarylogic_epi32(r, _mm512_slli_epi16(w, 8), Set16(0x8000), kOrAnd);
}

// 16 codes -> 16 f16 or f32, in element order.
template <Dtype kKind, bool kMerged, Dtype kDt>
void Decode16(__m128i raw, __m512 sv, unsigned char* o, __mmask16 k) {
  using T = KindTraits<kKind>;
  const __m512i c = _mm512_cvtepu8_epi32(raw);
  const __m512i fields = _mm512_slli_epi32(_mm512_and_si512(c, Set32(0x7F)), T::kShift);
  __m512 mag = ScaledMagnitude<kKind, kMerged>(fields, sv);
  if constexpr (kDt == Dtype::kF32) {
    if constexpr (!kMerged) {  // an f32 overflow gives the largest finite f32, not Inf
      mag = _mm512_min_ps(mag, _mm512_castsi512_ps(Set32(0x7F7FFFFF)));
    }
    const __m512i v = _mm512_ternarylogic_epi32(_mm512_castps_si512(mag), _mm512_slli_epi32(c, 24),
                                                Set32(static_cast<int>(0x80000000u)), kOrAnd);
    _mm512_mask_storeu_epi32(o, k, v);
  } else {
    const __m256i h = _mm512_cvtps_ph(_mm512_min_ps(mag, _mm512_set1_ps(65504.0f)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i sign = _mm256_slli_epi16(_mm256_cvtepu8_epi16(raw), 8);
    _mm256_mask_storeu_epi16(
        o, k,
        _mm256_ternarylogic_epi32(h, sign, _mm256_set1_epi16(static_cast<short>(0x8000)), kOrAnd));
  }
}

template <Dtype kKind, Dtype kDt, bool kMerged>
void DequantizeRow(const uint8_t* in, size_t width, float factor, unsigned char* o) {
  constexpr size_t es = kElemSize<kDt>;
  const __m512 sv = _mm512_set1_ps(factor);
  size_t i = 0;
  if constexpr (kDt == Dtype::kBF16) {
    for (; i + 32 <= width; i += 32) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
      _mm512_storeu_si512(o + i * es, DecodeBf16x32<kKind, kMerged>(raw, sv));
    }
    if (i < width) {
      const __mmask32 k = TailMask32(width - i);
      const __m256i raw = _mm256_maskz_loadu_epi8(k, in + i);
      _mm512_mask_storeu_epi16(o + i * es, k, DecodeBf16x32<kKind, kMerged>(raw, sv));
    }
  } else {
    for (; i < width; i += 16) {
      const size_t rem = width - i;
      const __mmask16 k = rem >= 16 ? __mmask16(0xFFFF) : TailMask16(rem);
      const __m128i raw = _mm_maskz_loadu_epi8(k, in + i);
      Decode16<kKind, kMerged, kDt>(raw, sv, o + i * es, k);
    }
  }
}

// ---- Scans ----

size_t FindInvalidCodeAvx512(Dtype kind, const uint8_t* codes, size_t n) {
  const __m512i mag_mask = _mm512_set1_epi8(0x7F);
  const __m512i first_bad = _mm512_set1_epi8(kind == Dtype::kE4M3 ? 0x7F : 0x7C);
  for (size_t i = 0; i < n; i += 64) {
    const __mmask64 k = TailMask64(n - i);
    const __m512i v = _mm512_maskz_loadu_epi8(k, codes + i);
    const __mmask64 bad = _mm512_mask_cmpge_epu8_mask(k, _mm512_and_si512(v, mag_mask), first_bad);
    if (bad != 0) return i + static_cast<size_t>(__builtin_ctzll(bad));
  }
  return n;
}

size_t FindNonFiniteAvx512(Dtype dtype, const void* src, size_t n) {
  const auto* p = static_cast<const unsigned char*>(src);
  if (dtype == Dtype::kF32) {
    const __m512i abs_mask = Set32(0x7FFFFFFF);
    const __m512i inf = Set32(static_cast<int>(kF32InfBits));
    for (size_t i = 0; i < n; i += 16) {
      const __mmask16 k = n - i >= 16 ? __mmask16(0xFFFF) : TailMask16(n - i);
      const __m512i v = _mm512_and_si512(_mm512_maskz_loadu_epi32(k, p + 4 * i), abs_mask);
      const __mmask16 bad = _mm512_mask_cmpge_epu32_mask(k, v, inf);
      if (bad != 0) return i + static_cast<size_t>(__builtin_ctz(bad));
    }
    return n;
  }
  const __m512i abs_mask = Set16(0x7FFF);
  const __m512i inf = Set16(dtype == Dtype::kBF16 ? 0x7F80 : 0x7C00);
  for (size_t i = 0; i < n; i += 32) {
    const __mmask32 k = n - i >= 32 ? ~__mmask32{0} : TailMask32(n - i);
    const __m512i v = _mm512_and_si512(_mm512_maskz_loadu_epi16(k, p + 2 * i), abs_mask);
    const __mmask32 bad = _mm512_mask_cmpge_epu16_mask(k, v, inf);
    if (bad != 0) return i + static_cast<size_t>(__builtin_ctz(bad));
  }
  return n;
}

// ---- Element encoder and raw conversions ----

template <Dtype kKind>
void EncodeScaledT(const float* x, size_t n, uint8_t* codes) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512i c0 = EncodeAny<kKind>(_mm512_loadu_ps(x + i));
    const __m512i c1 = EncodeAny<kKind>(_mm512_loadu_ps(x + i + 16));
    const __m512i w = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7),
                                               _mm512_packs_epi32(c0, c1));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i), _mm512_cvtepi16_epi8(w));
  }
  for (; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? __mmask16(0xFFFF) : TailMask16(n - i);
    const __m512i cv = EncodeAny<kKind>(_mm512_maskz_loadu_ps(k, x + i));
    _mm_mask_storeu_epi8(codes + i, k, _mm512_cvtepi32_epi8(cv));
  }
}

template <Dtype kDt>
__m512 LoadF32x16(const unsigned char* p, __mmask16 k) {
  if constexpr (kDt == Dtype::kF32) {
    return _mm512_maskz_loadu_ps(k, p);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(k, p);
    if constexpr (kDt == Dtype::kBF16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      return _mm512_cvtph_ps(h);
    }
  }
}

template <Dtype kDt>
void StoreF32x16(unsigned char* p, __mmask16 k, __m512 v) {
  if constexpr (kDt == Dtype::kF32) {
    _mm512_mask_storeu_ps(p, k, v);
  } else if constexpr (kDt == Dtype::kBF16) {
    _mm256_mask_storeu_epi16(p, k, _mm512_cvtepi32_epi16(ToBf16Any(v)));
  } else {
    _mm256_mask_storeu_epi16(p, k, ToF16(v));
  }
}

template <Dtype kSrc, Dtype kDst>
void ConvertT(const void* src, size_t n, void* dst) {
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? __mmask16(0xFFFF) : TailMask16(n - i);
    StoreF32x16<kDst>(out + i * kElemSize<kDst>, k, LoadF32x16<kSrc>(in + i * kElemSize<kSrc>, k));
  }
}

// The primitives row_drivers.h runs on.
struct Avx512 {
  template <Dtype kDt>
  static float RowAmax(const unsigned char* p, size_t n) {
    return internal::RowAmax<kDt>(p, n);
  }
  template <Dtype kKind, Dtype kDt>
  static void QuantizeRow(const unsigned char* row, size_t width, float scale, uint8_t* out) {
    internal::QuantizeRow<kKind, kDt>(row, width, scale, out);
  }
  template <Dtype kKind, Dtype kDt, bool kMerged>
  static void DequantizeRow(const uint8_t* in, size_t width, float factor, unsigned char* o) {
    internal::DequantizeRow<kKind, kDt, kMerged>(in, width, factor, o);
  }
  template <Dtype kKind>
  static void EncodeScaled(const float* x, size_t n, uint8_t* codes) {
    EncodeScaledT<kKind>(x, n, codes);
  }
  template <Dtype kSrc, Dtype kDst>
  static void Convert(const void* src, size_t n, void* dst) {
    ConvertT<kSrc, kDst>(src, n, dst);
  }
  static size_t FindInvalidCode(Dtype kind, const uint8_t* codes, size_t n) {
    return FindInvalidCodeAvx512(kind, codes, n);
  }
  static size_t FindNonFinite(Dtype dtype, const void* src, size_t n) {
    return FindNonFiniteAvx512(dtype, src, n);
  }
};

}  // namespace

const Kernels kAvx512Kernels = MakeKernels<Avx512>();

}  // namespace kvfile::codec::internal
