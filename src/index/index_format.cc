// SPDX-License-Identifier: Apache-2.0
// Codecs of the prefix index file (spec/INDEX.md).
#include "index/index_format.h"

#include <algorithm>
#include <cstring>

#include "format/endian.h"

namespace kvfile::index {

using format::LoadU32;
using format::LoadU64;
using format::StoreU32;
using format::StoreU64;

void EncodeHeader(const Header& h, uint8_t* out) {
  format::EncodeFrame(kFrame, {kMajor, kMinor, 0, 0}, {out, kHeaderBytes});
  StoreU64(out + hdr::kEntryCount, h.entry_count);
  StoreU32(out + hdr::kRestartInterval, h.restart_interval);
  StoreU64(out + hdr::kBlocksBytes, h.blocks_bytes);
  StoreU64(out + hdr::kBlockCount, h.block_count);
  StoreU64(out + hdr::kBlockTableChecksum, h.block_table_checksum);
  StoreU64(out + hdr::kGroupCount, h.group_count);
  StoreU64(out + hdr::kGroupTableChecksum, h.group_table_checksum);
  StoreU64(out + hdr::kDirectoryDigest, h.directory_digest);
  StoreU64(out + hdr::kFileBytes, h.file_bytes);
  StoreU64(out + hdr::kSkipped, h.skipped);
  format::SealRecord({out, kHeaderBytes});
}

Status DecodeHeader(const std::string& path, const uint8_t* in, Header* h) {
  const format::FrameCheck frame = format::ParseFrame(kFrame, {in, kHeaderBytes});
  switch (frame.fault) {
    case format::FrameFault::kNone:
      break;
    case format::FrameFault::kMagic:
      return Status::Corruption(path + ": not a kvfile prefix index (bad magic)");
    case format::FrameFault::kMajor:
      return Status::Unsupported(path + ": index format " + std::to_string(frame.fields.major) +
                                 " (this build reads " + std::to_string(kMajor) + ")");
    case format::FrameFault::kChecksum:
      return Status::Corruption(path + ": index header checksum mismatch");
    case format::FrameFault::kHeaderBytes:
      return Status::Corruption(path + ": index header size is not " + std::to_string(kHeaderBytes));
    case format::FrameFault::kRequiredFlags:  // the index has no flags
    case format::FrameFault::kReserved:
      return Status::Corruption(path + ": index header reserved bytes are not zero");
  }
  h->entry_count = LoadU64(in + hdr::kEntryCount);
  h->restart_interval = LoadU32(in + hdr::kRestartInterval);
  h->blocks_bytes = LoadU64(in + hdr::kBlocksBytes);
  h->block_count = LoadU64(in + hdr::kBlockCount);
  h->block_table_checksum = LoadU64(in + hdr::kBlockTableChecksum);
  h->group_count = LoadU64(in + hdr::kGroupCount);
  h->group_table_checksum = LoadU64(in + hdr::kGroupTableChecksum);
  h->directory_digest = LoadU64(in + hdr::kDirectoryDigest);
  h->file_bytes = LoadU64(in + hdr::kFileBytes);
  h->skipped = LoadU64(in + hdr::kSkipped);
  if (h->restart_interval == 0 || h->restart_interval > kMaxRestartInterval)
    return Status::Corruption(path + ": index restart interval " + std::to_string(h->restart_interval) +
                              " is out of range");
  return Status::OK();
}

void EncodeBlockRef(const BlockRef& b, uint8_t* out) {
  StoreU64(out + be::kOffset, b.offset);
  StoreU32(out + be::kBytes, b.bytes);
  StoreU32(out + be::kEntries, b.entries);
  StoreU64(out + be::kChecksum, b.checksum);
}

BlockRef DecodeBlockRef(const uint8_t* in) {
  return {LoadU64(in + be::kOffset), LoadU32(in + be::kBytes), LoadU32(in + be::kEntries),
          LoadU64(in + be::kChecksum)};
}

void EncodeGroup(const Group& g, uint8_t* out) {
  StoreU64(out + ge::kFingerprint, g.fingerprint);
  StoreU64(out + ge::kFirst, g.first);
  StoreU64(out + ge::kCount, g.count);
}

Group DecodeGroup(const uint8_t* in) {
  return {LoadU64(in + ge::kFingerprint), LoadU64(in + ge::kFirst), LoadU64(in + ge::kCount)};
}

uint64_t CommonPrefix(std::span<const uint32_t> a, std::span<const uint32_t> b) {
  auto [ia, ib] = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  return static_cast<uint64_t>(ia - a.begin());
}

int CompareEntries(const PrefixEntry& a, const PrefixEntry& b) {
  if (a.fingerprint != b.fingerprint) return a.fingerprint < b.fingerprint ? -1 : 1;
  auto c = std::lexicographical_compare_three_way(a.tokens.begin(), a.tokens.end(), b.tokens.begin(),
                                                  b.tokens.end());
  if (c != 0) return c < 0 ? -1 : 1;
  int p = a.path.compare(b.path);
  return p < 0 ? -1 : p > 0 ? 1 : 0;
}

void EncodeEntry(const PrefixEntry& e, const PrefixEntry* previous, std::vector<uint8_t>* block) {
  uint64_t shared = previous ? CommonPrefix(previous->tokens, e.tokens) : 0;
  uint64_t suffix = e.tokens.size() - shared;
  size_t at = block->size();
  block->resize(at + kEntryFixedBytes + suffix * 4 + e.path.size() + e.model_id.size());
  uint8_t* p = block->data() + at;
  StoreU32(p + en::kShared, static_cast<uint32_t>(shared));
  StoreU32(p + en::kSuffixCount, static_cast<uint32_t>(suffix));
  StoreU32(p + en::kPathBytes, static_cast<uint32_t>(e.path.size()));
  StoreU32(p + en::kModelIdBytes, static_cast<uint32_t>(e.model_id.size()));
  StoreU64(p + en::kFingerprint, e.fingerprint);
  StoreU64(p + en::kSize, e.size);
  StoreU64(p + en::kMtime, static_cast<uint64_t>(e.mtime_ns));
  StoreU64(p + en::kCtime, static_cast<uint64_t>(e.ctime_ns));
  StoreU64(p + en::kDevice, e.device);
  StoreU64(p + en::kInode, e.inode);
  p += kEntryFixedBytes;
  for (uint64_t i = 0; i < suffix; ++i, p += 4) StoreU32(p, e.tokens[shared + i]);
  std::memcpy(p, e.path.data(), e.path.size());
  std::memcpy(p + e.path.size(), e.model_id.data(), e.model_id.size());
}

Status DecodeBlock(const std::string& where, std::span<const uint8_t> block, uint32_t count,
                   std::vector<PrefixEntry>* entries) {
  entries->clear();
  size_t at = 0;
  for (uint32_t k = 0; k < count; ++k) {
    std::string what = where + " entry " + std::to_string(k);
    if (block.size() - at < kEntryFixedBytes) return Status::Corruption(what + ": ends past its block");
    const uint8_t* p = block.data() + at;
    uint32_t shared = LoadU32(p + en::kShared);
    uint64_t suffix = LoadU32(p + en::kSuffixCount);
    uint32_t path_bytes = LoadU32(p + en::kPathBytes);
    uint32_t model_bytes = LoadU32(p + en::kModelIdBytes);
    if (path_bytes == 0 || path_bytes > kMaxPathBytes)
      return Status::Corruption(what + ": path length " + std::to_string(path_bytes) + " is out of range");
    if (model_bytes > kMaxModelIdBytes)
      return Status::Corruption(what + ": model id length " + std::to_string(model_bytes) + " is out of range");
    uint64_t need = kEntryFixedBytes + suffix * 4 + path_bytes + model_bytes;
    if (block.size() - at < need) return Status::Corruption(what + ": ends past its block");
    const PrefixEntry* prev = k ? &entries->back() : nullptr;
    if (shared > (prev ? prev->tokens.size() : 0))
      return Status::Corruption(what + ": shares " + std::to_string(shared) + " tokens with a shorter entry");
    PrefixEntry e;
    e.fingerprint = LoadU64(p + en::kFingerprint);
    e.size = LoadU64(p + en::kSize);
    e.mtime_ns = static_cast<int64_t>(LoadU64(p + en::kMtime));
    e.ctime_ns = static_cast<int64_t>(LoadU64(p + en::kCtime));
    e.device = LoadU64(p + en::kDevice);
    e.inode = LoadU64(p + en::kInode);
    e.tokens.reserve(shared + suffix);
    if (prev) e.tokens.assign(prev->tokens.begin(), prev->tokens.begin() + shared);
    p += kEntryFixedBytes;
    for (uint64_t i = 0; i < suffix; ++i, p += 4) e.tokens.push_back(LoadU32(p));
    e.path.assign(reinterpret_cast<const char*>(p), path_bytes);
    e.model_id.assign(reinterpret_cast<const char*>(p) + path_bytes, model_bytes);
    if (prev && CompareEntries(*prev, e) >= 0)
      return Status::Corruption(what + ": out of order");
    if (prev && CommonPrefix(prev->tokens, e.tokens) != shared)
      return Status::Corruption(what + ": shared prefix length is not the longest");
    at += need;
    entries->push_back(std::move(e));
  }
  if (at != block.size()) return Status::Corruption(where + ": " + std::to_string(block.size() - at) +
                                                    " bytes after its last entry");
  return Status::OK();
}

}  // namespace kvfile::index
