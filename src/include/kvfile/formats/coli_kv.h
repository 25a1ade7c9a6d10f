// SPDX-License-Identifier: Apache-2.0
// Experimental tier (kvfile/formats/): may change between minor releases; docs/api.md, "Header tiers".
// colibri's .coli_kv session files, in and out.
//
// The layout (colibri c/kv_persist.h; docs/formats.md names the fork and
// commit followed): 8 magic bytes, eight little-endian i32 header words
//   h[0] layers, h[1] kv_lora (latent row width), h[2] qk_rope (rope row
//   width), h[3] index_hd (indexer row width, 0 without one), h[4] layers
//   with an indexer, h[5] vocabulary size, h[6] record count (the commit:
//   written last), h[7] format tag (0 for COLIKV1, 1 for COLIKV2),
// then one record per token: the i32 token id; for each layer the latent
// row then the rope row (COLIKV1: f32 rows; COLIKV2: e4m3 codes, each row
// followed by its f32 scale); then the f32 indexer row of each indexer layer
// (h[4] of them, in layer order; the header does not say which layers).
// Bytes past the record count (a torn append) are ignored, as colibri does.
//
// In a .kv file the session is streams "latent" and "rope" (e4m3, one row
// per token) and, with an indexer, "indexer" (raw f32, one row per token)
// in the layers that carry it (StreamSpec::layers).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kvfile/export.h"
#include "kvfile/file.h"
#include "kvfile/geometry.h"
#include "kvfile/reader.h"
#include "kvfile/status.h"

namespace kvfile::coli {

inline constexpr uint64_t kHeaderBytes = 40;  // magic + 8 i32 words

struct KVFILE_EXPORT Header {
  int version = 0;  // 1 (COLIKV1, f32 rows) or 2 (COLIKV2, e4m3 rows + f32 scales)
  uint32_t layers = 0;
  uint32_t kv_lora = 0;
  uint32_t qk_rope = 0;
  uint32_t index_hd = 0;        // 0 exactly when indexer_layers is 0 (others are refused)
  uint32_t indexer_layers = 0;  // h[4]: how many layers carry the indexer
  // Which layers carry it, ascending, when some do not (the header does not
  // say which: an import is told, ImportOptions); empty when all or none do.
  std::vector<uint32_t> indexer_layer_list;
  uint32_t vocab = 0;
  uint32_t records = 0;         // committed tokens
  uint64_t record_bytes = 0;    // bytes of one token's record
};

// Whether 8 bytes are a .coli_kv magic (COLIKV1, COLIKV2, or COLIKV3,
// which ParseHeader refuses as unsupported).
KVFILE_EXPORT bool HasMagic(const uint8_t* first8);

// Checks a 40-byte header of a file of `file_size` bytes: a known magic and
// format tag (kUnsupported for COLIKV3 and for layouts this reader does not
// know, such as a COLIKV2 whose h[7] is not 1), dimensions that are
// positive and within kvfile's limits, and a file long enough for the
// record count (kCorruption otherwise).
KVFILE_EXPORT Status ParseHeader(const uint8_t* bytes, uint64_t file_size, Header* out);

// The .kv geometry of a session with this header.
KVFILE_EXPORT Geometry GeometryOf(const Header& h);
// The model id an import gives the .kv file ("coli_kv:vocab=<V>"): the
// session has no identity of its own, and an export needs the vocabulary.
KVFILE_EXPORT std::string ModelIdFor(uint32_t vocab);

struct KVFILE_EXPORT ImportResult {
  Header header;
  uint64_t ignored_bytes = 0;  // past the record count
};

// Writes the session at `in` as a new .kv file at `out` (created; it must
// not exist). Every record is checked before it is appended: token ids in
// [0, vocab), COLIKV2 scales valid (spec/CODEC.md 8.2) and below 3.4e38
// (colibri zeroes a row whose scale is not), codes not NaN, no code x scale
// infinite in f32 (colibri's decode has no clamp), f32 rows finite. Bad data is kCorruption (or kNonFinite) naming the
// record; the caller removes `out` then.
KVFILE_EXPORT Status Import(const std::string& in, const std::string& out, FileSystem* fs, ImportResult* result);

struct KVFILE_EXPORT ImportOptions {
  FileSystem* fs = nullptr;
  // Which layers carry the indexer, ascending: needed where the header's
  // h[4] is neither 0 nor h[0] (GLM-5.2 keeps it in 21 of 78 layers); it
  // must name exactly h[4] layers below h[0]. Otherwise kInvalidArgument
  // saying what to give. The .kv file records them (its stream's layers).
  std::optional<std::vector<uint32_t>> indexer_layers;
  // Tokens per chunk of the .kv file; default: 256, fitted to the
  // session's size by FitChunkTokens (kvfile/writer.h).
  std::optional<uint32_t> chunk_tokens;
  // Called after each batch of records with the records done of all; a
  // status that is not OK stops the import and is returned (an interrupt).
  std::function<Status(uint64_t done, uint64_t total)> on_batch;
};
KVFILE_EXPORT Status Import(const std::string& in, const std::string& out, const ImportOptions& options,
                            ImportResult* result);
// Sets h->indexer_layer_list from what the user gave (ImportOptions).
KVFILE_EXPORT Status SetIndexerLayers(const std::optional<std::vector<uint32_t>>& given, Header* h);

struct KVFILE_EXPORT ExportOptions {
  std::optional<uint32_t> vocab;  // default: from a model id of ModelIdFor's form
  // 2: COLIKV2 (e4m3 codes and f32 scales as stored; a colibri reads it only
  // when started with KV8=1). 1: COLIKV1 (latent and rope rows decoded to
  // f32, h[7] = 0; what a colibri without KV8, or one that reads only v1,
  // resumes).
  int version = 2;
  FileSystem* fs = nullptr;
  // As ImportOptions::on_batch, for the tokens written.
  std::function<Status(uint64_t done, uint64_t total)> on_batch;
};

// Writes the .kv file at `in` as a COLIKV2 (or, by options.version, COLIKV1)
// session at `out` (created exclusively, synced). The geometry must be
// colibri's: streams "latent" and "rope" in e4m3 with one row per token,
// optionally "indexer" (a raw stream, one row per token), nothing else; the
// token count and ids must fit (ids below the vocabulary). Otherwise
// kInvalidArgument with the reason, before anything is written. COLIKV2:
// codes and scales are copied as stored, except that a row colibri would
// hold otherwise than kvfile decodes it (a scale of at least 3.4e38, which
// colibri's loader zeroes, or a code x scale that is infinite in colibri's
// unclamped f32 decode) is kInvalidArgument naming the token, layer and
// stream; `out` is then partly written and the caller removes it.
KVFILE_EXPORT Status Export(const std::string& in, const std::string& out, const ExportOptions& options,
                            uint64_t* tokens);
// The same for the first `tokens` tokens of the open file `r` (named
// `in_name` in errors); `out` is created through options.fs.
KVFILE_EXPORT Status Export(Reader& r, const std::string& in_name, uint64_t tokens, const std::string& out,
                            const ExportOptions& options);

}  // namespace kvfile::coli
