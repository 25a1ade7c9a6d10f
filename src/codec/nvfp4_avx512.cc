// SPDX-License-Identifier: Apache-2.0
// NVFP4 row kernels for AVX-512 (F, BW, VL, DQ): a 16-element block is one
// vector of f32, two blocks one vector of bf16 or f16 patterns. Compiled with
// the AVX-512 flags and called only after the dispatcher has checked them.
// Bit-identical to nvfp4_scalar.cc.
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

// _mm512_shuffle_ps on integer vectors. The immediate is a template
// argument: clang requires a constant expression there.
template <int kImm>
[[gnu::always_inline]] inline __m512i ShufflePs(__m512i a, __m512i b) {
  return _mm512_castps_si512(_mm512_shuffle_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(b), kImm));
}

// Lane j of the result: the largest lane of v[j] (16 vectors of magnitude
// bit patterns, compared as unsigned integers: the order of non-negative
// floats, with Inf and NaN above every finite value). A transposing
// reduction: within 128-bit lanes, then across them.
[[gnu::always_inline]] inline __m512i BlockMaxima(const __m512i* v) {
  __m512i l1[8], l2[4], l3[2];
  for (int i = 0; i < 8; ++i) {
    l1[i] = _mm512_max_epu32(ShufflePs<0x44>(v[2 * i], v[2 * i + 1]), ShufflePs<0xEE>(v[2 * i], v[2 * i + 1]));
  }
  for (int i = 0; i < 4; ++i) {
    l2[i] = _mm512_max_epu32(ShufflePs<0x88>(l1[2 * i], l1[2 * i + 1]), ShufflePs<0xDD>(l1[2 * i], l1[2 * i + 1]));
  }
  for (int i = 0; i < 2; ++i) {
    l3[i] = _mm512_max_epu32(_mm512_shuffle_i32x4(l2[2 * i], l2[2 * i + 1], 0x88),
                             _mm512_shuffle_i32x4(l2[2 * i], l2[2 * i + 1], 0xDD));
  }
  return _mm512_max_epu32(_mm512_shuffle_i32x4(l3[0], l3[1], 0x88), _mm512_shuffle_i32x4(l3[0], l3[1], 0xDD));
}

// Two codes a byte, low nibble first: 16 lanes -> 8 bytes. Each 64-bit lane
// holds an even element's code in bits 0-3 and the next one's in bits 32-35.
void StorePacked(uint8_t* out, __m512i codes) {
  const __m512i pairs = _mm512_or_si512(codes, _mm512_srli_epi64(codes, 28));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm512_cvtepi64_epi8(pairs));
}

// E4M3 codes of 16 values that are >= 0 and finite (spec/CODEC.md section
// 3, saturating at 0x7E): the normal-range code by integer rounding of the f32
// pattern (half an e4m3 ulp minus one, plus the kept lsb for ties to even,
// the rebias folded in), the subnormal-range code by adding 2^14, whose ulp is
// the e4m3 subnormal step 2^-9; the code is the smaller of the two.
__m512i E4M3Codes(__m512 q) {
  const __m512i bits = _mm512_castps_si512(q);
  const __m512i m = _mm512_max_epi32(bits, _mm512_set1_epi32(0x3C800000));  // 2^-6
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(m, 20), _mm512_set1_epi32(1));
  const __m512i normal = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(m, _mm512_set1_epi32((1 << 19) - 1 - (120 << 23))), lsb),
      20);
  const __m512i sub = _mm512_sub_epi32(
      _mm512_castps_si512(_mm512_add_ps(q, _mm512_set1_ps(16384.0f))), _mm512_set1_epi32(0x46800000));
  return _mm512_min_epi32(_mm512_min_epi32(normal, sub), _mm512_set1_epi32(0x7E));
}

// DEC_e4m3 of codes 0 .. 0x7E, exactly: the code placed in the f32 exponent
// and mantissa fields is the value times 2^-120 (a subnormal f32 for codes
// below 8), and the multiplication by 2^120 is exact.
__m512 E4M3Values(__m512i codes) {
  return _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(codes, 20)),
                       _mm512_castsi512_ps(_mm512_set1_epi32(247 << 23)));
}

