// SPDX-License-Identifier: Apache-2.0
// Fuzz target: an arbitrary .kv file (v1 or v2) opened with Reader::Open,
// then every token id and every row of every chunk, layer and stream read
// back (see ReadEverything). Damage must give a Status, never a crash, a
// hang or an allocation out of proportion to the file.
#include "fuzz/fuzz_support.h"
#include "fuzz/input_fs.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvfile;
  if (size > fuzz::kMaxInputBytes) return -1;
  fuzz::InputFs fs("in.kv", {data, size});
  std::unique_ptr<Reader> reader;
  if (!fuzz::OpenReader(&fs, "in.kv", &reader).ok()) return 0;
  (void)fuzz::ReadEverything(*reader);
  return 0;
}
