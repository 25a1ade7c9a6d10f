// SPDX-License-Identifier: Apache-2.0
// Unit tests of the fp8 codec (spec/CODEC.md): element tables against the
// independent reference vectors in tests/vectors/, the row rule, and bit
// identity of every vectorized path with the scalar reference.
//
// The heavy sweeps (every finite f32, 10^8 random elements) live in
// codec_exhaustive_test.cc (CTest label `long`).

#include "kvfile/codec.h"

#include <gtest/gtest.h>
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "codec/codec_internal.h"

namespace kvfile::codec {
namespace {

using internal::Kernels;

constexpr Dtype kKinds[] = {Dtype::kE4M3, Dtype::kE5M2};
constexpr Dtype kRawDtypes[] = {Dtype::kBF16, Dtype::kF16, Dtype::kF32};
constexpr Isa kVectorIsas[] = {Isa::kAvx2, Isa::kAvx512};

const char* KindName(Dtype k) { return k == Dtype::kE4M3 ? "e4m3" : "e5m2"; }
const char* DtName(Dtype d) {
  return d == Dtype::kBF16 ? "bf16" : d == Dtype::kF16 ? "f16" : d == Dtype::kF32 ? "f32" : "?";
}
size_t Esize(Dtype d) { return d == Dtype::kF32 ? 4 : 2; }

uint32_t Bits(float x) { return std::bit_cast<uint32_t>(x); }
float FromBits(uint32_t b) { return std::bit_cast<float>(b); }

std::vector<uint8_t> ReadVector(const std::string& name) {
  const std::string path = std::string(KVFILE_TEST_DATA "/vectors/").append(name);
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::vector<float> ReadF32(const std::string& name) {
  const std::vector<uint8_t> raw = ReadVector(name);
  std::vector<float> v(raw.size() / 4);
  std::memcpy(v.data(), raw.data(), v.size() * 4);
  return v;
}

// ---- Parameterized over the vector ISAs ----

class IsaTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!IsaSupported(GetParam())) {
      GTEST_SKIP() << IsaName(GetParam())
                   << " is not supported on this CPU; its path is not tested";
    }
  }
  const Kernels& K() const { return internal::KernelsFor(GetParam()); }
  static const Kernels& Ref() { return internal::kScalarKernels; }
};

std::string IsaParamName(const ::testing::TestParamInfo<Isa>& info) { return IsaName(info.param); }

INSTANTIATE_TEST_SUITE_P(AllIsas, IsaTest,
                         ::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512), IsaParamName);

// Vector-only tests (comparing with the scalar reference).
class VectorIsaTest : public IsaTest {};
INSTANTIATE_TEST_SUITE_P(Vector, VectorIsaTest, ::testing::ValuesIn(kVectorIsas), IsaParamName);

// ---- Raw buffers with deliberate misalignment ----

// A byte buffer whose data() starts `offset` bytes past a 64-byte boundary.
class Buffer {
 public:
  Buffer(size_t bytes, size_t offset) : storage_(bytes + offset + 64), offset_(offset) {
    const auto base = reinterpret_cast<uintptr_t>(storage_.data());
    start_ = ((base + 63) & ~uintptr_t{63}) - base + offset_;
  }
  unsigned char* data() { return storage_.data() + start_; }
  const unsigned char* data() const { return storage_.data() + start_; }

 private:
  std::vector<unsigned char> storage_;
  size_t offset_;
  size_t start_ = 0;
};

