// SPDX-License-Identifier: Apache-2.0
// The resume example's synthetic KV (see synthetic_kv.h), built on the
// generator of `kvfile synth` (tools/kvfile/synth_data.h): its rows depend
// on (seed, layer, stream, position), so seeding it with the token id gives
// rows that depend on the token too.
#include "synthetic_kv.h"

#include "synth_data.h"

namespace resume {

void SyntheticRows(const kvfile::Geometry& g, uint32_t layer, uint32_t stream, std::span<const uint32_t> ids,
                   uint64_t first_position, uint16_t* out) {
  const uint64_t per_token = g.streams[stream].ElementsPerToken();
  for (size_t t = 0; t < ids.size(); ++t)
    kvfile::synth::GenerateRows(g, ids[t], layer, stream, first_position + t, 1, out + t * per_token);
}

void PromptTokens(uint64_t n, uint64_t diverge_at, uint32_t* out) {
  // Seed 1 for the shared conversation, seed 2 for the edited part.
  uint64_t shared = diverge_at < n ? diverge_at : n;
  kvfile::synth::GenerateTokens(1, 0, shared, out);
  kvfile::synth::GenerateTokens(2, shared, n - shared, out + shared);
}

}  // namespace resume
