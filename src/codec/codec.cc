// SPDX-License-Identifier: Apache-2.0
// The fp8 codec: element conversions (the reference semantics of spec/CODEC.md),
// run-time ISA dispatch and the public block wrappers.
//
// The element conversions here are written for clarity, with integer rounding
// only; the vectorized kernels in codec_avx2.cc and codec_avx512.cc are tested
// against them bit for bit.

#include "kvfile/codec.h"

#include <cpuid.h>

#include <bit>
#include <cstdint>
#include <cstring>

#include "codec/codec_internal.h"

namespace kvfile::codec {
namespace {

using internal::Kernels;

// ---- Generic rounding of an f32 magnitude into a smaller binary format ----

// A binary floating-point format with an IEEE-style layout: sign, exponent
// field with the given bias, `mant_bits` fraction bits, subnormals when the
// exponent field is 0. `max_finite` is the magnitude bit pattern (exponent and
// fraction fields) of its largest finite value; results saturate there.
struct SmallFormat {
  uint32_t mant_bits;
  uint32_t bias;
  uint32_t max_finite;
};

constexpr SmallFormat kE4M3Format{3, 7, 0x7E};
constexpr SmallFormat kE5M2Format{2, 15, 0x7B};
constexpr SmallFormat kF16Format{10, 15, 0x7BFF};
constexpr SmallFormat kBf16Format{7, 127, 0x7F7F};

constexpr const SmallFormat& FormatOf(Dtype kind) {
  return kind == Dtype::kE4M3 ? kE4M3Format : kE5M2Format;
}

constexpr uint32_t kF32AbsMask = 0x7FFFFFFFu;
constexpr uint32_t kF32FracMask = 0x007FFFFFu;
constexpr uint32_t kF32ImplicitBit = 0x00800000u;
constexpr uint32_t kF32Bias = 127;
constexpr uint32_t kF32FracBits = 23;

// v / 2^s rounded to the nearest integer, ties to the even one. 1 <= s <= 31.
constexpr uint32_t ShiftRightRne(uint32_t v, uint32_t s) {
  const uint32_t quotient = v >> s;
  const uint32_t remainder = v & ((1u << s) - 1u);
  const uint32_t half = 1u << (s - 1u);
  // Round up above the half, and at exactly the half when that makes it even.
  // (Written without branches: on real data this decision is unpredictable.)
  const bool up = (remainder > half) | ((remainder == half) & ((quotient & 1u) != 0));
  return quotient + static_cast<uint32_t>(up);
}

// The magnitude bit pattern (exponent and fraction fields) in format `f`
// nearest to the f32 magnitude whose bits are `abs_bits` (finite or +Inf; not
// NaN), ties to even, saturated to f.max_finite.
constexpr uint32_t RoundMagnitude(uint32_t abs_bits, const SmallFormat& f) {
  const uint32_t exp = abs_bits >> kF32FracBits;
  // f32 biased exponent of the target's smallest normal number, 2^(1 - bias).
  const uint32_t min_normal_exp = kF32Bias + 1u - f.bias;
  uint32_t mag;
  if (exp >= min_normal_exp) {
    // Normal in the target. Dropping the low (23 - mant_bits) fraction bits of
    // the f32 pattern with rounding keeps exponent and fraction together, so a
    // rounding carry out of the fraction correctly bumps the exponent. Then
    // re-bias the exponent from 127 to the target's bias.
    mag =
        ShiftRightRne(abs_bits, kF32FracBits - f.mant_bits) - ((kF32Bias - f.bias) << f.mant_bits);
  } else {
    // Subnormal (or zero) in the target, whose step is 2^(1 - bias - mant_bits).
    // The f32 value is sig * 2^(e - 150), so value / step = sig * 2^-shift.
    const uint32_t e = exp == 0 ? 1u : exp;
    const uint32_t sig = (abs_bits & kF32FracMask) | (exp == 0 ? 0u : kF32ImplicitBit);
    const uint32_t shift = (kF32Bias + kF32FracBits + 1u) - f.bias - f.mant_bits - e;  // >= 1
    // sig < 2^24, so for shift >= 25 the quotient is below one half: zero.
    mag = shift >= 25u ? 0u : ShiftRightRne(sig, shift);
  }
  return mag < f.max_finite ? mag : f.max_finite;
}

// The f32 bit pattern of the finite magnitude `mag` of format `f` (exact).
// Only for formats whose subnormals are f32 normals (fp8, f16).
constexpr uint32_t ExpandMagnitude(uint32_t mag, const SmallFormat& f) {
  const uint32_t exp = mag >> f.mant_bits;
  const uint32_t frac = mag & ((1u << f.mant_bits) - 1u);
  if (exp != 0) {
    return ((exp + kF32Bias - f.bias) << kF32FracBits) | (frac << (kF32FracBits - f.mant_bits));
  }
  if (frac == 0) return 0;
  // frac * 2^(1 - bias - mant_bits) with frac's leading one at bit p.
  const uint32_t p = static_cast<uint32_t>(std::bit_width(frac)) - 1u;
  const uint32_t f32_exp = p + 1u + kF32Bias - f.bias - f.mant_bits;
  return (f32_exp << kF32FracBits) | ((frac - (1u << p)) << (kF32FracBits - p));
}

constexpr uint32_t kQuietNanBits = 0x7FC00000u;

// The value of every code of one fp8 kind, as f32 bit patterns.
struct DecodeTable {
  uint32_t bits[256];
};

constexpr DecodeTable MakeDecodeTable(Dtype kind) {
  DecodeTable t{};
  const SmallFormat& f = FormatOf(kind);
  for (uint32_t c = 0; c < 256; ++c) {
    const uint32_t sign = (c & 0x80u) << 24;
    const uint32_t mag = c & 0x7Fu;
    uint32_t bits;
    if (kind == Dtype::kE4M3 && mag == 0x7F) {
      bits = kQuietNanBits;  // e4m3 has no Inf; S.1111.111 is NaN
    } else if (kind == Dtype::kE5M2 && mag == 0x7C) {
      bits = internal::kF32InfBits;  // e5m2 S.11111.00 is Inf
    } else if (kind == Dtype::kE5M2 && mag > 0x7C) {
      bits = kQuietNanBits;  // e5m2 S.11111.mm (mm != 0) is NaN
    } else {
      bits = ExpandMagnitude(mag, f);
    }
    t.bits[c] = sign | bits;
  }
  return t;
}

constexpr DecodeTable kE4M3Table = MakeDecodeTable(Dtype::kE4M3);
constexpr DecodeTable kE5M2Table = MakeDecodeTable(Dtype::kE5M2);

static_assert(kE4M3Table.bits[0x7E] == 0x43E00000u);  // 448
static_assert(kE5M2Table.bits[0x7B] == 0x47600000u);  // 57344
static_assert(kE4M3Table.bits[0x01] == 0x3B000000u);  // 2^-9
static_assert(kE5M2Table.bits[0x01] == 0x37800000u);  // 2^-16
static_assert(RoundMagnitude(0x43E00000u, kE4M3Format) == 0x7E);
static_assert(RoundMagnitude(0x47800000u, kE5M2Format) == 0x7B);
static_assert(RoundMagnitude(0x3A800000u, kE4M3Format) == 0x00);  // 2^-10: tie to even 0
static_assert(RoundMagnitude(0x3AC00000u, kE4M3Format) == 0x01);  // 1.5 * 2^-10 rounds up

// ---- ISA dispatch ----

// F16C is CPUID leaf 1, ECX bit 29. Asked directly: clang (14) does not
// know "f16c" in __builtin_cpu_supports.
bool CpuHasF16c() {
  unsigned eax, ebx, ecx, edx;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

bool DetectAvx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && CpuHasF16c();
}

bool DetectAvx512() {
  return DetectAvx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

Isa DetectBestIsa() {
  // Normally done by a libgcc constructor; explicit in case the first codec
  // call comes from another static initializer that runs before it.
  __builtin_cpu_init();
  if (DetectAvx512()) return Isa::kAvx512;
  if (DetectAvx2()) return Isa::kAvx2;
  return Isa::kScalar;
}

bool IsRawDtype(Dtype d) { return d == Dtype::kBF16 || d == Dtype::kF16 || d == Dtype::kF32; }

// EncodeElement for one kind known at compile time (the shifts and constants
// of RoundMagnitude then fold).
template <Dtype kKind>
uint8_t EncodeAs(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t abs_bits = bits & kF32AbsMask;
  if (abs_bits > internal::kF32InfBits) return internal::kNanCode;
  const uint32_t sign = (bits >> 24) & 0x80u;
  return static_cast<uint8_t>(sign | RoundMagnitude(abs_bits, FormatOf(kKind)));
}

}  // namespace

// ---- internal ----

namespace internal {

Isa ResolveIsa(Isa isa) {
  static const Isa best = DetectBestIsa();
  if (isa == Isa::kBest) return best;
  // Nested sets: scalar < avx2 < avx512. Fall back to the widest one below.
  return static_cast<uint8_t>(isa) <= static_cast<uint8_t>(best) ? isa : best;
}

const Kernels& KernelsFor(Isa isa) {
  switch (ResolveIsa(isa)) {
    case Isa::kAvx512:
      return kAvx512Kernels;
    case Isa::kAvx2:
      return kAvx2Kernels;
    default:
      return kScalarKernels;
  }
}

void EncodeScaledReference(Dtype kind, const float* x, size_t n, uint8_t* codes) {
  if (kind == Dtype::kE4M3) {
    for (size_t i = 0; i < n; ++i) codes[i] = EncodeAs<Dtype::kE4M3>(x[i]);
  } else {
    for (size_t i = 0; i < n; ++i) codes[i] = EncodeAs<Dtype::kE5M2>(x[i]);
  }
}

}  // namespace internal

// ---- Public API ----

Isa BestIsa() { return internal::ResolveIsa(Isa::kBest); }

bool IsaSupported(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
    case Isa::kBest:
      return true;
    case Isa::kAvx2:
    case Isa::kAvx512:
      return internal::ResolveIsa(isa) == isa;
  }
  return false;
}

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kBest:
      return IsaName(BestIsa());
  }
  return "unknown";
}