// Raw elements of a dtype built from f32 values (bf16/f16 by RNE conversion).
std::vector<unsigned char> ToRaw(Dtype dt, const std::vector<float>& x) {
  std::vector<unsigned char> out(x.size() * Esize(dt));
  for (size_t i = 0; i < x.size(); ++i) {
    if (dt == Dtype::kF32) {
      std::memcpy(&out[i * 4], &x[i], 4);
    } else {
      const uint16_t h = dt == Dtype::kBF16 ? F32ToBf16(x[i]) : F32ToF16(x[i]);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

std::vector<unsigned char> U16ToRaw(const std::vector<uint16_t>& v) {
  std::vector<unsigned char> out(v.size() * 2);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

struct QuantResult {
  bool ok = false;
  size_t bad_row = 0;
  std::vector<uint8_t> codes;
  std::vector<uint32_t> scale_bits;
};

// Quantizes with one kernel set, from a copy of `src` placed `offset` bytes
// past an alignment boundary, codes likewise.
QuantResult Quantize(const Kernels& k, Dtype kind, Dtype dt,
                     const std::vector<unsigned char>& src, size_t rows, size_t width,
                     size_t offset = 0) {
  Buffer in(src.size(), offset);
  if (!src.empty()) std::memcpy(in.data(), src.data(), src.size());
  Buffer codes(rows * width, offset);
  std::memset(codes.data(), 0xAA, rows * width);
  std::vector<float> scales(rows, -1.0f);
  QuantResult r;
  r.bad_row = ~size_t{0};
  r.ok = k.quantize_rows(kind, dt, in.data(), rows, width, codes.data(), scales.data(), &r.bad_row);
  r.codes.assign(codes.data(), codes.data() + rows * width);
  for (float s : scales) r.scale_bits.push_back(Bits(s));
  return r;
}

// Expects bit-identical quantization by `k` and the scalar reference.
void ExpectSameQuantize(const Kernels& k, Dtype kind, Dtype dt,
                        const std::vector<unsigned char>& src, size_t rows, size_t width,
                        const std::string& what, size_t offset = 0) {
  const QuantResult ref = Quantize(internal::kScalarKernels, kind, dt, src, rows, width);
  const QuantResult got = Quantize(k, kind, dt, src, rows, width, offset);
  const std::string ctx = what + " " + KindName(kind) + " from " + DtName(dt) +
                          " rows=" + std::to_string(rows) + " width=" + std::to_string(width);
  ASSERT_EQ(ref.ok, got.ok) << ctx;
  if (!ref.ok) {
    EXPECT_EQ(ref.bad_row, got.bad_row) << ctx;
    return;
  }
  for (size_t r = 0; r < rows; ++r) {
    ASSERT_EQ(ref.scale_bits[r], got.scale_bits[r]) << ctx << " scale of row " << r;
  }
  for (size_t i = 0; i < ref.codes.size(); ++i) {
    ASSERT_EQ(ref.codes[i], got.codes[i])
        << ctx << " element " << i << " (row " << i / width << ")";
  }
}

// ===========================================================================
// 1. Element conversions against the reference tables
// ===========================================================================

TEST(ElementTables, EncodeEveryBf16Pattern) {
  for (Dtype kind : kKinds) {
    const std::vector<uint8_t> want = ReadVector(std::string(KindName(kind)) + "_from_bf16.bin");
    ASSERT_EQ(want.size(), 65536u);
    for (uint32_t h = 0; h < 65536; ++h) {
      ASSERT_EQ(EncodeElement(FromBits(h << 16), kind), want[h])
          << KindName(kind) << " bf16 0x" << std::hex << h;
    }
  }
}

TEST(ElementTables, EncodeEveryF16Pattern) {
  for (Dtype kind : kKinds) {
    const std::vector<uint8_t> want = ReadVector(std::string(KindName(kind)) + "_from_f16.bin");
    ASSERT_EQ(want.size(), 65536u);
    for (uint32_t h = 0; h < 65536; ++h) {
      ASSERT_EQ(EncodeElement(F16ToF32(static_cast<uint16_t>(h)), kind), want[h])
          << KindName(kind) << " f16 0x" << std::hex << h;
    }
  }
}

TEST(ElementTables, DecodeEveryCode) {
  for (Dtype kind : kKinds) {
    const std::vector<float> want = ReadF32(std::string(KindName(kind)) + "_to_f32.bin");
    ASSERT_EQ(want.size(), 256u);
    for (uint32_t c = 0; c < 256; ++c) {
      const float got = DecodeElement(static_cast<uint8_t>(c), kind);
      if (std::isnan(want[c])) {
        EXPECT_TRUE(std::isnan(got)) << KindName(kind) << " code 0x" << std::hex << c;
      } else {
        EXPECT_EQ(Bits(got), Bits(want[c])) << KindName(kind) << " code 0x" << std::hex << c;
      }
      // The invalid codes are exactly the non-finite ones.
      EXPECT_EQ(IsNonFiniteCode(static_cast<uint8_t>(c), kind), !std::isfinite(want[c]))
          << KindName(kind) << " code 0x" << std::hex << c;
    }
  }
}

TEST(ElementTables, InvalidCodeSets) {
  for (uint32_t c = 0; c < 256; ++c) {
    const auto u = static_cast<uint8_t>(c);
    EXPECT_EQ(IsNonFiniteCode(u, Dtype::kE4M3), c == 0x7F || c == 0xFF);
    EXPECT_EQ(IsNonFiniteCode(u, Dtype::kE5M2), (c & 0x7F) >= 0x7C);
  }
}

TEST(ElementTables, Constants) {
  EXPECT_EQ(Fp8MaxFinite(Dtype::kE4M3), 448.0f);
  EXPECT_EQ(Fp8MaxFinite(Dtype::kE5M2), 57344.0f);
  EXPECT_EQ(DecodeElement(0x7E, Dtype::kE4M3), 448.0f);
  EXPECT_EQ(DecodeElement(0x7B, Dtype::kE5M2), 57344.0f);
  EXPECT_EQ(DecodeElement(0x01, Dtype::kE4M3), std::ldexp(1.0f, -9));
  EXPECT_EQ(DecodeElement(0x01, Dtype::kE5M2), std::ldexp(1.0f, -16));
  EXPECT_EQ(DecodeElement(0x08, Dtype::kE4M3), std::ldexp(1.0f, -6));
  EXPECT_EQ(DecodeElement(0x04, Dtype::kE5M2), std::ldexp(1.0f, -14));
  EXPECT_EQ(DecodeElement(0x7C, Dtype::kE5M2), INFINITY);
  EXPECT_EQ(DecodeElement(0xFC, Dtype::kE5M2), -INFINITY);
  EXPECT_EQ(Bits(DecodeElement(0x80, Dtype::kE4M3)), 0x80000000u);
}

// An independent check of round-to-nearest-even: every finite code decodes
// and re-encodes to itself; the exact midpoint between two neighbours goes to
// the one with an even mantissa, and one f32 ulp either side of it goes to
// the nearer one.
TEST(ElementRounding, MidpointsAndNeighbours) {
  for (Dtype kind : kKinds) {
    const uint8_t max_code = kind == Dtype::kE4M3 ? 0x7E : 0x7B;
    for (uint32_t sign : {0u, 0x80u}) {
      for (uint32_t c = 0; c <= max_code; ++c) {
        const auto code = static_cast<uint8_t>(sign | c);
        const float v = DecodeElement(code, kind);
        ASSERT_EQ(EncodeElement(v, kind), code) << KindName(kind) << " code " << c;
        if (c == max_code) continue;
        const auto next = static_cast<uint8_t>(sign | (c + 1));
        const float w = DecodeElement(next, kind);
        const float mid = (v + w) / 2;  // exact: both have few significant bits
        const uint8_t even = (c & 1) == 0 ? code : next;
        EXPECT_EQ(EncodeElement(mid, kind), even) << KindName(kind) << " midpoint above " << c;
        EXPECT_EQ(EncodeElement(std::nextafter(mid, v), kind), code);
        EXPECT_EQ(EncodeElement(std::nextafter(mid, w), kind), next);
      }
    }
  }
}

TEST(ElementRounding, SaturationNanAndZeros) {
  for (Dtype kind : kKinds) {
    const uint8_t max_code = kind == Dtype::kE4M3 ? 0x7E : 0x7B;
    const float m = Fp8MaxFinite(kind);
    EXPECT_EQ(EncodeElement(m * 2, kind), max_code);
    EXPECT_EQ(EncodeElement(-m * 2, kind), max_code | 0x80);
    EXPECT_EQ(EncodeElement(INFINITY, kind), max_code);
    EXPECT_EQ(EncodeElement(-INFINITY, kind), max_code | 0x80);
    EXPECT_EQ(EncodeElement(FromBits(0x7F7FFFFF), kind), max_code);
    EXPECT_EQ(EncodeElement(NAN, kind), 0x7F);
    EXPECT_EQ(EncodeElement(-NAN, kind), 0x7F);
    EXPECT_EQ(EncodeElement(FromBits(0x7F800001), kind), 0x7F);  // signalling NaN
    EXPECT_EQ(EncodeElement(0.0f, kind), 0x00);
    EXPECT_EQ(EncodeElement(-0.0f, kind), 0x80);
    EXPECT_EQ(EncodeElement(FromBits(1), kind), 0x00);           // smallest f32 subnormal
    EXPECT_EQ(EncodeElement(FromBits(0x80000001), kind), 0x80);  // keeps its sign
  }
  // Between the largest finite and the next (missing) binade step, RNE would
  // reach 480 (e4m3); saturation keeps it at 448.
  EXPECT_EQ(EncodeElement(464.0f, Dtype::kE4M3), 0x7E);
  EXPECT_EQ(EncodeElement(465.0f, Dtype::kE4M3), 0x7E);
  EXPECT_EQ(EncodeElement(61440.0f, Dtype::kE5M2), 0x7B);
  // Subnormal ties (e4m3 step 2^-9): 0.5 step -> 0, 1.5 steps -> 2, 2.5 -> 2.
  EXPECT_EQ(EncodeElement(std::ldexp(0.5f, -9), Dtype::kE4M3), 0x00);
  EXPECT_EQ(EncodeElement(std::ldexp(1.5f, -9), Dtype::kE4M3), 0x02);
  EXPECT_EQ(EncodeElement(std::ldexp(2.5f, -9), Dtype::kE4M3), 0x02);
  EXPECT_EQ(EncodeElement(std::ldexp(7.5f, -9), Dtype::kE4M3), 0x08);  // into the normals
}

// ---- bf16 / f16 conversions ----

// Exact value of an f16 pattern computed independently in double.
double F16Value(uint16_t h) {
  const int e = (h >> 10) & 0x1F;
  const int m = h & 0x3FF;
  const double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}

TEST(RawConversions, WideningIsExact) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto u = static_cast<uint16_t>(h);
    EXPECT_EQ(Bits(Bf16ToF32(u)), h << 16);
    const float f = F16ToF32(u);
    if ((h & 0x7C00) == 0x7C00) {
      if ((h & 0x3FF) == 0) {
        EXPECT_TRUE(std::isinf(f));
      } else {
        EXPECT_TRUE(std::isnan(f));
      }
      EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0);
    } else {
      ASSERT_EQ(static_cast<double>(f), F16Value(u)) << std::hex << h;
      EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0);
    }
  }
}

TEST(RawConversions, NarrowingRoundTripsEveryFinitePattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto u = static_cast<uint16_t>(h);
    if ((h & 0x7F80) != 0x7F80) {
      EXPECT_EQ(F32ToBf16(Bf16ToF32(u)), u) << std::hex << h;
    }
    if ((h & 0x7C00) != 0x7C00) {
      EXPECT_EQ(F32ToF16(F16ToF32(u)), u) << std::hex << h;
    }
  }
}

// For random finite f32 values, the result is the nearest representable value
// (ties to even), or +-max finite beyond the range.
TEST(RawConversions, NarrowingIsNearestEven) {
  std::mt19937_64 rng(7);
  for (int t = 0; t < 400000; ++t) {
    uint32_t b = static_cast<uint32_t>(rng());
    if ((b & 0x7F800000u) == 0x7F800000u) continue;
    if (t % 4 == 0) b &= 0xFFFF8000u | (static_cast<uint32_t>(rng()) & 0x1u) << 15;  // near ties
    const float x = FromBits(b);
    // bf16
    {
      const uint16_t y = F32ToBf16(x);
      const double yv = Bf16ToF32(y);
      ASSERT_TRUE(std::isfinite(yv));
      ASSERT_EQ(std::signbit(yv), std::signbit(x));
      const uint16_t mag = y & 0x7FFF;
      for (int d : {-1, 1}) {
        const int nm = mag + d;
        if (nm < 0 || nm > 0x7F7F) continue;
        const double other = Bf16ToF32(static_cast<uint16_t>((y & 0x8000) | nm));
        const double e0 = std::fabs(yv - x), e1 = std::fabs(other - x);
        ASSERT_TRUE(e0 < e1 || (e0 == e1 && (mag & 1) == 0) || (mag == 0x7F7F && d == 1))
            << std::hex << b << " -> " << y;
      }
    }
    // f16
    {
      const uint16_t y = F32ToF16(x);
      const double yv = F16ToF32(y);
      ASSERT_TRUE(std::isfinite(yv));
      ASSERT_EQ(std::signbit(yv), std::signbit(x));
      const uint16_t mag = y & 0x7FFF;
      if (mag == 0x7BFF) {
        EXPECT_GE(std::fabs(x), 65504.0f - 16.0f);
      }
      if (std::fabs(x) >= 65536.0f) {
        ASSERT_EQ(mag, 0x7BFF);  // too far out for the double comparison below
        continue;
      }
      for (int d : {-1, 1}) {
        const int nm = mag + d;
        if (nm < 0 || nm > 0x7BFF) continue;
        const double other = F16ToF32(static_cast<uint16_t>((y & 0x8000) | nm));
        const double e0 = std::fabs(yv - x), e1 = std::fabs(other - x);
        ASSERT_TRUE(e0 < e1 || (e0 == e1 && (mag & 1) == 0)) << std::hex << b << " -> " << y;
      }
    }
  }
}

TEST(RawConversions, ClampingAndSpecials) {
  EXPECT_EQ(F32ToBf16(FromBits(0x7F7FFFFF)), 0x7F7F);
  EXPECT_EQ(F32ToBf16(FromBits(0x7F7F8000)), 0x7F7F);  // a tie that would round to Inf
  EXPECT_EQ(F32ToBf16(-FromBits(0x7F7F8000)), 0xFF7F);
  EXPECT_EQ(F32ToBf16(INFINITY), 0x7F7F);
  EXPECT_EQ(F32ToBf16(-0.0f), 0x8000);
  EXPECT_EQ(F32ToBf16(FromBits(0x00008000)), 0x0000);  // subnormal tie to even
  EXPECT_EQ(F32ToBf16(FromBits(0x00018000)), 0x0002);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7BFF);
  EXPECT_EQ(F32ToF16(65519.99f), 0x7BFF);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7BFF);  // would be Inf under plain RNE
  EXPECT_EQ(F32ToF16(1e30f), 0x7BFF);
  EXPECT_EQ(F32ToF16(-INFINITY), 0xFBFF);
  EXPECT_EQ(F32ToF16(-0.0f), 0x8000);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even
  EXPECT_EQ(F32ToF16(std::ldexp(3.0f, -26)), 0x0001);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -14)), 0x0400);
  // NaN stays NaN.
  EXPECT_EQ(F32ToBf16(NAN) & 0x7FC0, 0x7FC0);
  EXPECT_EQ(F32ToF16(NAN) & 0x7E00, 0x7E00);
  EXPECT_EQ(F32ToBf16(FromBits(0x7F800001)) & 0x7FFF, 0x7FC0);  // quieted
  EXPECT_TRUE(std::isnan(F16ToF32(0x7C01)));
}

// The F16C instructions are an independent implementation of f32 <-> f16
// (RNE, no clamping): F32ToF16 must equal them wherever no clamping happens
// (|x| < 65520, and NaN), and F16ToF32 everywhere.
__attribute__((target("f16c"))) uint16_t HwF32ToF16(float x) {
  return static_cast<uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float HwF16ToF32(uint16_t h) { return _cvtsh_ss(h); }

TEST(RawConversions, F16MatchesF16cInstructions) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "no F16C on this CPU";
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto u = static_cast<uint16_t>(h);
    ASSERT_EQ(Bits(F16ToF32(u)), Bits(HwF16ToF32(u))) << std::hex << h;
  }
  std::mt19937_64 rng(17);
  std::vector<uint32_t> xs;
  for (uint32_t h = 0; h < 65536; ++h) xs.push_back(h << 16);
  for (int i = 0; i < 1000000; ++i) xs.push_back(static_cast<uint32_t>(rng()));
  for (int i = 0; i < 1000000; ++i) {  // dense in and around the f16 range
    xs.push_back((static_cast<uint32_t>(rng()) & 0x807FFFFFu) |
                 ((96u + static_cast<uint32_t>(rng() % 48)) << 23));
  }
  for (uint32_t b : xs) {
    const float x = FromBits(b);
    const uint16_t got = F32ToF16(x);
    if (std::isnan(x) || std::fabs(x) < 65520.0f) {
      ASSERT_EQ(got, HwF32ToF16(x)) << std::hex << b;
    } else {
      ASSERT_EQ(got, (b >> 31) ? 0xFBFF : 0x7BFF) << std::hex << b;
    }
  }
}

// ===========================================================================
// 2. Reference rows, every ISA
// ===========================================================================

TEST_P(IsaTest, ReferenceRows) {
  const std::vector<uint8_t> src = ReadVector("rows_bf16.bin");
  ASSERT_EQ(src.size(), 4096u * 128 * 2);
  for (Dtype kind : kKinds) {
    const std::string k = KindName(kind);
    const std::vector<uint8_t> want_codes = ReadVector("rows_" + k + "_codes.bin");
    const std::vector<float> want_scales = ReadF32("rows_" + k + "_scales.bin");
    ASSERT_EQ(want_codes.size(), 4096u * 128);
    ASSERT_EQ(want_scales.size(), 4096u);
    std::vector<uint8_t> codes(4096 * 128);
    std::vector<float> scales(4096);
    size_t bad = 0;
    ASSERT_TRUE(QuantizeRows(kind, Dtype::kBF16, src.data(), 4096, 128, codes.data(), scales.data(),
                             &bad, GetParam()));
    for (size_t r = 0; r < 4096; ++r) {
      ASSERT_EQ(Bits(scales[r]), Bits(want_scales[r])) << k << " scale of row " << r;
    }
    for (size_t i = 0; i < codes.size(); ++i) {
      ASSERT_EQ(codes[i], want_codes[i]) << k << " row " << i / 128 << " col " << i % 128;
    }
    // The same rows, converted exactly to f32, give the same bytes.
    std::vector<float> f32(4096 * 128);
    ConvertRaw(Dtype::kBF16, src.data(), f32.size(), Dtype::kF32, f32.data());
    std::vector<uint8_t> codes2(codes.size());
    std::vector<float> scales2(4096);
    ASSERT_TRUE(QuantizeRows(kind, Dtype::kF32, f32.data(), 4096, 128, codes2.data(),
                             scales2.data(), &bad, GetParam()));
    EXPECT_EQ(codes2, want_codes);
    EXPECT_EQ(0, std::memcmp(scales2.data(), want_scales.data(), 4096 * 4));
  }
}

// ===========================================================================
// 3. Vector paths == scalar reference, bit for bit
// ===========================================================================

