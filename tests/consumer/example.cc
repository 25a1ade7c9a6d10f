// SPDX-License-Identifier: Apache-2.0
// The C++ example of docs/api.md, compiled and run by CI: writes a 16-token
// session shaped like Llama 3.1 8B's cache, reads it back and checks every
// value. Usage: example_cpp [FILE]; exit status 0 only if all matches.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "kvfile/codec.h"
#include "kvfile/presets.h"
#include "kvfile/reader.h"
#include "kvfile/writer.h"

// Element i of (layer, stream) for token t: magnitudes in [0.5, 1), so that
// e4m3 (3 mantissa bits) keeps every value within 1/16 of itself.
static float Value(uint32_t layer, uint32_t stream, uint64_t t, uint64_t i) {
  float v = 0.5f + static_cast<float>((layer * 7 + stream * 3 + t * 5 + i) % 64) / 128.0f;
  return (i % 2 == 0) ? v : -v;
}

static int Fail(const kvfile::Status& st) {
  std::fprintf(stderr, "example: %s\n", st.ToString().c_str());
  return 1;
}

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "example.kv";
  kvfile::Geometry g;
  kvfile::Status st = kvfile::GetPreset("llama-3.1-8b", kvfile::Dtype::kE4M3, &g);
  if (!st.ok()) return Fail(st);
  const size_t streams = g.streams.size();

  // One append: the token ids, and for every layer and stream the rows of
  // those tokens, [tokens][rows_per_token][row_width], here as bf16 bits.
  const std::vector<uint32_t> tokens = {128000, 791, 4062, 14198, 39935, 35308, 927, 279,
                                        16053, 5679, 13, 578, 4062, 374, 6437, 13};
  std::vector<std::vector<uint16_t>> rows(g.layers * streams);
  kvfile::AppendBatch batch;
  batch.tokens = tokens;
  for (uint32_t layer = 0; layer < g.layers; ++layer) {
    for (uint32_t s = 0; s < streams; ++s) {
      std::vector<uint16_t>& block = rows[layer * streams + s];
      block.resize(tokens.size() * g.streams[s].ElementsPerToken());
      for (uint64_t e = 0; e < block.size(); ++e)
        block[e] = kvfile::codec::F32ToBf16(
            Value(layer, s, e / g.streams[s].ElementsPerToken(), e % g.streams[s].ElementsPerToken()));
      batch.blocks.push_back({kvfile::Dtype::kBF16, block.data(), nullptr});
    }
  }
  std::unique_ptr<kvfile::Writer> w;
  kvfile::WriterOptions options;
  options.overwrite = true;
  st = kvfile::Writer::Create(path, g, {"meta-llama/Llama-3.1-8B", 0x5eed}, options, &w);
  if (st.ok()) st = w->Append(batch);  // quantized to fp8 here
  if (st.ok()) st = w->Close();        // durable and committed
  if (!st.ok()) return Fail(st);

  // A later request: open (refusing a file of another shape), find how much
  // of the new prompt is cached, and load that prefix layer by layer.
  kvfile::ReaderOptions ro;
  ro.expect_geometry = g;
  std::unique_ptr<kvfile::Reader> r;
  st = kvfile::Reader::Open(path, ro, &r);
  if (!st.ok()) return Fail(st);
  std::vector<uint32_t> prompt(tokens.begin(), tokens.begin() + 10);
  prompt.push_back(42);
  uint64_t reuse = r->LongestCommonPrefix(prompt);
  if (reuse != 10) {
    std::fprintf(stderr, "example: common prefix %llu, expected 10\n", static_cast<unsigned long long>(reuse));
    return 1;
  }
  for (uint32_t layer = 0; layer < g.layers; ++layer) {
    for (uint32_t s = 0; s < streams; ++s) {
      std::vector<float> got(reuse * g.streams[s].ElementsPerToken());
      st = r->ReadRows(layer, s, 0, reuse, kvfile::Dtype::kF32, got.data());
      if (!st.ok()) return Fail(st);
      for (uint64_t e = 0; e < got.size(); ++e) {
        float want = kvfile::codec::Bf16ToF32(rows[layer * streams + s][e]);
        if (!(std::fabs(got[e] - want) <= std::fabs(want) / 16)) {
          std::fprintf(stderr, "example: layer %u stream %u element %llu: read %g, wrote %g\n", layer, s,
                       static_cast<unsigned long long>(e), got[e], want);
          return 1;
        }
      }
    }
  }
  std::printf("%s: %llu tokens, %llu reusable, every value within fp8 rounding\n", path,
              static_cast<unsigned long long>(r->token_count()), static_cast<unsigned long long>(reuse));
  return 0;
}
