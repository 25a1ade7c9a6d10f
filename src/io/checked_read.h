// SPDX-License-Identifier: Apache-2.0
// ReadChecked: reads a region of a file whose XXH3-64 is known (a table of a
// pack or of a prefix index) with memory bounded by the bytes that prove it.
#pragma once

#include <cstdint>
#include <vector>

#include "kvfile/file.h"
#include "kvfile/status.h"

namespace kvfile::internal {

// Regions up to this size are read whole and checked; larger ones are
// checked in pieces of this size first.
inline constexpr uint64_t kCheckedReadPiece = uint64_t{1} << 20;

// Reads [offset, offset + n) of `f` into *out when its XXH3-64 is `want`
// (*match true); *match false and *out empty otherwise. A region larger
// than kCheckedReadPiece is hashed piece by piece before anything of its
// size is allocated, then read again whole: a size the file claims but its
// bytes do not back (a hole, a forged count) costs one piece of memory, and
// a table is allocated only once its bytes are known to be the writer's.
Status ReadChecked(File& f, uint64_t offset, uint64_t n, uint64_t want, std::vector<uint8_t>* out, bool* match);

}  // namespace kvfile::internal
