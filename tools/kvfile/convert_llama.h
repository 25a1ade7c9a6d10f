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
  std::optional<uint32_t> head_size;  // values per KV head (required: the file does not record it)
  std::optional<uint32_t> chunk_tokens;
  uint16_t major = 2;
  std::optional<std::string> model;  // --model: a GGUF model file that gives the head size
  std::optional<bool> rotated;  // --rotated yes|no: whether llama.cpp rotated a quantized cache
  bool unrotate = false;        // --unrotate: store rotated rows un-rotated (plain keys and values)
};
Status ImportLlama(const std::string& in, const std::string& tmp, const LlamaImport& o, std::string* summary);
// The geometry and model id an import of the parsed state file `s` gives.
Status PlanLlamaImport(const std::string& in, const llama::StateLayout& s, const LlamaImport& o, Geometry* g,
                       ModelIdentity* id);
// Appends cells [c0, c1) of `s` (read from `f`, named `in`) to `w` as one
// append (batches marked continued), checking for an interrupt between them;
// unrotate_head: not 0, the head size of rows to un-rotate (--unrotate).
Status AppendLlamaCells(const std::string& in, File& f, const llama::StateLayout& s, uint32_t unrotate_head,
                        uint64_t c0, uint64_t c1, Writer& w);

struct LlamaExport {
  bool session = false;               // --format llama-session (else llama-seq)
  std::optional<std::string> type;    // --dtype: TYPE or k=TYPE,v=TYPE (default: as imported, else f16)
  std::optional<uint32_t> v_trans;    // --v-trans (default: the imported file's, else 0)
  std::optional<std::string> arch;    // --arch (default: the imported file's)
  std::optional<bool> rotated;        // --rotated: whether the context rotates (default: as llama.cpp does)
  std::optional<uint32_t> n_stream;   // --n-stream: cache streams (default: as imported, else 1)
};
// Where an export puts the cells, when not where the imported file had them
// (kvfile llama-server restore: the stream and sequence of the server's slot).
struct LlamaPlacement {
  uint32_t n_stream = 1;
  uint32_t stream = 0;
  int32_t seq_id = 0;
};
// Checks a llama.cpp export's --dtype: one of f16, bf16, f32, q8_0 for both
// streams, or k=TYPE and/or v=TYPE, comma separated.
Status CheckLlamaDtype(const std::string& spec);

// Refuses (rotated=yes) or warns about (rotated=unknown, a type and head
// size llama.cpp rotates) an export of `r`'s k and v rows to a consumer
// that takes them for plain keys and values: rows imported from a
// llama.cpp quantized cache may be Hadamard-rotated.
Status CheckPlainRows(const std::string& in, const Reader& r, std::string* warning);
// Exports the first `tokens` tokens of `r` (read from `in`).
Status ExportLlama(const std::string& in, Reader& r, uint64_t tokens, const std::string& tmp, const LlamaExport& o,
                   std::string* summary, std::string* warning, const LlamaPlacement* at = nullptr);

}  // namespace kvfile::cli