// X of one threshold for 8 divisors (double lanes): the least f32 >= (or >)
// midpoint * D, as an f32 bit pattern (+Inf when no finite f32 is; for
// D = +Inf, +Inf or, strict, the NaN pattern above it).
__m256i ThresholdBits(__m512d d, const Threshold& t) {
  const __m512d p = _mm512_mul_pd(d, _mm512_set1_pd(t.midpoint));
  if (t.strict) {  // the f32 at or below the product, plus one ulp
    const __m256 below = _mm512_cvt_roundpd_ps(p, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    return _mm256_add_epi32(_mm256_castps_si256(below), _mm256_set1_epi32(1));
  }
  return _mm256_castps_si256(_mm512_cvt_roundpd_ps(p, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC));
}

// The same threshold for bf16 elements, in the low 16 bits of each 32-bit
// lane: X's pattern rounded up to 16 bits (a bf16 magnitude reaches X
// exactly when its pattern is at least that: patterns of non-negative
// values order as the values do). For a strict X = below + 1 ulp that is
// (below >> 16) + 1.
__m256i Bf16ThresholdBits(__m512d d, const Threshold& t) {
  const __m512d p = _mm512_mul_pd(d, _mm512_set1_pd(t.midpoint));
  if (t.strict) {
    const __m256 below = _mm512_cvt_roundpd_ps(p, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    return _mm256_add_epi32(_mm256_srli_epi32(_mm256_castps_si256(below), 16), _mm256_set1_epi32(1));
  }
  const __m256 above = _mm512_cvt_roundpd_ps(p, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
  return _mm256_srli_epi32(_mm256_add_epi32(_mm256_castps_si256(above), _mm256_set1_epi32(0xFFFF)), 16);
}

// The block scales and divisors (spec/CODEC.md 14.3 steps 4-5) of up to 16
// blocks whose maxima are in bmax[0, count): codes to block_scales, the
// divisors of blocks 0-7 to *lo and 8-15 to *hi (double lanes). A zero block
// scale gets the divisor +Inf: no finite element reaches any of its
// thresholds, so its codes are signed zeros, as the reference's are.
[[gnu::always_inline]] inline void BlockDivisors(const float* bmax, size_t count, float scale,
                                                 uint8_t* block_scales, __m512d* lo, __m512d* hi) {
  const __mmask16 k = static_cast<__mmask16>((1u << count) - 1u);
  const __m512 s = _mm512_set1_ps(scale);
  const __m512 relative = _mm512_div_ps(_mm512_maskz_loadu_ps(k, bmax), s);
  const __m512i codes = E4M3Codes(_mm512_div_ps(relative, _mm512_set1_ps(kE2M1Max)));
  _mm_mask_storeu_epi8(block_scales, k, _mm512_cvtepi32_epi8(codes));
  const __mmask16 zero = _mm512_cmpeq_epi32_mask(codes, _mm512_setzero_si512());
  const __m512 divisor = _mm512_mask_mov_ps(_mm512_mul_ps(E4M3Values(codes), s), zero,
                                            _mm512_castsi512_ps(_mm512_set1_epi32(0x7F800000)));
  *lo = _mm512_cvtps_pd(_mm512_castps512_ps256(divisor));
  *hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(divisor), 1)));
}

// The block scales and element thresholds (steps 4-6) of up to 16 blocks:
// threshold i of block b to lane b of x[i] (f32 bit patterns).
[[gnu::always_inline]] inline void BlockThresholds(const float* bmax, size_t count, float scale,
                                                   uint8_t* block_scales, __m512i (&x)[7]) {
  __m512d lo, hi;
  BlockDivisors(bmax, count, scale, block_scales, &lo, &hi);
#pragma GCC unroll 7
  for (int i = 0; i < 7; ++i) {
    x[i] = _mm512_inserti64x4(_mm512_castsi256_si512(ThresholdBits(lo, kThresholds[i])),
                              ThresholdBits(hi, kThresholds[i]), 1);
  }
}

// E2M1 codes (one per 32-bit lane) of a block's 16 finite elements: the
// count of thresholds each magnitude reaches, the sign in bit 3.
[[gnu::always_inline]] inline __m512i BlockCodes(__m512 v, const float (*x)[16], size_t j) {
  const __m512 a = _mm512_and_ps(v, kAbsMask);
  const __m512i one = _mm512_set1_epi32(1);
  __m512i m = _mm512_setzero_si512();
#pragma GCC unroll 7
  for (int i = 0; i < 7; ++i) {
    m = _mm512_mask_add_epi32(m, _mm512_cmp_ps_mask(a, _mm512_set1_ps(x[i][j]), _CMP_GE_OQ), m, one);
  }
  const __m512i sign = _mm512_slli_epi32(_mm512_srli_epi32(_mm512_castps_si512(v), 31), 3);
  return _mm512_or_si512(m, sign);
}

// Word indices: the even words of two vectors, then their odd words.
alignas(64) constexpr uint16_t kEvenWords[32] = {0,  2,  4,  6,  8,  10, 12, 14, 16, 18, 20,
                                                 22, 24, 26, 28, 30, 32, 34, 36, 38, 40, 42,
                                                 44, 46, 48, 50, 52, 54, 56, 58, 60, 62};
alignas(64) constexpr uint16_t kOddWords[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21,
                                                23, 25, 27, 29, 31, 33, 35, 37, 39, 41, 43,
                                                45, 47, 49, 51, 53, 55, 57, 59, 61, 63};

// max(word 2k, word 2k + 1) of a (k < 16), then of b: every block of 2^w
// words in a and b becomes 2^(w-1) words, in order.
[[gnu::always_inline]] inline __m512i PairMax(__m512i a, __m512i b) {
  const __m512i even = _mm512_load_si512(kEvenWords), odd = _mm512_load_si512(kOddWords);
  return _mm512_max_epu16(_mm512_permutex2var_epi16(a, even, b), _mm512_permutex2var_epi16(a, odd, b));
}

// The magnitude patterns' maxima of up to 16 blocks of bf16 or f16 at src,
// as f32 bit patterns in lane order (0 past count). Patterns of
// non-negative values order as the values do, Inf and NaN above every
// finite one.
template <Dtype kDt>
[[gnu::always_inline]] inline __m512i HalfBlockMaxima(const uint16_t* src, size_t count) {
  const __m512i mag = _mm512_set1_epi16(0x7FFF);
  __m512i v[8];
  if (count == 16) {
#pragma GCC unroll 8
    for (size_t p = 0; p < 8; ++p) v[p] = _mm512_and_si512(_mm512_loadu_si512(src + p * 2 * kBlock), mag);
  } else {
#pragma GCC unroll 8
    for (size_t p = 0; p < 8; ++p) {
      const size_t left = count > 2 * p ? count - 2 * p : 0;
      const __mmask32 k = left >= 2 ? ~__mmask32{0} : left == 1 ? __mmask32{0xFFFF} : __mmask32{0};
      v[p] = _mm512_and_si512(_mm512_maskz_loadu_epi16(k, src + p * 2 * kBlock), mag);
    }
  }
  const __m512i w0 = PairMax(PairMax(v[0], v[1]), PairMax(v[2], v[3]));
  const __m512i w1 = PairMax(PairMax(v[4], v[5]), PairMax(v[6], v[7]));
  const __m512i u = PairMax(PairMax(w0, w1), _mm512_setzero_si512());
  if constexpr (kDt == Dtype::kBF16) return _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(u)), 16);
  return _mm512_castps_si512(_mm512_cvtph_ps(_mm512_castsi512_si256(u)));
}

// Word 8b + i of a table: threshold i (1-7) of its block b (0-3), from
// word 16 * (i % 2) + b of p[i / 2] (see HalfTables) plus the table's
// first word there.
alignas(64) constexpr uint16_t kTableWords[32] = {
    0, 16, 32, 48, 0, 16, 32, 48, 1, 17, 33, 49, 1, 17, 33, 49,
    2, 18, 34, 50, 2, 18, 34, 50, 3, 19, 35, 51, 3, 19, 35, 51,
};

