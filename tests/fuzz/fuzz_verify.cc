// SPDX-License-Identifier: Apache-2.0
// Fuzz target: VerifyFile on an arbitrary .kv file, quick and full. Beyond
// not crashing, a file the full verification finds clean (no error, no
// warning) must open with the Reader and read back whole: verify is what
// `kvfile verify` users trust to say a file is good.
#include "fuzz/fuzz_support.h"
#include "fuzz/input_fs.h"
#include "kvfile/verify.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvfile;
  if (size > fuzz::kMaxInputBytes) return -1;
  fuzz::InputFs fs("in.kv", {data, size});
  VerifyOptions options;
  options.fs = &fs;
  options.quick = true;
  VerifyReport quick;
  if (!VerifyFile("in.kv", options, &quick).ok()) fuzz::Fail("VerifyFile could not examine a memory file");
  options.quick = false;
  VerifyReport full;
  if (!VerifyFile("in.kv", options, &full).ok()) fuzz::Fail("VerifyFile could not examine a memory file");
  if (!full.opened || full.HasErrors() || full.HasWarnings()) return 0;
  std::unique_ptr<Reader> reader;
  Status st = fuzz::OpenReader(&fs, "in.kv", &reader);
  if (!st.ok()) fuzz::Fail("verify found the file clean, but it does not open: " + st.ToString());
  if (reader->token_count() != full.tokens) fuzz::Fail("verify and the reader count different tokens");
  st = fuzz::ReadEverything(*reader);
  if (!st.ok()) fuzz::Fail("verify found the file clean, but a read fails: " + st.ToString());
  return 0;
}
