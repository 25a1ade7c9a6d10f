// SPDX-License-Identifier: Apache-2.0
// Replays inputs through a fuzz target without libFuzzer, so that every
// build (gcc, ASan CI) runs the committed seed corpus and every crasher
// ever found (tests/fuzz/regressions/) as a test. Arguments are files or
// directories (their files, in name order; dot files are skipped). Exits
// non-zero if no input was found, so that a wrong path does not pass.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz/fuzz_support.h"

namespace {

bool ReadWhole(const std::filesystem::path& p, std::vector<uint8_t>* out) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    fs::path arg(argv[i]);
    if (fs::is_directory(arg)) {
      std::vector<fs::path> files;
      for (const fs::directory_entry& e : fs::directory_iterator(arg))
        if (e.is_regular_file() && e.path().filename().string().front() != '.') files.push_back(e.path());
      std::sort(files.begin(), files.end());
      inputs.insert(inputs.end(), files.begin(), files.end());
    } else if (fs::exists(arg)) {
      inputs.push_back(arg);
    } else {
      std::fprintf(stderr, "%s: no such file or directory\n", argv[i]);
      return 2;
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "usage: %s FILE_OR_DIR... (no input found)\n", argv[0]);
    return 2;
  }
  std::vector<uint8_t> bytes;
  for (const fs::path& p : inputs) {
    // Named before it runs: a crash leaves its name as the last line.
    std::fprintf(stderr, "replaying %s\n", p.c_str());
    std::fflush(stderr);
    if (!ReadWhole(p, &bytes)) {
      std::fprintf(stderr, "%s: cannot read\n", p.c_str());
      return 2;
    }
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
  }
  std::printf("%zu inputs replayed\n", inputs.size());
  return 0;
}
