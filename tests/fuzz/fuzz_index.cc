// SPDX-License-Identifier: Apache-2.0
// Fuzz target: PrefixIndex on an arbitrary .kvfile-index (spec/INDEX.md).
// Beyond not crashing: when every entry of an index reads, a lookup of an
// entry's own token ids under its fingerprint matches all of them.
#include "fuzz/fuzz_support.h"
#include "kvfile/prefix_index.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvfile;
  if (size > fuzz::kMaxInputBytes) return -1;
  std::unique_ptr<testing::FaultFs> fs = fuzz::FsHolding("in.idx", data, size);
  std::unique_ptr<PrefixIndex> ix;
  if (!PrefixIndex::Open("in.idx", fs.get(), &ix).ok()) return 0;
  std::vector<PrefixEntry> entries;
  for (uint64_t i = 0; i < ix->entry_count(); ++i) {
    PrefixEntry e;
    if (!ix->ReadEntry(i, &e).ok()) return 0;
    if (i > 0 && !PrefixEntryLess(entries.back(), e)) return 0;  // out of order across blocks: no promise
    entries.push_back(std::move(e));
  }
  for (const PrefixEntry& e : entries) {
    std::optional<PrefixMatch> m;
    Status st = ix->Lookup(e.tokens, e.fingerprint, &m);
    if (!st.ok()) fuzz::Fail("a lookup in a readable index failed: " + st.ToString());
    if (e.tokens.empty() ? m.has_value() : (!m || m->matched != e.tokens.size()))
      fuzz::Fail("a lookup of an entry's own tokens does not match them all");
  }
  return 0;
}
