// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the .coli_kv importer on an arbitrary file, the way
// `kvfile convert X.coli_kv OUT.kv` runs it, into a memory file system. An
// import that succeeds reads back whole, with the header's record count;
// a COLIKV2 import exports back to exactly the committed bytes of the input.
#include <algorithm>
#include <cstring>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "kvfile/formats/coli_kv.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvfile;
  if (size > fuzz::kMaxInputBytes) return -1;
  // A header may declare records of up to 64 MiB with none present; the
  // new file's staging would then be as large. Not worth fuzzing here.
  coli::Header h;
  if (size >= coli::kHeaderBytes && coli::ParseHeader(data, size, &h).ok() && h.record_bytes > (uint64_t{1} << 20))
    return 0;
  auto fs = fuzz::FsHolding("in.coli_kv", data, size);
  coli::ImportResult res;
  coli::ImportOptions io;
  io.fs = fs.get();
  // An indexer in some layers only: the header does not say which, so the
  // user names them (--indexer-layers); here the first h[4] layers, the
  // export then writes the same h[4] back.
  if (size >= coli::kHeaderBytes && coli::ParseHeader(data, size, &h).ok() && h.indexer_layers > 0 &&
      h.indexer_layers < h.layers) {
    io.indexer_layers = std::vector<uint32_t>(h.indexer_layers);
    for (uint32_t i = 0; i < h.indexer_layers; ++i) (*io.indexer_layers)[i] = i;
  }
  Status st = coli::Import("in.coli_kv", "out.kv", io, &res);
  if (!st.ok()) {
    if (!st.IsDataError()) fuzz::Fail("a bad session is not a data error: " + st.ToString());
    return 0;
  }
  std::unique_ptr<Reader> reader;
  st = fuzz::OpenReader(fs.get(), "out.kv", &reader);
  if (!st.ok()) fuzz::Fail("the imported file does not open: " + st.ToString());
  if (reader->token_count() != res.header.records) fuzz::Fail("the import has another token count");
  st = fuzz::ReadEverything(*reader);
  if (!st.ok()) fuzz::Fail("the imported file does not read back: " + st.ToString());
  reader.reset();
  if (res.header.version != 2) return 0;
  coli::ExportOptions o;
  o.fs = fs.get();
  uint64_t tokens = 0;
  st = coli::Export("out.kv", "back.coli_kv", o, &tokens);
  if (!st.ok()) fuzz::Fail("an imported COLIKV2 session does not export: " + st.ToString());
  std::unique_ptr<File> f;
  uint64_t n = 0;
  if (!fs->Open("back.coli_kv", OpenMode::kRead, &f).ok() || !f->Size(&n).ok()) fuzz::Fail("no exported file");
  uint64_t committed = coli::kHeaderBytes + uint64_t{res.header.records} * res.header.record_bytes;
  if (n != committed) fuzz::Fail("the export is not the size of the committed records");
  std::vector<uint8_t> back(n);
  if (!f->ReadAt(0, back.data(), n).ok() || std::memcmp(back.data(), data, n) != 0)
    fuzz::Fail("the export differs from the input's committed bytes");
  return 0;
}
