// SPDX-License-Identifier: Apache-2.0
// find_bench: the prefix lookup figures of docs/packs.md ("Prefix lookup").
//
//   find_bench make DIR N       N tiny .kv files (1 layer, 1 bf16 stream of 4
//                               values): 100 families share a 32-token prefix,
//                               each file adds 8 tokens of its own
//   find_bench lookup DIR Q     opens DIR/.kvfile-index (timed), then Q
//                               lookups of random prompts; prints the open
//                               time, the first lookup and the median and
//                               99th percentile of the rest
//   find_bench query DIR FILE   writes one query (a family prefix + 3 tokens
//                               of a member) to FILE, for kvfile find
#include <algorithm>
#include <atomic>
#include <thread>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kvfile/prefix_index.h"
#include "kvfile/writer.h"

namespace {

using Clock = std::chrono::steady_clock;
double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

std::vector<uint32_t> Tokens(uint64_t i) {
  std::vector<uint32_t> t;
  uint64_t family = i % 100;
  for (uint32_t k = 0; k < 32; ++k) t.push_back(static_cast<uint32_t>(family * 1000 + k));
  std::mt19937 rng(static_cast<uint32_t>(i));
  for (int k = 0; k < 8; ++k) t.push_back(static_cast<uint32_t>(rng() % 50000));
  return t;
}

int Make(const std::string& dir, uint64_t n) {
  kvfile::Geometry g;
  g.layers = 1;
  g.streams = {{"k", 1, 4, kvfile::Dtype::kBF16}};
  kvfile::WriterOptions wo;
  wo.sync = kvfile::SyncMode::kNone;
  wo.chunk_tokens = 64;
  std::vector<uint16_t> rows(40 * 4, 0x3f80);
  for (uint64_t d = 0; d * 1000 < n; ++d) std::filesystem::create_directories(std::filesystem::path(dir) / ("d" + std::to_string(d)));
  // Eight writers: creating a file costs a directory sync, latency more than work.
  std::atomic<uint64_t> next{0};
  std::atomic<int> failed{0};
  auto work = [&] {
  for (uint64_t i; !failed && (i = next.fetch_add(1)) < n;) {
    std::filesystem::path sub = std::filesystem::path(dir) / ("d" + std::to_string(i / 1000));
    std::vector<uint32_t> tokens = Tokens(i);
    std::unique_ptr<kvfile::Writer> w;
    kvfile::Status st = kvfile::Writer::Create((sub / ("s" + std::to_string(i) + ".kv")).string(), g,
                                               {"bench/tiny", 0x1234}, wo, &w);
    kvfile::AppendBatch b;
    b.tokens = tokens;
    b.blocks = {kvfile::RowBlock{kvfile::Dtype::kBF16, rows.data(), nullptr}};
    if (st.ok()) st = w->Append(b);
    if (st.ok()) st = w->Close();
    if (!st.ok()) {
      std::fprintf(stderr, "find_bench: %s\n", st.ToString().c_str());
      failed = 1;
    }
  }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < 8; ++t) pool.emplace_back(work);
  for (auto& t : pool) t.join();
  return failed;
}

std::vector<uint32_t> Query(std::mt19937_64& rng, uint64_t n) {
  std::vector<uint32_t> q = Tokens(rng() % n);
  q.resize(32 + rng() % 9);
  q.push_back(7);
  return q;
}

int Lookup(const std::string& dir, int queries) {
  std::string path = (std::filesystem::path(dir) / kvfile::kPrefixIndexName).string();
  auto t0 = Clock::now();
  std::unique_ptr<kvfile::PrefixIndex> ix;
  kvfile::Status st = kvfile::PrefixIndex::Open(path, nullptr, &ix);
  auto t1 = Clock::now();
  if (!st.ok()) {
    std::fprintf(stderr, "find_bench: %s\n", st.ToString().c_str());
    return 1;
  }
  std::mt19937_64 rng(42);
  std::vector<double> ms;
  std::optional<kvfile::PrefixMatch> m;
  for (int i = 0; i < queries; ++i) {
    std::vector<uint32_t> q = Query(rng, ix->entry_count());
    auto a = Clock::now();
    st = ix->Lookup(q, std::nullopt, &m);
    auto b = Clock::now();
    if (!st.ok() || !m || m->matched + 1 < q.size()) {
      std::fprintf(stderr, "find_bench: lookup %d failed: %s\n", i, st.ToString().c_str());
      return 1;
    }
    ms.push_back(Ms(b - a));
  }
  double first = ms.front();
  std::vector<double> rest(ms.begin() + 1, ms.end());
  std::sort(rest.begin(), rest.end());
  std::printf("entries %llu  open %.3f ms  first lookup %.3f ms  warm lookup median %.4f ms  p99 %.4f ms\n",
              static_cast<unsigned long long>(ix->entry_count()), Ms(t1 - t0), first, rest[rest.size() / 2],
              rest[rest.size() * 99 / 100]);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "make") return Make(argv[2], std::strtoull(argv[3], nullptr, 10));
  if (argc == 4 && std::string(argv[1]) == "lookup") return Lookup(argv[2], std::atoi(argv[3]));
  if (argc == 4 && std::string(argv[1]) == "query") {
    std::mt19937_64 rng(7);
    std::ofstream out(argv[3]);
    for (uint32_t t : Query(rng, 100000)) out << t << ' ';
    out << '\n';
    return 0;
  }
  std::fprintf(stderr, "usage: find_bench make DIR N | lookup DIR QUERIES | query DIR FILE\n");
  return 2;
}
