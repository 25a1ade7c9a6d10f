// SPDX-License-Identifier: Apache-2.0
// Writer: creates a .kv v2 file and appends tokens to it.
//
// Appended tokens gather in a staging buffer laid out exactly as the chunk
// will be on disk; a full buffer is written as one chunk. Nothing already on
// disk is ever overwritten by an append. What is durable when is set by the
// SyncMode (spec/RECOVERY.md states the guarantees).
//
// Threads. A Writer has no lock of its own: it is used by one thread at a
// time (every member, the const accessors included; calls from different
// threads must be ordered by the caller, e.g. by a mutex), and it may move
// from one thread to another between calls. Different Writers, of
// different files, may be used at once from different threads. One file
// has one Writer at a time, across threads and processes: a Writer holds
// the file's writer lock from Create or Open until it is closed, and
// another Open of that file meanwhile fails with kBusy. Readers (reader.h)
// may read the file while it is written, from any thread or process. The
// threads WriterOptions::threads asks for are the Writer's own, inside one
// Append, and touch no file; all the Writer's I/O runs on the calling
// thread, through WriterOptions::fs (file.h says what a FileSystem must
// allow).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvfile/export.h"
#include "kvfile/file.h"
#include "kvfile/geometry.h"
#include "kvfile/row_block.h"
#include "kvfile/status.h"

namespace kvfile {

namespace internal {
struct WriterAccess;  // the library's own parts: access to the writer behind the API
}

enum class SyncMode {
  kNone,   // never fsync on its own; only an explicit Sync() makes data durable
  kChunk,  // every chunk is durable (and committed) before the append returns
  kClose,  // Close() makes everything durable (default)
};

struct WriterOptions {
  uint32_t chunk_tokens = 256;  // tokens per chunk (1..65536)
  SyncMode sync = SyncMode::kClose;
  FileSystem* fs = nullptr;     // nullptr: FileSystem::Default()
  // Create() replaces an existing regular file (through a symlink: its
  // target) at once with the new, empty one: the old contents are gone
  // when Create returns, before any token is appended. To replace a file
  // only once its successor is complete, create the new file under another
  // name in the same directory and rename it over the old one when closed
  // (what the kvfile CLI does, spec/RECOVERY.md "Replacing a file").
  bool overwrite = false;
  // Create(): the format to write: 2, or 1 (raw streams only, for engines
  // that must stay raw and for tests of the upgrade).
  uint16_t format_major = 2;
  // Open() of a v1 file upgrades it to v2 first (spec/RECOVERY.md,
  // "Upgrade"): its raw streams become `upgrade_dtype` (kE4M3 or kE5M2)
  // except those named in `keep_raw`, which stay as they are.
  Dtype upgrade_dtype = Dtype::kE4M3;
  std::vector<std::string> keep_raw;
  // Open() of a file shorter than its commit record (cut inside committed
  // data) fails with kCorruption unless this is set; then the file is cut
  // to its valid prefix of whole chunks and a commit record vouching for
  // them is written (kvfile repair --force). Acknowledged tokens are lost.
  bool drop_missing_committed = false;
  // Threads that check and quantize the rows of a large append, one
  // (layer, stream) section each (0: one per core). The file's bytes and
  // every error are the same for every count.
  unsigned threads = 1;
};

class KVFILE_EXPORT Writer {
 public:
  // Creates `path` with the given geometry and identity. The header is
  // written under a temporary name, synced and renamed into place, so a
  // crash never leaves a half-created file under `path`.
  static Status Create(const std::string& path, const Geometry& geometry,
                       const ModelIdentity& identity, const WriterOptions& options,
                       std::unique_ptr<Writer>* out);