// Threshold t of 16 blocks (divisors lo, hi) for bf16 or f16 elements, in
// 16-bit words ordered as _mm256_packus_epi32 leaves them (it works within
// 128-bit lanes): blocks 0-3, 8-11, 4-7, 12-15.
template <Dtype kDt>
[[gnu::always_inline]] inline __m256i HalfThresholds(__m512d lo, __m512d hi, const Threshold& t) {
  if constexpr (kDt == Dtype::kBF16) {
    return _mm256_packus_epi32(Bf16ThresholdBits(lo, t), Bf16ThresholdBits(hi, t));
  } else {
    // An f16 reaches X exactly when it is at least the least f16 at or
    // above X: X converted rounding up (+Inf past the range; a NaN X stays
    // a NaN, above every finite pattern too).
    constexpr int kUp = _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC;
    const __m128i l = _mm256_cvtps_ph(_mm256_castsi256_ps(ThresholdBits(lo, t)), kUp);
    const __m128i h = _mm256_cvtps_ph(_mm256_castsi256_ps(ThresholdBits(hi, t)), kUp);
    return _mm256_set_m128i(_mm_unpackhi_epi64(l, h), _mm_unpacklo_epi64(l, h));
  }
}

// The block scales and the bf16 or f16 element thresholds of up to 16
// blocks, as four tables of four blocks: word 8b + i of tables[q] is
// threshold i of block 4q + b (word 8b is not used).
template <Dtype kDt>
[[gnu::always_inline]] inline void HalfTables(const float* bmax, size_t count, float scale, uint8_t* block_scales,
                                              __m512i* tables) {
  __m512d lo, hi;
  BlockDivisors(bmax, count, scale, block_scales, &lo, &hi);
  __m256i t[8];
  t[0] = _mm256_setzero_si256();
#pragma GCC unroll 7
  for (int i = 0; i < 7; ++i) t[i + 1] = HalfThresholds<kDt>(lo, hi, kThresholds[i]);
  // p[k]: thresholds 2k (words 0-15) and 2k + 1 (words 16-31).
  __m512i p[4];
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) p[k] = _mm512_inserti64x4(_mm512_castsi256_si512(t[2 * k]), t[2 * k + 1], 1);
  const __m512i index = _mm512_load_si512(kTableWords);
  constexpr short kFirstWord[4] = {0, 8, 4, 12};  // of blocks 0, 4, 8, 12 in t[i]
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    const __m512i at = _mm512_add_epi16(index, _mm512_set1_epi16(kFirstWord[q]));
    const __m512i low = _mm512_permutex2var_epi16(p[0], at, p[1]);   // thresholds 0-3
    const __m512i high = _mm512_permutex2var_epi16(p[2], at, p[3]);  // thresholds 4-7
    tables[q] = _mm512_mask_blend_epi16(0xF0F0F0F0u, low, high);
  }
}

// The codes of two bf16 or f16 blocks (raw patterns) under their table (blocks 0
// and 1 of it, or 2 and 3), as one packed byte per 32-bit lane. A
// magnitude's code is the number of the block's seven (non-decreasing)
// thresholds it reaches, found by a binary search: threshold 4, then m + 2,
// then m + 1.
[[gnu::always_inline]] inline __m512i HalfPairCodes(__m512i raw, __m512i table, bool second_pair) {
  // Lanes 0-15 look up their block's words of the table, lanes 16-31 the
  // next block's: blocks 0 and 1 of the table, or 2 and 3.
  const __m512i base = second_pair ? _mm512_inserti64x4(_mm512_set1_epi16(16), _mm256_set1_epi16(24), 1)
                                   : _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(8), 1);
  const __m512i one = _mm512_set1_epi16(1), two = _mm512_set1_epi16(2), four = _mm512_set1_epi16(4);
  const __m512i a = _mm512_and_si512(raw, _mm512_set1_epi16(0x7FFF));
  __m512i m = _mm512_maskz_mov_epi16(
      _mm512_cmpge_epu16_mask(a, _mm512_permutexvar_epi16(_mm512_add_epi16(base, four), table)), four);
  const __m512i t2 = _mm512_permutexvar_epi16(_mm512_add_epi16(_mm512_add_epi16(base, two), m), table);
  m = _mm512_mask_add_epi16(m, _mm512_cmpge_epu16_mask(a, t2), m, two);
  const __m512i t1 = _mm512_permutexvar_epi16(_mm512_add_epi16(_mm512_add_epi16(base, one), m), table);
  m = _mm512_mask_add_epi16(m, _mm512_cmpge_epu16_mask(a, t1), m, one);
  // m | (sign bit moved to bit 3): (raw >> 12) & 8.
  const __m512i codes = _mm512_ternarylogic_epi32(m, _mm512_srli_epi16(raw, 12), _mm512_set1_epi16(8), 0xF8);
  // Each 32-bit lane: its even element's code plus 16 times its odd one's.
  return _mm512_madd_epi16(codes, _mm512_set1_epi32(0x00100001));
}