float Fp8MaxFinite(Dtype kind) {
  return kind == Dtype::kE4M3 ? internal::kE4M3Max : internal::kE5M2Max;
}

uint8_t EncodeElement(float x, Dtype kind) {
  return kind == Dtype::kE4M3 ? EncodeAs<Dtype::kE4M3>(x) : EncodeAs<Dtype::kE5M2>(x);
}

float DecodeElement(uint8_t code, Dtype kind) {
  const DecodeTable& t = kind == Dtype::kE4M3 ? kE4M3Table : kE5M2Table;
  return std::bit_cast<float>(t.bits[code]);
}

bool IsNonFiniteCode(uint8_t code, Dtype kind) {
  const uint8_t mag = code & 0x7F;
  return kind == Dtype::kE4M3 ? mag == 0x7F : mag >= 0x7C;
}

uint16_t F32ToBf16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t abs_bits = bits & kF32AbsMask;
  if (abs_bits > internal::kF32InfBits) {
    // NaN: keep sign and the top of the payload, set the quiet bit.
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  const uint32_t sign = (bits >> 16) & 0x8000u;
  return static_cast<uint16_t>(sign | RoundMagnitude(abs_bits, kBf16Format));
}

uint16_t F32ToF16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t abs_bits = bits & kF32AbsMask;
  const uint32_t sign = (bits >> 16) & 0x8000u;
  if (abs_bits > internal::kF32InfBits) {
    // NaN: keep sign and the top 10 payload bits, set the quiet bit.
    return static_cast<uint16_t>(sign | 0x7E00u | ((abs_bits >> 13) & 0x03FFu));
  }
  return static_cast<uint16_t>(sign | RoundMagnitude(abs_bits, kF16Format));
}

