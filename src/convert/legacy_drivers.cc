// SPDX-License-Identifier: Apache-2.0
// TEMPORARY, until foreign28's branch merges (issue 28): the rows of the
// llama.cpp, Mooncake and colibri drivers, whose conversions the CLI still
// does itself (tools/kvfile/convert_llama.cc, convert_mooncake.cc,
// convert_coli.cc), and the two things driver.h declares for them. Their
// driver files (llama_driver.cc, mooncake_driver.cc, coli_driver.cc)
// replace this file: delete it at that merge.
#include <filesystem>

#include "convert/driver.h"
#include "kvfile/llama_state.h"
#include "kvfile/reader.h"

namespace kvfile::convert {

namespace {

bool SniffLlama(std::span<const uint8_t> head, const std::string&, bool dir) {
  return !dir && head.size() >= 4 && llama::HasStateMagic(head.data());
}

bool SniffMooncake(std::span<const uint8_t>, const std::string& path, bool dir) {
  std::error_code ec;
  return dir && std::filesystem::is_regular_file(std::filesystem::path(path) / "manifest.json", ec);
}

bool SniffNothing(std::span<const uint8_t>, const std::string&, bool) { return false; }

}  // namespace

const Driver kLlamaDriver = {Format::kLlamaState, false, nullptr, SniffLlama, nullptr, nullptr};
const Driver kMooncakeDriver = {Format::kMooncake, true, nullptr, SniffMooncake, nullptr, nullptr};
const Driver kColiDriver = {Format::kColi, false, ".coli_kv", SniffNothing, nullptr, nullptr};

Status BeginDirectoryOutput(const Driver&, const std::string& out, bool, std::string*) {
  return Status::Unsupported(out + ": directory outputs come with the Mooncake driver");
}

Status CommitDirectoryOutput(const Driver&, const std::string&, const std::string& out) {
  return Status::Unsupported(out + ": directory outputs come with the Mooncake driver");
}

// The copy of tools/kvfile/convert_llama.cc's CheckPlainRows that the
// safetensors export calls (driver.h); foreign28 moves that one here.
Status CheckPlainRows(const std::string& in, const Reader& r, std::string* warning) {
  std::optional<llama::Provenance> prov = llama::ParseModelId(r.identity().model_id);
  if (!prov) return Status::OK();
  const Geometry& g = r.geometry();
  for (bool v : {false, true}) {
    std::optional<uint32_t> i = g.FindStream(v ? "v" : "k");
    if (!i) continue;
    llama::CacheType t = v ? prov->v_type : prov->k_type;
    llama::Rotation rot = llama::StreamRotation(*prov, v, g.streams[*i].row_width);
    std::string what = std::string(v ? "v" : "k") + " rows (imported from a llama.cpp " + llama::CacheTypeName(t) +
                       " cache with heads of " + std::to_string(g.streams[*i].row_width) + ", rotated=" +
                       llama::RotationName(rot) + ")";
    if (rot == llama::Rotation::kYes)
      return Status::InvalidArgument(in + ": the " + what + " are Hadamard-rotated, not plain " +
                                     (v ? "values" : "keys") +
                                     ": import the llama.cpp file again with --unrotate, or export with --format "
                                     "llama-seq|llama-session (which un-rotates them for a float cache)");
    if (rot == llama::Rotation::kUnknown && warning->empty())
      *warning = in + ": the " + what + " may be Hadamard-rotated (llama.cpp does so unless "
                 "LLAMA_ATTN_ROT_DISABLE=1): import with --rotated yes --unrotate, or --rotated no, to say which";
  }
  return Status::OK();
}

}  // namespace kvfile::convert
