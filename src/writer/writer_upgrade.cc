// SPDX-License-Identifier: Apache-2.0
// The v1 -> v2 upgrade at a writable open of a v1 file (spec/RECOVERY.md,
// "Upgrade").
#include <xxhash.h>

#include <algorithm>

#include "kvfile/replace.h"
#include "writer/writer_impl.h"

namespace kvfile {

using namespace kvfile::format;
using internal::NewHeader;
using internal::RandomSalt;

Status Writer::Impl::OpenUpgrading(const std::string& path, const std::string& real, const WriterOptions& options,
                                   File& v1, const internal::ScanResult& scan, std::unique_ptr<Impl>* out) {
  auto impl = std::make_unique<Impl>();
  std::string tmp = TempPathFor(real, ".kvupgrade");
  if (!IsFp8(options.upgrade_dtype))
    return Status::InvalidArgument(path + ": the upgrade dtype must be e4m3 or e5m2");
  FileHeader h = NewHeader(scan.header.geometry, scan.header.identity, scan.header.chunk_tokens, kMajorV2);
  for (StreamSpec& s : h.geometry.streams)
    if (std::find(options.keep_raw.begin(), options.keep_raw.end(), s.name) == options.keep_raw.end())
      s.dtype = options.upgrade_dtype;
  for (const std::string& name : options.keep_raw)
    if (!h.geometry.FindStream(name))
      return Status::InvalidArgument(path + ": --keep-raw names stream '" + name + "', which the file does not have");
  KVFILE_RETURN_IF_ERROR(RandomSalt(&h.salt));
  KVFILE_RETURN_IF_ERROR(impl->Init(path, options, h, /*cap_chunk_size=*/true));
  FileSystem* fs = impl->fs;
  uint32_t epoch = 0;
  KVFILE_RETURN_IF_ERROR(internal::CommitLog::BumpEpoch(path, scan.commit.epoch, &epoch));
  // The upgrade renames a new file over the old one's name: another hard
  // link would go on naming the old v1 data, so that is refused. The new
  // file gets the old one's mode, owner and group.
  PathInfo info;
  FileId locked;
  KVFILE_RETURN_IF_ERROR(fs->Stat(real, &info));
  KVFILE_RETURN_IF_ERROR(v1.Id(&locked));
  if (!info.exists || !(info.id == locked))
    return Status::Busy(path + ": the file was replaced while opening it; not upgraded");
  if (info.links > 1)
    return Status::InvalidArgument(
        path + ": a v1 file with " + std::to_string(info.links) +
        " hard links is not upgraded to v2 in place (the other names would keep the old v1 data); "
        "write a v2 copy with `kvfile convert`, or remove the other links first");
  Status st = impl->CreateFile(tmp, epoch);
  if (!st.ok()) return st.WithContext(path + ": upgrade to v2 failed, the v1 file is unchanged");
  st = impl->UpgradeFrom(v1, scan);
  if (st.ok()) st = fs->CopyAttributes(info, tmp);
  if (st.ok()) st = fs->Rename(tmp, real, /*replace=*/true);
  if (!st.ok()) {
    impl->file.reset();
    (void)fs->Remove(tmp);
    return st.WithContext(path + ": upgrade to v2 failed, the v1 file is unchanged");
  }
  KVFILE_RETURN_IF_ERROR(fs->SyncDir(DirName(real)));
  impl->recovery.upgraded_from_v1 = true;
  impl->recovery.dropped_committed_tokens = scan.tail.committed_tokens_missing;
  *out = std::move(impl);
  return Status::OK();
}

// The v1 -> v2 upgrade (spec/RECOVERY.md, "Upgrade"): stream every live
// token of the v1 file into a new v2 file at <path>.kvupgrade, checking
// every v1 section checksum on the way; make it durable; rename it over
// the original; sync the directory. Until the rename the original is only
// read; on any failure the temporary file is removed.
Status Writer::Impl::UpgradeFrom(File& v1, const internal::ScanResult& scan) {
  const Geometry& g1 = scan.header.geometry;
  internal::LayoutCache layouts(&scan.header.geometry);
  // Tokens are read in slices of at most 8 MiB of rows, so memory stays
  // bounded whatever the v1 chunk size: the slice buffer plus the two
  // staging buffers of the new file.
  uint64_t bytes_per_token = 0;
  for (const StreamSpec& s : g1.streams) bytes_per_token += s.ElementsPerToken() * ElementSize(s.dtype);
  bytes_per_token *= g1.layers;
  uint64_t slice_tokens = std::max<uint64_t>(1, (8u << 20) / bytes_per_token);
  internal::PageBuffer slice;
  struct StateFree {
    void operator()(XXH3_state_t* st) const { XXH3_freeState(st); }
  };
  std::vector<std::unique_ptr<XXH3_state_t, StateFree>> hashes;
  for (size_t i = 0; i < static_cast<size_t>(g1.layers) * g1.streams.size(); ++i) {
    hashes.emplace_back(XXH3_createState());
    if (!hashes.back()) return Status::IOError(path + ": out of memory for checksum state");
  }
  AppendBatch batch;
  for (size_t ci = 0; ci < scan.chunks.size(); ++ci) {
    const internal::ScannedChunk& c = scan.chunks[ci];
    const ChunkLayout* layout;
    KVFILE_RETURN_IF_ERROR(layouts.Get(c.info.stored_tokens, &layout));
    for (auto& h : hashes) XXH3_64bits_reset(h.get());
    uint32_t stored = c.info.stored_tokens;
    for (uint32_t t0 = 0; t0 < stored; t0 += static_cast<uint32_t>(slice_tokens)) {
      uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(slice_tokens, stored - t0));
      bool last_slice = t0 + n == stored;
      if (!slice.Resize(n * bytes_per_token))
        return Status::IOError(path + ": no memory for an upgrade slice of " + std::to_string(n * bytes_per_token) +
                               " bytes");
      batch.blocks.clear();
      uint8_t* dst = slice.data();
      for (size_t i = 0; i < layout->sections.size(); ++i) {
        const SectionLayout& sec = layout->sections[i];
        const StreamSpec& spec = g1.streams[i % g1.streams.size()];
        uint64_t token_bytes = spec.ElementsPerToken() * ElementSize(spec.dtype);
        uint64_t off = c.info.offset + sec.offset + t0 * token_bytes;
        Status st = v1.ReadAt(off, dst, n * token_bytes);
        if (!st.ok()) return st.WithContext("v1 " + internal::ChunkWhere(ci, c.info.offset));
        XXH3_64bits_update(hashes[i].get(), dst, n * token_bytes);
        if (last_slice) {
          // The section's padding is under its checksum too.
          uint64_t pad_from = sec.offset + sec.data_bytes;
          std::vector<uint8_t> pad(sec.end - pad_from);
          st = v1.ReadAt(c.info.offset + pad_from, pad.data(), pad.size());
          if (!st.ok()) return st.WithContext("v1 " + internal::ChunkWhere(ci, c.info.offset));
          XXH3_64bits_update(hashes[i].get(), pad.data(), pad.size());
        }
        batch.blocks.push_back({spec.dtype, dst, nullptr});
        dst += n * token_bytes;
      }
      // Only live tokens go on; tokens a rewind left dead are dropped.
      uint64_t live_end = c.info.live_tokens;
      if (t0 < live_end) {
        uint64_t take = std::min<uint64_t>(n, live_end - t0);
        batch.tokens = std::span<const uint32_t>(scan.tokens).subspan(c.info.first_token + t0, take);
        KVFILE_RETURN_IF_ERROR(AppendTokens(batch));
      }
    }
    for (size_t i = 0; i < hashes.size(); ++i)
      if (!ChecksumMatches(scan.SectionChecksums(ci)[i], XXH3_64bits_digest(hashes[i].get())))
        return Status::Corruption("v1 " + internal::ChunkWhere(ci, c.info.offset) + ": payload checksum mismatch in layer " +
                                  std::to_string(i / g1.streams.size()) + " stream '" +
                                  g1.streams[i % g1.streams.size()].name + "'; not upgraded");
  }
  KVFILE_RETURN_IF_ERROR(WriteStagedChunk());
  return CommitDurably(/*force=*/true);
}

}  // namespace kvfile
