// SPDX-License-Identifier: Apache-2.0
// The kvfile naming convention over safetensors (kvfile/formats/safetensors.h, "The
// kvfile convention"): the names it gives tensors and metadata, in one
// place for both directions. DescribeKv reads a file by them (import);
// PlanExport lays one out by them (the safetensors driver's export).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvfile/geometry.h"
#include "kvfile/formats/safetensors.h"
#include "kvfile/status.h"

namespace kvfile::safetensors::naming {

inline constexpr std::string_view kTokens = "tokens";              // the token ids
inline constexpr std::string_view kCodesSuffix = ".codes";               // <stream>.codes
inline constexpr std::string_view kScalesSuffix = ".scales";             // <stream>.scales
inline constexpr std::string_view kBlockScalesSuffix = ".block_scales";  // <stream>.block_scales (nvfp4)
inline constexpr std::string_view kModelKey = "kvfile.model";
inline constexpr std::string_view kFingerprintKey = "kvfile.fingerprint";
inline constexpr std::string_view kLayerCountKey = "kvfile.layer_count";
// "kvfile.shape.<stream>": an nvfp4 stream's ROWSxWIDTH.
inline std::string ShapeKey(const std::string& stream) { return "kvfile.shape." + stream; }
// "kvfile.layers.<stream>": the layers a stream is in (FormatLayerList).
inline std::string LayersKey(const std::string& stream) { return "kvfile.layers." + stream; }

// True for a stream name the convention cannot carry: "tokens", or one
// ending in a part's suffix (an import would read it as that part).
bool IsReserved(const std::string& stream);

// What one tensor of an export holds: a stream's values, or one stored
// part of its quantized dtype (kDtypeTable's parts).
struct ExportTensor {
  uint32_t stream = 0;
  std::optional<DtypePart> part;  // none: values
  Dtype dtype = Dtype::kBF16;     // the values' dtype, or the stream's stored dtype
};

// The layout of an export of `tokens` tokens of a .kv of geometry `g`:
// tensors[0] is the token ids (I64); tensors[i + 1] holds items[i]. With
// `codes`, quantized streams as stored (codes and scales), raw streams as
// stored; else every stream decoded to `values`. kInvalidArgument (naming
// `in`) for a stream named by a reserved name.
struct ExportLayout {
  std::vector<TensorInfo> tensors;
  std::vector<ExportTensor> items;
  std::map<std::string, std::string> metadata;
};
Status PlanExport(const std::string& in, const Geometry& g, const ModelIdentity& id, uint64_t tokens, bool codes,
                  Dtype values, ExportLayout* out);

// The index of model layer `layer` in stream `stream`'s tensors (which hold
// the stream's own layers only).
uint64_t TensorLayer(const Geometry& g, uint32_t layer, uint32_t stream);

}  // namespace kvfile::safetensors::naming
