// SPDX-License-Identifier: Apache-2.0
// The arithmetic of `kvfile bench --fidelity`: how far a KV cache moves when
// it is stored in a quantized dtype and read back.
//
// Two measures, both relative L2 errors ||x - y|| / ||x|| (x exact, y read
// back), computed in double:
// - of the elements of each stream;
// - of one attention output per layer, softmax(q K^T / sqrt(d)) V for one
//   query per key head, the exact output against the one computed from the
//   decoded K and V with the same queries. A query is a fixed random
//   direction scaled so that the softmax over the exact keys has a chosen
//   entropy, a fraction of log(tokens) (the sharpness: near 1, attention
//   spread over every token; near 0, on a few). exp(entropy) is the
//   "effective number of tokens" attended to.
//
// Which streams are keys and values: "k"/"v" (grouped-query caches), or
// "latent" + "rope" as keys and "latent" as values (MLA, in its absorbed
// form). Raw streams (stored bf16 whatever the dtype) are not quantized.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvfile/status.h"

namespace kvfile::fidelity {

// ||a - b|| / ||a|| over n elements; 0 when both are all zero, +Inf when a is
// zero and b is not.
double RelativeL2(const float* a, const float* b, size_t n);

// Natural-log entropy of softmax(beta * z[0, n)).
double SoftmaxEntropy(const double* z, size_t n, double beta);

// The beta >= 0 at which the entropy of softmax(beta * z) is `fraction` of
// log(n) (0 < fraction < 1), by bisection (the entropy falls as beta
// grows). Returns 0 when every z is equal (the entropy is log(n) for every
// beta) and the largest beta tried when the target cannot be reached.
double BetaForEntropy(const double* z, size_t n, double fraction);

// out[0, d) = sum over t of softmax(beta * z)[t] * v[t * stride + (0 .. d)].
void AttentionOutput(const double* z, size_t n, double beta, const float* v, size_t stride, size_t d,
                     double* out);

// z[t] += q . k_t for the n keys k_t = k[t * stride + (0 .. d)] (a key's
// dot products summed over the streams that hold its parts).
void AddDotProducts(const float* q, const float* k, size_t n, size_t stride, size_t d, double* z);

// ---- The measurement over a synthetic session ----

struct Options {
  std::string preset;
  uint64_t tokens = 0;
  uint32_t layers = 0;  // the first `layers` layers; 0: all
  std::vector<double> sharpness;  // entropy fractions, e.g. {0.9, 0.5, 0.1}
};

struct Spread {
  double median = 0, max = 0;  // over layers
};

struct DtypeResult {
  std::string dtype;                         // "e4m3", "e5m2", "nvfp4"
  double bits_per_element = 0;               // codes and scales, over the quantized streams
  std::vector<std::string> streams;          // quantized streams, in the preset's order
  std::vector<Spread> element;               // per stream
  std::vector<Spread> attention;             // per sharpness
};

struct Result {
  std::string preset;
  uint64_t tokens = 0;
  uint32_t layers = 0;
  size_t heads = 0;       // key heads (queries) per layer
  size_t key_dim = 0;     // d of the logits
  std::vector<double> sharpness;
  std::vector<DtypeResult> dtypes;  // e4m3, e5m2, nvfp4
};

// Generates the preset's rows (kvfile synth's generator, seed 1), stores them
// in each dtype and measures. kInvalidArgument for an unknown preset or one
// without key and value streams.
Status Measure(const Options& options, Result* result);

}  // namespace kvfile::fidelity