TEST_P(VectorIsaTest, EncodeScaledEveryBf16AndF16Pattern) {
  std::vector<float> x(2 * 65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    x[h] = FromBits(h << 16);
    x[65536 + h] = F16ToF32(static_cast<uint16_t>(h));
  }
  for (Dtype kind : kKinds) {
    const std::vector<uint8_t> want_bf16 =
        ReadVector(std::string(KindName(kind)) + "_from_bf16.bin");
    const std::vector<uint8_t> want_f16 = ReadVector(std::string(KindName(kind)) + "_from_f16.bin");
    std::vector<uint8_t> got(x.size());
    K().encode_scaled(kind, x.data(), x.size(), got.data());
    for (uint32_t h = 0; h < 65536; ++h) {
      ASSERT_EQ(got[h], want_bf16[h]) << KindName(kind) << " bf16 0x" << std::hex << h;
      ASSERT_EQ(got[65536 + h], want_f16[h]) << KindName(kind) << " f16 0x" << std::hex << h;
    }
    // Every length and start offset of the tails.
    for (size_t n = 0; n < 80; ++n) {
      for (size_t off = 0; off < 4; ++off) {
        std::vector<uint8_t> part(n + 1, 0xAA);
        K().encode_scaled(kind, x.data() + 0x3F00 + off * 7, n, part.data());
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(part[i], want_bf16[0x3F00 + off * 7 + i]);
        ASSERT_EQ(part[n], 0xAA) << "wrote past the end, n=" << n;
      }
    }
  }
}

// Every finite 16-bit pattern of a dtype, shuffled into rows of several widths,
// plus rows mixing them with large values so that the scales vary.
std::vector<uint16_t> FinitePatterns(Dtype dt) {
  std::vector<uint16_t> v;
  const uint16_t exp_mask = dt == Dtype::kBF16 ? 0x7F80 : 0x7C00;
  for (uint32_t h = 0; h < 65536; ++h) {
    if ((h & exp_mask) != exp_mask) v.push_back(static_cast<uint16_t>(h));
  }
  return v;
}

TEST_P(VectorIsaTest, QuantizeEvery16BitPattern) {
  for (Dtype dt : {Dtype::kBF16, Dtype::kF16}) {
    const std::vector<uint16_t> ordered = FinitePatterns(dt);
    std::vector<uint16_t> shuffled = ordered;
    std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937_64(11));
    for (Dtype kind : kKinds) {
      // In order: rows of neighbouring patterns, so every row has its own
      // binade and each pattern is quantized against a nearby amax.
      for (size_t width : {128u, 37u, 1u}) {
        const size_t rows = ordered.size() / width;
        std::vector<uint16_t> v(ordered.begin(), ordered.begin() + static_cast<long>(rows * width));
        ExpectSameQuantize(K(), kind, dt, U16ToRaw(v), rows, width, "ordered patterns");
      }
      // Shuffled, width 100, unaligned.
      const size_t rows = shuffled.size() / 100;
      std::vector<uint16_t> v(shuffled.begin(), shuffled.begin() + static_cast<long>(rows * 100));
      ExpectSameQuantize(K(), kind, dt, U16ToRaw(v), rows, 100, "shuffled patterns", 1);
      // Each pattern next to a large value: every pattern also quantized
      // against big scales (codes near zero, subnormal codes).
      std::vector<uint16_t> mixed;
      const uint16_t bigs[] = {static_cast<uint16_t>(dt == Dtype::kBF16 ? 0x7F7F : 0x7BFF),
                               static_cast<uint16_t>(dt == Dtype::kBF16 ? 0x4780 : 0x5800),
                               static_cast<uint16_t>(dt == Dtype::kBF16 ? 0xC2F0 : 0xD400)};
      for (size_t i = 0; i < ordered.size(); i += 15) {
        mixed.push_back(bigs[(i / 15) % 3]);
        for (size_t j = i; j < i + 15; ++j) mixed.push_back(ordered[j % ordered.size()]);
      }
      ExpectSameQuantize(K(), kind, dt, U16ToRaw(mixed), mixed.size() / 16, 16, "mixed with large");
    }
  }
}

// Random f32 rows of varied widths and magnitudes; see also the long test.
std::vector<float> RandomRow(std::mt19937_64& rng, size_t width) {
  std::vector<float> row(width);
  const int mode = static_cast<int>(rng() % 8);
  const int top = static_cast<int>(rng() % 280) - 152;  // binade of the row's largest values
  for (float& x : row) {
    const uint32_t r = static_cast<uint32_t>(rng());
    switch (mode) {
      case 0: {  // random finite bit patterns
        uint32_t b = static_cast<uint32_t>(rng());
        if ((b & 0x7F800000u) == 0x7F800000u) b &= 0xBFFFFFFFu;
        x = FromBits(b);
        break;
      }
      case 1:  // zeros of both signs
        x = (r & 1) ? -0.0f : 0.0f;
        break;
      case 2:  // zeros with a few values
        x = (r % 5 == 0) ? std::ldexp(static_cast<float>(r % 1000) - 500.0f, top - 10)
                         : ((r & 2) ? -0.0f : 0.0f);
        break;
      default: {  // magnitudes within ~40 binades below `top`
        const float m = 1.0f + static_cast<float>(r & 0xFFFFFF) / 16777216.0f;
        int e = top - static_cast<int>(rng() % 40);
        x = std::ldexp(m, std::max(e, -160));
        if (r >> 31) x = -x;
        break;
      }
    }
    if (!std::isfinite(x)) x = 0.0f;
  }
  return row;
}

TEST_P(VectorIsaTest, QuantizeRandomF32Rows) {
  std::mt19937_64 rng(1234);
  const size_t widths[] = {1,  2,  3,  5,  7,  8,  9,   15,  16,  17,  31,
                           32, 33, 47, 63, 64, 65, 127, 128, 129, 255, 1000};
  for (size_t width : widths) {
    const size_t rows = 20000 / width + 3;
    std::vector<float> x;
    for (size_t r = 0; r < rows; ++r) {
      const std::vector<float> row = RandomRow(rng, width);
      x.insert(x.end(), row.begin(), row.end());
    }
    for (Dtype dt : kRawDtypes) {
      const std::vector<unsigned char> raw = ToRaw(dt, x);
      for (Dtype kind : kKinds) {
        ExpectSameQuantize(K(), kind, dt, raw, rows, width, "random", width % 3);
      }
    }
  }
}

TEST_P(VectorIsaTest, QuantizeZeroRowsAndWidths) {
  for (Dtype kind : kKinds) {
    for (Dtype dt : kRawDtypes) {
      ExpectSameQuantize(K(), kind, dt, {}, 0, 128, "no rows");
      ExpectSameQuantize(K(), kind, dt, {}, 0, 0, "nothing");
      ExpectSameQuantize(K(), kind, dt, {}, 5, 0, "empty rows");
    }
  }
}

// Valid codes of a kind, in order.
std::vector<uint8_t> ValidCodes(Dtype kind) {
  std::vector<uint8_t> v;
  for (uint32_t c = 0; c < 256; ++c) {
    if (!IsNonFiniteCode(static_cast<uint8_t>(c), kind)) v.push_back(static_cast<uint8_t>(c));
  }
  return v;
}

