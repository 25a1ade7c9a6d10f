// SPDX-License-Identifier: Apache-2.0
// AVX2 + FMA + F16C kernels. Compiled with -mavx2 -mfma -mf16c and only ever
// called after the dispatcher in codec.cc has checked those features.
// Bit-identical to codec_scalar.cc. Tails shorter than a vector go through a
// zero-padded stack buffer, so every element takes the same vector path.
//
// The row drivers and dispatch are the shared ones of row_drivers.h; this
// file holds the AVX2 primitives they run on. Everything here has internal
// linkage (see codec_internal.h for why).

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "codec/codec_internal.h"
#include "codec/row_drivers.h"
#include "kvfile/codec.h"

namespace kvfile::codec::internal {
namespace {

__m256i Set32(int v) { return _mm256_set1_epi32(v); }
__m256i Set16(int v) { return _mm256_set1_epi16(static_cast<short>(v)); }

// fp8 magnitude codes of 8 f32 values >= +0, not NaN: the minimum of the
// normal-range integer rounding (input raised to the smallest normal) and
// the subnormal-range magic-number rounding. See EncodeMagnitude in
// codec_avx512.cc for the argument. kSaturate: clamp to the largest finite
// code (QuantizeRows' quotients never need it).
// All compares are signed: the patterns are below 2^31.
template <Dtype kKind, bool kSaturate>
__m256i EncodeMagnitude(__m256 q) {
  using T = KindTraits<kKind>;
  const __m256i bits = _mm256_castps_si256(q);
  const __m256i m = _mm256_max_epi32(bits, Set32(T::kMinNormalBits));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(m, T::kShift), Set32(1));
  __m256i normal = _mm256_add_epi32(_mm256_add_epi32(m, Set32(T::kRoundBias)), lsb);
  normal = _mm256_srli_epi32(normal, T::kShift);
  if constexpr (kSaturate) normal = _mm256_min_epi32(normal, Set32(T::kMaxCode));
  const __m256i magic = Set32(T::kMagicBits);
  const __m256 sum = _mm256_add_ps(q, _mm256_castsi256_ps(magic));
  const __m256i sub = _mm256_sub_epi32(_mm256_castps_si256(sum), magic);
  return _mm256_min_epi32(normal, sub);
}

// Full codes of any 8 f32 values (sign, NaN -> 0x7F, saturation).
template <Dtype kKind>
__m256i EncodeAny(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i abs = _mm256_and_si256(bits, Set32(0x7FFFFFFF));
  __m256i code = EncodeMagnitude<kKind, true>(_mm256_castsi256_ps(abs));
  code = _mm256_or_si256(code, _mm256_and_si256(_mm256_srli_epi32(bits, 24), Set32(0x80)));
  const __m256i is_nan = _mm256_cmpgt_epi32(abs, Set32(static_cast<int>(kF32InfBits)));
  return _mm256_blendv_epi8(code, Set32(kNanCode), is_nan);
}

// 4 x 8 codes in 32-bit lanes -> 32 bytes in order.
__m256i PackCodes32(__m256i c0, __m256i c1, __m256i c2, __m256i c3) {
  const __m256i p01 = _mm256_packs_epi32(c0, c1);  // per 128-bit lane: c0[..4], c1[..4]
  const __m256i p23 = _mm256_packs_epi32(c2, c3);
  const __m256i b = _mm256_packus_epi16(p01, p23);  // lane0: c0 c1 c2 c3 low halves
  return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// 8 codes in 32-bit lanes -> 8 bytes in the low quadword.
__m128i PackCodes8(__m256i c) {
  const __m256i p = _mm256_packs_epi32(c, c);
  const __m256i b = _mm256_packus_epi16(p, p);  // dword 0 of each lane: 4 codes
  return _mm256_castsi256_si128(
      _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4)));
}

// 2 x 8 u16 values in the low halves of 32-bit lanes -> 16 u16 in order.
__m256i Pack16x16(__m256i a, __m256i b) {
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
}

