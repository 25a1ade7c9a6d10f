// SPDX-License-Identifier: Apache-2.0
// Experimental tier (kvfile/formats/): may change between minor releases; docs/api.md, "Header tiers".
// llama.cpp state files (llama_state_seq_save_file: magic 'ggsq'; and
// llama_state_save_file: magic 'ggsn'): a checked parser of their layout, row
// decoding and encoding for the cache types kvfile handles (f32, f16, bf16,
// q8_0), the provenance kvfile keeps in an imported file's model id, and a
// writer of new state files. The layout is described in docs/llama.md.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvfile/export.h"
#include "kvfile/file.h"
#include "kvfile/status.h"

namespace kvfile::llama {

// ggml type ids of the cache types handled.
enum class CacheType : int32_t { kF32 = 0, kF16 = 1, kQ8_0 = 8, kBF16 = 30 };

enum class FileKind { kSequence, kSession };

KVFILE_EXPORT const char* CacheTypeName(CacheType t);
KVFILE_EXPORT std::optional<CacheType> CacheTypeFromName(std::string_view name);
KVFILE_EXPORT bool IsQuantized(CacheType t);
// Bytes of one row of `width` values (q8_0: width must be a multiple of 32).
KVFILE_EXPORT uint64_t RowBytes(CacheType t, uint64_t width);
// One row of `width` values: decoded to f32, or encoded from f32 the way
// ggml's reference conversion does (round to nearest even; q8_0 blocks of
// 32 values with an f16 scale max|x|/127).
KVFILE_EXPORT void DecodeRow(CacheType t, const uint8_t* src, uint64_t width, float* out);
KVFILE_EXPORT void EncodeRow(CacheType t, const float* src, uint64_t width, uint8_t* out);

// True if the first 4 bytes are one of the two magics.
KVFILE_EXPORT bool HasStateMagic(const uint8_t* first4);

// A session file's architecture name: 1 to 64 bytes of [a-z0-9._-], the
// rule of import and export alike. Errors say what is wrong with `arch`.
KVFILE_EXPORT Status CheckArch(std::string_view arch);

// llama.cpp v0.5.0 stores the rows of a quantized cache multiplied by an
// orthonormal Walsh-Hadamard matrix when the head size is a multiple of 64
// (unless LLAMA_ATTN_ROT_DISABLE=1): K in blocks of the largest power of two
// that divides the head size, V in blocks of 64 (src/llama-kv-cache.cpp).
enum class Rotation { kNo, kYes, kUnknown };
KVFILE_EXPORT const char* RotationName(Rotation r);
// True if llama.cpp rotates rows of type `t` with heads of `head_size`.
KVFILE_EXPORT bool RotatesRows(CacheType t, uint64_t head_size);
// Values per rotation block of K (v false) or V rows with heads of `head_size`.
KVFILE_EXPORT uint32_t RotationBlock(bool v, uint64_t head_size);
// Multiplies each block of `block` (a power of two) values of x[width] by
// the orthonormal Walsh-Hadamard matrix of that size, in place. The matrix
// is its own inverse: the same call rotates and un-rotates.
KVFILE_EXPORT void Hadamard(float* x, uint64_t width, uint32_t block);

// Where the data of one layer's K or V lies in a state file.
struct KVFILE_EXPORT LayerBlock {
  CacheType type = CacheType::kF16;
  uint64_t offset = 0;  // first byte of the rows (after the layer's own header)
};

// The parsed layout of a state file holding one sequence: exactly one
// non-empty cache stream whose cells hold positions first_pos,
// first_pos+1, ... of one sequence id, one cell per token id. A model with
// two caches (llama.cpp's iSWA: the full-attention layers' cache, then the
// sliding-window layers') writes one after the other; both must hold the
// same cells, and `layers`, `k`, `v` run over the first cache's layers,
// then the second's.
struct KVFILE_EXPORT StateLayout {
  FileKind kind = FileKind::kSequence;
  uint32_t version = 0;
  std::string arch;  // session files only
  std::vector<uint32_t> tokens;
  // The token array was llama-server's serialized token record
  // (tools/server: server_tokens::serialize, version 1): the int32 values
  // -1, 1, n, the n ids, 0 (no media chunks), rather than the n ids alone.
  bool server_tokens = false;
  uint32_t n_stream = 1;  // cache streams in the file
  uint32_t stream = 0;    // the non-empty one
  int32_t seq_id = 0;
  int32_t first_pos = 0;
  uint32_t cells = 0;
  bool v_trans = false;
  uint32_t layers = 0;
  std::vector<uint32_t> cache_layers;  // layers of each cache, in file order (sum: layers)
  uint32_t k_width = 0;  // values per cell and layer (KV heads x head size)
  uint32_t v_width = 0;
  std::vector<LayerBlock> k, v;
  uint64_t file_size = 0;
};

// Parses and checks the whole layout (every count and size against the
// file's size, which the layout must fill exactly). Errors name `path`.
KVFILE_EXPORT Status ParseState(File& file, const std::string& path, StateLayout* out);

// Cells [c0, c1) of one layer's K or V as f32, [c1-c0][width].
KVFILE_EXPORT Status ReadCells(File& file, const StateLayout& s, bool v, uint32_t layer, uint32_t c0, uint32_t c1, float* out);
// The same as stored, [c1-c0][RowBytes] (little-endian values), for a block
// that is not transposed V: false (nothing read) if it is.
KVFILE_EXPORT bool IsRowMajor(const StateLayout& s, bool v);
KVFILE_EXPORT Status ReadCellBytes(File& file, const StateLayout& s, bool v, uint32_t layer, uint32_t c0, uint32_t c1,
                     uint8_t* out);

// What an import keeps in the .kv model id, so that an export can write
// the file back as llama.cpp had it. The model id is
// "llama.cpp:" followed by space-separated key=value pairs (spec/FORMAT.md,
// "Model ids of imported llama.cpp files").
struct KVFILE_EXPORT Provenance {
  FileKind kind = FileKind::kSequence;
  uint32_t version = 0;
  std::string arch;  // empty if unknown
  CacheType k_type = CacheType::kF16;
  CacheType v_type = CacheType::kF16;
  bool v_trans = false;
  uint32_t n_stream = 1;
  uint32_t stream = 0;
  int32_t seq_id = 0;
  int32_t first_pos = 0;
  bool server_tokens = false;  // the token array is llama-server's record ("tokens=server")
  std::vector<uint32_t> cache_layers;  // two or more caches: the layers of each; else empty
  Rotation rotated = Rotation::kUnknown;  // of the quantized streams (float ones are never rotated)
};
// True if the rows of stream k (v false) or v with heads of `head_size`, as
// the file `p` describes them, are (kYes), are not (kNo) or may be
// (kUnknown) rotated.
KVFILE_EXPORT Rotation StreamRotation(const Provenance& p, bool v, uint64_t head_size);
KVFILE_EXPORT std::string FormatModelId(const Provenance& p);
KVFILE_EXPORT std::optional<Provenance> ParseModelId(std::string_view model_id);

// What a new state file holds.
struct KVFILE_EXPORT WriteSpec {
  FileKind kind = FileKind::kSequence;
  std::string arch;  // session files
  uint32_t n_stream = 1;
  uint32_t stream = 0;
  int32_t seq_id = 0;
  int32_t first_pos = 0;
  bool v_trans = false;
  CacheType k_type = CacheType::kF16;
  CacheType v_type = CacheType::kF16;
  uint32_t layers = 0;
  std::vector<uint32_t> cache_layers;  // two caches: the layers of each (sum: layers); empty: one
  uint32_t k_width = 0;
  uint32_t v_width = 0;
  bool server_tokens = false;  // write the token array as llama-server's record
};
KVFILE_EXPORT Status CheckWriteSpec(const WriteSpec& w);
// Size of the file WriteState produces for `tokens` tokens.
KVFILE_EXPORT uint64_t StateFileSize(const WriteSpec& w, uint64_t tokens);

// Writes a state file at the offsets StateFileSize implies: the caller
// calls Header() once, then Rows() or RawRows() for every layer's K and V
// (any order, in blocks of cells).
class KVFILE_EXPORT StateWriter {
 public:
  StateWriter(File* file, WriteSpec spec, uint64_t tokens);
  Status Header(const std::vector<uint32_t>& tokens);
  // Cells [c0, c0+n) of one layer's K (v false) or V, [n][width] f32.
  Status Rows(bool v, uint32_t layer, uint64_t c0, uint64_t n, const float* values);
  // The same with rows already encoded in the cache type (not for a
  // transposed V): n * RowBytes bytes.
  Status RawRows(bool v, uint32_t layer, uint64_t c0, uint64_t n, const uint8_t* rows);

 private:
  uint64_t CacheStart(size_t cache) const;
  uint64_t KOffset(uint32_t layer) const;
  uint64_t VOffset(uint32_t layer) const;

  File* file_;
  WriteSpec spec_;
  uint64_t cells_;
  uint64_t meta_end_ = 0;  // where the layer data begins
  std::vector<uint8_t> buf_;
};

// What a GGUF model file (llama.cpp's model format, version 2 or 3) says
// about its KV heads: the values per K and V head (its architecture's
// attention.key_length and value_length, else embedding_length /
// attention.head_count). Only the metadata is read, each count checked
// against the file's size. Errors name `path` and the key that is wrong.
struct KVFILE_EXPORT ModelHeads {
  std::string arch;
  uint32_t k_head = 0;
  uint32_t v_head = 0;
};
KVFILE_EXPORT Status ReadModelHeads(File& file, const std::string& path, ModelHeads* out);

}  // namespace kvfile::llama
