// SPDX-License-Identifier: Apache-2.0
// The preset geometries. Shapes follow the published model configurations:
// Llama 3.1 8B (32 layers, 8 KV heads of 128), Qwen2.5 7B (28 layers, 4 KV
// heads of 128), DeepSeek-V3 (61 layers, MLA latent 512 + decoupled RoPE key
// 64), and a DeepSeek sparse-attention cache whose lightning-indexer keys
// (128 dims) stay bf16 beside the fp8 latent; and GLM-5.2 (78 MLA layers
// of the same shape, its indexer kept in 21 of them: docs/presets.md).
#include "kvfile/presets.h"

namespace kvfile {

namespace {

struct PresetStream {
  const char* name;
  uint32_t rows;
  uint32_t width;
  bool raw_bf16;  // stored bf16 whatever the fp8 dtype
  std::vector<uint32_t> layers = {};  // empty: every layer
};

// GLM-5.2's indexer layers: one full indexer per four layers (IndexShare),
// 21 of the 78 as colibri writes h[4]: layers 0, 4, ..., 76 and 77.
std::vector<uint32_t> Glm52IndexerLayers() {
  std::vector<uint32_t> l;
  for (uint32_t i = 0; i < 78; i += 4) l.push_back(i);
  l.push_back(77);
  return l;
}

struct Preset {
  const char* name;
  uint32_t layers;
  std::vector<PresetStream> streams;
};

const std::vector<Preset>& Presets() {
  static const std::vector<Preset> presets = {
      {"llama-3.1-8b", 32, {{"k", 8, 128, false}, {"v", 8, 128, false}}},
      {"qwen2.5-7b", 28, {{"k", 4, 128, false}, {"v", 4, 128, false}}},
      {"deepseek-v3", 61, {{"latent", 1, 512, false}, {"rope", 1, 64, false}}},
      {"dsa-mixed", 61, {{"latent", 1, 512, false}, {"rope", 1, 64, false}, {"indexer", 1, 128, true}}},
      {"glm-5.2", 78,
       {{"latent", 1, 512, false}, {"rope", 1, 64, false}, {"indexer", 1, 128, true, Glm52IndexerLayers()}}},
      {"tiny", 2, {{"k", 2, 16, false}, {"v", 2, 16, false}}},
  };
  return presets;
}

}  // namespace

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : Presets()) names.emplace_back(p.name);
  return names;
}

Status GetPreset(std::string_view name, Dtype fp8_dtype, Geometry* out) {
  // Every preset's rows x width is a multiple of 16, as nvfp4 needs.
  if (!IsQuantized(fp8_dtype))
    return Status::InvalidArgument(std::string("preset dtype must be e4m3, e5m2 or nvfp4, not ") +
                                   DtypeName(fp8_dtype));
  for (const Preset& p : Presets()) {
    if (name != p.name) continue;
    Geometry g;
    g.layers = p.layers;
    for (const PresetStream& s : p.streams)
      g.streams.push_back({s.name, s.rows, s.width, s.raw_bf16 ? Dtype::kBF16 : fp8_dtype, s.layers});
    *out = std::move(g);
    return Status::OK();
  }
  std::string known;
  for (const Preset& p : Presets()) known += (known.empty() ? "" : ", ") + std::string(p.name);
  return Status::InvalidArgument("unknown preset '" + std::string(name) + "' (known: " + known + ")");
}

}  // namespace kvfile
