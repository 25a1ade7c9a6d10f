// NVFP4 row kernels for AVX-512 (F, BW, VL, DQ): one 16-element block is one
// vector. Compiled with the AVX-512 flags and called only after the
// dispatcher has checked them. Bit-identical to nvfp4_scalar.cc.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#ifndef __clang__  // GCC 12's AVX-512 headers (see codec_avx512.cc)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cfloat>
#include <cstring>

#include "codec/nvfp4.h"

namespace kvfile::codec::nvfp4::internal {
namespace {

const __m512 kAbsMask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));

// E2M1 codes (one per 32-bit lane) of 16 f32 quotients, spec/CODEC.md 14.2:
// the magnitude code counts the rounding boundaries at or below |q| (a tie
// belongs to the even side: > for the boundaries that end an even code's
// interval, >= for those that start one), the sign goes to bit 3.
__m512i EncodeE2M1x16(__m512 q) {
  const __m512 a = _mm512_and_ps(q, kAbsMask);
  const __m512i one = _mm512_set1_epi32(1);
  __m512i m = _mm512_setzero_si512();
  m = _mm512_mask_add_epi32(m, _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.25f), _CMP_GT_OQ), m, one);
  m = _mm512_mask_add_epi32(m, _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.75f), _CMP_GE_OQ), m, one);
  m = _mm512_mask_add_epi32(m, _mm512_cmp_ps_mask(a, _mm512_set1_ps(1.25f), _CMP_GT_OQ), m, one);
  m = _mm512_mask_add_epi32(m, _mm512_cmp_ps_mask(a, _mm512_set1_ps(1.75f), _CMP_GE_OQ), m, one);
  m = _mm512_mask_add_epi32(m, _mm512_cmp_ps_mask(a, _mm512_set1_ps(2.5f), _CMP_GT_OQ), m, one);
  m = _mm512_mask_add_epi32(m, _mm512_cmp_ps_mask(a, _mm512_set1_ps(3.5f), _CMP_GE_OQ), m, one);
  m = _mm512_mask_add_epi32(m, _mm512_cmp_ps_mask(a, _mm512_set1_ps(5.0f), _CMP_GT_OQ), m, one);
  const __m512i sign = _mm512_srli_epi32(_mm512_castps_si512(q), 31);
  return _mm512_or_si512(m, _mm512_slli_epi32(sign, 3));
}

// Two codes a byte, low nibble first: 16 lanes -> 8 bytes.
void StorePacked(uint8_t* out, __m512i codes) {
  const __m128i bytes = _mm512_cvtepi32_epi8(codes);
  const __m128i lo = _mm_and_si128(bytes, _mm_set1_epi16(0x000F));
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi16(0x00F0));
  const __m128i pairs = _mm_packus_epi16(_mm_or_si128(lo, hi), _mm_setzero_si128());
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), pairs);
}

bool QuantizeRowAvx512(const float* x, size_t n, uint8_t* packed, uint8_t* block_scales,
                       float* row_scale) {
  // Pass 1: finiteness and the row's amax.
  const __m512i exp_mask = _mm512_set1_epi32(0x7F800000);
  __m512 vmax = _mm512_setzero_ps();
  for (size_t i = 0; i < n; i += kBlock) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __m512i e = _mm512_and_si512(_mm512_castps_si512(v), exp_mask);
    if (_mm512_cmpeq_epi32_mask(e, exp_mask) != 0) return false;
    vmax = _mm512_max_ps(vmax, _mm512_and_ps(v, kAbsMask));
  }
  const float scale = RowScale(_mm512_reduce_max_ps(vmax));
  *row_scale = scale;
  // Pass 2: each block's scale, then its codes.
  for (size_t b = 0; b < n / kBlock; ++b) {
    const __m512 v = _mm512_loadu_ps(x + b * kBlock);
    const float block_amax = _mm512_reduce_max_ps(_mm512_and_ps(v, kAbsMask));
    const uint8_t code = BlockScaleCode(block_amax, scale);
    block_scales[b] = code;
    const float divisor = BlockDivisor(code, scale);
    __m512i codes;
    if (divisor == 0.0f) {
      codes = _mm512_slli_epi32(_mm512_srli_epi32(_mm512_castps_si512(v), 31), 3);
    } else {
      codes = EncodeE2M1x16(_mm512_div_ps(v, _mm512_set1_ps(divisor)));
    }
    StorePacked(packed + b * kBlock / 2, codes);
  }
  return true;
}

void DequantizeRowAvx512(const uint8_t* packed, const uint8_t* block_scales, float row_scale,
                         size_t n, float* out) {
  const __m512 table = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f,
                                      -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
  const __m512 fmax = _mm512_set1_ps(FLT_MAX);
  for (size_t b = 0; b < n / kBlock; ++b) {
    uint64_t eight;
    std::memcpy(&eight, packed + b * kBlock / 2, 8);
    const __m128i bytes = _mm_cvtsi64_si128(static_cast<long long>(eight));
    const __m128i lo = _mm_and_si128(bytes, _mm_set1_epi8(0x0F));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F));
    const __m512i idx = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
    const __m512 values = _mm512_permutexvar_ps(idx, table);
    const __m512 v = _mm512_mul_ps(values, _mm512_set1_ps(BlockDivisor(block_scales[b], row_scale)));
    // +-Inf (only from scales near FLT_MAX) becomes +-FLT_MAX, the sign kept.
    const __m512 sign = _mm512_andnot_ps(kAbsMask, v);
    const __m512 mag = _mm512_min_ps(_mm512_and_ps(v, kAbsMask), fmax);
    _mm512_storeu_ps(out + b * kBlock, _mm512_or_ps(mag, sign));
  }
}

}  // namespace

const Kernels kAvx512Kernels = {QuantizeRowAvx512, DequantizeRowAvx512};

}  // namespace kvfile::codec::nvfp4::internal
