// SPDX-License-Identifier: Apache-2.0
// PrefixIndex: opens an index file and answers longest-prefix lookups,
// reading and checking only the blocks a binary search touches.
//
// Why the neighbours of the insertion point suffice. Let s_1 <= ... <= s_n
// be a group's token sequences in lexicographic order, and p the first
// index with s_p >= q. For sorted a <= b <= c, lcp(a, c) = min(lcp(a, b),
// lcp(b, c)): a and c agree up to where one of them first departs from b.
// So for j < p, s_j <= s_{p-1} < q gives lcp(s_j, q) <= lcp(s_{p-1}, q),
// and for j >= p, q <= s_p <= s_j gives lcp(q, s_j) <= lcp(q, s_p): the
// longest match L is the larger of the two neighbours'. The first entry in
// index order with L tokens in common is the first with s >= q[0, L): it
// lies between q[0, L) and a sequence that starts with q[0, L), so by the
// same identity it starts with q[0, L) too, and every sequence that does is
// >= q[0, L). Entries with equal tokens follow in path order.
//
// Lookup can be limited to the entries a predicate keeps (the members of
// one pack): the kept entries are a sorted subsequence, so the same holds
// for the nearest kept entries on each side of the insertion point, and
// for the first kept entry >= q[0, L).
#include <algorithm>

#include "io/checked_read.h"
#include "index/index_format.h"
#include "kvfile/prefix_index.h"
#include "s3/s3_url.h"

namespace kvfile {

namespace {
// A remote index up to this size is fetched whole when it opens (one GET
// after the first, none when the first MiB holds it): a lookup then costs
// no request per block.
constexpr uint64_t kWholeRemoteIndexBytes = uint64_t{64} << 20;
}  // namespace

using index::BlockRef;
using index::Group;

bool PrefixEntryLess(const PrefixEntry& a, const PrefixEntry& b) { return index::CompareEntries(a, b) < 0; }

struct KVFILE_NO_EXPORT PrefixIndex::Impl {
  std::string path;
  std::unique_ptr<File> file;
  index::Header header;
  std::vector<BlockRef> blocks;
  std::vector<Group> groups;
  // The last block decoded (a binary search's last steps stay in it).
  uint64_t cached_block = UINT64_MAX;
  std::vector<PrefixEntry> cached;
  std::vector<uint8_t> buffer;
  std::vector<uint8_t> whole;  // the whole file, when it was fetched whole

  // ReadChecked, from `whole` when the file was fetched whole (the region
  // was checked to lie inside the file before).
  Status Checked(uint64_t offset, uint64_t n, uint64_t want, std::vector<uint8_t>* out, bool* match) {
    if (whole.empty()) return internal::ReadChecked(*file, offset, n, want, out, match);
    const uint8_t* p = whole.data() + offset;
    *match = format::ChecksumMatches(want, format::Checksum(p, n));
    if (*match) out->assign(p, p + n);
    else out->clear();
    return Status::OK();
  }

  Status LoadBlock(uint64_t b) {
    if (b == cached_block) return Status::OK();
    const BlockRef& ref = blocks[b];
    std::string where = path + ": index block " + std::to_string(b);
    bool match = false;
    Status st = Checked(ref.offset, ref.bytes, ref.checksum, &buffer, &match);
    if (!st.ok()) return st;
    if (!match) return Status::Corruption(where + ": checksum mismatch");
    cached_block = UINT64_MAX;
    st = index::DecodeBlock(where, buffer, ref.entries, &cached);
    if (!st.ok()) return st;
    // Every entry of a block lies in one group, the one the table says.
    uint64_t first = b * header.restart_interval;
    for (uint32_t k = 0; k < ref.entries; ++k) {
      auto g = std::upper_bound(groups.begin(), groups.end(), first + k,
                                [](uint64_t i, const Group& gr) { return i < gr.first; });
      if (g == groups.begin() || std::prev(g)->fingerprint != cached[k].fingerprint)
        return Status::Corruption(where + " entry " + std::to_string(k) + ": fingerprint differs from its group's");
    }
    cached_block = b;
    return Status::OK();
  }

  Status Entry(uint64_t i, const PrefixEntry** out) {
    Status st = LoadBlock(i / header.restart_interval);
    if (!st.ok()) return st;
    *out = &cached[i % header.restart_interval];
    return Status::OK();
  }

