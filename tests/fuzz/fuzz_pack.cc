// SPDX-License-Identifier: Apache-2.0
// Fuzz target: PackReader on an arbitrary .kvpack. Beyond not crashing, a
// pack that Verify finds clean must give every member back: its record and
// chunks read, and its materialised .kv opens with the member's token ids.
#include "fuzz/fuzz_support.h"
#include "kvfile/pack.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvfile;
  if (size > fuzz::kMaxInputBytes) return -1;
  std::unique_ptr<testing::FaultFs> fs = fuzz::FsHolding("in.kvpack", data, size);
  std::unique_ptr<PackReader> pack;
  if (!PackReader::Open("in.kvpack", fs.get(), &pack).ok()) return 0;
  PackVerifyReport report;
  if (!pack->Verify(&report).ok()) return 0;
  if (report.members != pack->members().size() || report.chunks != pack->chunks().size())
    fuzz::Fail("Verify's counts differ from the tables");
  std::vector<uint32_t> tokens, ids;
  for (size_t i = 0; i < pack->members().size(); ++i) {
    if (!pack->ReadMember(i, &tokens, &ids).ok()) fuzz::Fail("a verified member's record does not read");
    Status st = pack->Materialize(i, "out.kv");
    if (!st.ok()) fuzz::Fail("a verified member does not materialise: " + st.ToString());
    std::unique_ptr<Reader> reader;
    st = fuzz::OpenReader(fs.get(), "out.kv", &reader);
    if (!st.ok()) fuzz::Fail("a materialised member does not open: " + st.ToString());
    if (!std::equal(tokens.begin(), tokens.end(), reader->tokens().begin(), reader->tokens().end()))
      fuzz::Fail("a materialised member holds other token ids");
    st = fuzz::ReadEverything(*reader);
    if (!st.ok()) fuzz::Fail("a materialised member does not read back: " + st.ToString());
  }
  return 0;
}
