// SPDX-License-Identifier: Apache-2.0
// NVFP4 row kernels for AVX2: one 16-element block is two vectors. Compiled
// with the AVX2 flags and called only after the dispatcher has checked them.
// Bit-identical to nvfp4_scalar.cc.
#include <immintrin.h>

#include <cfloat>
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

// E2M1 codes (one per 32-bit lane) of 8 quotients; see nvfp4_avx512.cc.
__m256i EncodeE2M1x8(__m256 q) {
  const __m256 a = _mm256_and_ps(q, AbsMask());
  const __m256i one = _mm256_set1_epi32(1);
  __m256i m = _mm256_setzero_si256();
  auto count = [&](float t, int pred) {
    const __m256 c = pred == 0 ? _mm256_cmp_ps(a, _mm256_set1_ps(t), _CMP_GT_OQ)
                               : _mm256_cmp_ps(a, _mm256_set1_ps(t), _CMP_GE_OQ);
    m = _mm256_add_epi32(m, _mm256_and_si256(_mm256_castps_si256(c), one));
  };
  count(0.25f, 0);
  count(0.75f, 1);
  count(1.25f, 0);
  count(1.75f, 1);
  count(2.5f, 0);
  count(3.5f, 1);
  count(5.0f, 0);
  const __m256i sign = _mm256_srli_epi32(_mm256_castps_si256(q), 31);
  return _mm256_or_si256(m, _mm256_slli_epi32(sign, 3));
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
  for (size_t b = 0; b < n / kBlock; ++b) {
    const __m256 v0 = _mm256_loadu_ps(x + b * kBlock);
    const __m256 v1 = _mm256_loadu_ps(x + b * kBlock + 8);
    const float block_amax =
        ReduceMax(_mm256_max_ps(_mm256_and_ps(v0, AbsMask()), _mm256_and_ps(v1, AbsMask())));
    const uint8_t code = BlockScaleCode(block_amax, scale);
    block_scales[b] = code;
    const float divisor = BlockDivisor(code, scale);
    if (divisor == 0.0f) {
      StorePacked(packed + b * kBlock / 2, SignZeros(v0), SignZeros(v1));
    } else {
      const __m256 d = _mm256_set1_ps(divisor);
      StorePacked(packed + b * kBlock / 2, EncodeE2M1x8(_mm256_div_ps(v0, d)),
                  EncodeE2M1x8(_mm256_div_ps(v1, d)));
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
