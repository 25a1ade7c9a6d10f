// SPDX-License-Identifier: Apache-2.0
// A real kill -9 loop: a child process appends with sync mode `chunk` and
// reports each acknowledged token count on a pipe; the parent kills it at a
// random moment, then checks that the file opens and holds at least every
// acknowledged token, bit for bit. The next child reopens the same file
// (recovery) and goes on appending, so recovery itself is killed too.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>

#include "kvfile/codec.h"
#include "kvfile/presets.h"
#include "kvfile/reader.h"
#include "kvfile/writer.h"

namespace kvfile {
namespace {

Geometry Tiny() {
  Geometry g;
  EXPECT_TRUE(GetPreset("tiny", Dtype::kE4M3, &g).ok());
  return g;
}

// Token t's id and rows are pure functions of t.
uint32_t IdOf(uint64_t t) { return static_cast<uint32_t>(t * 2654435761u % 100000); }
void RowsOf(const Geometry& g, uint64_t t, uint32_t layer, uint32_t stream, float* out) {
  uint64_t x = t * 0x9E3779B97F4A7C15ull + layer * 31 + stream + 1;
  for (uint64_t i = 0; i < g.streams[stream].ElementsPerToken(); ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    out[i] = static_cast<float>(static_cast<int32_t>(x >> 40) - (1 << 23)) / 4096.0f;
  }
}

// The child: reopen (or create) and append until killed, reporting acks.
[[noreturn]] void AppendForever(const std::string& path, int ack_fd) {
  Geometry g = Tiny();
  WriterOptions opt;
  opt.sync = SyncMode::kChunk;
  opt.chunk_tokens = 8;
  std::unique_ptr<Writer> w;
  Status st = std::filesystem::exists(path) ? Writer::Open(path, opt, &w)
                                            : Writer::Create(path, g, {"kill", 9}, opt, &w);
  if (!st.ok()) {
    std::fprintf(stderr, "child: %s\n", st.ToString().c_str());
    _exit(3);
  }
  uint64_t t = w->token_count();
  std::vector<std::vector<float>> blocks(g.layers * g.streams.size());
  std::vector<uint32_t> ids;
  for (;;) {
    uint32_t n = 1 + static_cast<uint32_t>(t % 5);
    ids.clear();
    for (uint32_t i = 0; i < n; ++i) ids.push_back(IdOf(t + i));
    AppendBatch b;
    b.tokens = ids;
    for (uint32_t l = 0; l < g.layers; ++l)
      for (uint32_t s = 0; s < g.streams.size(); ++s) {
        auto& blk = blocks[l * g.streams.size() + s];
        size_t per = g.streams[s].ElementsPerToken();
        blk.resize(n * per);
        for (uint32_t i = 0; i < n; ++i) RowsOf(g, t + i, l, s, blk.data() + i * per);
        b.blocks.push_back({Dtype::kF32, blk.data(), nullptr});
      }
    if (!w->Append(b).ok()) _exit(4);
    t += n;
    uint64_t acked = w->durable_tokens();
    if (write(ack_fd, &acked, sizeof acked) != sizeof acked) _exit(5);
  }
}

TEST(KillTest, EveryAcknowledgedTokenSurvivesKill9) {
  std::string dir = testing::TempDir() + "kvfile_kill_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::string path = dir + "/session.kv";
  Geometry g = Tiny();
  std::mt19937 rng(12345);
  const int kKills = 200;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  int kills = 0;
  uint64_t max_tokens_seen = 0;
  for (; kills < kKills && std::chrono::steady_clock::now() < deadline; ++kills) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(fds[0]);
      AppendForever(path, fds[1]);
    }
    close(fds[1]);
    usleep(std::uniform_int_distribution<int>(0, 30000)(rng));
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "child exited by itself with status " << WEXITSTATUS(status);
    uint64_t acked = 0, v;
    while (read(fds[0], &v, sizeof v) == sizeof v) acked = v;
    close(fds[0]);
    if (!std::filesystem::exists(path)) {
      ASSERT_EQ(acked, 0u);
      continue;
    }
    std::unique_ptr<Reader> r;
    Status st = Reader::Open(path, {}, &r);
    ASSERT_TRUE(st.ok()) << "after kill " << kills << ": " << st.ToString();
    ASSERT_GE(r->token_count(), acked) << "after kill " << kills;
    max_tokens_seen = std::max(max_tokens_seen, r->token_count());
    for (uint64_t t = 0; t < r->token_count(); ++t) ASSERT_EQ(r->tokens()[t], IdOf(t)) << "token " << t;
    // Every row of every token, exactly as the codec encodes it.
    uint64_t n = r->token_count();
    for (uint32_t l = 0; l < g.layers && n > 0; ++l)
      for (uint32_t s = 0; s < g.streams.size(); ++s) {
        size_t per = g.streams[s].ElementsPerToken();
        size_t rows = n * g.streams[s].rows_per_token;
        std::vector<float> in(n * per);
        for (uint64_t t = 0; t < n; ++t) RowsOf(g, t, l, s, in.data() + t * per);
        std::vector<uint8_t> codes(n * per), want(n * per);
        std::vector<float> scales(rows), want_scales(rows);
        size_t bad;
        ASSERT_TRUE(codec::QuantizeRows(Dtype::kE4M3, Dtype::kF32, in.data(), rows,
                                        g.streams[s].row_width, want.data(), want_scales.data(), &bad));
        ASSERT_TRUE(r->ReadCodes(l, s, 0, n, codes.data(), scales.data()).ok());
        ASSERT_EQ(codes, want) << "after kill " << kills << ", layer " << l << " stream " << s;
        ASSERT_EQ(0, std::memcmp(scales.data(), want_scales.data(), rows * 4));
      }
  }
  std::printf("[ %d kills; the file grew to %llu tokens ]\n", kills,
              static_cast<unsigned long long>(max_tokens_seen));
  EXPECT_GE(kills, 200);
  EXPECT_GT(max_tokens_seen, 100u) << "the children never got far: the test proved little";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvfile
