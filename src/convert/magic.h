// SPDX-License-Identifier: Apache-2.0
// The foreign formats' magic numbers: what their readers and writers
// (llama_state.cc, coli_kv.cc) and the sniffs (sniff.cc, in every build,
// KVFILE_WITH_FORMATS or not) go by.
#pragma once

#include <cstdint>

namespace kvfile::llama {
inline constexpr uint32_t kMagicSequence = 0x67677371;  // 'ggsq'
inline constexpr uint32_t kMagicSession = 0x6767736e;   // 'ggsn'
}  // namespace kvfile::llama

namespace kvfile::coli {
inline constexpr uint8_t kMagicV1[8] = {'C', 'O', 'L', 'I', 'K', 'V', '1', 0};
inline constexpr uint8_t kMagicV2[8] = {'C', 'O', 'L', 'I', 'K', 'V', '2', 0};
inline constexpr uint8_t kMagicV3[8] = {'C', 'O', 'L', 'I', 'K', 'V', '3', 0};
}  // namespace kvfile::coli