// The packed bytes of 8 blocks from HalfPairCodes of blocks 0-1, 2-3, 4-5
// and 6-7 (one byte per 32-bit lane): two packs leave, in each 128-bit
// lane L, 4 bytes of each vector (its lanes 4L .. 4L + 3), which one
// permutation of 32-bit groups puts in order.
[[gnu::always_inline]] inline void StorePacked64(uint8_t* out, __m512i c0, __m512i c1, __m512i c2, __m512i c3) {
  const __m512i bytes = _mm512_packus_epi16(_mm512_packus_epi32(c0, c1), _mm512_packus_epi32(c2, c3));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_si512(out, _mm512_permutexvar_epi32(order, bytes));
}

// The packed codes of `count` bf16 or f16 blocks (at most 16) with their
// threshold tables, two blocks per vector.
[[gnu::always_inline]] inline void HalfCodes(const uint16_t* src, size_t count, const __m512i* tables,
                                             uint8_t* packed) {
  if (count == 16) {
#pragma GCC unroll 2
    for (size_t h = 0; h < 2; ++h) {
      __m512i c[4];
#pragma GCC unroll 4
      for (size_t j = 0; j < 4; ++j) {
        c[j] = HalfPairCodes(_mm512_loadu_si512(src + (8 * h + 2 * j) * kBlock), tables[2 * h + j / 2], j % 2 == 1);
      }
      StorePacked64(packed + 8 * h * kBlock / 2, c[0], c[1], c[2], c[3]);
    }
    return;
  }
  for (size_t j = 0; j < count; j += 2) {
    const bool pair = count - j >= 2;
    const __m512i raw = _mm512_maskz_loadu_epi16(pair ? ~__mmask32{0} : __mmask32{0xFFFF}, src + j * kBlock);
    const __m128i bytes = _mm512_cvtepi32_epi8(HalfPairCodes(raw, tables[j / 4], (j / 2) % 2 == 1));
    if (pair) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(packed + j * kBlock / 2), bytes);
    } else {
      _mm_storel_epi64(reinterpret_cast<__m128i*>(packed + j * kBlock / 2), bytes);
    }
  }
}

// The row scale from the block maxima's largest pattern in vmax (f32 bit
// patterns): false when that is Inf or NaN (a non-finite element).
[[gnu::always_inline]] inline bool RowScaleOf(__m512i vmax, float* scale) {
  const uint32_t amax = _mm512_reduce_max_epu32(vmax);
  if (amax >= 0x7F800000u) return false;
  float amax_f;
  std::memcpy(&amax_f, &amax, sizeof amax_f);
  *scale = RowScale(amax_f);
  return true;
}

// bf16 and f16 rows: block maxima and finiteness in one pass over the
// 16-bit patterns, then, up to 128 blocks at a time, the thresholds of each
// 16 (independent of each other, so that they overlap) and the codes.
template <Dtype kDt>
bool QuantizeRowHalf(const uint16_t* src, size_t n, uint8_t* packed, uint8_t* block_scales,
                     float* row_scale, float* scratch) {
  const size_t blocks = n / kBlock;
  __m512i vmax = _mm512_setzero_si512();
  for (size_t g = 0; g < blocks; g += 16) {
    const __m512i m = HalfBlockMaxima<kDt>(src + g * kBlock, blocks - g < 16 ? blocks - g : 16);
    _mm512_storeu_si512(scratch + g, m);
    vmax = _mm512_max_epu32(vmax, m);
  }
  float scale;
  if (!RowScaleOf(vmax, &scale)) return false;
  *row_scale = scale;
  alignas(64) __m512i tables[8][4];
  for (size_t c = 0; c < blocks; c += 128) {
    const size_t end = blocks - c < 128 ? blocks : c + 128;
    for (size_t g = c; g < end; g += 16) {
      HalfTables<kDt>(scratch + g, end - g < 16 ? end - g : 16, scale, block_scales + g, tables[(g - c) / 16]);
    }
    for (size_t g = c; g < end; g += 16) {
      // The same bytes of the next row (callers quantize rows in order),
      // while this one is in registers and L1: pass 1 then finds them in
      // cache. (A prefetch past the buffer's end is harmless.)
      for (size_t line = 0; line < 16 * kBlock * 2; line += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(src + n + g * kBlock) + line, _MM_HINT_T0);
      }
      HalfCodes(src + g * kBlock, end - g < 16 ? end - g : 16, tables[(g - c) / 16], packed + g * kBlock / 2);
    }
  }
  return true;
}