  // Opens an existing file to append to it, after recovery; a v1 file is
  // upgraded to v2 first (the v1 bytes are untouched until the finished,
  // synced v2 file is renamed over them). Takes the
  // writer lock (kBusy if another writer holds it), removes a torn tail and
  // makes that durable, commits valid chunks found past the commit record,
  // and rewrites a damaged commit slot. Damage in the committed region is
  // an error (kCorruption) and the file is left as it was. A damaged
  // uncommitted chunk is cut with the rest of the tail, even when whole
  // chunks follow it (nothing there was acknowledged; see recovery()).
  // options.salt is ignored; options.chunk_tokens too: chunks hold the
  // file's nominal count, capped so that a staging buffer stays <= 64 MiB.
  static Status Open(const std::string& path, const WriterOptions& options,
                     std::unique_ptr<Writer>* out);

  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;
  ~Writer();  // closes (with Close()'s durability) if Close() was not called

  // Appends tokens. Validates every block first: a non-finite row or a
  // wrong dtype fails the whole append (nothing of it is written; the
  // message names layer, stream, token and row). A failed call fails the
  // whole append it belongs to, earlier `continued` batches included: the
  // writer is left as it was before the append began (if part of it was
  // already in chunks on disk, by a durable rewind), or, after an I/O
  // error, unusable with the file cut back to its last commit.
  Status Append(const AppendBatch& batch);
  // Writes the staged tokens as a (possibly short) chunk; no fsync.
  Status Flush();
  // Flush, then make every finished append durable and committed (an
  // unfinished `continued` append is not acknowledged).
  Status Sync();
  // Flush, and Sync() unless the mode is kNone. The writer is unusable after.
  // An unfinished `continued` append is dropped (kFailed says so; the
  // finished appends are still made durable as usual).
  Status Close();
  // Keeps the first n tokens and drops the rest, durably: when it returns OK
  // the file holds exactly those n tokens (plus what is appended later). A
  // crash during it leaves either the old sequence or the rewound one.
  Status Rewind(uint64_t n);

  // What Open() found and repaired.
  struct RecoveryReport {
    uint64_t truncated_bytes = 0;     // torn tail removed
    std::string torn_reason;          // why those bytes were not a valid chunk
    uint64_t recommitted_chunks = 0;  // valid chunks past the old commit record
    bool slot_rewritten = false;      // a damaged commit slot was rewritten
    // The tail that was cut began with a damaged uncommitted chunk followed
    // by whole ones (they were dropped too: nothing there was acknowledged;
    // a crash with writes reaching the disk out of order leaves this).
    bool dropped_after_damage = false;
    bool upgraded_from_v1 = false;    // the file was a v1 file, now v2
    bool removed_stale_upgrade = false;  // a leftover <path>.kvupgrade was removed
    // The file was shorter than its commit record (drop_missing_committed):
    // it was cut to the whole chunks before the cut and recommitted.
    uint64_t dropped_committed_tokens = 0;
  };
  const RecoveryReport& recovery() const;

  std::span<const uint32_t> tokens() const;  // every appended token id
  uint64_t LongestCommonPrefix(std::span<const uint32_t> prompt) const;

  uint64_t token_count() const;     // appended so far (staged included)
  uint64_t durable_tokens() const;  // acknowledged by the last successful sync
  const Geometry& geometry() const;
  const std::string& path() const;

 private:
  friend struct internal::WriterAccess;
  struct Impl;  // defined hidden: not exported
  KVFILE_NO_EXPORT explicit Writer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The chunk-size rule for a default chunk size: `wanted` tokens per chunk,
// halved while a chunk of that many tokens of geometry `g` would exceed
// max(64 MiB, input_bytes) or the format's limit (1 GiB); never below 1.
// Writer::Open applies it with input_bytes 0 (staging buffers of at most
// 64 MiB whatever the file's hint); the kvfile CLI with its input's size.
KVFILE_EXPORT uint32_t FitChunkTokens(const Geometry& g, uint32_t wanted, uint64_t input_bytes);

// Removes a leftover "<path>.kvupgrade" of an interrupted upgrade, under
// the file's writer lock, without opening the file for writing (what
// `kvfile repair` does for a v1 file). *removed says whether there was one.
KVFILE_EXPORT Status RemoveLeftoverUpgradeFile(const std::string& path, FileSystem* fs, bool* removed);

}  // namespace kvfile