// Scales covering the corners of the decode: the smallest allowed, ones that
// send products into f16/bf16 subnormals and below, ones that overflow f16 or
// f32 (and so bf16), and a spread of random ones.
std::vector<float> TestScales() {
  std::vector<float> s = {FromBits(0x00800000),  // FLT_MIN
                          FromBits(0x00800001),
                          1.0f,
                          1.0f / 448,
                          1.0f / 57344,
                          std::ldexp(1.0f, -20),
                          std::ldexp(1.0f, -24),
                          std::ldexp(1.0f, -30),
                          std::ldexp(1.0f, -100),
                          std::ldexp(1.0f, -117),
                          std::ldexp(1.7f, -118),
                          146.2857f,  // 65536 / 448: e4m3 max -> just above f16 max
                          1.1428572f,
                          2.0f,
                          3.0f,
                          1e10f,
                          std::ldexp(1.0f, 119),
                          std::ldexp(1.5f, 120),
                          7.5957e35f,
                          FromBits(0x7F7FFFFF)};
  std::mt19937_64 rng(99);
  for (int i = 0; i < 200; ++i) {
    const uint32_t b = 0x00800000u + static_cast<uint32_t>(rng() % (0x7F7FFFFFu - 0x00800000u + 1));
    s.push_back(FromBits(b));
  }
  for (int i = 0; i < 100; ++i) {  // dense near 1/448 .. 1 where f16 ties live
    s.push_back(std::ldexp(1.0f + static_cast<float>(rng() % 4096) / 4096.0f,
                           -static_cast<int>(rng() % 24)));
  }
  return s;
}

// Decoding every valid code with many scales into every dtype.
TEST_P(IsaTest, DequantizeEveryCodeManyScales) {
  const std::vector<float> scales = TestScales();
  for (Dtype kind : kKinds) {
    const std::vector<uint8_t> valid = ValidCodes(kind);
    // Row r holds all valid codes rotated by r, so tails see every code.
    const size_t width = valid.size();
    const size_t rows = scales.size();
    std::vector<uint8_t> codes(rows * width);
    for (size_t r = 0; r < rows; ++r) {
      for (size_t i = 0; i < width; ++i) codes[r * width + i] = valid[(i + r) % width];
    }
    for (Dtype dt : kRawDtypes) {
      const size_t es = Esize(dt);
      for (size_t offset : {size_t{0}, size_t{1}}) {
        Buffer cbuf(codes.size(), offset);
        std::memcpy(cbuf.data(), codes.data(), codes.size());
        Buffer out(rows * width * es, offset);
        K().dequantize_rows(kind, cbuf.data(), scales.data(), rows, width, dt, out.data());
        for (size_t r = 0; r < rows; ++r) {
          for (size_t i = 0; i < width; ++i) {
            // Independent expectation: one f32 multiply, then the element
            // conversion.
            const float v = DecodeElement(codes[r * width + i], kind) * scales[r];
            const size_t at = (r * width + i) * es;
            if (dt == Dtype::kF32) {
              uint32_t got;
              std::memcpy(&got, out.data() + at, 4);
              const uint32_t want = std::isinf(v) ? (Bits(v) & 0x80000000u) | 0x7F7FFFFFu : Bits(v);
              ASSERT_EQ(got, want) << KindName(kind) << " f32 row " << r << " i " << i;
            } else {
              uint16_t got;
              std::memcpy(&got, out.data() + at, 2);
              const uint16_t want = dt == Dtype::kBF16 ? F32ToBf16(v) : F32ToF16(v);
              ASSERT_EQ(got, want) << KindName(kind) << " " << DtName(dt) << " code 0x" << std::hex
                                   << int{codes[r * width + i]} << " scale " << Bits(scales[r]);
            }
          }
        }
      }
      // Tails: widths 1..40 against the same expectation (via the scalar path).
      for (size_t w = 1; w <= 40; ++w) {
        const size_t n_rows = 7;
        std::vector<unsigned char> got(n_rows * w * es), want(n_rows * w * es);
        K().dequantize_rows(kind, codes.data(), scales.data() + 3, n_rows, w, dt, got.data());
        Ref().dequantize_rows(kind, codes.data(), scales.data() + 3, n_rows, w, dt, want.data());
        ASSERT_EQ(got, want) << "width " << w;
      }
    }
  }
}

TEST_P(IsaTest, DequantizeOverflowClampsToMaxFinite) {
  for (Dtype kind : kKinds) {
    const uint8_t max_code = kind == Dtype::kE4M3 ? 0x7E : 0x7B;
    const uint8_t codes[2] = {max_code, static_cast<uint8_t>(max_code | 0x80)};
    const float scale = FromBits(0x7F7FFFFF);  // product overflows f32 to Inf
    uint16_t bf[2], h[2];
    float f[2];
    DequantizeRows(kind, codes, &scale, 1, 2, Dtype::kBF16, bf, GetParam());
    DequantizeRows(kind, codes, &scale, 1, 2, Dtype::kF16, h, GetParam());
    DequantizeRows(kind, codes, &scale, 1, 2, Dtype::kF32, f, GetParam());
    EXPECT_EQ(bf[0], 0x7F7F);
    EXPECT_EQ(bf[1], 0xFF7F);
    EXPECT_EQ(h[0], 0x7BFF);
    EXPECT_EQ(h[1], 0xFBFF);
    // f32 output: the f32 multiply overflowed; clamped like the others.
    EXPECT_EQ(Bits(f[0]), 0x7F7FFFFFu);
    EXPECT_EQ(Bits(f[1]), 0xFF7FFFFFu);
    // Signed zeros come back signed.
    const uint8_t zeros[2] = {0x00, 0x80};
    const float one = 1.0f;
    DequantizeRows(kind, zeros, &one, 1, 2, Dtype::kBF16, bf, GetParam());
    DequantizeRows(kind, zeros, &one, 1, 2, Dtype::kF16, h, GetParam());
    EXPECT_EQ(bf[0], 0x0000);
    EXPECT_EQ(bf[1], 0x8000);
    EXPECT_EQ(h[0], 0x0000);
    EXPECT_EQ(h[1], 0x8000);
    // Also under the largest valid scale: one multiplication of finite
    // factors, never 0 * Inf (compare nvfp4's divisor, spec/CODEC.md 14.4).
    DequantizeRows(kind, zeros, &scale, 1, 2, Dtype::kF32, f, GetParam());
    DequantizeRows(kind, zeros, &scale, 1, 2, Dtype::kBF16, bf, GetParam());
    DequantizeRows(kind, zeros, &scale, 1, 2, Dtype::kF16, h, GetParam());
    EXPECT_EQ(Bits(f[0]), 0x00000000u);
    EXPECT_EQ(Bits(f[1]), 0x80000000u);
    EXPECT_EQ(bf[0], 0x0000);
    EXPECT_EQ(bf[1], 0x8000);
    EXPECT_EQ(h[0], 0x0000);
    EXPECT_EQ(h[1], 0x8000);
  }
}

TEST_P(IsaTest, FindInvalidCode) {
  std::mt19937_64 rng(5);
  for (Dtype kind : kKinds) {
    const std::vector<uint8_t> valid = ValidCodes(kind);
    std::vector<uint8_t> bad;
    for (uint32_t c = 0; c < 256; ++c) {
      if (IsNonFiniteCode(static_cast<uint8_t>(c), kind)) bad.push_back(static_cast<uint8_t>(c));
    }
    for (size_t n : {0u, 1u, 2u, 15u, 16u, 31u, 32u, 33u, 63u, 64u, 65u, 100u, 1000u}) {
      for (size_t offset : {0u, 1u, 3u}) {
        Buffer buf(n + 1, offset);
        for (size_t i = 0; i < n; ++i) buf.data()[i] = valid[rng() % valid.size()];
        buf.data()[n] = bad[0];  // just past the end: must not be seen
        EXPECT_EQ(K().find_invalid_code(kind, buf.data(), n), n);
        EXPECT_EQ(FindInvalidCode(kind, buf.data(), n, GetParam()), n);
        for (size_t pos = 0; pos < n; pos += 1 + pos / 3) {
          for (uint8_t b : bad) {
            const uint8_t keep = buf.data()[pos];
            buf.data()[pos] = b;
            ASSERT_EQ(K().find_invalid_code(kind, buf.data(), n), pos)
                << KindName(kind) << " n=" << n << " code " << int{b};
            if (pos + 1 < n) buf.data()[n - 1] = bad.back();  // a later one too
            ASSERT_EQ(K().find_invalid_code(kind, buf.data(), n), pos);
            buf.data()[pos] = keep;
            if (pos + 1 < n) buf.data()[n - 1] = valid[0];
          }
        }
      }
    }
  }
}

