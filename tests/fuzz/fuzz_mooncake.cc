// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the Mooncake FP8 codec record parser on an arbitrary record,
// the way `kvfile convert DIR OUT.kv` reads each record file. A record the
// parser accepts decodes, and is canonical: EncodeCodes of its descriptor,
// scales and codes gives back exactly the input bytes. Each input is tried
// as it is and with its CRC field recomputed.
#include <cstring>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "kvfile/formats/mooncake.h"

namespace {

void Check(const uint8_t* data, size_t size) {
  using namespace kvfile;
  mooncake::RecordView v;
  if (!mooncake::ParseRecord({data, size}, &v).ok()) return;
  if (v.elements > size) fuzz::Fail("a record holds more elements than bytes");
  std::vector<uint16_t> values(v.elements);
  mooncake::DecodeValues(v, values.data());
  std::vector<float> f32(v.elements);
  mooncake::DecodeF32(v, f32.data());
  for (float x : f32)
    if (!(x == x) || x - x != 0.0f) fuzz::Fail("a checked record decodes to a NaN or infinity");
  std::vector<float> scales(v.groups);
  for (uint64_t g = 0; g < v.groups; ++g) scales[g] = v.scale(g);
  std::vector<uint8_t> again;
  Status st = mooncake::EncodeCodes(v.desc, scales.data(), v.codes, &again);
  if (!st.ok()) fuzz::Fail("an accepted record cannot be re-encoded: " + st.ToString());
  if (again.size() != size || std::memcmp(again.data(), data, size) != 0)
    fuzz::Fail("an accepted record is not what its own fields encode to");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kvfile::fuzz::kMaxInputBytes) return -1;
  Check(data, size);
  // The same bytes with their CRC made right, so that mutations reach the
  // checks behind it.
  if (size >= 28) {
    std::vector<uint8_t> sealed(data, data + size);
    uint32_t crc = kvfile::mooncake::RecordCrc(sealed);
    std::memcpy(sealed.data() + 24, &crc, 4);
    Check(sealed.data(), sealed.size());
  }
  return 0;
}