// Largest 16-bit / 32-bit lane.
uint16_t ReduceMaxU16(__m256i v) {
  __m128i x = _mm_max_epu16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_minpos_epu16(_mm_xor_si128(x, _mm_set1_epi32(-1)));  // smallest complement
  return static_cast<uint16_t>(~_mm_cvtsi128_si32(x));
}

uint32_t ReduceMaxU32(__m256i v) {
  __m128i x = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_max_epu32(x, _mm_shuffle_epi32(x, 0x4E));
  x = _mm_max_epu32(x, _mm_shuffle_epi32(x, 0xB1));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(x));
}

// ---- Loading 8 elements as f32 ----

template <Dtype kDt>
__m256 Load8(const unsigned char* p) {
  if constexpr (kDt == Dtype::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (kDt == Dtype::kBF16) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
      return _mm256_cvtph_ps(h);
    }
  }
}

// ---- Row amax ----

// The largest |x| of a row as an f32, or a negative value if the row holds a
// NaN or Inf (integer max over the magnitude bits).
template <Dtype kDt>
float RowAmax(const unsigned char* p, size_t n) {
  if constexpr (kDt == Dtype::kF32) {
    const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
    __m256i m0 = _mm256_setzero_si256();
    __m256i m1 = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const auto* q = reinterpret_cast<const __m256i*>(p + 4 * i);
      m0 = _mm256_max_epu32(m0, _mm256_and_si256(_mm256_loadu_si256(q), abs_mask));
      m1 = _mm256_max_epu32(m1, _mm256_and_si256(_mm256_loadu_si256(q + 1), abs_mask));
    }
    for (; i < n; i += 8) {
      alignas(32) unsigned char buf[32] = {};
      const size_t take = n - i >= 8 ? 8 : n - i;
      std::memcpy(buf, p + 4 * i, take * 4);
      m0 = _mm256_max_epu32(
          m0, _mm256_and_si256(_mm256_load_si256(reinterpret_cast<const __m256i*>(buf)), abs_mask));
    }
    const uint32_t amax_bits = ReduceMaxU32(_mm256_max_epu32(m0, m1));
    if (amax_bits >= kF32InfBits) return -1.0f;
    float amax;
    std::memcpy(&amax, &amax_bits, 4);
    return amax;
  } else {
    const __m256i abs_mask = _mm256_set1_epi16(0x7FFF);
    __m256i m0 = _mm256_setzero_si256();
    __m256i m1 = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
      const auto* q = reinterpret_cast<const __m256i*>(p + 2 * i);
      m0 = _mm256_max_epu16(m0, _mm256_and_si256(_mm256_loadu_si256(q), abs_mask));
      m1 = _mm256_max_epu16(m1, _mm256_and_si256(_mm256_loadu_si256(q + 1), abs_mask));
    }
    for (; i < n; i += 16) {
      alignas(32) unsigned char buf[32] = {};
      const size_t take = n - i >= 16 ? 16 : n - i;
      std::memcpy(buf, p + 2 * i, take * 2);
      m0 = _mm256_max_epu16(
          m0, _mm256_and_si256(_mm256_load_si256(reinterpret_cast<const __m256i*>(buf)), abs_mask));
    }
    const uint16_t amax_bits = ReduceMaxU16(_mm256_max_epu16(m0, m1));
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