TEST_P(IsaTest, ConvertRawMatchesScalar) {
  // Every 16-bit pattern (NaN and Inf included), every direction.
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  // f32: specials, boundaries, random patterns.
  std::vector<uint32_t> f32 = {
      0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001,
      0xFF80FFFF, 0x7FBFFFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F7FFF, 0x7F7F8000, 0x477FE000,
      0x477FEFFF, 0x477FF000, 0x477FF001, 0x33800000, 0x33000000, 0x33000001, 0x38800000,
      0x387FFFFF, 0x00000001, 0x00008000, 0x00018000, 0x007FFFFF, 0x3F808000, 0x3F818000};
  std::mt19937_64 rng(3);
  for (int i = 0; i < 200000; ++i) f32.push_back(static_cast<uint32_t>(rng()));
  for (int i = 0; i < 100000; ++i) {  // the f16 range, dense
    f32.push_back((static_cast<uint32_t>(rng()) & 0x80FFFFFFu) |
                  ((100u + static_cast<uint32_t>(rng() % 44)) << 23));
  }
  struct Case {
    Dtype dt;
    std::vector<unsigned char> raw;
    size_t n;
  };
  std::vector<Case> cases;
  cases.push_back({Dtype::kBF16, U16ToRaw(all), all.size()});
  cases.push_back({Dtype::kF16, U16ToRaw(all), all.size()});
  {
    std::vector<unsigned char> raw(f32.size() * 4);
    std::memcpy(raw.data(), f32.data(), raw.size());
    cases.push_back({Dtype::kF32, raw, f32.size()});
  }
  for (const Case& c : cases) {
    for (Dtype dst : kRawDtypes) {
      const size_t es = Esize(dst);
      for (size_t n : {c.n, c.n - 1, size_t{13}, size_t{7}, size_t{1}, size_t{0}}) {
        for (size_t offset : {0u, 2u}) {
          Buffer in(n * Esize(c.dt), offset);
          if (n) std::memcpy(in.data(), c.raw.data(), n * Esize(c.dt));
          std::vector<unsigned char> want(n * es + 1, 0x5A);
          Buffer got(n * es + 1, offset);
          std::memset(got.data(), 0x5A, n * es + 1);
          Ref().convert_raw(c.dt, in.data(), n, dst, want.data());
          K().convert_raw(c.dt, in.data(), n, dst, got.data());
          ASSERT_EQ(0, std::memcmp(want.data(), got.data(), n * es + 1))
              << DtName(c.dt) << " -> " << DtName(dst) << " n=" << n;
        }
      }
      // The scalar reference itself is the element functions.
      if (c.dt == Dtype::kF32 && dst != Dtype::kF32) {
        std::vector<uint16_t> out(c.n);
        Ref().convert_raw(c.dt, c.raw.data(), c.n, dst, out.data());
        for (size_t i = 0; i < c.n; ++i) {
          const float x = FromBits(f32[i]);
          ASSERT_EQ(out[i], dst == Dtype::kBF16 ? F32ToBf16(x) : F32ToF16(x));
        }
      }
    }
  }
}

TEST_P(IsaTest, FindNonFinite) {
  for (Dtype dt : kRawDtypes) {
    const size_t es = Esize(dt);
    const std::vector<uint32_t> specials =
        dt == Dtype::kF32
            ? std::vector<uint32_t>{0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF}
        : dt == Dtype::kBF16 ? std::vector<uint32_t>{0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFFF}
                             : std::vector<uint32_t>{0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFFFF};
    const uint32_t big = dt == Dtype::kF32 ? 0x7F7FFFFF : dt == Dtype::kBF16 ? 0x7F7F : 0x7BFF;
    for (size_t n : {0u, 1u, 7u, 8u, 15u, 16u, 17u, 31u, 32u, 33u, 64u, 100u}) {
      Buffer buf((n + 1) * es, 2);
      auto put = [&](size_t i, uint32_t v) {
        if (es == 4) {
          std::memcpy(buf.data() + i * 4, &v, 4);
        } else {
          const auto h = static_cast<uint16_t>(v);
          std::memcpy(buf.data() + i * 2, &h, 2);
        }
      };
      for (size_t i = 0; i < n; ++i)
        put(i, (i & 1) ? big : (big | (es == 4 ? 0x80000000u : 0x8000u)));
      put(n, specials[0]);  // past the end
      EXPECT_EQ(K().find_non_finite(dt, buf.data(), n), n);
      EXPECT_EQ(FindNonFinite(dt, buf.data(), n), n);
      for (size_t pos = 0; pos < n; ++pos) {
        for (uint32_t s : specials) {
          put(pos, s);
          ASSERT_EQ(K().find_non_finite(dt, buf.data(), n), pos) << DtName(dt) << " n=" << n;
          put(pos, big);
        }
      }
    }
  }
}

// ===========================================================================
// 4. The row rule
// ===========================================================================

TEST_P(IsaTest, NonFiniteRowsRejectedWithTheirIndex) {
  for (Dtype dt : kRawDtypes) {
    const std::vector<uint32_t> specials =
        dt == Dtype::kF32    ? std::vector<uint32_t>{0x7F800000, 0xFF800000, 0x7FC00000, 0xFF800001}
        : dt == Dtype::kBF16 ? std::vector<uint32_t>{0x7F80, 0xFF80, 0x7FC0, 0xFF81}
                             : std::vector<uint32_t>{0x7C00, 0xFC00, 0x7E00, 0xFC01};
    for (Dtype kind : kKinds) {
      for (size_t width : {1u, 5u, 16u, 33u, 128u}) {
        const size_t rows = 9;
        std::vector<float> x(rows * width, 1.5f);
        std::vector<unsigned char> raw = ToRaw(dt, x);
        for (size_t bad_row : {0u, 4u, 8u}) {
          for (size_t col : {size_t{0}, width / 2, width - 1}) {
            for (uint32_t s : specials) {
              std::vector<unsigned char> r2 = raw;
              const size_t at = (bad_row * width + col) * Esize(dt);
              if (dt == Dtype::kF32) {
                std::memcpy(&r2[at], &s, 4);
              } else {
                const auto h = static_cast<uint16_t>(s);
                std::memcpy(&r2[at], &h, 2);
              }
              // A second bad row later must not win.
              if (bad_row + 2 < rows)
                std::memcpy(&r2[(rows - 1) * width * Esize(dt)], &r2[at], Esize(dt));
              std::vector<uint8_t> codes(rows * width);
              std::vector<float> scales(rows);
              size_t got_row = 12345;
              EXPECT_FALSE(QuantizeRows(kind, dt, r2.data(), rows, width, codes.data(),
                                        scales.data(), &got_row, GetParam()));
              EXPECT_EQ(got_row, bad_row) << DtName(dt) << " width " << width << " col " << col;
            }
          }
        }
      }
    }
  }
}