  // First index in [lo, hi) whose tokens are >= key.
  Status LowerBound(uint64_t lo, uint64_t hi, std::span<const uint32_t> key, uint64_t* out) {
    while (lo < hi) {
      uint64_t mid = lo + (hi - lo) / 2;
      const PrefixEntry* e = nullptr;
      Status st = Entry(mid, &e);
      if (!st.ok()) return st;
      if (std::lexicographical_compare(e->tokens.begin(), e->tokens.end(), key.begin(), key.end())) lo = mid + 1;
      else hi = mid;
    }
    *out = lo;
    return Status::OK();
  }

  // The first index in [from, hi) stepping by +1, or (down) in [lo, from)
  // stepping by -1, whose entry `keep` accepts (every entry when `keep` is
  // empty); *at = UINT64_MAX when none.
  Status NextKept(uint64_t from, uint64_t lo, uint64_t hi, bool down, const PrefixKeep& keep, uint64_t* at,
                  const PrefixEntry** e) {
    *at = UINT64_MAX;
    for (uint64_t n = from; down ? n > lo : n < hi; down ? --n : ++n) {
      uint64_t i = down ? n - 1 : n;
      Status st = Entry(i, e);
      if (!st.ok()) return st;
      if (!keep || keep(**e)) {
        *at = i;
        break;
      }
    }
    return Status::OK();
  }

