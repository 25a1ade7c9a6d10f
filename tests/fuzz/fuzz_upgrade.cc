// SPDX-License-Identifier: Apache-2.0
// Fuzz target: an arbitrary file opened for writing with Writer::Open, in
// memory: a v1 file is upgraded to v2 (a v2 file goes through recovery),
// and whatever the writer leaves must read back whole with the same tokens
// the Reader saw in the input. The input is also read as it is, so v1
// parsing and the on-the-fly quantization of ReadCodes are covered too.
#include <algorithm>

#include "fuzz/fuzz_support.h"
#include "format/kv_format.h"
#include "kvfile/writer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvfile;
  if (size > fuzz::kMaxInputBytes) return -1;
  auto fs = fuzz::FsHolding("in.kv", data, size);
  std::unique_ptr<Reader> before;
  std::vector<uint32_t> tokens_before;
  bool readable = fuzz::OpenReader(fs.get(), "in.kv", &before).ok();
  if (readable) {
    tokens_before.assign(before->tokens().begin(), before->tokens().end());
    readable = fuzz::ReadEverything(*before).ok();
    before.reset();
  }

  WriterOptions options;
  options.fs = fs.get();
  std::unique_ptr<Writer> writer;
  if (!Writer::Open("in.kv", options, &writer).ok()) return 0;
  const uint64_t written = writer->token_count();
  // An upgrade checks every value it copies; recovery of a v2 file reads no
  // payload, so damage a reader of the input saw may stay.
  const bool must_read_back = writer->recovery().upgraded_from_v1 || readable;
  Status st = writer->Close();
  if (!st.ok()) fuzz::Fail("closing a memory file failed: " + st.ToString());
  writer.reset();

  std::unique_ptr<Reader> after;
  st = fuzz::OpenReader(fs.get(), "in.kv", &after);
  if (!st.ok()) fuzz::Fail("the file Writer::Open left does not open: " + st.ToString());
  if (after->major_version() != format::kMajorV2) fuzz::Fail("Writer::Open left a file that is not v2");
  if (after->token_count() != written) fuzz::Fail("the writer and the reader count different tokens");
  // Recovery and the upgrade keep exactly the tokens a reader of the input
  // returns (a torn or damaged tail is cut for both).
  if (readable && !std::ranges::equal(tokens_before, after->tokens()))
    fuzz::Fail("Writer::Open changed the token sequence a reader of the input saw");
  st = fuzz::ReadEverything(*after);
  if (must_read_back && !st.ok()) fuzz::Fail("the file Writer::Open left does not read back: " + st.ToString());
  return 0;
}
