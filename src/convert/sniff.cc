// SPDX-License-Identifier: Apache-2.0
// The foreign formats found by their first bytes (driver.h): in every
// build, so that a build without KVFILE_WITH_FORMATS still names the
// format it cannot convert (formats_unavailable.cc). With the public magic
// checks they rest on (kvfile/formats/llama_state.h, coli_kv.h).
#include <cstring>

#include "convert/driver.h"
#include "convert/magic.h"
#include "format/endian.h"
#include "kvfile/formats/coli_kv.h"
#include "kvfile/formats/llama_state.h"
#include "kvfile/formats/safetensors.h"

namespace kvfile {

bool llama::HasStateMagic(const uint8_t* first4) {
  uint32_t m = format::LoadU32(first4);
  return m == kMagicSequence || m == kMagicSession;
}

bool coli::HasMagic(const uint8_t* first8) {
  for (const uint8_t* m : {kMagicV1, kMagicV2, kMagicV3})
    if (std::memcmp(first8, m, 8) == 0) return true;
  return false;
}

namespace convert {

// The format's header: an 8-byte little-endian length, then a JSON object.
bool SniffSafetensors(std::span<const uint8_t> head, const std::string&, bool dir) {
  if (dir || head.size() < 9) return false;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | head[static_cast<size_t>(i)];
  return n >= 2 && n <= safetensors::kMaxHeaderBytes && head[8] == '{';
}

bool SniffLlama(std::span<const uint8_t> head, const std::string&, bool dir) {
  return !dir && head.size() >= 4 && llama::HasStateMagic(head.data());
}

// COLIKV1, COLIKV2 and COLIKV3 (refused by the import with its own line).
bool SniffColi(std::span<const uint8_t> head, const std::string&, bool dir) {
  return !dir && head.size() >= 8 && coli::HasMagic(head.data());
}

}  // namespace convert

}  // namespace kvfile