  // The best match inside one group among the kept entries: *matched 0
  // when none.
  Status Search(const Group& g, std::span<const uint32_t> q, const PrefixKeep& keep, uint64_t* matched,
                uint64_t* best) {
    uint64_t lo = g.first, hi = g.first + g.count, p, at;
    Status st = LowerBound(lo, hi, q, &p);
    if (!st.ok()) return st;
    uint64_t l = 0;
    const PrefixEntry* e = nullptr;
    for (bool down : {true, false}) {
      if (!(st = NextKept(p, lo, hi, down, keep, &at, &e)).ok()) return st;
      if (at != UINT64_MAX) l = std::max(l, index::CommonPrefix(e->tokens, q));
    }
    *matched = l;
    if (l == 0) return Status::OK();
    if (!(st = LowerBound(lo, hi, q.first(l), &p)).ok()) return st;
    return NextKept(p, lo, hi, false, keep, best, &e);
  }
};

PrefixIndex::PrefixIndex(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PrefixIndex::~PrefixIndex() = default;
uint64_t PrefixIndex::entry_count() const { return impl_->header.entry_count; }
uint64_t PrefixIndex::directory_digest() const { return impl_->header.directory_digest; }
uint64_t PrefixIndex::skipped() const { return impl_->header.skipped; }

Status PrefixIndex::Open(const std::string& path, FileSystem* fs, std::unique_ptr<PrefixIndex>* out) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  if (!fs) fs = FileSystem::Default();
  Status st = fs->Open(path, OpenMode::kRead, &impl->file);
  if (!st.ok()) return st;
  uint64_t size = 0;
  if (!(st = impl->file->Size(&size)).ok()) return st;
  if (size < index::kHeaderBytes) return Status::Corruption(path + ": index shorter than its header (" + std::to_string(size) + " bytes)");
  uint8_t raw[index::kHeaderBytes];
  if (!(st = impl->file->ReadAt(0, raw, sizeof raw)).ok()) return st;
  index::Header& h = impl->header;
  if (!(st = index::DecodeHeader(path, raw, &h)).ok()) return st;
  if (h.file_bytes != size)
    return Status::Corruption(path + ": index is " + std::to_string(size) + " bytes, its header says " +
                              std::to_string(h.file_bytes));
  // Sizes come from the file: each table must fit in the bytes present
  // before anything is allocated for it.
  uint64_t room = size - index::kHeaderBytes;
  if (h.blocks_bytes > room || h.block_count > (room - h.blocks_bytes) / index::kBlockEntryBytes ||
      h.group_count > (room - h.blocks_bytes - h.block_count * index::kBlockEntryBytes) / index::kGroupEntryBytes ||
      index::kHeaderBytes + h.blocks_bytes + h.block_count * index::kBlockEntryBytes +
              h.group_count * index::kGroupEntryBytes != size)
    return Status::Corruption(path + ": index tables do not fill the file");
  uint64_t k = h.restart_interval;
  if (h.block_count != (h.entry_count + k - 1) / k)
    return Status::Corruption(path + ": index has " + std::to_string(h.block_count) + " blocks for " +
                              std::to_string(h.entry_count) + " entries");
  // Every entry takes at least its fixed part and a one-byte path in the
  // blocks, and every group at least one entry: the counts are bounded by
  // the blocks' bytes before the tables are read.
  if (h.entry_count > h.blocks_bytes / (index::kEntryFixedBytes + 1) || h.group_count > h.entry_count)
    return Status::Corruption(path + ": index claims " + std::to_string(h.entry_count) + " entries in " +
                              std::to_string(h.group_count) + " groups, more than " +
                              std::to_string(h.blocks_bytes) + " bytes of blocks hold");
  // Each table is allocated only once its checksum holds (ReadChecked).
  const uint64_t block_table = h.block_count * index::kBlockEntryBytes;
  std::vector<uint8_t> blocks_raw, groups_raw;
  bool match = false;
  // A remote index of moderate size: fetched whole, then read from memory.
  if (s3::IsS3Path(path) && size <= kWholeRemoteIndexBytes) {
    impl->whole.resize(size);
    if (!(st = impl->file->ReadAt(0, impl->whole.data(), size)).ok()) return st;
  }
  if (!(st = impl->Checked(index::kHeaderBytes + h.blocks_bytes, block_table,
                           h.block_table_checksum, &blocks_raw, &match)).ok())
    return st;
  if (!match) return Status::Corruption(path + ": index block table checksum mismatch");
  if (!(st = impl->Checked(index::kHeaderBytes + h.blocks_bytes + block_table,
                           h.group_count * index::kGroupEntryBytes, h.group_table_checksum, &groups_raw, &match)).ok())
    return st;
  if (!match) return Status::Corruption(path + ": index group table checksum mismatch");
  uint64_t at = index::kHeaderBytes;
  impl->blocks.reserve(h.block_count);
  impl->groups.reserve(h.group_count);
  for (uint64_t b = 0; b < h.block_count; ++b) {
    BlockRef ref = index::DecodeBlockRef(blocks_raw.data() + b * index::kBlockEntryBytes);
    uint64_t want = b + 1 < h.block_count ? k : h.entry_count - b * k;
    // Minimal entry: fixed part and a one-byte path.
    if (ref.offset != at || ref.entries != want || ref.bytes < ref.entries * (index::kEntryFixedBytes + 1) ||
        ref.bytes > index::kHeaderBytes + h.blocks_bytes - at)
      return Status::Corruption(path + ": index block " + std::to_string(b) + " does not follow the one before");
    at += ref.bytes;
    impl->blocks.push_back(ref);
  }
  if (at != index::kHeaderBytes + h.blocks_bytes) return Status::Corruption(path + ": index blocks do not fill their region");
  uint64_t next = 0;
  for (uint64_t g = 0; g < h.group_count; ++g) {
    Group gr = index::DecodeGroup(groups_raw.data() + g * index::kGroupEntryBytes);
    if (gr.first != next || gr.count == 0 || gr.count > h.entry_count - next ||
        (g > 0 && gr.fingerprint <= impl->groups.back().fingerprint))
      return Status::Corruption(path + ": index group " + std::to_string(g) + " does not follow the one before");
    next += gr.count;
    impl->groups.push_back(gr);
  }
  if (next != h.entry_count) return Status::Corruption(path + ": index groups do not cover its entries");
  out->reset(new PrefixIndex(std::move(impl)));
  return Status::OK();
}

Status PrefixIndex::ReadEntry(uint64_t i, PrefixEntry* out) {
  if (i >= impl_->header.entry_count) return Status::InvalidArgument(impl_->path + ": no index entry " + std::to_string(i));
  const PrefixEntry* e = nullptr;
  Status st = impl_->Entry(i, &e);
  if (st.ok()) *out = *e;
  return st;
}

Status PrefixIndex::Lookup(std::span<const uint32_t> query, std::optional<uint64_t> fingerprint,
                           std::optional<PrefixMatch>* out) {
  return Lookup(query, fingerprint, PrefixKeep(), out);
}

Status PrefixIndex::Lookup(std::span<const uint32_t> query, std::optional<uint64_t> fingerprint,
                           const PrefixKeep& keep, std::optional<PrefixMatch>* out) {
  out->reset();
  uint64_t best_len = 0, best = 0;
  for (const Group& g : impl_->groups) {
    if (fingerprint && g.fingerprint != *fingerprint) continue;
    uint64_t len = 0, at = 0;
    Status st = impl_->Search(g, query, keep, &len, &at);
    if (!st.ok()) return st;
    if (len > best_len) best_len = len, best = at;  // groups ascend: a tie keeps the smaller fingerprint
  }
  if (best_len == 0) return Status::OK();
  const PrefixEntry* e = nullptr;
  Status st = impl_->Entry(best, &e);
  if (!st.ok()) return st;
  *out = PrefixMatch{e->path, e->model_id, e->fingerprint, e->tokens.size(), best_len};
  return Status::OK();
}

}  // namespace kvfile
