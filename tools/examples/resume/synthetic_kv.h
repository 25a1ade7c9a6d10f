// SPDX-License-Identifier: Apache-2.0
// Synthetic KV rows for the resume example: what a model would compute for
// a token, as a pure function of (token id, position, layer, stream). A
// cached prefix is only valid if every token before it is the same, and the
// value depends on both id and position, so loading KV for the wrong token
// or at the wrong place shows up as a mismatch.
#pragma once

#include <cstdint>
#include <span>

#include "kvfile/geometry.h"

namespace resume {

// Fills out[t][rows_per_token][row_width] (bf16 bit patterns) for the tokens
// ids[0, n) at positions first_position + t, of (layer, stream).
void SyntheticRows(const kvfile::Geometry& g, uint32_t layer, uint32_t stream, std::span<const uint32_t> ids,
                   uint64_t first_position, uint16_t* out);

// The prompt: n token ids; those from `diverge_at` on are drawn from
// another sequence, as when a user edits a conversation there.
void PromptTokens(uint64_t n, uint64_t diverge_at, uint32_t* out);

}  // namespace resume
