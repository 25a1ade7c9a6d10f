// SPDX-License-Identifier: Apache-2.0
// NVFP4 row kernels for AVX2: one 16-element block is two vectors. Compiled
// with the AVX2 flags and called only after the dispatcher has checked them.
// Bit-identical to nvfp4_scalar.cc.
#include <immintrin.h>

#include <cfloat>
#include <cmath>
#include <cstring>

#include "codec/nvfp4.h"

namespace kvfile::codec::nvfp4::internal {
namespace {

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
__m256i BlockCodes8(__m256 v, const float (*x)[8], size_t j) {
  const __m256 a = _mm256_and_ps(v, AbsMask());
  __m256i m = _mm256_setzero_si256();
  for (int i = 0; i < 7; ++i) {
    const __m256 reached = _mm256_cmp_ps(a, _mm256_broadcast_ss(&x[i][j]), _CMP_GE_OQ);
    m = _mm256_sub_epi32(m, _mm256_castps_si256(reached));
  }
  return _mm256_or_si256(m, SignZeros(v));
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
  const __m256 s = _mm256_set1_ps(scale);
  const size_t blocks = n / kBlock;
  for (size_t g = 0; g < blocks; g += 8) {
    const size_t count = blocks - g < 8 ? blocks - g : 8;
    alignas(32) float bmax[8] = {};
    for (size_t j = 0; j < count; ++j) {
      const float* block = x + (g + j) * kBlock;
      bmax[j] = ReduceMax(_mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(block), AbsMask()),
                                        _mm256_and_ps(_mm256_loadu_ps(block + 8), AbsMask())));
    }
    // Steps 4-5 of spec/CODEC.md 14.3 for 8 blocks; a zero block scale gets
    // the divisor +Inf, whose thresholds no finite element reaches.
    const __m256i codes = E4M3Codes(_mm256_div_ps(_mm256_div_ps(_mm256_load_ps(bmax), s), _mm256_set1_ps(kE2M1Max)));
    alignas(32) int32_t code[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(code), codes);
    for (size_t j = 0; j < count; ++j) block_scales[g + j] = static_cast<uint8_t>(code[j]);
    const __m256 value = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(codes, 20)),
                                       _mm256_castsi256_ps(_mm256_set1_epi32(247 << 23)));  // DEC_e4m3, exact
    const __m256 zero = _mm256_castsi256_ps(_mm256_cmpeq_epi32(codes, _mm256_setzero_si256()));
    const __m256 divisor = _mm256_blendv_ps(_mm256_mul_ps(value, s), _mm256_set1_ps(INFINITY), zero);
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(divisor));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(divisor, 1));
    alignas(32) float t[7][8];
    for (int i = 0; i < 7; ++i) {
      _mm_store_si128(reinterpret_cast<__m128i*>(t[i]), ThresholdBits(lo, kThresholds[i]));
      _mm_store_si128(reinterpret_cast<__m128i*>(t[i] + 4), ThresholdBits(hi, kThresholds[i]));
    }
    for (size_t j = 0; j < count; ++j) {
      const float* block = x + (g + j) * kBlock;
      StorePacked(packed + (g + j) * kBlock / 2, BlockCodes8(_mm256_loadu_ps(block), t, j),
                  BlockCodes8(_mm256_loadu_ps(block + 8), t, j));
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
      const __m256 v = _mm256_mul_ps(_mm256_xor_ps(mag, _mm256_castsi256_ps(sign)), d);
      const __m256 vsign = _mm256_andnot_ps(AbsMask(), v);
      const __m256 vmag = _mm256_min_ps(_mm256_and_ps(v, AbsMask()), fmax);
      _mm256_storeu_ps(out + b * kBlock + half * 8, _mm256_or_ps(vmag, vsign));
    }
  }
}

bool QuantizeRowWidenedAvx2(Dtype src_dtype, const void* src, size_t n, uint8_t* packed,
                            uint8_t* block_scales, float* row_scale, float* scratch) {
  const float* x = static_cast<const float*>(src);
  if (src_dtype != Dtype::kF32) {
    ConvertRaw(src_dtype, src, n, Dtype::kF32, scratch);
    x = scratch;
  }
  return QuantizeRowAvx2(x, n, packed, block_scales, row_scale);
}

void DequantizeRowNarrowedAvx2(const uint8_t* packed, const uint8_t* block_scales, float row_scale,
                               size_t n, Dtype dst_dtype, void* out, float* scratch) {
  float* f = dst_dtype == Dtype::kF32 ? static_cast<float*>(out) : scratch;
  DequantizeRowAvx2(packed, block_scales, row_scale, n, f);
  if (dst_dtype != Dtype::kF32) ConvertRaw(Dtype::kF32, f, n, dst_dtype, out);
}

}  // namespace

const Kernels kAvx2Kernels = {QuantizeRowWidenedAvx2, DequantizeRowNarrowedAvx2};

}  // namespace kvfile::codec::nvfp4::internal
