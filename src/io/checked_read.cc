// SPDX-License-Identifier: Apache-2.0
#include "io/checked_read.h"

#include <algorithm>

#include "format/framing.h"

namespace kvfile::internal {

Status ReadChecked(File& f, uint64_t offset, uint64_t n, uint64_t want, std::vector<uint8_t>* out, bool* match) {
  out->clear();
  *match = false;
  if (n > kCheckedReadPiece) {
    format::ChecksumStream sum;
    std::vector<uint8_t> piece(kCheckedReadPiece);
    for (uint64_t at = 0; at < n;) {
      const size_t k = static_cast<size_t>(std::min<uint64_t>(piece.size(), n - at));
      KVFILE_RETURN_IF_ERROR(f.ReadAt(offset + at, piece.data(), k));
      sum.Update(piece.data(), k);
      at += k;
    }
    if (!format::ChecksumMatches(want, sum.Digest())) return Status::OK();
  }
  out->resize(n);
  if (n) KVFILE_RETURN_IF_ERROR(f.ReadAt(offset, out->data(), n));
  // Checked again: the bytes read now are the ones kept.
  *match = format::ChecksumMatches(want, format::Checksum(out->data(), n));
  if (!*match) out->clear();
  return Status::OK();
}

}  // namespace kvfile::internal
