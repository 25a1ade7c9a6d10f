// SPDX-License-Identifier: Apache-2.0
// Writer::Impl: the coordinator behind kvfile::Writer. It owns the file and
// the token sequence written so far, and hands the rest to one object per
// concern:
//   ChunkBuilder (chunk_builder.h)  staging and sealing chunk bytes, no I/O
//   CommitLog (commit_log.h)        commit slots, data-before-record order
//   writer_lock.h                   opening and locking the file
// and one file per operation on the whole: writer_recovery.cc (open of an
// existing file, cut back after a failure), writer_rewind.cc,
// writer_upgrade.cc (v1 -> v2). writer.cc holds the append path and the
// public API.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "format/header.h"
#include "kvfile/writer.h"
#include "writer/chunk_builder.h"
#include "writer/commit_log.h"
#include "reader/file_scan.h"
#include "writer/direct_chunk.h"
#include "writer/write_behind.h"

namespace kvfile {

struct KVFILE_NO_EXPORT Writer::Impl final : internal::DirectChunkSink {
  std::string path;
  FileSystem* fs = nullptr;
  std::unique_ptr<File> file;
  WriterOptions options;
  format::FileHeader header;
  internal::ChunkBuilder builder;
  internal::CommitLog log;
  internal::WriteBehind write_behind;  // early writeback of written chunks

  // The chunk write in flight (File::SubmitWrite), if any: its buffer is
  // the builder's other one. `syncs`: it has a linked fdatasync.
  struct InFlight {
    bool pending = false;
    bool syncs = false;
  } in_flight;

  // The sequence: chunks on disk, then the builder's staged tokens.
  uint64_t disk_tokens = 0;  // live tokens in chunks written to the file
  uint64_t end = format::kDataOffset;
  struct WrittenChunk {
    uint64_t offset, bytes, first_token;
  };
  std::vector<WrittenChunk> chunks;  // every chunk of the sequence, in order
  std::vector<uint32_t> tokens;      // every token id, staged ones included
  // Append ends (spec/RECOVERY.md, "Atomic appends"): tokens before
  // append_end belong to finished appends; those after it to the append
  // still open (AppendBatch::continued), if any. Files with
  // kFlagAppendEnds record it in every chunk head and commit only up to it.
  bool append_ends = false;
  uint64_t append_end = 0;
  bool append_open = false;
  uint64_t disk_append_end = 0;  // the last append end inside a chunk written to the file

  Status failure;  // set once an I/O error makes the writer unusable
  bool closed = false;
  RecoveryReport recovery;

  const format::Geometry& g() const { return header.geometry; }

  Status CheckUsable() const {
    if (closed) return Status::Failed(path + ": writer is closed");
    if (!failure.ok())
      return Status::Failed(path + ": writer stopped after an earlier error (" + failure.message() +
                            "); tokens after the last sync are lost");
    return Status::OK();
  }
  Status Fail(Status st) {
    failure = st;
    return st;
  }

  Status Init(const std::string& p, const WriterOptions& o, format::FileHeader h, bool cap_chunk_size);
  Status CreateFile(const std::string& write_path, uint32_t epoch);

  // writer.cc: the append path.
  Status AppendTokens(const AppendBatch& batch, bool* wrote_chunk = nullptr);
  Status WriteStagedChunk();
  Status WaitInFlight();
  Status CommitDurably(bool force = false);
  Status WriteCommit(format::CommitRecord next);
  uint64_t CommitTarget() const;
  Status AbandonAppend(Status why);

  // direct_chunk.cc: chunks a caller writes whole into the file, without
  // staging (DirectChunk, through internal::DirectChunkSink).
  Status BeginDirectChunk(uint32_t n, format::ChunkHeader* head, format::ChunkLayout* layout) override;
  const std::string& DirectChunkPath() const override { return path; }
  Status QueueChunkBytes(uint64_t offset, const uint8_t* bytes, size_t n) override;
  Status WaitChunkBytes() override;
  void AbandonChunkBytes() override;
  Status EndDirectChunk(const format::ChunkHeader& head, std::span<const uint8_t> head_bytes,
                        std::span<const uint32_t> chunk_tokens) override;

  // writer_recovery.cc
  Status Recover(const internal::ScanResult& scan);
  void CutBackAfterFailure();
  // writer_rewind.cc
  Status RewindTo(uint64_t n);
  // writer_upgrade.cc: Writer::Open's branch for a v1 file. Upgrades it
  // and makes *out the writer of the new v2 file. `v1` is the file, locked;
  // `real` its path with symlinks resolved.
  static Status OpenUpgrading(const std::string& path, const std::string& real, const WriterOptions& options,
                              File& v1, const internal::ScanResult& scan, std::unique_ptr<Impl>* out);
  Status UpgradeFrom(File& v1, const internal::ScanResult& scan);
};

namespace internal {

// The library's two doors into a writer (writer.h's one friend), each
// narrow: a chunk written whole (DirectChunk) sees the writer only as its
// DirectChunkSink, and Create is Writer::Create with the salt given.
struct WriterAccess {
  static DirectChunkSink& DirectChunks(Writer& w) { return *w.impl_; }
  // Writer::Create with `salt` for the new file instead of a random one
  // (0: random, which is all Writer::Create does). The format wants a
  // fresh random salt for every file (spec/FORMAT.md); nothing in the
  // library passes another. Tests whose files must come out byte for byte
  // the same (golden files, sweeps) do, through the test library
  // (tests/support/testing_hooks.h).
  static Status Create(const std::string& path, const Geometry& geometry, const ModelIdentity& identity,
                       const WriterOptions& options, uint64_t salt, std::unique_ptr<Writer>* out);
};

// A new file's header (salt left 0).
format::FileHeader NewHeader(const Geometry& geometry, const ModelIdentity& identity, uint32_t chunk_tokens,
                             uint16_t major);
Status RandomSalt(uint64_t* salt);

}  // namespace internal

}  // namespace kvfile
