// SPDX-License-Identifier: Apache-2.0
// Packs: one .kvpack file holding the KV caches of many sessions (members),
// with the chunks members share stored once (spec/PACK.md).
//
// PackWriter builds a whole pack under a temporary name and renames it over
// the destination when finished: a crash leaves the old pack or the new one.
// PackReader opens a pack, lists and finds members, reads a member's tokens
// and chunks (each checked before it is returned), materialises a member as
// a .kv file, and verifies the whole pack with every shared chunk read once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvfile/export.h"
#include "kvfile/file.h"
#include "kvfile/geometry.h"
#include "kvfile/reader.h"
#include "kvfile/status.h"

namespace kvfile {

// One model (identity, geometry, dtypes) of a pack, and the tokens per pack
// chunk its members are cut into.
struct PackModel {
  ModelIdentity identity;
  Geometry geometry;
  uint32_t chunk_tokens = 0;
  uint64_t payload_bytes_per_token = 0;
};

// One stored chunk (an entry of the chunk table).
struct PackChunk {
  uint64_t offset = 0;  // file offset of the payload
  uint64_t bytes = 0;   // token_count * the model's payload bytes per token
  uint64_t first_token = 0;
  uint32_t token_count = 0;
  uint32_t model = 0;
  uint64_t chain_hash = 0;
  uint64_t payload_checksum = 0;
};

// One member (an entry of the member index).
struct PackMember {
  std::string name;  // relative path
  uint32_t model = 0;
  uint64_t token_count = 0;
  uint64_t record_offset = 0;
  uint64_t record_checksum = 0;
  uint32_t source_chunk_tokens = 0;
  uint16_t source_major = 0;
  uint16_t source_minor = 0;
  uint64_t chunk_count = 0;  // ceil(token_count / the model's chunk_tokens)
};

// Where one (layer, stream) lies inside a chunk payload of `tokens` tokens.
struct PayloadSection {
  uint32_t layer = 0;  // which (layer, stream) it holds
  uint32_t stream = 0;
  uint64_t data_offset = 0;
  uint64_t data_bytes = 0;     // codes: T*R*W*element size, T*R*W/2 for nvfp4
  uint64_t block_scales_offset = 0;  // nvfp4 streams only
  uint64_t block_scales_bytes = 0;   // T*R*W/16 for nvfp4, else 0
  uint64_t scales_offset = 0;  // fp8 and nvfp4 streams
  uint64_t scales_bytes = 0;   // T*R*4 for fp8, T*4 for nvfp4, 0 for raw streams
};
// Sections in layer-major order: every (layer, stream) the stream is present
// in (index layer * streams + stream when every stream is in every layer).
KVFILE_EXPORT std::vector<PayloadSection> PackPayloadLayout(const Geometry& g, uint32_t tokens);

struct PackWriterOptions {
  FileSystem* fs = nullptr;     // nullptr: FileSystem::Default()
  uint32_t chunk_tokens = 256;  // tokens per pack chunk (lowered for a model whose chunk would pass 1 GiB)
  // Requantize on the way, as `kvfile convert --dtype` does: kE4M3/kE5M2/
  // kNvfp4 re-encode fp8 and nvfp4 streams (and a version 1 file's raw
  // streams), raw streams stay raw; kBF16/kF16/kF32 store every stream raw
  // in that dtype.
  std::optional<Dtype> dtype;
  // AddFile: threads reading and checking each chunk's sections; the pack's
  // bytes do not depend on it. The file is opened and scanned once: the
  // further threads read the state that open found, each through a handle
  // of the same file (one renamed over the path meanwhile: kFailed, "PATH:
  // the file was replaced since it was opened").
  unsigned threads = 1;
};

struct PackWriteStats {
  uint64_t members = 0;
  uint64_t tokens = 0;
  uint64_t chunks_stored = 0;
  uint64_t chunks_referenced = 0;    // chunk references of all members
  uint64_t payload_bytes_stored = 0;
  uint64_t payload_bytes_referenced = 0;
  uint64_t file_bytes = 0;           // after Finish
};

class KVFILE_EXPORT PackWriter {
 public:
  // Prepares the replacement of `dest` (src/io/atomic_replace.h); nothing is
  // visible under `dest` before Finish succeeds.
  static Status Begin(const std::string& dest, const PackWriterOptions& options,
                      std::unique_ptr<PackWriter>* out);
  ~PackWriter();  // without a successful Finish: removes the temporary file
  PackWriter(const PackWriter&) = delete;
  PackWriter& operator=(const PackWriter&) = delete;

  // Adds the live tokens of an open .kv file as member `name` (a relative
  // path, unique in the pack). Every section read is checked on the way.
  // A failure other than an I/O error on the pack leaves the pack as it
  // was before the call (the writer stays usable).
  Status Add(const std::string& name, Reader& reader);
  // Opens `kv_path` (through the writer's file system) and adds it.
  Status AddFile(const std::string& name, const std::string& kv_path);
  // Writes the tables and the header, syncs and renames the pack into place.
  Status Finish();

  const PackWriteStats& stats() const;

 private:
  struct Impl;  // defined hidden: not exported
  KVFILE_NO_EXPORT explicit PackWriter(std::unique_ptr<Impl> impl);
  KVFILE_NO_EXPORT Status AddMember(const std::string& name, Reader& reader);
  std::unique_ptr<Impl> impl_;
};

struct PackVerifyReport {
  uint64_t members = 0;
  uint64_t chunks = 0;
  uint64_t payload_bytes = 0;  // chunk bytes read and checked (each chunk once)
};

class KVFILE_EXPORT PackReader {
 public:
  // Reads and checks the header, the model and chunk tables, the names and
  // the member index, and that chunks and records tile the data region.
  static Status Open(const std::string& path, FileSystem* fs, std::unique_ptr<PackReader>* out);
  ~PackReader();
  PackReader(const PackReader&) = delete;
  PackReader& operator=(const PackReader&) = delete;

  const std::string& path() const;
  uint64_t file_bytes() const;
  std::span<const PackModel> models() const;
  std::span<const PackChunk> chunks() const;
  std::span<const PackMember> members() const;  // sorted by name
  // Binary search by name.
  std::optional<size_t> Find(std::string_view name) const;

  // Reads and checks member `index`'s record: its token ids and chunk ids
  // (and that each chunk id names the right chunk: model, position, chain
  // hash of the tokens).
  Status ReadMember(size_t index, std::vector<uint32_t>* tokens, std::vector<uint32_t>* chunk_ids);
  // Reads chunk `id`'s payload into *payload (resized), checks its checksum,
  // codes, scales and raw values (spec/PACK.md section 6).
  Status ReadChunk(uint32_t id, std::vector<uint8_t>* payload);
  // Writes member `index` as the .kv file `dest`, replaced atomically, in
  // one pass: each chunk is read once and checked before its rows are
  // staged; damage anywhere leaves `dest` as it was.
  Status Materialize(size_t index, const std::string& dest);
  // Checks every record and every chunk once, and that every chunk is used
  // and stored once. Returns the first damage found.
  Status Verify(PackVerifyReport* report);

 private:
  struct Impl;  // defined hidden: not exported
  KVFILE_NO_EXPORT explicit PackReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Whether `name` is a valid member name (spec/PACK.md section 5).
KVFILE_EXPORT bool IsValidPackMemberName(std::string_view name);

}  // namespace kvfile