// Codes of 16 consecutive elements divided by the row scale, as 16-bit lanes
// in element order: |x| is divided and encoded, the sign bit of x put back.
template <Dtype kKind, Dtype kDt>
__m256i QuantizeWords16(const unsigned char* p, __m256 sv) {
  __m256i words;
  __m256i signs;  // sign bit of element i at bit 15 of lane i
  if constexpr (kDt == Dtype::kF32) {
    const __m256i u0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i u1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));
    const __m256 a0 = _mm256_castsi256_ps(_mm256_and_si256(u0, Set32(0x7FFFFFFF)));
    const __m256 a1 = _mm256_castsi256_ps(_mm256_and_si256(u1, Set32(0x7FFFFFFF)));
    words = _mm256_packs_epi32(EncodeMagnitude<kKind, false>(_mm256_div_ps(a0, sv)),
                               EncodeMagnitude<kKind, false>(_mm256_div_ps(a1, sv)));
    signs = _mm256_packs_epi32(_mm256_srai_epi32(u0, 16), _mm256_srai_epi32(u1, 16));
    // packs interleaves 4-element groups of its operands: restore the order.
    words = _mm256_permute4x64_epi64(words, 0xD8);
    signs = _mm256_permute4x64_epi64(signs, 0xD8);
  } else {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i a = _mm256_and_si256(v, Set16(0x7FFF));
    signs = v;
    if constexpr (kDt == Dtype::kBF16) {
      // Interleaving with zeros makes the f32 patterns of elements 0-3, 8-11
      // (lo) and 4-7, 12-15 (hi); packing them restores the order.
      const __m256i zero = _mm256_setzero_si256();
      const __m256 lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, a));
      const __m256 hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, a));
      words = _mm256_packs_epi32(EncodeMagnitude<kKind, false>(_mm256_div_ps(lo, sv)),
                                 EncodeMagnitude<kKind, false>(_mm256_div_ps(hi, sv)));
    } else {
      const __m256 x0 = _mm256_cvtph_ps(_mm256_castsi256_si128(a));
      const __m256 x1 = _mm256_cvtph_ps(_mm256_extracti128_si256(a, 1));
      words = _mm256_packs_epi32(EncodeMagnitude<kKind, false>(_mm256_div_ps(x0, sv)),
                                 EncodeMagnitude<kKind, false>(_mm256_div_ps(x1, sv)));
      words = _mm256_permute4x64_epi64(words, 0xD8);
    }
  }
  return _mm256_or_si256(words, _mm256_and_si256(_mm256_srli_epi16(signs, 8), Set16(0x80)));
}

// The codes of one row divided by its scale.
template <Dtype kKind, Dtype kDt>
void QuantizeRow(const unsigned char* row, size_t width, float scale, uint8_t* out) {
  constexpr size_t es = kElemSize<kDt>;
  const __m256 sv = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 32 <= width; i += 32) {
    const __m256i w0 = QuantizeWords16<kKind, kDt>(row + i * es, sv);
    const __m256i w1 = QuantizeWords16<kKind, kDt>(row + (i + 16) * es, sv);
    const __m256i b = _mm256_permute4x64_epi64(_mm256_packus_epi16(w0, w1), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), b);
  }
  for (; i < width; i += 16) {
    const size_t rem = width - i >= 16 ? 16 : width - i;
    alignas(32) unsigned char buf[64] = {};  // zero padding encodes to 0x00
    std::memcpy(buf, row + i * es, rem * es);
    const __m256i w = QuantizeWords16<kKind, kDt>(buf, sv);
    const __m256i b = _mm256_permute4x64_epi64(_mm256_packus_epi16(w, w), 0x08);
    alignas(16) unsigned char bytes[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(bytes), _mm256_castsi256_si128(b));
    std::memcpy(out + i, bytes, rem);
  }
}

