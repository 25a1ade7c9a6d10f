// SPDX-License-Identifier: Apache-2.0
// Experimental tier (kvfile/formats/): may change between minor releases; docs/api.md, "Header tiers".
// llama.cpp state files (sequence state 'ggsq', session 'ggsn') to and from
// .kv files: what kvfile::Convert's llama.cpp driver does, in the pieces
// that `kvfile llama-server` uses (save: an import appended to an existing
// file; restore: an export placed in the server's slot). The file layout and the provenance
// kept in the .kv model id are in kvfile/formats/llama_state.h.
//
// Formats tier: this header may change between minor releases; the stable
// entry point is kvfile/convert.h.
#pragma once

#include <cstdint>
#include <string>

#include "kvfile/convert.h"
#include "kvfile/export.h"
#include "kvfile/file.h"
#include "kvfile/geometry.h"
#include "kvfile/formats/llama_state.h"
#include "kvfile/reader.h"
#include "kvfile/status.h"
#include "kvfile/writer.h"

namespace kvfile::llama {

// The geometry and model id an import of the parsed state file `s` (read
// from `in`) gives: streams k and v of [KV heads] x head size, stored as
// o.dtype (default e4m3), or raw where o.keep_raw names them (a raw o.dtype,
// else the cache's own type, f32 for q8_0); the head size from
// o.llama.head_size or o.llama.model's GGUF; the rotation from
// o.llama.rotated / o.llama.unrotate. kInvalidArgument with the reason
// (a missing or contradicting head size, a rotation flag for rows that are
// never rotated, ...).
KVFILE_EXPORT Status PlanImport(const std::string& in, const StateLayout& s, const ConvertOptions& o, Geometry* g,
                                ModelIdentity* id);

// Imports the state file `in` into a new .kv file at kv_path (created; the
// caller commits or removes it): PlanImport's geometry, o.kv_major, chunks
// of o.chunk_tokens (default: the one chunk-size rule). report: tokens, and
// the summary "N tokens; L layers; sequence state of f16/f16 cache; ...".
KVFILE_EXPORT Status Import(const std::string& in, const ConvertOptions& o, const std::string& kv_path,
                            ConvertReport* report);

// Appends cells [c0, c1) of `s` (read from `f`, named `in`) to `w` as one
// append (batches marked continued). unrotate_head: not 0, the head size of
// rows to un-rotate. o.interrupted is polled between batches (kFailed
// "IN: interrupted"); o.progress hears "convert IN".
KVFILE_EXPORT Status AppendCells(const std::string& in, File& f, const StateLayout& s, uint32_t unrotate_head,
                                 uint64_t c0, uint64_t c1, const ConvertOptions& o, Writer& w);

// Checks an export's cache type: one of f16, bf16, f32, q8_0 for both
// streams, or k=TYPE and/or v=TYPE, comma separated (o.llama.type).
KVFILE_EXPORT Status CheckExportType(const std::string& spec);

// Refuses (rotated=yes) or warns about (rotated=unknown, a type and head
// size llama.cpp rotates) an export of `r`'s k and v rows to a consumer
// that takes them for plain keys and values (safetensors, Mooncake records):
// rows imported from a llama.cpp quantized cache may be Hadamard-rotated.
// *warning is set only if empty.
KVFILE_EXPORT Status CheckPlainRows(const std::string& in, const Reader& r, std::string* warning);

// Where an export puts the cells, when not where the imported file had them
// (kvfile llama-server restore: the stream and sequence of the server's slot).
struct KVFILE_EXPORT Placement {
  uint32_t n_stream = 1;
  uint32_t stream = 0;
  int32_t seq_id = 0;
};

// Writes the first `tokens` tokens of `r` (read from `in`; streams exactly
// k and v) as a llama.cpp state file at `out` (created exclusively, synced)
// by o.llama: session or sequence state, the cache types (default: as
// imported, else f16), V layout, architecture, streams and rotation.
// *summary: "N tokens; ...; B bytes"; *warning: a rotation that may not
// match, or left as it is. The caller removes `out` after a failure.
KVFILE_EXPORT Status Export(const std::string& in, Reader& r, uint64_t tokens, const std::string& out,
                            const ConvertOptions& o, std::string* summary, std::string* warning,
                            const Placement* at = nullptr);

// ---- A .kv file kept in line with llama.cpp state files (kvfile llama-server) ----

struct SaveStateOptions {
  // The import's options: dtype or keep_raw, llama.head_size or
  // llama.model, rotation; progress, and interrupted (polled between
  // batches).
  ConvertOptions convert;
  uint64_t fingerprint = 0;  // the model fingerprint FILE records (a server: its model's)
  std::string source;        // where the state came from, for a mismatch's message ("slot 0 of URL, model M")
  // Asked before FILE is opened for writing, between the pieces of a
  // divergent save's copy, and (`path` the state file) after a failed
  // append; a non-OK status stops the save with it, FILE as it was.
  std::function<Status(const std::string& path)> check_stop;
};

struct SaveStateReport {
  bool created = false;        // FILE did not exist
  uint64_t before = 0;         // FILE's tokens before
  uint64_t kept = 0;           // of them, the prefix shared with the state, kept
  uint64_t cells = 0;          // the state's tokens: FILE's after
  uint64_t size_before = 0, size_after = 0;  // FILE's bytes
};

// Brings FILE in line with the parsed state file `s` (read from `f`, named
// `in`): creates it with the state's cells (PlanImport's geometry, the one
// chunk-size rule), or appends the cells past the longest common prefix of
// FILE's tokens and the state's (one durable append). A divergence
// replaces FILE whole: its bytes are copied under its writer lock, the copy
// rewound to that prefix and appended to, then renamed over FILE once FILE
// is found unchanged since (else kBusy, not replaced). Where the cells sat
// (stream, sequence, first position) is the file's own and is not compared.
// Another model or geometry is kMismatch ("FILE: ... (SOURCE)"). A refusal,
// failure or stop leaves FILE as it was.
KVFILE_EXPORT Status SaveState(const std::string& file, const std::string& in, File& f, const StateLayout& s,
                               const SaveStateOptions& o, SaveStateReport* report);

// A restore of `r` (named `name`) into a server's slot: CheckRestorable
// before the server is asked anything (kMismatch: a file that kvfile
// llama-server save did not write; kInvalidArgument: no tokens);
// CheckRestoreInto against the server's cache as a probe save of it shows
// (kMismatch: another shape, or a cache quantized on one side only, which
// llama.cpp Hadamard-rotates; kUnsupported: K and V caches of two types).
KVFILE_EXPORT Status CheckRestorable(const std::string& name, const Reader& r);
KVFILE_EXPORT Status CheckRestoreInto(const std::string& name, const Reader& r, const StateLayout& server);

}  // namespace kvfile::llama
