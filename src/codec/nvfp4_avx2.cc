// SPDX-License-Identifier: Apache-2.0
// NVFP4 row kernels for AVX2: one 16-element block is two vectors of f32 or
// one of 16-bit elements. Compiled with the AVX2 flags and called only after
// the dispatcher has checked them. Bit-identical to nvfp4_scalar.cc.
#include <immintrin.h>

#include <cfloat>
#include <cmath>
#include <cstring>

#include "codec/nvfp4.h"

namespace kvfile::codec::nvfp4::internal {
namespace {

float BitsToFloat(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

__m256 AbsMask() { return _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)); }

float ReduceMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// 16 codes (two vectors of 8 lanes) -> 8 bytes, low nibble first.
void StorePacked(uint8_t* out, __m256i c0, __m256i c1) {
  // packs works within 128-bit lanes: [c0 0-3, c1 0-3, c0 4-7, c1 4-7].
  const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(c0, c1), 0xD8);
  const __m128i bytes = _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
  const __m128i lo = _mm_and_si128(bytes, _mm_set1_epi16(0x000F));
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi16(0x00F0));
  const __m128i pairs = _mm_packus_epi16(_mm_or_si128(lo, hi), _mm_setzero_si128());
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), pairs);
}

__m256i SignZeros(__m256 v) {
  return _mm256_slli_epi32(_mm256_srli_epi32(_mm256_castps_si256(v), 31), 3);
}

// E4M3 codes of 8 values that are >= 0 and finite, saturating at 0x7E: the
// method of E4M3Codes in nvfp4_avx512.cc.
__m256i E4M3Codes(__m256 q) {
  const __m256i m = _mm256_max_epi32(_mm256_castps_si256(q), _mm256_set1_epi32(0x3C800000));  // 2^-6
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(m, 20), _mm256_set1_epi32(1));
  const __m256i normal = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(m, _mm256_set1_epi32((1 << 19) - 1 - (120 << 23))), lsb), 20);
  const __m256i sub = _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(q, _mm256_set1_ps(16384.0f))),
                                       _mm256_set1_epi32(0x46800000));
  return _mm256_min_epi32(_mm256_min_epi32(normal, sub), _mm256_set1_epi32(0x7E));
}

// X of one threshold (nvfp4.h) for 4 divisors: the least f32 >= (or >)
// midpoint * D, as an f32 bit pattern. Without AVX-512's rounding modes:
// the nearest f32, one ulp up when it is below the product (or, strict, not
// above it). For D = +Inf: +Inf, or, strict, the NaN pattern above it.
__m128i ThresholdBits(__m256d d, const Threshold& t) {
  const __m256d p = _mm256_mul_pd(d, _mm256_set1_pd(t.midpoint));
  const __m128 nearest = _mm256_cvtpd_ps(p);
  const __m256d back = _mm256_cvtps_pd(nearest);
  const __m256d up = t.strict ? _mm256_cmp_pd(back, p, _CMP_LE_OQ) : _mm256_cmp_pd(back, p, _CMP_LT_OQ);
  // The 64-bit masks narrowed to 32 bits: all ones (-1) where one ulp is added.
  const __m128i up32 = _mm256_castsi256_si128(
      _mm256_permutevar8x32_epi32(_mm256_castpd_si256(up), _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7)));
  return _mm_sub_epi32(_mm_castps_si128(nearest), up32);
}

// E2M1 codes (one per 32-bit lane) of 8 finite elements whose block's
// thresholds are x[0..7][j]: the count of thresholds each magnitude
// reaches, the sign in bit 3.
__m256i BlockCodes8(__m256 v, const uint32_t (*x)[8], size_t j) {
  const __m256 a = _mm256_and_ps(v, AbsMask());
  __m256i m = _mm256_setzero_si256();
  for (int i = 0; i < 7; ++i) {
    const __m256 threshold = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(x[i][j])));
    const __m256 reached = _mm256_cmp_ps(a, threshold, _CMP_GE_OQ);
    m = _mm256_sub_epi32(m, _mm256_castps_si256(reached));
  }
  return _mm256_or_si256(m, SignZeros(v));
}

