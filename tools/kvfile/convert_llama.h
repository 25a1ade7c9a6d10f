// SPDX-License-Identifier: Apache-2.0
// kvfile convert to and from llama.cpp state files (sequence state 'ggsq',
// session 'ggsn'): the import into a .kv file and the export of a .kv file
// whose streams are k and v. cmd_convert.cc dispatches here.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "kvfile/geometry.h"
#include "kvfile/llama_state.h"
#include "kvfile/reader.h"
#include "kvfile/status.h"
#include "kvfile/writer.h"

namespace kvfile::cli {

// True if `path` is a regular file starting with a llama.cpp state magic.
bool IsLlamaStateFile(const std::string& path);

struct LlamaImport {
  std::optional<Dtype> dtype;       // --dtype (default e4m3)
  std::set<std::string> keep_raw;   // streams stored raw (a raw --dtype, else lossless: the cache's type, f32 for q8_0)
  std::optional<uint32_t> head_size;  // values per KV head (default 128 when it divides the rows)
  std::optional<uint32_t> chunk_tokens;
  uint16_t major = 2;
};
Status ImportLlama(const std::string& in, const std::string& tmp, const LlamaImport& o, std::string* summary);
// The geometry and model id an import of the parsed state file `s` gives.
Status PlanLlamaImport(const std::string& in, const llama::StateLayout& s, const LlamaImport& o, Geometry* g,
                       ModelIdentity* id);
// Appends cells [c0, c1) of `s` (read from `f`, named `in`) to `w` as one
// append (batches marked continued), checking for an interrupt between them.
Status AppendLlamaCells(const std::string& in, File& f, const llama::StateLayout& s, uint64_t c0, uint64_t c1,
                        Writer& w);

struct LlamaExport {
  bool session = false;               // --format llama-session (else llama-seq)
  std::optional<std::string> type;    // --dtype: f16 (default), bf16, f32, q8_0
  std::optional<uint32_t> v_trans;    // --v-trans (default: the imported file's, else 0)
  std::optional<std::string> arch;    // --arch (default: the imported file's)
};
// Where an export puts the cells, when not where the imported file had them
// (kvfile llama-server restore: the stream and sequence of the server's slot).
struct LlamaPlacement {
  uint32_t n_stream = 1;
  uint32_t stream = 0;
  int32_t seq_id = 0;
};
// Exports the first `tokens` tokens of `r` (read from `in`).
Status ExportLlama(const std::string& in, Reader& r, uint64_t tokens, const std::string& tmp, const LlamaExport& o,
                   std::string* summary, std::string* warning, const LlamaPlacement* at = nullptr);

}  // namespace kvfile::cli
