// SPDX-License-Identifier: Apache-2.0
// The fidelity measures of `kvfile bench --fidelity` (see fidelity.h).
#include "fidelity.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "bench_support.h"
#include "kvfile/codec.h"
#include "kvfile/presets.h"
#include "synth_data.h"

namespace kvfile::fidelity {

namespace {

template <typename T>
double RelativeL2Of(const T* a, const T* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = a[i], d = x - static_cast<double>(b[i]);
    num += d * d;
    den += x * x;
  }
  if (num == 0) return 0;
  return den == 0 ? INFINITY : std::sqrt(num / den);
}

// Natural-log entropy of softmax(beta * z); also the weights (unnormalized,
// largest 1) and their sum when w is given.
double Entropy(const double* z, size_t n, double beta, double* w, double* sum) {
  double top = -INFINITY;
  for (size_t t = 0; t < n; ++t) top = std::max(top, beta * z[t]);
  double s = 0, dot = 0;
  for (size_t t = 0; t < n; ++t) {
    const double e = beta * z[t] - top;
    const double p = std::exp(e);
    if (w) w[t] = p;
    s += p;
    dot += p * e;
  }
  if (sum) *sum = s;
  return std::log(s) - dot / s;
}

// A fixed pseudo-random unit vector of dimension d for (layer, head):
// SplitMix64 bits, Box-Muller normals.
std::vector<float> QueryDirection(uint32_t layer, size_t head, size_t d) {
  uint64_t state = 0x51ED2701ull ^ (uint64_t{layer} << 32) ^ head;
  auto next = [&] {
    uint64_t x = (state += 0x9E3779B97F4A7C15ull);
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  };
  std::vector<double> v(d);
  double norm = 0;
  for (size_t i = 0; i < d; ++i) {
    const double u1 = (static_cast<double>(next() >> 11) + 1.0) * 0x1p-53;
    const double u2 = static_cast<double>(next() >> 11) * 0x1p-53;
    v[i] = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
    norm += v[i] * v[i];
  }
  std::vector<float> q(d);
  for (size_t i = 0; i < d; ++i) q[i] = static_cast<float>(v[i] / std::sqrt(norm));
  return q;
}

Spread Over(const std::vector<double>& per_layer) {
  bench::Summary s = bench::Summarize(per_layer);
  return {s.median, s.max};
}

// The stored forms compared: the fp8 dtypes and NVFP4.
enum class Tier { kE4M3, kE5M2, kNvfp4 };

const char* TierName(Tier t) { return t == Tier::kE4M3 ? "e4m3" : t == Tier::kE5M2 ? "e5m2" : "nvfp4"; }

// The decoded f32 rows of one stream's exact rows x (tokens x rows x width)
// stored as `dtype`: fp8 with one scale per row of `width`, nvfp4 with one
// row per token (rows x width elements), as the .kv dtypes store them.
void RoundTrip(Tier tier, const std::vector<float>& x, uint64_t tokens, const StreamSpec& s,
               std::vector<float>* y) {
  y->resize(x.size());
  size_t bad = 0;
  if (tier != Tier::kNvfp4) {
    const Dtype dtype = tier == Tier::kE4M3 ? Dtype::kE4M3 : Dtype::kE5M2;
    const size_t rows = tokens * s.rows_per_token;
    std::vector<uint8_t> codes(x.size());
    std::vector<float> scales(rows);
    codec::QuantizeRows(dtype, Dtype::kF32, x.data(), rows, s.row_width, codes.data(), scales.data(), &bad);
    codec::DequantizeRows(dtype, codes.data(), scales.data(), rows, s.row_width, Dtype::kF32, y->data());
  } else {
    const size_t width = s.ElementsPerToken();
    std::vector<uint8_t> packed(x.size() / 2), blocks(x.size() / codec::kNvfp4Block);
    std::vector<float> scales(tokens);
    codec::QuantizeNvfp4Rows(Dtype::kF32, x.data(), tokens, width, packed.data(), blocks.data(), scales.data(),
                             &bad);
    codec::DequantizeNvfp4Rows(packed.data(), blocks.data(), scales.data(), tokens, width, Dtype::kF32,
                               y->data());
  }
}

// Code and scale bits per element of one stream stored as `dtype`.
double StoredBits(Tier tier, const StreamSpec& s) {
  if (tier != Tier::kNvfp4) return 8.0 + 32.0 / s.row_width;
  return 4.0 + 8.0 / codec::kNvfp4Block + 32.0 / static_cast<double>(s.ElementsPerToken());
}

}  // namespace