// f16 patterns of 8 f32 values. min/max return their second operand when one
// is NaN, so a NaN reaches the conversion, which keeps it as a quiet NaN.
__m128i ToF16(__m256 v) {
  v = _mm256_max_ps(_mm256_set1_ps(-65504.0f), _mm256_min_ps(_mm256_set1_ps(65504.0f), v));
  return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// ---- Dequantize ----

// |table[code]| * scale for 8 codes whose exponent and mantissa fields sit at
// the top of an f32 fraction (an exact f32 of |table[code]| * 2^-120, or
// 2^-112 for e5m2): the multiply by 2^120 (2^112) is exact, the one by the
// scale the only rounding. kMerged: `sv` already holds scale * 2^120 (exact
// when scale < 2^8): one multiply, the same single rounding.
template <Dtype kKind, bool kMerged>
__m256 ScaledMagnitude(__m256i fields_bits, __m256 sv) {
  using T = KindTraits<kKind>;
  __m256 t = _mm256_castsi256_ps(fields_bits);
  if constexpr (!kMerged) t = _mm256_mul_ps(t, _mm256_castsi256_ps(Set32(T::kDecodePow2Bits)));
  return _mm256_mul_ps(t, sv);
}

// bf16 patterns (low halves of 32-bit lanes) of 8 non-negative, non-NaN f32
// patterns. kClamp: first clamp to 0x7F7F7FFF, so that every value that would
// round to Inf (and Inf) rounds to 0x7F7F.
template <bool kClamp>
__m256i RoundToBf16Magnitude(__m256i bits) {
  if constexpr (kClamp) bits = _mm256_min_epi32(bits, Set32(0x7F7F7FFF));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), Set32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(bits, Set32(0x7FFF)), lsb), 16);
}

// Decodes 16 codes at `in` and writes 16 elements at `o`. The magnitude is
// scaled and rounded; the code's sign bit is put back after (rounding is
// symmetric).
template <Dtype kKind, bool kMerged, Dtype kDt>
void Decode16(const uint8_t* in, __m256 sv, unsigned char* o) {
  using T = KindTraits<kKind>;
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in));
  if constexpr (kDt == Dtype::kBF16) {
    // 16-bit code lanes, fields shifted into place, interleaved with zeros:
    // f32 lanes of elements 0-3, 8-11 (lo) and 4-7, 12-15 (hi).
    const __m256i w = _mm256_cvtepu8_epi16(raw);
    const __m256i f =
        _mm256_and_si256(_mm256_slli_epi16(w, T::kShift - 16), Set16(0x7F << (T::kShift - 16)));
    const __m256i zero = _mm256_setzero_si256();
    const __m256 lo = ScaledMagnitude<kKind, kMerged>(_mm256_unpacklo_epi16(zero, f), sv);
    const __m256 hi = ScaledMagnitude<kKind, kMerged>(_mm256_unpackhi_epi16(zero, f), sv);
    // Products of a merged row cannot overflow bf16 (scale < 2^8): no clamp.
    const __m256i r = _mm256_packus_epi32(RoundToBf16Magnitude<!kMerged>(_mm256_castps_si256(lo)),
                                          RoundToBf16Magnitude<!kMerged>(_mm256_castps_si256(hi)));
    const __m256i sign = _mm256_and_si256(_mm256_slli_epi16(w, 8), Set16(0x8000));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), _mm256_or_si256(r, sign));
  } else {
    const __m256i c0 = _mm256_cvtepu8_epi32(raw);
    const __m256i c1 = _mm256_cvtepu8_epi32(_mm_unpackhi_epi64(raw, raw));
    const __m256i mag_mask = Set32(0x7F);
    __m256 m0 = ScaledMagnitude<kKind, kMerged>(
        _mm256_slli_epi32(_mm256_and_si256(c0, mag_mask), T::kShift), sv);
    __m256 m1 = ScaledMagnitude<kKind, kMerged>(
        _mm256_slli_epi32(_mm256_and_si256(c1, mag_mask), T::kShift), sv);
    if constexpr (kDt == Dtype::kF32) {
      if constexpr (!kMerged) {  // an f32 overflow gives the largest finite f32, not Inf
        const __m256 flt_max = _mm256_castsi256_ps(Set32(0x7F7FFFFF));
        m0 = _mm256_min_ps(m0, flt_max);
        m1 = _mm256_min_ps(m1, flt_max);
      }
      const __m256i sign_bit = Set32(static_cast<int>(0x80000000u));
      const __m256i s0 = _mm256_and_si256(_mm256_slli_epi32(c0, 24), sign_bit);
      const __m256i s1 = _mm256_and_si256(_mm256_slli_epi32(c1, 24), sign_bit);
      auto* f = reinterpret_cast<__m256i*>(o);
      _mm256_storeu_si256(f, _mm256_or_si256(_mm256_castps_si256(m0), s0));
      _mm256_storeu_si256(f + 1, _mm256_or_si256(_mm256_castps_si256(m1), s1));
    } else {
      const __m256 f16_max = _mm256_set1_ps(65504.0f);
      constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
      const __m256i h = _mm256_set_m128i(_mm256_cvtps_ph(_mm256_min_ps(m1, f16_max), kRne),
                                         _mm256_cvtps_ph(_mm256_min_ps(m0, f16_max), kRne));
      const __m256i sign =
          _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepu8_epi16(raw), 8), Set16(0x8000));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), _mm256_or_si256(h, sign));
    }
  }
}

