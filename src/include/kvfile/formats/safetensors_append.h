// SPDX-License-Identifier: Apache-2.0
// Experimental tier (kvfile/formats/): may change between minor releases; docs/api.md, "Header tiers".
// How the tensors of a safetensors file in the kvfile convention
// (kvfile/formats/safetensors.h) are appended to a .kv file, new or existing: the
// geometry each side has and which input stream feeds which stream of the
// file. `kvfile append` asks this before it opens anything for writing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvfile/export.h"
#include "kvfile/geometry.h"
#include "kvfile/formats/safetensors.h"
#include "kvfile/status.h"

namespace kvfile::safetensors {

struct AppendPlanOptions {
  // The dtype of the quantized streams (e4m3, e5m2 or nvfp4). Unset: codes
  // keep their own dtype; values go into a quantized stream of an existing
  // file as that stream's dtype, into a new file as e4m3. A raw stream of
  // an existing file keeps its dtype whatever this says.
  std::optional<Dtype> dtype;
  // A v1 file is upgraded to v2 by the writable open: the fp8 dtype of its
  // streams after it. Unset: `dtype` when it is fp8, else e4m3.
  std::optional<Dtype> upgrade_dtype;
  // Streams kept raw by a v1 file's upgrade; in a new file, stored raw
  // (bf16).
  std::vector<std::string> keep_raw;
};

struct AppendPlan {
  Dtype upgrade_dtype = Dtype::kE4M3;  // what a v1 file's upgrade quantizes to
  // The file's geometry once it is open for writing: an existing file's
  // (a v1 file's after its upgrade), or the new file's.
  Geometry file;
  // What the input asks for: its streams matched to the file's by name,
  // in the file's order, then any the file lacks (CheckExpected(file, want)
  // names them). For a new file, `file` itself.
  Geometry want;
  // The input stream (an index into KvTensors::streams) of each of want's
  // streams: AppendAll's stream_of.
  std::vector<size_t> stream_of;
};

// Plans the append of `kv` to a file `path` whose geometry and format major
// version are `existing` and `existing_major`, or (existing null) to a new
// file. `input` names the safetensors file in messages. Refuses:
//   - a new file's geometry that Geometry::Validate refuses (its message,
//     with `input` as context);
//   - an nvfp4 stream into a v1 file, which its upgrade makes fp8
//     (kInvalidArgument: "PATH: stream 'k' would be appended as nvfp4
//     (from INPUT), but a v1 file is upgraded to e4m3 or e5m2 first; ...").
// A model or geometry that differs from the file's is not refused here:
// CheckExpected(identity, plan.file, wanted identity, plan.want) does.
KVFILE_EXPORT Status PlanAppend(const KvTensors& kv, const Geometry* existing, uint16_t existing_major,
                                const AppendPlanOptions& options, const std::string& path, const std::string& input,
                                AppendPlan* plan);

}  // namespace kvfile::safetensors
