// SPDX-License-Identifier: Apache-2.0
// Deterministic synthetic KV rows shaped like a real cache.
//
// Every element is a pure function of (seed, layer, stream, token, index),
// so any token range can be regenerated alone: `synth --check` uses this to
// re-derive every stored code and scale.
//
// Shapes: key-like streams (every stream but "v" and "latent") are Gaussian
// with a few fixed outlier channels per row that are 8-40x larger, as in
// measured K caches; "v" and "latent" rows are close to Gaussian. Each layer
// has its own magnitude, so scales vary across the file.
#pragma once

#include <cstdint>
#include <vector>

#include "kvfile/geometry.h"

namespace kvfile::synth {

// Fills `out` with rows [tokens][rows_per_token][row_width] of bf16 bit
// patterns for tokens [first, first + count) of (layer, stream).
void GenerateRows(const Geometry& g, uint64_t seed, uint32_t layer, uint32_t stream,
                  uint64_t first, uint64_t count, uint16_t* out);

// Token ids of tokens [first, first + count), in [0, 128000).
void GenerateTokens(uint64_t seed, uint64_t first, uint64_t count, uint32_t* out);

}  // namespace kvfile::synth