double RelativeL2(const float* a, const float* b, size_t n) { return RelativeL2Of(a, b, n); }

double SoftmaxEntropy(const double* z, size_t n, double beta) { return Entropy(z, n, beta, nullptr, nullptr); }

double BetaForEntropy(const double* z, size_t n, double fraction) {
  const double target = fraction * std::log(static_cast<double>(n));
  if (n == 0 || *std::min_element(z, z + n) == *std::max_element(z, z + n)) return 0;
  double lo = 0, hi = 1;
  while (SoftmaxEntropy(z, n, hi) > target) {
    lo = hi;
    hi *= 2;
    if (hi > 1e300) return hi;
  }
  for (int i = 0; i < 200 && hi - lo > 1e-12 * hi; ++i) {
    const double mid = 0.5 * (lo + hi);
    (SoftmaxEntropy(z, n, mid) > target ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

void AttentionOutput(const double* z, size_t n, double beta, const float* v, size_t stride, size_t d,
                     double* out) {
  std::vector<double> w(n);
  double sum = 0;
  Entropy(z, n, beta, w.data(), &sum);
  std::fill(out, out + d, 0.0);
  for (size_t t = 0; t < n; ++t) {
    const double p = w[t] / sum;
    const float* row = v + t * stride;
    for (size_t i = 0; i < d; ++i) out[i] += p * row[i];
  }
}

void AddDotProducts(const float* q, const float* k, size_t n, size_t stride, size_t d, double* z) {
  for (size_t t = 0; t < n; ++t) {
    const float* row = k + t * stride;
    double dot = 0;
    for (size_t i = 0; i < d; ++i) dot += static_cast<double>(q[i]) * row[i];
    z[t] += dot;
  }
}

Status Measure(const Options& o, Result* r) {
  Geometry g;
  KVFILE_RETURN_IF_ERROR(GetPreset(o.preset, Dtype::kE4M3, &g));
  auto find = [&](const char* name) -> int {
    for (size_t s = 0; s < g.streams.size(); ++s)
      if (g.streams[s].name == name) return static_cast<int>(s);
    return -1;
  };
  std::vector<int> keys;
  int value = find("v");
  if (find("k") >= 0 && value >= 0) {
    keys = {find("k")};
  } else if (find("latent") >= 0) {
    keys = {find("latent")};
    if (find("rope") >= 0) keys.push_back(find("rope"));
    value = find("latent");
  } else {
    return Status::InvalidArgument("preset '" + o.preset + "' has no key and value streams (k and v, or latent)");
  }
  const size_t heads = g.streams[value].rows_per_token;
  size_t key_dim = 0;
  for (int k : keys) {
    if (g.streams[k].rows_per_token != heads)
      return Status::InvalidArgument("preset '" + o.preset + "': key and value streams differ in rows per token");
    key_dim += g.streams[k].row_width;
  }
  const uint64_t T = o.tokens;
  const uint32_t layers = o.layers == 0 ? g.layers : std::min(o.layers, g.layers);
  std::vector<size_t> quantized;  // stream indexes
  for (size_t s = 0; s < g.streams.size(); ++s)
    if (g.streams[s].dtype != Dtype::kBF16) quantized.push_back(s);

  *r = Result{.preset = o.preset, .tokens = T, .layers = layers, .heads = heads, .key_dim = key_dim,
              .sharpness = o.sharpness, .dtypes = {}};
  const Tier dtypes[] = {Tier::kE4M3, Tier::kE5M2, Tier::kNvfp4};
  // Per dtype: per stream and per sharpness, the figure of each layer.
  std::vector<std::vector<std::vector<double>>> element(3, std::vector<std::vector<double>>(quantized.size()));
  std::vector<std::vector<std::vector<double>>> attention(3, std::vector<std::vector<double>>(o.sharpness.size()));

  std::vector<std::vector<float>> exact(g.streams.size()), decoded(g.streams.size());
  std::vector<uint16_t> bf16;
  for (uint32_t l = 0; l < layers; ++l) {
    for (size_t s = 0; s < g.streams.size(); ++s) {
      const size_t n = T * g.streams[s].ElementsPerToken();
      bf16.resize(n);
      synth::GenerateRows(g, 1, l, static_cast<uint32_t>(s), 0, T, bf16.data());
      exact[s].resize(n);
      codec::ConvertRaw(Dtype::kBF16, bf16.data(), n, Dtype::kF32, exact[s].data());
    }
    // Per head: the query direction, the exact logits and, per sharpness,
    // its beta and the exact output.
    std::vector<std::vector<float>> q(heads);
    std::vector<std::vector<double>> z_exact(heads, std::vector<double>(T, 0.0));
    std::vector<std::vector<double>> betas(heads), out_exact(o.sharpness.size());
    const StreamSpec& vs = g.streams[value];
    auto logits = [&](const std::vector<std::vector<float>>& rows, size_t h, std::vector<double>* z) {
      z->assign(T, 0.0);
      size_t at = 0;
      for (int k : keys) {
        const StreamSpec& ks = g.streams[k];
        AddDotProducts(q[h].data() + at, rows[k].data() + h * ks.row_width, T, ks.ElementsPerToken(),
                       ks.row_width, z->data());
        at += ks.row_width;
      }
      for (double& x : *z) x /= std::sqrt(static_cast<double>(key_dim));
    };
    auto output = [&](const std::vector<std::vector<float>>& rows, const std::vector<double>& z, size_t h,
                      double beta, double* out) {
      AttentionOutput(z.data(), T, beta, rows[value].data() + h * vs.row_width, vs.ElementsPerToken(),
                      vs.row_width, out);
    };
    for (size_t h = 0; h < heads; ++h) {
      q[h] = QueryDirection(l, h, key_dim);
      logits(exact, h, &z_exact[h]);
      for (double f : o.sharpness) betas[h].push_back(BetaForEntropy(z_exact[h].data(), T, f));
    }
    for (size_t i = 0; i < o.sharpness.size(); ++i) {
      out_exact[i].resize(heads * vs.row_width);
      for (size_t h = 0; h < heads; ++h)
        output(exact, z_exact[h], h, betas[h][i], out_exact[i].data() + h * vs.row_width);
    }
    for (size_t d = 0; d < 3; ++d) {
      for (size_t s = 0; s < g.streams.size(); ++s) {
        if (g.streams[s].dtype == Dtype::kBF16) {
          decoded[s] = exact[s];
        } else {
          RoundTrip(dtypes[d], exact[s], T, g.streams[s], &decoded[s]);
        }
      }
      for (size_t j = 0; j < quantized.size(); ++j) {
        const size_t s = quantized[j];
        element[d][j].push_back(RelativeL2(exact[s].data(), decoded[s].data(), exact[s].size()));
      }
      std::vector<double> z, out(heads * vs.row_width);
      std::vector<std::vector<double>> zq(heads);
      for (size_t h = 0; h < heads; ++h) logits(decoded, h, &zq[h]);
      for (size_t i = 0; i < o.sharpness.size(); ++i) {
        for (size_t h = 0; h < heads; ++h) output(decoded, zq[h], h, betas[h][i], out.data() + h * vs.row_width);
        attention[d][i].push_back(RelativeL2Of(out_exact[i].data(), out.data(), out.size()));
      }
    }
  }
  for (size_t d = 0; d < 3; ++d) {
    DtypeResult dr{.dtype = TierName(dtypes[d]), .bits_per_element = 0, .streams = {}, .element = {}, .attention = {}};
    double bits = 0, elements = 0;
    for (size_t j = 0; j < quantized.size(); ++j) {
      const StreamSpec& s = g.streams[quantized[j]];
      dr.streams.push_back(s.name);
      dr.element.push_back(Over(element[d][j]));
      bits += StoredBits(dtypes[d], s) * static_cast<double>(s.ElementsPerToken());
      elements += static_cast<double>(s.ElementsPerToken());
    }
    dr.bits_per_element = elements > 0 ? bits / elements : 0;
    for (size_t i = 0; i < o.sharpness.size(); ++i) dr.attention.push_back(Over(attention[d][i]));
    r->dtypes.push_back(std::move(dr));
  }
  return Status::OK();
}

}  // namespace kvfile::fidelity
