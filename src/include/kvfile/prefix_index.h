// SPDX-License-Identifier: Apache-2.0
// Prefix lookup: which .kv file of a directory, or which member of a pack,
// shares the longest prefix of token ids with a prompt (spec/INDEX.md).
//
// A directory gets a persistent index file, DIR/.kvfile-index: its entries
// sorted by (model fingerprint, token ids, path) and front-coded in blocks
// of kIndexRestartInterval entries, each block checksummed and read on
// demand, so a lookup reads O(log n) blocks and memory stays bounded
// whatever the corpus size. FindPrefix checks the index against the
// directory (a digest of every file's path, size, times, device and inode),
// refreshes it when files changed (re-reading only changed and new files)
// and rebuilds it when it is damaged: a stale or damaged index is never
// trusted. The index also lists the members of the .kvpack files under
// the directory, as PACK:MEMBER. A pack is searched through the index
// beside it (PACK's directory's .kvfile-index) when that index lists the
// pack as it is now (its size, times, device and inode), else member by
// member (PackReader).
//
// The answer: the entry with the longest common prefix; among equally long
// matches the first in index order (smallest fingerprint, then smallest
// token sequence, then smallest path). No entry sharing the first token:
// no match (std::nullopt).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvfile/export.h"
#include "kvfile/file.h"
#include "kvfile/status.h"

namespace kvfile {

// The index file's name inside the directory it indexes.
inline constexpr const char* kPrefixIndexName = ".kvfile-index";

// One indexed .kv file (or pack member).
struct PrefixEntry {
  std::string path;  // relative to the directory, '/' separated; a pack member: PACK:MEMBER
  std::string model_id;
  uint64_t fingerprint = 0;
  std::vector<uint32_t> tokens;
  // What says the file changed (a pack member: its pack's).
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  uint64_t device = 0;
  uint64_t inode = 0;
};

// Index order: fingerprint, then token ids (lexicographic, a prefix before
// its extensions), then path (bytes).
KVFILE_EXPORT bool PrefixEntryLess(const PrefixEntry& a, const PrefixEntry& b);

// The answer of a lookup.
struct PrefixMatch {
  std::string path;    // relative path (directory) or member name (pack)
  std::string model_id;
  uint64_t fingerprint = 0;
  uint64_t tokens = 0;   // the entry's token count
  uint64_t matched = 0;  // length of the common prefix (>= 1)
};

// Which entries a lookup may answer with (PrefixIndex::Lookup).
using PrefixKeep = std::function<bool(const PrefixEntry&)>;

// An open index file. Open reads and checks the header, the block table and
// the fingerprint groups; blocks are read and checked when a lookup needs
// them (an index object, s3://, of at most 64 MiB is fetched whole by
// Open, so that a lookup costs no further request). Used by one thread at
// a time.
class KVFILE_EXPORT PrefixIndex {
 public:
  static Status Open(const std::string& path, FileSystem* fs, std::unique_ptr<PrefixIndex>* out);
  ~PrefixIndex();
  PrefixIndex(const PrefixIndex&) = delete;
  PrefixIndex& operator=(const PrefixIndex&) = delete;

  uint64_t entry_count() const;
  // The digest of the directory the index was built from (spec/INDEX.md 5).
  uint64_t directory_digest() const;
  // .kv files and subdirectories of the directory left out because they
  // could not be read.
  uint64_t skipped() const;
  // The longest match for `query` (restricted to `fingerprint` when set);
  // *out = std::nullopt when no entry shares the first token.
  Status Lookup(std::span<const uint32_t> query, std::optional<uint64_t> fingerprint,
                std::optional<PrefixMatch>* out);
  // The same among the entries `keep` accepts only (empty: all). The
  // entries passed over between the insertion point and the nearest kept
  // ones are read too.
  Status Lookup(std::span<const uint32_t> query, std::optional<uint64_t> fingerprint, const PrefixKeep& keep,
                std::optional<PrefixMatch>* out);
  // Entry `i` in index order.
  Status ReadEntry(uint64_t i, PrefixEntry* out);

 private:
  struct Impl;  // defined hidden: not exported
  KVFILE_NO_EXPORT explicit PrefixIndex(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Writes an index file through PendingReplace: entries must come in index
// order (PrefixEntryLess, no two equal); nothing is visible at `dest`
// before Finish succeeds.
class KVFILE_EXPORT PrefixIndexWriter {
 public:
  static Status Begin(const std::string& dest, FileSystem* fs, std::unique_ptr<PrefixIndexWriter>* out);
  ~PrefixIndexWriter();
  PrefixIndexWriter(const PrefixIndexWriter&) = delete;
  PrefixIndexWriter& operator=(const PrefixIndexWriter&) = delete;
  Status Add(const PrefixEntry& entry);
  Status Finish(uint64_t directory_digest, uint64_t skipped = 0);

 private:
  struct Impl;  // defined hidden: not exported
  KVFILE_NO_EXPORT explicit PrefixIndexWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct PrefixFindOptions {
  FileSystem* fs = nullptr;  // nullptr: FileSystem::Default()
  std::optional<uint64_t> fingerprint;
  // A directory: write the refreshed index back (false: never write).
  bool write_index = true;
};

// What a directory search or indexing did.
struct PrefixIndexReport {
  uint64_t files = 0;      // .kv and .kvpack files found (a pack's search: its members)
  uint64_t indexed = 0;    // entries of the index used
  uint64_t reread = 0;     // entries read from new or changed files (a pack: one per member)
  uint64_t kept = 0;       // entries taken over from the old index
  uint64_t skipped = 0;    // .kv files, packs and subdirectories that could not be read (left out)
  std::string first_skipped;  // "PATH: why" of the first of them
  bool was_fresh = false;     // the index on disk matched the directory (a pack: the index beside it
                              // lists the pack as it is, and answered)
  bool rebuilt = false;       // an index was there but damaged: rebuilt from the files
  bool written = false;       // a new index file was written
  std::string not_written;    // why a stale index could not be replaced ("" if it was)
};

// Brings DIR/.kvfile-index up to date with the .kv and .kvpack files under `dir`
// (written only when it changed).
KVFILE_EXPORT Status IndexDirectory(const std::string& dir, FileSystem* fs, PrefixIndexReport* report);

// The longest match for `query` in a directory (through its index, refreshed
// as IndexDirectory does; when it cannot be written the answer comes from a
// scan of the refreshed entries) or in a pack (through the index beside it
// when that lists the pack as it is, else member by member).
KVFILE_EXPORT Status FindPrefix(const std::string& path, std::span<const uint32_t> query,
                                const PrefixFindOptions& options, std::optional<PrefixMatch>* out,
                                PrefixIndexReport* report = nullptr);

}  // namespace kvfile
