// SPDX-License-Identifier: Apache-2.0
// The synthetic KV generator (see synth_data.h).
#include "synth_data.h"

#include <cmath>
#include <cstring>
#include <vector>


namespace kvfile::synth {

namespace {

// SplitMix64: a well-mixed 64-bit hash of a counter; used to seed and to
// step the per-row generator.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// An approximately standard normal value from 64 random bits: the sum of four
// 16-bit uniforms (Irwin-Hall) has mean 2 and variance 1/3.
float Normal(uint64_t bits) {
  float sum = static_cast<float>((bits & 0xFFFF) + ((bits >> 16) & 0xFFFF) + ((bits >> 32) & 0xFFFF) +
                                 (bits >> 48)) * (1.0f / 65536.0f);
  return (sum - 2.0f) * 1.7320508f;
}

}  // namespace

// Round to nearest even into bf16 (inputs here are always finite and far
// from the bf16 range limits).
inline uint16_t ToBf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

void GenerateRows(const Geometry& g, uint64_t seed, uint32_t layer, uint32_t stream,
                  uint64_t first, uint64_t count, uint16_t* out) {
  const StreamSpec& s = g.streams[stream];
  bool key_like = s.name != "v" && s.name != "latent";
  uint64_t base = Mix(seed ^ (uint64_t{layer} << 40) ^ (uint64_t{stream} << 32));
  // Per-layer magnitude between 0.05 and 3, varying smoothly with depth.
  float sigma = 0.05f + 2.95f * (0.5f + 0.5f * std::sin(0.7f * static_cast<float>(layer) + static_cast<float>(stream)));
  size_t w = s.row_width;
  // Per-channel gain of each row-in-token: 1, or 8-40 for the few outlier
  // channels (about one in 16), fixed for the (layer, stream, row).
  std::vector<float> gain(static_cast<size_t>(s.rows_per_token) * w, sigma);
  if (key_like) {
    for (uint32_t r = 0; r < s.rows_per_token; ++r) {
      uint64_t key = Mix(base ^ (uint64_t{r} << 20));
      for (size_t i = 0; i < w; ++i) {
        uint64_t h = Mix(key ^ i);
        if ((h & 15) == 0) gain[r * w + i] = sigma * (8.0f + 32.0f * static_cast<float>((h >> 8) & 0xFF) / 255.0f);
      }
    }
  }
  for (uint64_t t = 0; t < count; ++t) {
    for (uint32_t r = 0; r < s.rows_per_token; ++r) {
      uint64_t state = Mix(base ^ ((first + t) * 0x100000001B3ull) ^ r);
      uint16_t* row = out + (t * s.rows_per_token + r) * w;
      const float* row_gain = gain.data() + r * w;
      for (size_t i = 0; i < w; ++i) {
        // A 64-bit LCG step per element (one multiply) with its high bits
        // folded down: plenty for test data, and cheap enough to generate
        // gigabytes.
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        row[i] = ToBf16(row_gain[i] * Normal(state ^ (state >> 29)));
      }
    }
  }
}

void GenerateTokens(uint64_t seed, uint64_t first, uint64_t count, uint32_t* out) {
  for (uint64_t t = 0; t < count; ++t)
    out[t] = static_cast<uint32_t>(Mix(seed * 0x2545F4914F6CDD1Dull ^ (first + t)) % 128000);
}

}  // namespace kvfile::synth