template <Dtype kKind, Dtype kDt, bool kMerged>
void DequantizeRow(const uint8_t* in, size_t width, float factor, unsigned char* o) {
  constexpr size_t es = kElemSize<kDt>;
  const __m256 sv = _mm256_set1_ps(factor);
  size_t i = 0;
  for (; i + 16 <= width; i += 16) Decode16<kKind, kMerged, kDt>(in + i, sv, o + i * es);
  if (i < width) {
    const size_t rem = width - i;
    alignas(16) uint8_t cbuf[16] = {};
    alignas(32) unsigned char obuf[64];
    std::memcpy(cbuf, in + i, rem);
    Decode16<kKind, kMerged, kDt>(cbuf, sv, obuf);
    std::memcpy(o + i * es, obuf, rem * es);
  }
}

// bf16 patterns (low halves of 32-bit lanes) of any 8 f32 values: rounded
// to nearest even, clamped to the finite range, signed; NaN kept as a quiet
// NaN with the top of its payload.
__m256i ToBf16Any(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i abs = _mm256_and_si256(bits, Set32(0x7FFFFFFF));
  const __m256i hi = _mm256_srli_epi32(bits, 16);
  __m256i r = _mm256_or_si256(RoundToBf16Magnitude<true>(abs), _mm256_and_si256(hi, Set32(0x8000)));
  const __m256i is_nan = _mm256_cmpgt_epi32(abs, Set32(static_cast<int>(kF32InfBits)));
  return _mm256_blendv_epi8(r, _mm256_or_si256(hi, Set32(0x0040)), is_nan);
}

// ---- Scans ----

// Bit mask of the bytes of v that are >= t (unsigned), one bit per byte.
uint32_t BytesAtLeast(__m256i v, __m256i t) {
  return static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_max_epu8(v, t), v)));
}

size_t FindInvalidCodeAvx2(Dtype kind, const uint8_t* codes, size_t n) {
  const __m256i mag_mask = _mm256_set1_epi8(0x7F);
  const __m256i first_bad = _mm256_set1_epi8(kind == Dtype::kE4M3 ? 0x7F : 0x7C);
  for (size_t i = 0; i < n; i += 32) {
    __m256i v;
    if (n - i >= 32) {
      v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + i));
    } else {
      alignas(32) uint8_t buf[32] = {};  // code 0x00 is valid padding
      std::memcpy(buf, codes + i, n - i);
      v = _mm256_load_si256(reinterpret_cast<const __m256i*>(buf));
    }
    const uint32_t bad = BytesAtLeast(_mm256_and_si256(v, mag_mask), first_bad);
    if (bad != 0) return i + static_cast<size_t>(__builtin_ctz(bad));
  }
  return n;
}

