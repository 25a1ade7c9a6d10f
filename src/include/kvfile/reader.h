// SPDX-License-Identifier: Apache-2.0
// Reader: opens a .kv file, validates it, and reads rows back.
//
// Open reads the header, the commit slots and every chunk's head (header,
// section checksums, token ids); row payloads are read and checked on demand.
// Every read validates the chunks it needs (checksums, codes, scales) before
// it touches the caller's buffer: a failed read leaves the destination as it
// was. The file's state is taken once, at Open; a read of bytes that another
// process's rewind or repair has since cut or written over fails with
// kBusy, "PATH: changed while being read (rewound or repaired by another
// process); read it again", not as damage (spec/RECOVERY.md, "Readers and
// concurrent writers").
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvfile/export.h"
#include "kvfile/file.h"
#include "kvfile/file_state.h"
#include "kvfile/geometry.h"
#include "kvfile/status.h"

namespace kvfile {

namespace hooks {
struct ReaderAccess;
}  // namespace hooks
namespace internal {
struct ReaderAccess;  // the library's own parts: readers sharing one open (src/reader/reader_access.h)
}  // namespace internal

struct ReaderOptions {
  FileSystem* fs = nullptr;  // nullptr: FileSystem::Default()
  // When set, Open refuses a file of another model or geometry (kMismatch,
  // naming the first difference).
  std::optional<ModelIdentity> expect_identity;
  std::optional<Geometry> expect_geometry;
};

// One destination of Reader::ReadMany: the rows of (layer, stream), decoded,
// shaped [end-begin][rows][width] like a ReadRows destination.
struct RowsTarget {
  uint32_t layer = 0;
  uint32_t stream = 0;
  void* dst = nullptr;
};

// One destination of Reader::ReadManyCodes: the codes of (layer, stream),
// shaped [end-begin][rows][width], and its scales, [end-begin][rows]. For
// an nvfp4 stream: codes [end-begin][rows*width/2] (packed, low nibble
// first), block_scales [end-begin][rows*width/16] and scales [end-begin].
struct CodesTarget {
  uint32_t layer = 0;
  uint32_t stream = 0;
  uint8_t* codes = nullptr;
  float* scales = nullptr;
  uint8_t* block_scales = nullptr;  // nvfp4 streams only
};

// A Reader is used by one thread at a time; ReadMany and ReadManyCodes run
// on worker threads the reader keeps between calls (VerifyFile starts its
// own for the call).
class KVFILE_EXPORT Reader {
 public:
  static Status Open(const std::string& path, const ReaderOptions& options,
                     std::unique_ptr<Reader>* out);
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;
  ~Reader();

  uint16_t major_version() const;
  uint16_t minor_version() const;
  const Geometry& geometry() const;
  const ModelIdentity& identity() const;
  uint64_t salt() const;
  uint32_t nominal_chunk_tokens() const;
  uint32_t epoch() const;
  uint64_t token_count() const;
  std::span<const uint32_t> tokens() const;
  std::span<const ChunkInfo> chunks() const;
  const TailInfo& tail() const;
  // The header's flag words (spec/FORMAT.md 2).
  uint64_t required_flags() const;
  uint64_t optional_flags() const;
  // The commit record in force, which slot holds it (0 or 1), and the state
  // of both slots: a damaged slot does not stop an open (a crash while
  // writing a slot tears it) and is reported here.
  const CommitInfo& commit() const;
  int active_commit_slot() const;
  const std::array<CommitSlotState, 2>& commit_slots() const;
  const char* io_backend() const;
  const std::string& path() const;

  // Number of leading tokens shared by the file and `prompt`.
  uint64_t LongestCommonPrefix(std::span<const uint32_t> prompt) const;

  // Rows of (layer, stream) for tokens [begin, end), decoded into `dst` as
  // `out_dtype` (kBF16, kF16 or kF32), shaped [end-begin][rows][width].
  Status ReadRows(uint32_t layer, uint32_t stream, uint64_t begin, uint64_t end, Dtype out_dtype,
                  void* dst);
  // Rows of many (layer, stream) pairs for tokens [begin, end), decoded as
  // `out_dtype`: what an engine resuming a session does. Works chunk by
  // chunk, with one read per chunk covering every section asked for (a whole
  // session streams through the file sequentially), each section checked
  // (checksum, codes, scales) before it is decoded. `threads` workers share
  // the chunks (1: the calling thread alone; each further worker is a thread
  // of this reader's reading through a handle of the file of its own, both
  // made by the first call that needs them and kept until the reader is
  // destroyed, so that later calls start no thread and open nothing).
  // Unlike ReadRows, a failure is found chunk by chunk: on error every
  // destination is zero-filled, so no partly decoded data is left behind,
  // and the message names the chunk.
  Status ReadMany(std::span<const RowsTarget> targets, uint64_t begin, uint64_t end,
                  Dtype out_dtype, unsigned threads = 1);
  // Codes and scales of many (layer, stream) pairs of fp8 or nvfp4 streams for tokens
  // [begin, end): ReadCodes as ReadMany reads rows (chunk by chunk, the same
  // threads, the same failure contract: on error every destination is
  // zero-filled). A v1 file's rows are quantized as `v1_quantize_as`.
  Status ReadManyCodes(std::span<const CodesTarget> targets, uint64_t begin, uint64_t end,
                       unsigned threads = 1, Dtype v1_quantize_as = Dtype::kE4M3);
  // Codes and scales of an fp8 stream, shaped [end-begin][rows][width] and
  // [end-begin][rows]. In a v1 file (raw rows only) the rows are quantized on
  // the fly with the codec, as `v1_quantize_as` (kE4M3 or kE5M2): exactly the
  // codes an upgrade to v2 stores.
  Status ReadCodes(uint32_t layer, uint32_t stream, uint64_t begin, uint64_t end, uint8_t* codes,
                   float* scales, Dtype v1_quantize_as = Dtype::kE4M3);
  // Codes, block scales and row scales of an nvfp4 stream (spec/FORMAT.md
  // 5.2): per token, rows*width/2 packed code bytes (low nibble first),
  // rows*width/16 E4M3 block scale codes and one f32 row scale, shaped
  // [end-begin][rows*width/2], [end-begin][rows*width/16] and [end-begin].
  Status ReadCodes(uint32_t layer, uint32_t stream, uint64_t begin, uint64_t end, uint8_t* codes,
                   uint8_t* block_scales, float* row_scales);
  // The stored parts of a quantized stream, whatever its dtype: each part
  // its dtype has (kDtypeTable: codes, block scales, row scales), laid out
  // as the ReadCodes of that dtype lays it out (PartBytes(dtype, part,
  // (end-begin) * CodecRowsOf(...).per_token, width) bytes); block_scales is
  // ignored for a dtype without them. A v1 file's rows: as e4m3.
  struct Parts {
    uint8_t* codes = nullptr;
    uint8_t* block_scales = nullptr;
    float* scales = nullptr;
  };
  Status ReadParts(uint32_t layer, uint32_t stream, uint64_t begin, uint64_t end, const Parts& out);
 private:
  friend struct hooks::ReaderAccess;  // the library's tests (tests/support/testing_hooks.h)
  friend struct internal::ReaderAccess;
  Status VerifyChunk(size_t index);
  struct Impl;  // defined hidden: not exported
  KVFILE_NO_EXPORT explicit Reader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvfile
