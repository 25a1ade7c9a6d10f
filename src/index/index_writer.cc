// SPDX-License-Identifier: Apache-2.0
// PrefixIndexWriter: writes an index file block by block (spec/INDEX.md),
// holding one block and the block and group tables in memory.
#include <algorithm>

#include "io/atomic_replace.h"
#include "index/index_format.h"
#include "kvfile/prefix_index.h"

namespace kvfile {

using index::BlockRef;
using index::Group;

struct KVFILE_NO_EXPORT PrefixIndexWriter::Impl {
  FileSystem* fs = nullptr;
  std::unique_ptr<PendingReplace> replace;
  std::unique_ptr<File> file;
  std::vector<uint8_t> block;
  uint32_t block_entries = 0;
  PrefixEntry previous;  // the last entry added
  uint64_t entry_count = 0;
  uint64_t offset = index::kHeaderBytes;  // where the next block goes
  std::vector<BlockRef> blocks;
  std::vector<Group> groups;
  bool failed = false;

  Status FlushBlock() {
    if (block_entries == 0) return Status::OK();
    BlockRef b{offset, static_cast<uint32_t>(block.size()), block_entries,
               format::Checksum(block.data(), block.size())};
    Status st = file->WriteAt(offset, block.data(), block.size());
    if (!st.ok()) return st;
    blocks.push_back(b);
    offset += block.size();
    block.clear();
    block_entries = 0;
    return Status::OK();
  }
};

PrefixIndexWriter::PrefixIndexWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PrefixIndexWriter::~PrefixIndexWriter() = default;

Status PrefixIndexWriter::Begin(const std::string& dest, FileSystem* fs, std::unique_ptr<PrefixIndexWriter>* out) {
  auto impl = std::make_unique<Impl>();
  impl->fs = fs ? fs : FileSystem::Default();
  Status st = PendingReplace::Begin(dest, impl->fs, &impl->replace);
  if (st.ok()) st = impl->fs->Open(impl->replace->temp_path(), OpenMode::kCreateExclusive, &impl->file);
  if (!st.ok()) return st;
  out->reset(new PrefixIndexWriter(std::move(impl)));
  return Status::OK();
}

Status PrefixIndexWriter::Add(const PrefixEntry& e) {
  Impl& w = *impl_;
  if (w.failed) return Status::Failed(w.replace->target() + ": an earlier write to the index failed");
  if (e.path.empty() || e.path.size() > index::kMaxPathBytes)
    return Status::InvalidArgument(e.path + ": path length out of range for the index");
  if (e.model_id.size() > index::kMaxModelIdBytes)
    return Status::InvalidArgument(e.path + ": model id longer than 255 bytes");
  if (e.tokens.size() > UINT32_MAX) return Status::InvalidArgument(e.path + ": too many tokens for the index");
  if (w.entry_count > 0 && index::CompareEntries(w.previous, e) >= 0)
    return Status::InvalidArgument(e.path + ": entries must be added in index order, each once");
  index::EncodeEntry(e, w.block_entries ? &w.previous : nullptr, &w.block);
  if (w.block.size() > UINT32_MAX) return Status::InvalidArgument(e.path + ": index block too large");
  if (w.groups.empty() || w.groups.back().fingerprint != e.fingerprint) w.groups.push_back({e.fingerprint, w.entry_count, 0});
  ++w.groups.back().count;
  ++w.block_entries;
  ++w.entry_count;
  w.previous = e;
  if (w.block_entries == index::kRestartInterval) {
    Status st = w.FlushBlock();
    if (!st.ok()) {
      w.failed = true;
      return st;
    }
  }
  return Status::OK();
}

Status PrefixIndexWriter::Finish(uint64_t directory_digest, uint64_t skipped) {
  Impl& w = *impl_;
  if (w.failed) return Status::Failed(w.replace->target() + ": an earlier write to the index failed");
  w.failed = true;  // until it succeeds
  Status st = w.FlushBlock();
  if (!st.ok()) return st;
  std::vector<uint8_t> tables(w.blocks.size() * index::kBlockEntryBytes + w.groups.size() * index::kGroupEntryBytes);
  for (size_t i = 0; i < w.blocks.size(); ++i) index::EncodeBlockRef(w.blocks[i], tables.data() + i * index::kBlockEntryBytes);
  uint8_t* group_table = tables.data() + w.blocks.size() * index::kBlockEntryBytes;
  for (size_t i = 0; i < w.groups.size(); ++i) index::EncodeGroup(w.groups[i], group_table + i * index::kGroupEntryBytes);
  index::Header h;
  h.entry_count = w.entry_count;
  h.blocks_bytes = w.offset - index::kHeaderBytes;
  h.block_count = w.blocks.size();
  h.block_table_checksum = format::Checksum(tables.data(), w.blocks.size() * index::kBlockEntryBytes);
  h.group_count = w.groups.size();
  h.group_table_checksum = format::Checksum(group_table, w.groups.size() * index::kGroupEntryBytes);
  h.directory_digest = directory_digest;
  h.skipped = skipped;
  h.file_bytes = w.offset + tables.size();
  uint8_t header[index::kHeaderBytes];
  index::EncodeHeader(h, header);
  st = w.file->WriteAt(w.offset, tables.data(), tables.size());
  if (st.ok()) st = w.file->WriteAt(0, header, sizeof header);
  if (st.ok()) st = w.file->Sync();
  w.file.reset();
  if (st.ok()) st = w.replace->Commit();
  if (st.ok()) w.failed = false;
  return st;
}

}  // namespace kvfile