// f32 rows: block maxima in one pass, then thresholds and codes, one block
// per vector.
bool QuantizeRowF32(const float* src, size_t n, uint8_t* packed, uint8_t* block_scales,
                  float* row_scale, float* scratch) {
  // Pass 1, 16 blocks at a time: each block's largest magnitude (to
  // scratch), the row's, and finiteness (an Inf or NaN pattern is above
  // every finite one).
  const size_t blocks = n / kBlock;
  __m512i vmax = _mm512_setzero_si512();
  __m512i v[16];
  for (size_t g = 0; g < blocks; g += 16) {
    const size_t count = blocks - g < 16 ? blocks - g : 16;
#pragma GCC unroll 16
    for (size_t j = 0; j < 16; ++j) {
      v[j] = j < count ? _mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(src + (g + j) * kBlock)),
                                          _mm512_castps_si512(kAbsMask))
                       : _mm512_setzero_si512();
    }
    const __m512i m = BlockMaxima(v);
    _mm512_storeu_si512(scratch + g, m);
    vmax = _mm512_max_epu32(vmax, m);
  }
  float scale;
  if (!RowScaleOf(vmax, &scale)) return false;
  *row_scale = scale;
  // Pass 2, up to 128 blocks at a time: the scales and thresholds of each
  // 16 (independent of each other, so that they overlap), then the codes.
  alignas(64) float x[8][7][16];
  for (size_t c = 0; c < blocks; c += 128) {
    const size_t end = blocks - c < 128 ? blocks : c + 128;
    for (size_t g = c; g < end; g += 16) {
      __m512i t[7];
      BlockThresholds(scratch + g, end - g < 16 ? end - g : 16, scale, block_scales + g, t);
#pragma GCC unroll 7
      for (int i = 0; i < 7; ++i) _mm512_store_si512(x[(g - c) / 16][i], t[i]);
    }
    for (size_t g = c; g < end; g += 16) {
      const size_t count = end - g < 16 ? end - g : 16;
      const float(*t)[16] = x[(g - c) / 16];
      // The same bytes of the next row, as in QuantizeRowHalf.
      for (size_t line = 0; line < 16 * kBlock * sizeof(float); line += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(src + n + g * kBlock) + line, _MM_HINT_T0);
      }
      for (size_t j = 0; j < count; ++j) {
        StorePacked(packed + (g + j) * kBlock / 2, BlockCodes(_mm512_loadu_ps(src + (g + j) * kBlock), t, j));
      }
    }
  }
  return true;
}

bool QuantizeRowAvx512(Dtype src_dtype, const void* src, size_t n, uint8_t* packed,
                       uint8_t* block_scales, float* row_scale, float* scratch) {
  switch (src_dtype) {
    case Dtype::kBF16:
      return QuantizeRowHalf<Dtype::kBF16>(static_cast<const uint16_t*>(src), n, packed, block_scales, row_scale,
                                           scratch);
    case Dtype::kF16:
      return QuantizeRowHalf<Dtype::kF16>(static_cast<const uint16_t*>(src), n, packed, block_scales, row_scale,
                                          scratch);
    default:
      return QuantizeRowF32(static_cast<const float*>(src), n, packed, block_scales, row_scale, scratch);
  }
}