// Steps 4-6 of spec/CODEC.md 14.3 for up to 8 blocks whose maxima are in
// bmax[0, count): block scale codes to block_scales, threshold i of block j
// (f32 bit patterns) to t[i][j]. A zero block scale gets the divisor +Inf,
// whose thresholds no finite element reaches (its codes are signed zeros).
void BlockThresholds8(const float* bmax, size_t count, float scale, uint8_t* block_scales,
                      uint32_t (*t)[8]) {
  const __m256 s = _mm256_set1_ps(scale);
  const __m256 relative = _mm256_div_ps(_mm256_loadu_ps(bmax), s);
  const __m256i codes = E4M3Codes(_mm256_div_ps(relative, _mm256_set1_ps(kE2M1Max)));
  alignas(32) int32_t code[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(code), codes);
  for (size_t j = 0; j < count; ++j) block_scales[j] = static_cast<uint8_t>(code[j]);
  const __m256 value = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(codes, 20)),
                                     _mm256_castsi256_ps(_mm256_set1_epi32(247 << 23)));  // DEC_e4m3, exact
  const __m256 zero = _mm256_castsi256_ps(_mm256_cmpeq_epi32(codes, _mm256_setzero_si256()));
  const __m256 divisor = _mm256_blendv_ps(_mm256_mul_ps(value, s), _mm256_set1_ps(INFINITY), zero);
  const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(divisor));
  const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(divisor, 1));
  for (int i = 0; i < 7; ++i) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(t[i]), ThresholdBits(lo, kThresholds[i]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(t[i] + 4), ThresholdBits(hi, kThresholds[i]));
  }
}

bool QuantizeRowAvx2(const float* x, size_t n, uint8_t* packed, uint8_t* block_scales,
                     float* row_scale) {
  const __m256i exp_mask = _mm256_set1_epi32(0x7F800000);
  __m256 vmax = _mm256_setzero_ps();
  for (size_t i = 0; i < n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256i e = _mm256_and_si256(_mm256_castps_si256(v), exp_mask);
    if (_mm256_movemask_epi8(_mm256_cmpeq_epi32(e, exp_mask)) != 0) return false;
    vmax = _mm256_max_ps(vmax, _mm256_and_ps(v, AbsMask()));
  }
  const float scale = RowScale(ReduceMax(vmax));
  *row_scale = scale;
  const size_t blocks = n / kBlock;
  for (size_t g = 0; g < blocks; g += 8) {
    const size_t count = blocks - g < 8 ? blocks - g : 8;
    float bmax[8] = {};
    for (size_t j = 0; j < count; ++j) {
      const float* block = x + (g + j) * kBlock;
      bmax[j] = ReduceMax(_mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(block), AbsMask()),
                                        _mm256_and_ps(_mm256_loadu_ps(block + 8), AbsMask())));
    }
    uint32_t t[7][8];
    BlockThresholds8(bmax, count, scale, block_scales + g, t);
    for (size_t j = 0; j < count; ++j) {
      const float* block = x + (g + j) * kBlock;
      StorePacked(packed + (g + j) * kBlock / 2, BlockCodes8(_mm256_loadu_ps(block), t, j),
                  BlockCodes8(_mm256_loadu_ps(block + 8), t, j));
    }
  }
  return true;
}

// The largest of 16 unsigned 16-bit lanes.
uint16_t ReduceMaxU16(__m256i v) {
  const __m128i m = _mm_max_epu16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  // minpos finds the smallest lane: of the complements, the largest.
  return static_cast<uint16_t>(~_mm_cvtsi128_si32(_mm_minpos_epu16(_mm_xor_si128(m, _mm_set1_epi16(-1)))));
}

// bf16 and f16 rows, one block per vector of 16-bit lanes: a magnitude's
// pattern reaches the f32 threshold X exactly when it is at least X
// rounded up to the dtype (patterns of non-negative values order as the
// values do), so the codes need no widening. kDt: kBF16 or kF16.
template <Dtype kDt>
bool QuantizeRowHalfAvx2(const uint16_t* src, size_t n, uint8_t* packed, uint8_t* block_scales,
                         float* row_scale, float* bmax) {
  const __m256i mag = _mm256_set1_epi16(0x7FFF);
  const size_t blocks = n / kBlock;
  uint16_t amax = 0;
  for (size_t b = 0; b < blocks; ++b) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + b * kBlock));
    const uint16_t m = ReduceMaxU16(_mm256_and_si256(v, mag));
    amax = m > amax ? m : amax;
    bmax[b] = kDt == Dtype::kBF16 ? BitsToFloat(static_cast<uint32_t>(m) << 16) : _cvtsh_ss(m);
  }
  if (amax >= (kDt == Dtype::kBF16 ? 0x7F80 : 0x7C00)) return false;  // Inf or NaN
  const float scale =
      RowScale(kDt == Dtype::kBF16 ? BitsToFloat(static_cast<uint32_t>(amax) << 16) : _cvtsh_ss(amax));
  *row_scale = scale;
  for (size_t g = 0; g < blocks; g += 8) {
    const size_t count = blocks - g < 8 ? blocks - g : 8;
    float group_max[8] = {};
    std::memcpy(group_max, bmax + g, count * sizeof(float));
    uint32_t t[7][8];
    BlockThresholds8(group_max, count, scale, block_scales + g, t);
    // The thresholds in the dtype, minus one (a signed compare: magnitude
    // patterns are below 0x8000, and so is every threshold).
    int16_t below[7][8];
    for (int i = 0; i < 7; ++i) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t[i]));
      __m128i h;
      if constexpr (kDt == Dtype::kBF16) {
        const __m256i up = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0xFFFF)), 16);
        h = _mm_packus_epi32(_mm256_castsi256_si128(up), _mm256_extracti128_si256(up, 1));
      } else {  // X converted rounding up (a NaN X stays a NaN, above every finite pattern)
        h = _mm256_cvtps_ph(_mm256_castsi256_ps(x), _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(below[i]), _mm_sub_epi16(h, _mm_set1_epi16(1)));
    }
    for (size_t j = 0; j < count; ++j) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + (g + j) * kBlock));
      const __m256i a = _mm256_and_si256(raw, mag);
      __m256i m = _mm256_setzero_si256();
      for (int i = 0; i < 7; ++i) m = _mm256_sub_epi16(m, _mm256_cmpgt_epi16(a, _mm256_set1_epi16(below[i][j])));
      // m | sign in bit 3; then each 32-bit lane's even code plus 16 times its odd one.
      const __m256i codes = _mm256_or_si256(m, _mm256_and_si256(_mm256_srli_epi16(raw, 12), _mm256_set1_epi16(8)));
      const __m256i pairs = _mm256_madd_epi16(codes, _mm256_set1_epi32(0x00100001));
      // Byte 0 of each 32-bit lane: 4 bytes per 128-bit lane, then together.
      const __m256i bytes = _mm256_shuffle_epi8(pairs, _mm256_set1_epi32(0x0C080400));
      const __m256i both = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(packed + (g + j) * kBlock / 2), _mm256_castsi256_si128(both));
    }
  }
  return true;
}

