// SPDX-License-Identifier: Apache-2.0
// Converting between .kv and the foreign formats (docs/formats.md): one
// entry point for every format, the one the CLI's `kvfile convert`, the C API
// (kvfile_convert) and the Python module (kvfile.convert) call. Stable tier.
//
// Convert(IN, OUT) is one transaction: OUT is afterwards either what it was
// before (or absent) or the whole result, never a part (kvfile/replace.h; a
// directory output is written in a temporary directory renamed into place).
// A .kv input is verified first: damage is never converted silently; with
// `salvage` its verified prefix is converted and a warning says what was
// left out. Foreign -> foreign goes through a temporary .kv.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kvfile/dtype.h"
#include "kvfile/export.h"
#include "kvfile/status.h"

namespace kvfile {

class FileSystem;

enum class Format : uint8_t { kKv, kSafetensors, kLlamaState, kMooncake, kColi };
inline constexpr int kFormatCount = 5;

// "kv", "safetensors", "llama", "mooncake", "coli".
KVFILE_EXPORT const char* FormatName(Format f);
// The names above; another name is kInvalidArgument.
KVFILE_EXPORT Status ParseFormat(std::string_view name, Format* f);
// By content first (a file's first bytes; a directory's manifest), then by
// name (its suffix); a path that does not exist yet (an output,
// is_output = true) by name only. kNotFound / kInvalidArgument with one
// readable line otherwise. fs: nullptr for the default (s3:// included).
KVFILE_EXPORT Status DetectFormat(const std::string& path, bool is_output, FileSystem* fs, Format* f);

// llama.cpp state files (import: head_size, model, rotated, unrotate;
// export: the rest).
struct LlamaOptions {
  std::optional<uint32_t> head_size;
  std::optional<std::string> model;
  std::optional<bool> rotated;
  bool unrotate = false;
  bool session = false;
  std::optional<std::string> type;
  std::optional<uint32_t> v_trans;
  std::optional<std::string> arch;
  std::optional<uint32_t> n_stream;
};
struct MooncakeOptions {
  std::optional<uint32_t> group_size;
};
struct ColiOptions {
  std::optional<uint32_t> vocab;
  bool v1 = false;
  std::optional<std::string> indexer_layers;
};

struct ConvertOptions {
  std::optional<Format> to;              // default: DetectFormat(out, is_output = true)
  uint16_t kv_major = 2;                 // a .kv output's format (1 or 2)
  std::optional<Dtype> dtype;            // the target-dtype policy of docs/cli.md (convert --dtype)
  bool every_stream = false;             // a quantized dtype quantizes raw streams too (not kept raw)
  std::set<std::string> keep_raw;        // streams kept raw
  bool codes = false;                    // safetensors export: codes and scales instead of values
  std::optional<uint32_t> chunk_tokens;  // else the one rule (FitChunkTokens)
  bool salvage = false;                  // a damaged .kv input: convert its verified prefix, and warn
  bool force = false;                    // replace an existing output
  FileSystem* fs = nullptr;              // nullptr: the default (s3:// included)
  // Polled between batches; true: the conversion stops there, OUT is left as
  // it was, and Convert returns kFailed "OUT: interrupted".
  std::function<bool()> interrupted;
  // Called as work is done: `done` of `total` units of the step `label`
  // ("convert IN", "import IN", "export IN"); done == total at its end.
  // nullptr: nothing reported.
  std::function<void(const std::string& label, uint64_t done, uint64_t total)> progress;
  // Each format's own options apply where IN or OUT is of that format (llama:
  // head_size, model and unrotate to an IN, rotated to either, the rest to an
  // OUT); one set where it does not apply is kInvalidArgument, not ignored.
  LlamaOptions llama;
  MooncakeOptions mooncake;  // a Mooncake OUT
  ColiOptions coli;          // vocab, v1: a colibri OUT; indexer_layers: a colibri IN
};

struct ConvertReport {
  Format from{}, to{};
  uint64_t tokens = 0;                // tokens written
  std::string summary;                // what was written, one line (the CLI prints "IN -> OUT: " before it)
  std::vector<std::string> warnings;  // each one line (salvage, rotation, ...)
  std::vector<std::string> notes;     // each one line: remarks that are no warning (requantized records, ...)
  std::string out_name;               // OUT as the caller named it (set by Convert before a driver runs)
};

// IN -> OUT as one transaction (see above). report may be nullptr.
KVFILE_EXPORT Status Convert(const std::string& in, const std::string& out, const ConvertOptions& o,
                             ConvertReport* report);

}  // namespace kvfile