size_t FindNonFiniteAvx2(Dtype dtype, const void* src, size_t n) {
  const auto* p = static_cast<const unsigned char*>(src);
  const size_t es = dtype == Dtype::kF32 ? 4 : 2;
  const size_t per = 32 / es;  // elements per vector
  for (size_t i = 0; i < n; i += per) {
    __m256i v;
    if (n - i >= per) {
      v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i * es));
    } else {
      alignas(32) unsigned char buf[32] = {};  // zero is finite padding
      std::memcpy(buf, p + i * es, (n - i) * es);
      v = _mm256_load_si256(reinterpret_cast<const __m256i*>(buf));
    }
    uint32_t bad;  // one bit per byte of each non-finite element
    if (dtype == Dtype::kF32) {
      const __m256i abs = _mm256_and_si256(v, _mm256_set1_epi32(0x7FFFFFFF));
      const __m256i inf_minus_one = _mm256_set1_epi32(static_cast<int>(kF32InfBits - 1u));
      bad = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpgt_epi32(abs, inf_minus_one)));
    } else {
      const __m256i abs = _mm256_and_si256(v, _mm256_set1_epi16(0x7FFF));
      const __m256i inf = _mm256_set1_epi16(dtype == Dtype::kBF16 ? 0x7F80 : 0x7C00);
      const __m256i ge = _mm256_cmpeq_epi16(_mm256_max_epu16(abs, inf), abs);
      bad = static_cast<uint32_t>(_mm256_movemask_epi8(ge));
    }
    if (bad != 0) return i + static_cast<size_t>(__builtin_ctz(bad)) / es;
  }
  return n;
}

// ---- Element encoder and raw conversions ----

template <Dtype kKind>
void EncodeScaledT(const float* x, size_t n, uint8_t* codes) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i c0 = EncodeAny<kKind>(_mm256_loadu_ps(x + i));
    const __m256i c1 = EncodeAny<kKind>(_mm256_loadu_ps(x + i + 8));
    const __m256i c2 = EncodeAny<kKind>(_mm256_loadu_ps(x + i + 16));
    const __m256i c3 = EncodeAny<kKind>(_mm256_loadu_ps(x + i + 24));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i), PackCodes32(c0, c1, c2, c3));
  }
  for (; i < n; i += 8) {
    const size_t rem = n - i >= 8 ? 8 : n - i;
    alignas(32) float buf[8] = {};
    std::memcpy(buf, x + i, rem * 4);
    const __m256i cv = EncodeAny<kKind>(_mm256_load_ps(buf));
    alignas(16) unsigned char out[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(out), PackCodes8(cv));
    std::memcpy(codes + i, out, rem);
  }
}

// Converts 8 elements.
template <Dtype kSrc, Dtype kDst>
void Convert8(const unsigned char* in, unsigned char* out) {
  const __m256 v = Load8<kSrc>(in);
  if constexpr (kDst == Dtype::kF32) {
    _mm256_storeu_ps(reinterpret_cast<float*>(out), v);
  } else if constexpr (kDst == Dtype::kBF16) {
    const __m256i r = ToBf16Any(v);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(Pack16x16(r, r)));
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), ToF16(v));
  }
}

template <Dtype kSrc, Dtype kDst>
void ConvertT(const void* src, size_t n, void* dst) {
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    Convert8<kSrc, kDst>(in + i * kElemSize<kSrc>, out + i * kElemSize<kDst>);
  if (i < n) {
    alignas(32) unsigned char ibuf[32] = {};
    alignas(32) unsigned char obuf[32];
    std::memcpy(ibuf, in + i * kElemSize<kSrc>, (n - i) * kElemSize<kSrc>);
    Convert8<kSrc, kDst>(ibuf, obuf);
    std::memcpy(out + i * kElemSize<kDst>, obuf, (n - i) * kElemSize<kDst>);
  }
}

// The primitives row_drivers.h runs on.
struct Avx2 {
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
    return FindInvalidCodeAvx2(kind, codes, n);
  }
  static size_t FindNonFinite(Dtype dtype, const void* src, size_t n) {
    return FindNonFiniteAvx2(dtype, src, n);
  }
};

}  // namespace

const Kernels kAvx2Kernels = MakeKernels<Avx2>();

}  // namespace kvfile::codec::internal
