// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the llama.cpp state file importer on an arbitrary file, the
// way `kvfile convert x.bin y.kv` reads it: the layout check, every cell of
// every layer's K and V decoded, then the values written back as a new
// state file (StateWriter, in memory) that must parse to the same layout.
#include <algorithm>

#include "fuzz/fuzz_support.h"
#include "kvfile/formats/llama_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvfile;
  namespace ll = kvfile::llama;
  if (size > fuzz::kMaxInputBytes) return -1;
  auto fs = fuzz::FsHolding("in.bin", data, size);
  std::unique_ptr<File> in;
  if (!fs->Open("in.bin", OpenMode::kRead, &in).ok()) fuzz::Fail("cannot open the input");
  ll::StateLayout s;
  if (!ll::ParseState(*in, "in.bin", &s).ok()) return 0;
  if (s.cells == 0 || s.tokens.size() != s.cells) fuzz::Fail("a layout without one token per cell was accepted");

  ll::WriteSpec w;
  w.kind = s.kind;
  w.arch = s.arch;
  w.n_stream = s.n_stream;
  w.stream = s.stream;
  w.seq_id = s.seq_id;
  w.first_pos = s.first_pos;
  w.v_trans = s.v_trans;
  w.k_type = s.k[0].type;
  w.v_type = s.v[0].type;
  w.layers = s.layers;
  w.k_width = s.k_width;
  w.v_width = s.v_width;
  if (s.cache_layers.size() > 1) w.cache_layers = s.cache_layers;  // an iSWA file's two caches
  if (!ll::CheckWriteSpec(w).ok()) fuzz::Fail("the layout of an accepted file cannot be written");
  if (ll::StateFileSize(w, s.cells) != size) fuzz::Fail("the accepted layout does not fill the file");
  std::unique_ptr<File> out;
  if (!fs->Open("out.bin", OpenMode::kCreateExclusive, &out).ok()) fuzz::Fail("cannot create the output");
  ll::StateWriter sw(out.get(), w, s.cells);
  if (!sw.Header(s.tokens).ok()) fuzz::Fail("header write failed");
  // Blocks of up to 7 cells, so that writes at an offset are covered. The
  // f32 values are at most 4x the bytes they come from (q8_0: 34 -> 128).
  std::vector<float> vals;
  for (int part = 0; part < 2; ++part)
    for (uint32_t l = 0; l < s.layers; ++l)
      for (uint32_t c0 = 0; c0 < s.cells; c0 += 7) {
        uint32_t c1 = std::min(s.cells, c0 + 7);
        vals.resize(uint64_t{c1 - c0} * (part ? s.v_width : s.k_width));
        Status st = ll::ReadCells(*in, s, part == 1, l, c0, c1, vals.data());
        if (!st.ok()) fuzz::Fail("reading cells of an accepted file failed: " + st.ToString());
        if (!sw.Rows(part == 1, l, c0, c1 - c0, vals.data()).ok()) fuzz::Fail("row write failed");
      }
  ll::StateLayout t;
  Status st = ll::ParseState(*out, "out.bin", &t);
  if (!st.ok()) fuzz::Fail("the rewritten file does not parse: " + st.ToString());
  if (t.kind != s.kind || t.tokens != s.tokens || t.cells != s.cells || t.layers != s.layers ||
      t.k_width != s.k_width || t.v_width != s.v_width || t.v_trans != s.v_trans || t.stream != s.stream ||
      t.n_stream != s.n_stream || t.seq_id != s.seq_id || t.first_pos != s.first_pos || t.arch != s.arch ||
      t.cache_layers != s.cache_layers)
    fuzz::Fail("the rewritten file parses to another layout");
  return 0;
}
