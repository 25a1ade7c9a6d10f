// SPDX-License-Identifier: Apache-2.0
// What the fuzz targets share: the libFuzzer entry point, the cap on the
// input size, the in-memory file holding an input, a reader that reads back
// everything a .kv file holds, and the way a broken invariant is reported.
//
// Each fuzz_<name>.cc defines LLVMFuzzerTestOneInput; it is linked either
// with libFuzzer (KVFILE_FUZZING builds) or with replay_main.cc, which runs
// the committed corpus and regressions through it in every build.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kvfile/reader.h"
#include "support/fault_fs.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace kvfile::fuzz {

// Inputs above this are ignored: the work (and memory) per input must stay
// bounded, and 1 MiB holds every interesting structure of both formats.
inline constexpr size_t kMaxInputBytes = size_t{1} << 20;

// A memory file system holding the input as its one file, `path`.
std::unique_ptr<testing::FaultFs> FsHolding(const std::string& path, const uint8_t* data, size_t size);

// Reader::Open of `path` in `fs`, with no expectations.
Status OpenReader(FileSystem* fs, const std::string& path, std::unique_ptr<Reader>* out);

// Reads every token id, and every row of every layer and stream: all tokens
// at once (as f32, and as codes for fp8 streams and v1 files) and the middle
// third, which starts and ends inside chunks (as bf16 or f16). Checks on
// the way what the reader promises whatever the input: a failed read leaves
// the destination untouched, and a file shares its whole sequence with its
// own tokens. Returns the first read's failure (a damaged file may fail).
Status ReadEverything(Reader& reader);

// A promise of the library does not hold for this input: prints `what` and
// aborts, which libFuzzer (or the replay) reports as a crash.
[[noreturn]] void Fail(const std::string& what);

}  // namespace kvfile::fuzz
