// SPDX-License-Identifier: Apache-2.0
// PlanAppend: the geometries and stream order of an append of safetensors
// tensors to a .kv file (kvfile/formats/safetensors_append.h).
#include "kvfile/formats/safetensors_append.h"

#include <algorithm>

namespace kvfile::safetensors {

namespace {

bool Named(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// The geometry the input asks for, in `order` (indexes into kv.streams).
// A stream's dtype: codes keep theirs unless `dtype` says otherwise; a raw
// stream of the file keeps the file's; else `dtype`, else the file's
// stream's, else e4m3. Streams named in `keep_raw` of a new file (`file`
// null) are stored raw (bf16).
Geometry Wanted(const KvTensors& kv, const std::vector<size_t>& order, std::optional<Dtype> dtype,
                const Geometry* file, const std::vector<std::string>& keep_raw) {
  Geometry g;
  g.layers = kv.layers;
  for (size_t i : order) {
    const KvStream& s = kv.streams[i];
    StreamSpec spec{s.name, s.rows_per_token, s.row_width, Dtype::kE4M3, s.layers};
    std::optional<uint32_t> in_file = file ? file->FindStream(s.name) : std::nullopt;
    if (s.is_codes()) spec.dtype = dtype.value_or(s.source_dtype());
    else if (in_file && !IsQuantized(file->streams[*in_file].dtype)) spec.dtype = file->streams[*in_file].dtype;
    else if (dtype) spec.dtype = *dtype;
    else if (in_file) spec.dtype = file->streams[*in_file].dtype;
    if (!file && Named(keep_raw, s.name)) spec.dtype = Dtype::kBF16;
    g.streams.push_back(spec);
  }
  return g;
}

}  // namespace

Status PlanAppend(const KvTensors& kv, const Geometry* existing, uint16_t existing_major,
                  const AppendPlanOptions& options, const std::string& path, const std::string& input,
                  AppendPlan* plan) {
  *plan = AppendPlan{};
  // The upgrade of a v1 file writes fp8 only: dtype nvfp4 leaves it e4m3.
  plan->upgrade_dtype = options.upgrade_dtype ? *options.upgrade_dtype
                        : options.dtype && IsFp8(*options.dtype) ? *options.dtype
                                                                 : Dtype::kE4M3;
  if (existing == nullptr) {
    for (size_t i = 0; i < kv.streams.size(); ++i) plan->stream_of.push_back(i);
    plan->file = Wanted(kv, plan->stream_of, options.dtype, nullptr, options.keep_raw);
    plan->want = plan->file;
    return plan->file.Validate().WithContext(input);
  }
  plan->file = *existing;
  // A v1 file is upgraded by the writable open: its streams become fp8
  // except the keep_raw ones, and the append is checked against that.
  const bool v1 = existing_major == 1;
  if (v1)
    for (StreamSpec& s : plan->file.streams)
      if (!Named(options.keep_raw, s.name)) s.dtype = plan->upgrade_dtype;
  // Streams are matched by name: the file's order first, then any the file
  // lacks.
  for (const StreamSpec& fs : plan->file.streams)
    for (size_t i = 0; i < kv.streams.size(); ++i)
      if (kv.streams[i].name == fs.name) plan->stream_of.push_back(i);
  for (size_t i = 0; i < kv.streams.size(); ++i)
    if (std::find(plan->stream_of.begin(), plan->stream_of.end(), i) == plan->stream_of.end())
      plan->stream_of.push_back(i);
  plan->want = Wanted(kv, plan->stream_of, options.dtype, &plan->file, options.keep_raw);
  if (v1) {
    // Its upgrade quantizes to fp8 only: nvfp4 is refused before the open,
    // so the upgrade never runs for it.
    for (const StreamSpec& s : plan->want.streams) {
      std::optional<uint32_t> k = plan->file.FindStream(s.name);
      if (k && IsNvfp4(s.dtype) && IsFp8(plan->file.streams[*k].dtype))
        return Status::InvalidArgument(path + ": stream '" + s.name + "' would be appended as nvfp4 (from " + input +
                                       "), but a v1 file is upgraded to e4m3 or e5m2 first; write an nvfp4 copy "
                                       "with `kvfile convert --dtype nvfp4` and append to that");
    }
  }
  return Status::OK();
}

}  // namespace kvfile::safetensors
