// upgrade_bench: the v1 -> v2 upgrade against a raw copy of the same v1 file.
//
// Usage: upgrade_bench DIR [TOKENS]. Writes a v1 llama-3.1-8b session of
// TOKENS tokens (bf16 rows) in DIR, then three times: copies it raw
// (read + write + fdatasync, 8 MiB buffer) and upgrades a fresh copy of it in
// a child process (Writer::Open), whose peak RSS it reads. Prints medians.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "kvfile/presets.h"
#include "kvfile/writer.h"

using namespace kvfile;

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool WriteV1(const std::string& path, uint64_t tokens) {
  Geometry g;
  GetPreset("llama-3.1-8b", Dtype::kE4M3, &g);
  for (auto& s : g.streams) s.dtype = Dtype::kBF16;
  WriterOptions o;
  o.format_major = 1;
  std::unique_ptr<Writer> w;
  if (!Writer::Create(path, g, {"bench", 1}, o, &w).ok()) return false;
  std::vector<std::vector<uint16_t>> blocks(64, std::vector<uint16_t>(256 * 8 * 128));
  for (auto& b : blocks)
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint16_t>(0x3C00 + (i * 2654435761u >> 20) % 0x800);
  std::vector<uint32_t> ids(256, 5);
  for (uint64_t t = 0; t < tokens; t += 256) {
    AppendBatch b;
    b.tokens = ids;
    for (auto& x : blocks) b.blocks.push_back({Dtype::kBF16, x.data(), nullptr});
    if (!w->Append(b).ok()) return false;
  }
  return w->Close().ok();
}

double RawCopy(const std::string& from, const std::string& to) {
  double t0 = Now();
  int in = open(from.c_str(), O_RDONLY);
  int out = open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char> buf(8 << 20);
  ssize_t n;
  while ((n = read(in, buf.data(), buf.size())) > 0)
    if (write(out, buf.data(), static_cast<size_t>(n)) != n) std::exit(4);
  fdatasync(out);
  close(in);
  close(out);
  return Now() - t0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: upgrade_bench DIR [TOKENS]\n");
    return 2;
  }
  std::string dir = argv[1];
  uint64_t tokens = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 4096;
  std::string v1 = dir + "/upgrade_bench_v1.kv", work = dir + "/upgrade_bench_work.kv",
              copy = dir + "/upgrade_bench_copy.kv";
  std::filesystem::remove(v1);
  if (!WriteV1(v1, tokens)) return 1;
  double size = static_cast<double>(std::filesystem::file_size(v1));
  std::vector<double> copy_s, upgrade_s;
  long rss_kib = 0;
  for (int rep = 0; rep < 3; ++rep) {
    copy_s.push_back(RawCopy(v1, copy));
    std::filesystem::remove(work);
    std::filesystem::copy_file(v1, work);
    int fds[2];
    if (pipe(fds) != 0) return 5;
    pid_t pid = fork();
    if (pid == 0) {
      std::unique_ptr<Writer> w;
      double a = Now();
      Status st = Writer::Open(work, {}, &w);
      double seconds = Now() - a;
      if (!st.ok()) _exit(1);
      if (write(fds[1], &seconds, sizeof seconds) != sizeof seconds) _exit(1);
      _exit(0);
    }
    int status;
    struct rusage ru;
    wait4(pid, &status, 0, &ru);
    double seconds = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || read(fds[0], &seconds, sizeof seconds) != sizeof seconds)
      return 6;
    close(fds[0]);
    close(fds[1]);
    upgrade_s.push_back(seconds);
    rss_kib = std::max(rss_kib, ru.ru_maxrss);
  }
  std::sort(copy_s.begin(), copy_s.end());
  std::sort(upgrade_s.begin(), upgrade_s.end());
  std::printf("v1 file: %.0f MB (%llu llama-3.1-8b tokens, bf16)\n", size / 1e6, static_cast<unsigned long long>(tokens));
  std::printf("raw copy + fdatasync: median %.3f s (min %.3f, max %.3f), %.2f GB/s\n", copy_s[1], copy_s[0], copy_s[2],
              size / copy_s[1] / 1e9);
  std::printf("upgrade v1 -> v2:     median %.3f s (min %.3f, max %.3f), %.2f GB/s of v1\n", upgrade_s[1], upgrade_s[0],
              upgrade_s[2], size / upgrade_s[1] / 1e9);
  std::printf("ratio (copy time / upgrade time): %.2f; upgrade peak RSS %ld MiB\n", copy_s[1] / upgrade_s[1], rss_kib / 1024);
  for (const auto& p : {v1, work, copy}) std::filesystem::remove(p);
  return 0;
}
