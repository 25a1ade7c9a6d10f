// SPDX-License-Identifier: Apache-2.0
// Geometry and model identity: what a .kv file stores per token, and for
// which model. These are the logical contents of the file header.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvfile/export.h"
#include "kvfile/dtype.h"
#include "kvfile/status.h"

namespace kvfile {

// One stream: `rows_per_token` rows of `row_width` elements per token (for
// example stream "k" of a GQA model: one row per kv head), in every layer or
// in the layers `layers` lists (spec/FORMAT.md 3.2; a sparse-attention
// indexer kept in 21 of 78 layers).
struct StreamSpec {
  StreamSpec() = default;
  // {name, rows, width, dtype}: a stream in every layer, as most models have.
  StreamSpec(std::string n, uint32_t rows, uint32_t width, Dtype d = Dtype::kE4M3, std::vector<uint32_t> in_layers = {})
      : name(std::move(n)), rows_per_token(rows), row_width(width), dtype(d), layers(std::move(in_layers)) {}

  std::string name;
  uint32_t rows_per_token = 0;
  uint32_t row_width = 0;
  Dtype dtype = Dtype::kE4M3;
  // The layers the stream is present in, ascending; empty: every layer. A
  // list of every layer is invalid (it is written empty), so that one
  // geometry has one value.
  std::vector<uint32_t> layers;

  bool operator==(const StreamSpec&) const = default;
  uint64_t ElementsPerToken() const { return uint64_t{rows_per_token} * row_width; }
};

struct KVFILE_EXPORT Geometry {
  uint32_t layers = 0;
  std::vector<StreamSpec> streams;

  bool operator==(const Geometry&) const = default;
  // Checks the limits of spec/FORMAT.md ("Limits") and the stream names.
  Status Validate() const;
  std::optional<uint32_t> FindStream(std::string_view name) const;
  // Bytes one token occupies in the payload (codes + scales or raw rows),
  // summed over layers and streams, without alignment padding.
  uint64_t PayloadBytesPerToken() const;
  // Whether stream `stream` is present in `layer` (both in range).
  bool InLayer(uint32_t layer, uint32_t stream) const;
  // How many layers stream `stream` is present in.
  uint32_t StreamLayers(uint32_t stream) const;
  // Whether some stream is absent from some layer (the file's LAYER_SETS flag).
  bool HasLayerSets() const;
  // The (layer, stream) sections of a chunk: the sum of StreamLayers.
  uint64_t SectionCount() const;
};

// "3,5,7..9" -> {3, 5, 7, 8, 9}: a stream's layers as the CLI and the docs
// write them (ascending, no repeats); ParseLayerList refuses anything else
// naming the text. FormatLayerList writes the shortest such text.
KVFILE_EXPORT Status ParseLayerList(std::string_view text, std::vector<uint32_t>* out);
KVFILE_EXPORT std::string FormatLayerList(const std::vector<uint32_t>& layers);

struct ModelIdentity {
  std::string model_id;      // at most 255 bytes of UTF-8
  uint64_t fingerprint = 0;  // chosen by the writer (e.g. a hash of the weights)

  bool operator==(const ModelIdentity&) const = default;
};

// What a reader expects; Check() names the first difference with the file.
KVFILE_EXPORT Status CheckExpected(const ModelIdentity& file_identity, const Geometry& file_geometry,
                     const ModelIdentity& expected_identity, const Geometry& expected_geometry);

// Bytes of a chunk of `tokens` tokens of geometry `g`, head and padding
// included (spec/FORMAT.md 5); kInvalidArgument when it would pass the
// format's limits (more than 65536 tokens or 1 GiB).
KVFILE_EXPORT Status ChunkBytes(const Geometry& g, uint32_t tokens, uint64_t* bytes);

// "[a-z0-9_.-]{1,31}": stream names are identifiers in tools and safetensors.
KVFILE_EXPORT bool IsValidStreamName(std::string_view name);

}  // namespace kvfile
