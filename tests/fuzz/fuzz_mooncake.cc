// Fuzz target: the Mooncake FP8 codec record parser on an arbitrary record,
// the way `kvfile convert DIR OUT.kv` reads each record file. A record the
// parser accepts decodes, and is canonical: EncodeCodes of its descriptor,
// scales and codes gives back exactly the input bytes.
#include <cstring>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "kvfile/mooncake.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvfile;
  if (size > fuzz::kMaxInputBytes) return -1;
  mooncake::RecordView v;
  if (!mooncake::ParseRecord({data, size}, &v).ok()) return 0;
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
  return 0;
}