TEST_P(IsaTest, AllZeroRowsKeepSignedZeros) {
  for (Dtype dt : kRawDtypes) {
    for (Dtype kind : kKinds) {
      for (size_t width : {1u, 3u, 16u, 40u, 128u}) {
        std::vector<float> x(2 * width);
        for (size_t i = 0; i < width; ++i) {
          x[i] = (i % 3 == 1) ? -0.0f : 0.0f;
          x[width + i] = 0.0f;
        }
        x[width + width / 2] = -0.0f;
        const QuantResult r = Quantize(K(), kind, dt, ToRaw(dt, x), 2, width);
        ASSERT_TRUE(r.ok);
        EXPECT_EQ(r.scale_bits[0], Bits(1.0f));
        EXPECT_EQ(r.scale_bits[1], Bits(1.0f));
        for (size_t i = 0; i < 2 * width; ++i) {
          EXPECT_EQ(r.codes[i], std::signbit(x[i]) ? 0x80 : 0x00) << i;
        }
      }
    }
  }
}

TEST_P(IsaTest, TinyRowsGetFltMinScale) {
  for (Dtype dt : {Dtype::kBF16, Dtype::kF32}) {  // f16 cannot hold values this small
    for (Dtype kind : kKinds) {
      // amax = 2^-120: amax / 448 < FLT_MIN, so the scale is FLT_MIN and the
      // quotients are x * 2^126 exactly.
      std::vector<float> x = {std::ldexp(1.0f, -120), -std::ldexp(1.0f, -127),
                              std::ldexp(3.0f, -133), -0.0f, std::ldexp(1.0f, -133)};
      const QuantResult r = Quantize(K(), kind, dt, ToRaw(dt, x), 1, x.size());
      ASSERT_TRUE(r.ok);
      EXPECT_EQ(r.scale_bits[0], 0x00800000u);
      for (size_t i = 0; i < x.size(); ++i) {
        EXPECT_EQ(r.codes[i], EncodeElement(std::ldexp(x[i], 126), kind)) << i;
      }
      if (kind == Dtype::kE4M3) {
        EXPECT_EQ(r.codes[0], 0x68);  // 64 = 2^6: exponent field 6 + 7 = 13 -> 0.1101.000
        EXPECT_EQ(r.codes[1], 0xB0);  // -0.5 = -2^-1: exponent field 6 -> 1.0110.000
        EXPECT_EQ(r.codes[2], 0x0C);  // 3 * 2^-7 = 1.5 * 2^-6: 0.0001.100
        EXPECT_EQ(r.codes[3], 0x80);
      }
    }
  }
}

TEST_P(IsaTest, SaturationAndExactMaximum) {
  for (Dtype dt : kRawDtypes) {
    for (Dtype kind : kKinds) {
      const uint8_t max_code = kind == Dtype::kE4M3 ? 0x7E : 0x7B;
      // amax elements map to +-max code; a value just below amax too or one below.
      std::vector<float> x = {3.0f, -3.0f, 1.5f, 0.0f, -2.9990234f, 3.0f};
      const QuantResult r = Quantize(K(), kind, dt, ToRaw(dt, x), 1, x.size());
      ASSERT_TRUE(r.ok);
      EXPECT_EQ(r.scale_bits[0], Bits(3.0f / Fp8MaxFinite(kind)));
      EXPECT_EQ(r.codes[0], max_code);
      EXPECT_EQ(r.codes[1], max_code | 0x80);
      EXPECT_EQ(r.codes[5], max_code);
      EXPECT_EQ(r.codes[3], 0x00);
      // Largest finite inputs: the scale stays finite and the codes saturate.
      const float big = dt == Dtype::kF32    ? FromBits(0x7F7FFFFF)
                        : dt == Dtype::kBF16 ? FromBits(0x7F7F0000)
                                             : 65504.0f;
      std::vector<float> y = {big, -big, big / 2};
      const QuantResult s = Quantize(K(), kind, dt, ToRaw(dt, y), 1, y.size());
      ASSERT_TRUE(s.ok);
      EXPECT_EQ(s.scale_bits[0], Bits(big / Fp8MaxFinite(kind)));
      EXPECT_EQ(s.codes[0], max_code);
      EXPECT_EQ(s.codes[1], max_code | 0x80);
    }
  }
}

// The spec's worked examples (spec/CODEC.md, "Worked examples"); the
// expected bytes were computed independently of this code.
struct WorkedRow {
  Dtype kind;
  float x[4];
  uint32_t scale_bits;
  uint8_t codes[4];
  uint16_t bf16[4];
  uint16_t f16[4];
};

TEST_P(IsaTest, WorkedExamples) {
  const WorkedRow rows[] = {
      {Dtype::kE4M3,
       {7.0f, -0.3f, 0.06640625f, 0x3p-15f},
       0x3C800000u,
       {0x7E, 0xDA, 0x48, 0x03},
       {0x40E0, 0xBEA0, 0x3D80, 0x38C0},
       {0x4700, 0xB500, 0x2C00, 0x0600}},
      {Dtype::kE5M2,
       {7.0f, -0.3f, 0.06640625f, 0x3p-15f},
       0x39000000u,
       {0x7B, 0xE9, 0x60, 0x3A},
       {0x40E0, 0xBEA0, 0x3D80, 0x38C0},
       {0x4700, 0xB500, 0x2C00, 0x0600}},
      {Dtype::kE4M3,
       {1.0f, -0.3f, 0.0078125f, -0.0f},
       0x3B124925u,
       {0x7E, 0xF0, 0x46, 0x80},
       {0x3F80, 0xBE92, 0x3C00, 0x8000},
       {0x3C00, 0xB492, 0x2000, 0x8000}},
      {Dtype::kE5M2,
       {1.0f, -0.3f, 0.0078125f, -0.0f},
       0x37924925u,
       {0x7B, 0xF4, 0x5F, 0x80},
       {0x3F80, 0xBE92, 0x3C00, 0x8000},
       {0x3C00, 0xB492, 0x2000, 0x8000}},
  };
  for (const WorkedRow& w : rows) {
    uint8_t codes[4];
    float scale = 0;
    size_t bad = 0;
    ASSERT_TRUE(QuantizeRows(w.kind, Dtype::kF32, w.x, 1, 4, codes, &scale, &bad, GetParam()));
    EXPECT_EQ(Bits(scale), w.scale_bits) << KindName(w.kind);
    uint16_t bf[4], h[4];
    DequantizeRows(w.kind, codes, &scale, 1, 4, Dtype::kBF16, bf, GetParam());
    DequantizeRows(w.kind, codes, &scale, 1, 4, Dtype::kF16, h, GetParam());
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(codes[i], w.codes[i]) << KindName(w.kind) << " element " << i;
      EXPECT_EQ(bf[i], w.bf16[i]) << KindName(w.kind) << " element " << i;
      EXPECT_EQ(h[i], w.f16[i]) << KindName(w.kind) << " element " << i;
    }
  }
}

// spec/CODEC.md section 3.1 and examples 10.3 - 10.5, byte for byte.
TEST(SpecExamples, ElementTable) {
  struct Row {
    uint32_t x;
    uint8_t e4m3, e5m2;
  };
  const Row rows[] = {{0x3F800000, 0x38, 0x3C}, {0x3E99999A, 0x2A, 0x35}, {0xC0300000, 0xC3, 0xC2},
                      {0x41880000, 0x58, 0x4C}, {0x43E00000, 0x7E, 0x5F}, {0x43E80000, 0x7E, 0x5F},
                      {0x4E6E6B28, 0x7E, 0x7B}, {0x3A83126F, 0x01, 0x14}, {0x3A800000, 0x00, 0x14},
                      {0x3B400000, 0x02, 0x1A}, {0x80000000, 0x80, 0x80}, {0xB727C5AC, 0x80, 0x81},
                      {0x47700000, 0x7E, 0x7B}, {0x7FC00000, 0x7F, 0x7F}, {0xFF800000, 0xFE, 0xFB}};
  for (const Row& r : rows) {
    EXPECT_EQ(EncodeElement(FromBits(r.x), Dtype::kE4M3), r.e4m3) << std::hex << r.x;
    EXPECT_EQ(EncodeElement(FromBits(r.x), Dtype::kE5M2), r.e5m2) << std::hex << r.x;
  }
}

