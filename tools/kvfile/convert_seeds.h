// SPDX-License-Identifier: Apache-2.0
// kvfile convert for the seeds' own formats: a directory of Mooncake FP8
// codec records (convert_mooncake.cc) and colibri .coli_kv sessions
// (convert_coli.cc). cmd_convert.cc hands a conversion over here when one
// side is such a format.
#pragma once

#include <optional>
#include <string>

#include "kvfile/status.h"

namespace kvfile::cli {

struct SeedConvertArgs {
  std::string in;
  std::string out;
  std::string format;                  // --format (v2 when not given)
  std::optional<uint32_t> group_size;  // --group-size
  std::optional<uint32_t> vocab;       // --vocab
  bool force = false;
  bool other_flags = false;  // --dtype, --keep-raw, --codes, --chunk-tokens, --salvage or --jobs given
  std::optional<std::string> indexer_layers;  // --indexer-layers (a .coli_kv IN)
};

// True when IN or OUT is a Mooncake directory or a .coli_kv file (or the
// flags ask for one); the conversion is then done and *exit_code set.
bool ConvertSeedFormat(const SeedConvertArgs& a, int* exit_code);

// The two directions of each format; each returns the exit status.
int ExportMooncake(const SeedConvertArgs& a);
int ImportMooncake(const SeedConvertArgs& a);
int ImportColi(const SeedConvertArgs& a);
int ExportColi(const SeedConvertArgs& a);

// Whether `dir` holds a manifest.json written by ExportMooncake.
bool IsMooncakeDir(const std::string& dir);

// IN must pass kvfile verify before it is converted (damage is never
// converted silently): kCorruption with the first finding otherwise.
Status VerifyBeforeConvert(const std::string& in);

}  // namespace kvfile::cli