// Stores 16 f32 values as kDt, rounded to nearest even (spec/CODEC.md 5.1).
// clamp: +-Inf and values beyond the dtype's range become its +-max finite
// (needed only for rows whose scale is large, see DequantizeRowT).
template <Dtype kDt>
void Store16(void* dst, size_t i, __m512 v, bool clamp) {
  if constexpr (kDt == Dtype::kF32) {
    if (clamp) {
      const __m512 sign = _mm512_andnot_ps(kAbsMask, v);
      v = _mm512_or_ps(_mm512_min_ps(_mm512_and_ps(v, kAbsMask), _mm512_set1_ps(FLT_MAX)), sign);
    }
    _mm512_storeu_ps(static_cast<float*>(dst) + i, v);
  } else if constexpr (kDt == Dtype::kBF16) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i sign = _mm512_andnot_si512(_mm512_castps_si512(kAbsMask), bits);
    __m512i mag = _mm512_and_si512(bits, _mm512_castps_si512(kAbsMask));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(mag, 16), _mm512_set1_epi32(1));
    mag = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(mag, _mm512_set1_epi32(0x7FFF)), lsb), 16);
    if (clamp) mag = _mm512_min_epi32(mag, _mm512_set1_epi32(0x7F7F));
    const __m512i h = _mm512_or_si512(mag, _mm512_srli_epi32(sign, 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(dst) + i),
                        _mm512_cvtepi32_epi16(h));
  } else {
    if (clamp) {
      const __m512 sign = _mm512_andnot_ps(kAbsMask, v);
      v = _mm512_or_ps(_mm512_min_ps(_mm512_and_ps(v, kAbsMask), _mm512_set1_ps(65504.0f)), sign);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(dst) + i),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

template <Dtype kDt>
void DequantizeRowT(const uint8_t* packed, const uint8_t* block_scales, float row_scale, size_t n,
                    void* out) {
  const __m512 table = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f,
                                      -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
  // Every decoded magnitude is at most 6 * 448 * row_scale (rounded): below
  // a quarter of the dtype's largest value nothing needs clamping.
  const double top = 2688.0 * static_cast<double>(row_scale);
  const double limit = kDt == Dtype::kF16 ? 65504.0 : static_cast<double>(FLT_MAX);
  const bool clamp = top > limit / 4;
  const size_t blocks = n / kBlock;
  alignas(64) float divisor[16];
  const __m512 s = _mm512_set1_ps(row_scale);
  for (size_t g = 0; g < blocks; g += 16) {
    const size_t count = blocks - g < 16 ? blocks - g : 16;
    const __mmask16 k = static_cast<__mmask16>((1u << count) - 1u);
    const __m512i codes = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k, block_scales + g));
    _mm512_store_ps(divisor, _mm512_mul_ps(E4M3Values(codes), s));
    for (size_t j = 0; j < count; ++j) {
      const size_t b = g + j;
      uint64_t eight;
      std::memcpy(&eight, packed + b * kBlock / 2, 8);
      // Byte j -> 64-bit lane j; its high nibble moved to bits 32-35.
      const __m512i q = _mm512_cvtepu8_epi64(_mm_cvtsi64_si128(static_cast<long long>(eight)));
      const __m512i idx = _mm512_or_si512(_mm512_slli_epi64(_mm512_srli_epi64(q, 4), 32), q);
      const __m512 value = _mm512_permutexvar_ps(idx, table);
      // A zero code (low three bits 0) keeps its signed zero, also under a
      // divisor of +Inf (DecodeScaled): only the other lanes are multiplied.
      const __mmask16 nonzero = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(7));
      const __m512 v = _mm512_mask_mul_ps(value, nonzero, value, _mm512_set1_ps(divisor[j]));
      Store16<kDt>(out, b * kBlock, v, clamp);
    }
  }
}

void DequantizeRowAvx512(const uint8_t* packed, const uint8_t* block_scales, float row_scale,
                         size_t n, Dtype dst_dtype, void* out, float* /*scratch*/) {
  switch (dst_dtype) {
    case Dtype::kBF16:
      return DequantizeRowT<Dtype::kBF16>(packed, block_scales, row_scale, n, out);
    case Dtype::kF16:
      return DequantizeRowT<Dtype::kF16>(packed, block_scales, row_scale, n, out);
    default:
      return DequantizeRowT<Dtype::kF32>(packed, block_scales, row_scale, n, out);
  }
}

}  // namespace

const Kernels kAvx512Kernels = {QuantizeRowAvx512, DequantizeRowAvx512};

}  // namespace kvfile::codec::nvfp4::internal