TEST_P(IsaTest, SpecRowExamples) {
  struct Example {
    Dtype dt;
    std::vector<uint32_t> x;  // bit patterns of dt
    uint32_t scale_e4m3, scale_e5m2;
    std::vector<uint8_t> e4m3, e5m2;
  };
  const Example examples[] = {
      {Dtype::kF32,
       {0x80000000, 0x00000000, 0x00000000, 0x80000000},
       0x3F800000,
       0x3F800000,
       {0x80, 0x00, 0x00, 0x80},
       {0x80, 0x00, 0x00, 0x80}},
      {Dtype::kBF16,
       {0x0380, 0x8040, 0x0003, 0x8000},
       0x00800000,
       0x00800000,
       {0x68, 0xB0, 0x0C, 0x80},
       {0x54, 0xB8, 0x26, 0x80}},
      {Dtype::kF32,
       {0x40400000, 0xC0400000, 0x3FC00000, 0x00000000},
       0x3BDB6DB7,
       0,
       {0x7E, 0xFE, 0x76, 0x00},
       {0x7B, 0xFB, 0x77, 0x00}},
  };
  for (const Example& ex : examples) {
    std::vector<unsigned char> raw;
    for (uint32_t b : ex.x) {
      if (ex.dt == Dtype::kF32) {
        for (int k = 0; k < 4; ++k) raw.push_back(static_cast<unsigned char>(b >> (8 * k)));
      } else {
        raw.push_back(static_cast<unsigned char>(b));
        raw.push_back(static_cast<unsigned char>(b >> 8));
      }
    }
    const QuantResult a = Quantize(K(), Dtype::kE4M3, ex.dt, raw, 1, ex.x.size());
    const QuantResult b = Quantize(K(), Dtype::kE5M2, ex.dt, raw, 1, ex.x.size());
    ASSERT_TRUE(a.ok && b.ok);
    EXPECT_EQ(a.scale_bits[0], ex.scale_e4m3);
    if (ex.scale_e5m2 != 0) {
      EXPECT_EQ(b.scale_bits[0], ex.scale_e5m2);
    }
    EXPECT_EQ(a.codes, ex.e4m3);
    EXPECT_EQ(b.codes, ex.e5m2);
  }
}

// Why the row rule divides instead of multiplying by a reciprocal
// (spec/CODEC.md, "Implementation notes"): here x / scale is exactly 108, an
// e4m3 tie that goes to the even 112 (0x6E), while x * (1 / scale) is one ulp
// below 108 and would give 104 (0x6D).
TEST_P(IsaTest, DivisionNotReciprocal) {
  const float x[2] = {FromBits(0x3FF985CA), FromBits(0x3EF09C70)};
  const float scale_expected = FromBits(0x3B8E9598);
  ASSERT_NE(EncodeElement(x[1] * (1.0f / scale_expected), Dtype::kE4M3), 0x6E);
  for (Dtype dt : {Dtype::kF32}) {
    const QuantResult r = Quantize(K(), Dtype::kE4M3, dt, ToRaw(dt, {x[0], x[1]}), 1, 2);
    ASSERT_TRUE(r.ok);
    EXPECT_EQ(r.scale_bits[0], 0x3B8E9598u);
    EXPECT_EQ(r.codes[0], 0x7E);
    EXPECT_EQ(r.codes[1], 0x6E);
  }
}

// Second check, independent of the reference codes: every reconstruction is
// within half a step of the code's binade (plus the division's rounding).
TEST_P(IsaTest, ErrorBound) {
  std::mt19937_64 rng(77);
  for (Dtype kind : kKinds) {
    const int mant_bits = kind == Dtype::kE4M3 ? 3 : 2;
    const int emin = kind == Dtype::kE4M3 ? -6 : -14;
    for (int t = 0; t < 300; ++t) {
      const size_t width = 1 + rng() % 200;
      const std::vector<float> x = RandomRow(rng, width);
      const QuantResult r = Quantize(K(), kind, Dtype::kF32, ToRaw(Dtype::kF32, x), 1, width);
      ASSERT_TRUE(r.ok);
      const double scale = FromBits(r.scale_bits[0]);
      for (size_t i = 0; i < width; ++i) {
        const double t_val = DecodeElement(r.codes[i], kind);
        ASSERT_TRUE(std::isfinite(t_val));
        EXPECT_EQ(std::signbit(t_val), std::signbit(x[i]));
        // Half a step in the binade of the code (the subnormal step below 2^emin).
        int e = emin;
        if (std::fabs(t_val) >= std::ldexp(1.0, emin)) e = std::ilogb(t_val);
        const double half_step = std::ldexp(1.0, e - mant_bits - 1);
        const double err = std::fabs(static_cast<double>(x[i]) - t_val * scale);
        const double bound = scale * half_step + std::fabs(static_cast<double>(x[i])) * 0x1p-23;
        ASSERT_LE(err, bound) << KindName(kind) << " x=" << x[i] << " code " << int{r.codes[i]};
      }
    }
  }
}

TEST(PublicApi, IsaQueries) {
  EXPECT_TRUE(IsaSupported(Isa::kScalar));
  EXPECT_TRUE(IsaSupported(Isa::kBest));
  EXPECT_TRUE(IsaSupported(BestIsa()));
  EXPECT_NE(BestIsa(), Isa::kBest);
  EXPECT_STREQ(IsaName(Isa::kScalar), "scalar");
  EXPECT_STREQ(IsaName(Isa::kAvx2), "avx2");
  EXPECT_STREQ(IsaName(Isa::kAvx512), "avx512");
  if (IsaSupported(Isa::kAvx512)) {
    EXPECT_TRUE(IsaSupported(Isa::kAvx2));
  }
  std::printf("best codec ISA on this machine: %s\n", IsaName(Isa::kBest));
}

TEST(PublicApi, FindInvalidScale) {
  const float good[] = {FromBits(0x00800000), 1.0f, FromBits(0x7F7FFFFF), 3e-20f};
  EXPECT_EQ(FindInvalidScale(good, 4), 4u);
  EXPECT_EQ(FindInvalidScale(good, 0), 0u);
  const uint32_t bads[] = {0x00000000, 0x80000000, 0x007FFFFF, 0x00000001, 0xBF800000, 0x80800000,
                           0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001};
  for (uint32_t b : bads) {
    float s[5] = {1.0f, 2.0f, 3.0f, FromBits(b), FromBits(b)};
    EXPECT_EQ(FindInvalidScale(s, 5), 3u) << std::hex << b;
    EXPECT_EQ(FindInvalidScale(s, 3), 3u);
  }
}

TEST(PublicApi, ConvertRawSameDtypeIsACopy) {
  const uint16_t nan_payload[3] = {0x7F81, 0xFFFF, 0x1234};
  uint16_t out[3];
  ConvertRaw(Dtype::kBF16, nan_payload, 3, Dtype::kBF16, out);
  EXPECT_EQ(0, std::memcmp(out, nan_payload, 6));
  float f[3];
  ConvertRaw(Dtype::kF16, nan_payload, 3, Dtype::kF32, f);
  EXPECT_TRUE(std::isnan(f[0]));
  EXPECT_TRUE(std::isnan(f[1]));
  EXPECT_EQ(f[2], F16ToF32(0x1234));
}

TEST(PublicApi, BadDtypeIsRefused) {
  const uint8_t src[4] = {};
  uint8_t codes[4];
  float scale;
  size_t bad = 99;
  EXPECT_FALSE(QuantizeRows(Dtype::kE4M3, Dtype::kE4M3, src, 1, 4, codes, &scale, &bad));
  EXPECT_EQ(bad, 1u);  // == rows: no row is at fault
}

}  // namespace
}  // namespace kvfile::codec