void DequantizeRowAvx2(const uint8_t* packed, const uint8_t* block_scales, float row_scale,
                       size_t n, float* out) {
  const __m256 table = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
  const __m256 fmax = _mm256_set1_ps(FLT_MAX);
  for (size_t b = 0; b < n / kBlock; ++b) {
    uint64_t eight;
    std::memcpy(&eight, packed + b * kBlock / 2, 8);
    const __m128i bytes = _mm_cvtsi64_si128(static_cast<long long>(eight));
    const __m128i lo = _mm_and_si128(bytes, _mm_set1_epi8(0x0F));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F));
    const __m128i codes = _mm_unpacklo_epi8(lo, hi);  // 16 codes in element order
    const __m256 d = _mm256_set1_ps(BlockDivisor(block_scales[b], row_scale));
    for (int half = 0; half < 2; ++half) {
      const __m256i c = _mm256_cvtepu8_epi32(half == 0 ? codes : _mm_srli_si128(codes, 8));
      const __m256 mag = _mm256_permutevar8x32_ps(table, c);  // uses the low 3 bits
      const __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(c, 3), 31);
      const __m256 value = _mm256_xor_ps(mag, _mm256_castsi256_ps(sign));
      // A zero code keeps its signed zero, also under d = +Inf (DecodeScaled).
      const __m256 nonzero = _mm256_cmp_ps(mag, _mm256_setzero_ps(), _CMP_NEQ_OQ);
      const __m256 v = _mm256_blendv_ps(value, _mm256_mul_ps(value, d), nonzero);
      const __m256 vsign = _mm256_andnot_ps(AbsMask(), v);
      const __m256 vmag = _mm256_min_ps(_mm256_and_ps(v, AbsMask()), fmax);
      _mm256_storeu_ps(out + b * kBlock + half * 8, _mm256_or_ps(vmag, vsign));
    }
  }
}

bool QuantizeRowAnyAvx2(Dtype src_dtype, const void* src, size_t n, uint8_t* packed,
                        uint8_t* block_scales, float* row_scale, float* scratch) {
  switch (src_dtype) {
    case Dtype::kBF16:
      return QuantizeRowHalfAvx2<Dtype::kBF16>(static_cast<const uint16_t*>(src), n, packed, block_scales,
                                               row_scale, scratch);
    case Dtype::kF16:
      return QuantizeRowHalfAvx2<Dtype::kF16>(static_cast<const uint16_t*>(src), n, packed, block_scales,
                                              row_scale, scratch);
    default:
      return QuantizeRowAvx2(static_cast<const float*>(src), n, packed, block_scales, row_scale);
  }
}

void DequantizeRowNarrowedAvx2(const uint8_t* packed, const uint8_t* block_scales, float row_scale,
                               size_t n, Dtype dst_dtype, void* out, float* scratch) {
  float* f = dst_dtype == Dtype::kF32 ? static_cast<float*>(out) : scratch;
  DequantizeRowAvx2(packed, block_scales, row_scale, n, f);
  if (dst_dtype != Dtype::kF32) ConvertRaw(Dtype::kF32, f, n, dst_dtype, out);
}

}  // namespace

const Kernels kAvx2Kernels = {QuantizeRowAnyAvx2, DequantizeRowNarrowedAvx2};

}  // namespace kvfile::codec::nvfp4::internal
