// SPDX-License-Identifier: Apache-2.0
// Inputs that are no .kv file and are read whole (token lists, JSON
// manifests, Mooncake records, a pack's magic): every one is opened
// through FileSystem::Open, the one place that refuses what is not a
// regular file (src/io/posix_file.cc, OpenFd: opened with O_NONBLOCK, so a
// FIFO never waits for a writer), and read up to a cap.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvfile/status.h"

namespace kvfile::cli {

// Reads the whole file `path`, of at most `limit` bytes. A FIFO, a
// character or block device, a directory or a socket is refused at once
// with "PATH: not a regular file (a FIFO)" (kInvalidArgument, exit 2), a
// missing file with "PATH: No such file or directory" (exit 2); a larger
// file with "PATH: N bytes; more than the LIMIT bytes it may have"
// (kCorruption, exit 1), before anything is read.
Status ReadWholeFile(const std::string& path, uint64_t limit, std::vector<uint8_t>* out);

// Reads standard input to its end, at most `limit` bytes: more is
// "-: more than LIMIT bytes on standard input" (kInvalidArgument, exit 2),
// found after reading limit + 1 bytes, never more.
Status ReadWholeStdin(uint64_t limit, std::vector<uint8_t>* out);

// Whether `path` is a regular file whose first bytes are `magic`; anything
// else (absent, a FIFO, a device, too short) is false, without waiting.
bool FileStartsWith(const std::string& path, std::string_view magic);

// Object storage (docs/object-storage.md): whether `path` is an
// s3:// key prefix ("s3://bucket/", "s3://bucket/corpus/"), read as a
// directory is.
bool IsObjectPrefix(const std::string& path);
// Whether an output path exists, for the --force check: std::filesystem's
// answer for a local path (a dangling symlink counts as absent); for an
// s3:// object, the store's (a missing bucket or refused credentials are
// the error returned).
Status OutputExists(const std::string& path, bool* exists);

}  // namespace kvfile::cli