float Bf16ToF32(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

float F16ToF32(uint16_t bits) {
  const uint32_t sign = (static_cast<uint32_t>(bits) & 0x8000u) << 16;
  const uint32_t mag = bits & 0x7FFFu;
  uint32_t out;
  if (mag >= 0x7C00u) {
    const uint32_t frac = mag & 0x03FFu;
    // Inf stays Inf; a NaN becomes the quiet NaN with the same top payload.
    out = frac == 0 ? internal::kF32InfBits : (internal::kF32InfBits | 0x00400000u | (frac << 13));
  } else {
    out = ExpandMagnitude(mag, kF16Format);
  }
  return std::bit_cast<float>(sign | out);
}

bool QuantizeRows(Dtype kind, Dtype src_dtype, const void* src, size_t rows, size_t width,
                  uint8_t* codes, float* scales, size_t* bad_row, Isa isa) {
  if (!IsRawDtype(src_dtype)) {
    if (bad_row != nullptr) *bad_row = rows;  // not a row problem: a bad call
    return false;
  }
  size_t bad = 0;
  const bool ok = internal::KernelsFor(isa).quantize_rows(kind, src_dtype, src, rows, width, codes,
                                                          scales, &bad);
  if (!ok && bad_row != nullptr) *bad_row = bad;
  return ok;
}

void DequantizeRows(Dtype kind, const uint8_t* codes, const float* scales, size_t rows,
                    size_t width, Dtype dst_dtype, void* dst, Isa isa) {
  if (!IsRawDtype(dst_dtype)) return;
  internal::KernelsFor(isa).dequantize_rows(kind, codes, scales, rows, width, dst_dtype, dst);
}

size_t FindInvalidCode(Dtype kind, const uint8_t* codes, size_t n, Isa isa) {
  return internal::KernelsFor(isa).find_invalid_code(kind, codes, n);
}

size_t FindInvalidScale(const float* scales, size_t n) {
  // Valid: a positive normal finite f32, bit patterns 0x00800000..0x7F7FFFFF.
  // This refuses NaN, +-Inf, zeros of either sign, negatives and subnormals.
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, scales + i, sizeof bits);
    if (bits - 0x00800000u >= 0x7F000000u) return i;
  }
  return n;
}

void ConvertRaw(Dtype src_dtype, const void* src, size_t n, Dtype dst_dtype, void* dst) {
  if (!IsRawDtype(src_dtype) || !IsRawDtype(dst_dtype) || n == 0) return;
  if (src_dtype == dst_dtype) {
    std::memmove(dst, src, n * ElementSize(src_dtype));
    return;
  }
  internal::KernelsFor(Isa::kBest).convert_raw(src_dtype, src, n, dst_dtype, dst);
}

size_t FindNonFinite(Dtype dtype, const void* src, size_t n) {
  if (!IsRawDtype(dtype)) return n;
  return internal::KernelsFor(Isa::kBest).find_non_finite(dtype, src, n);
}

}  // namespace kvfile::codec
