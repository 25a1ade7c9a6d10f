// SPDX-License-Identifier: Apache-2.0
// The NVFP4 paths of the CLI's writing verbs under real adversity: `append
// --dtype nvfp4` onto an nvfp4 file killed (SIGKILL) or interrupted
// (SIGINT, SIGTERM) mid-append, `convert --dtype nvfp4` and `synth --dtype
// nvfp4` on a real full disk (a small tmpfs), a symlinked destination and
// FIFOs, and the refusal of an nvfp4 append to a v1 file. Each asserts the
// exit status, the one stderr line, and what the file holds afterwards:
// its old bytes or tokens, or the whole new content, never a part.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kvfile/reader.h"
#include "support/adversity.h"
#include "support/cli_run.h"
#include "support/scratch_dir.h"

namespace kvfile {
namespace {

namespace fs = std::filesystem;
using testing::CliRun;
using testing::ExpectOneErrorLine;
using testing::Kvfile;
using testing::ReadFile;

// Tokens [begin, end) of an nvfp4 .kv file as its reader gives them: the
// token ids, then per layer and stream the packed codes, block scales and
// row scales. A failure, a stream of another dtype or a short file gives a
// "<...>" text that no file's content equals.
std::string Nvfp4Tokens(const std::string& path, uint64_t begin, uint64_t end) {
  std::unique_ptr<Reader> r;
  Status st = Reader::Open(path, {}, &r);
  if (!st.ok()) return "<" + st.ToString() + ">";
  if (end > r->token_count()) return "<" + std::to_string(r->token_count()) + " tokens>";
  std::string s;
  for (uint64_t t = begin; t < end; ++t) s += std::to_string(r->tokens()[t]) + ",";
  const Geometry& g = r->geometry();
  const uint64_t n = end - begin;
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t k = 0; k < g.streams.size(); ++k) {
      const StreamSpec& spec = g.streams[k];
      if (!IsNvfp4(spec.dtype)) return "<stream " + spec.name + " is not nvfp4>";
      const uint64_t elements = spec.ElementsPerToken();
      std::string codes(n * elements / 2, '\0'), blocks(n * elements / 16, '\0');
      std::vector<float> scales(n);
      st = r->ReadCodes(l, k, begin, end, reinterpret_cast<uint8_t*>(codes.data()),
                        reinterpret_cast<uint8_t*>(blocks.data()), scales.data());
      if (!st.ok()) return "<" + st.ToString() + ">";
      s += "|" + codes + blocks + std::string(reinterpret_cast<const char*>(scales.data()), n * 4);
    }
  return s;
}

uint64_t TokenCount(const std::string& path) {
  std::unique_ptr<Reader> r;
  Status st = Reader::Open(path, {}, &r);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return st.ok() ? r->token_count() : 0;
}

class Nvfp4Adversity : public testing::ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    fs::create_directories(dir_ / "work");
  }
  void TearDown() override {
    child_.reset();  // kills a child still running
    tmpfs_.reset();
    ScratchDirTest::TearDown();
  }
  // The file appended to lives alone in work/.
  std::string W(const std::string& name) const { return (dir_ / "work" / name).string(); }
  std::vector<std::string> Names(const std::string& sub) const { return testing::SortedNames(dir_ / sub); }

  void Run(const std::string& args) {
    CliRun r = Kvfile("-q " + args);
    ASSERT_EQ(r.exit_code, 0) << args << ": " << r.err;
  }
  // A 1 MiB tmpfs at small/; false if this process may not mount one.
  bool MountSmall() {
    fs::create_directories(dir_ / "small");
    tmpfs_ = std::make_unique<testing::SmallTmpfs>();
    return tmpfs_->Mount(P("small"));
  }

  // old.kv: 16 tokens of qwen2.5-7b in nvfp4, chunks of 8 tokens, so that
  // an append writes many chunks; x.kv (in work/) a copy of it.
  void MakeOld() {
    Run("synth " + P("old.kv") + " --preset qwen2.5-7b --tokens 16 --dtype nvfp4 --chunk-tokens 8");
    fs::copy_file(P("old.kv"), W("x.kv"), fs::copy_options::overwrite_existing);
  }
  // src.kv: `tokens` tokens of the same model in nvfp4; turn.safetensors
  // its export (`flags`: "--codes" for the stored codes, "" for bf16).
  void MakeInput(uint64_t tokens, const std::string& flags) {
    Run("synth " + P("src.kv") + " --preset qwen2.5-7b --tokens " + std::to_string(tokens) + " --dtype nvfp4");
    Run("convert " + P("src.kv") + " " + P("turn.safetensors") + " " + flags);
  }
  std::string AppendArgs() const { return "append " + W("x.kv") + " " + P("turn.safetensors") + " --dtype nvfp4"; }

  // Starts the append of turn.safetensors to x.kv and stops it (SIGSTOP)
  // once x.kv has grown by `grown` bytes: it is writing the append.
  void StartAndFreezeAppend(uint64_t grown) {
    const uint64_t size = fs::file_size(W("x.kv"));
    err_path_ = P("stderr.txt");
    child_ = std::make_unique<testing::KvfileChild>(err_path_);
    child_->Start("-q " + AppendArgs());
    ASSERT_TRUE(child_->WaitUntil([&] { return fs::file_size(W("x.kv")) >= size + grown; })) << ReadFile(err_path_);
    ASSERT_TRUE(child_->Freeze()) << "the append ended before it could be stopped";
    ASSERT_GT(fs::file_size(W("x.kv")), size);
  }

  std::unique_ptr<testing::KvfileChild> child_;
  std::unique_ptr<testing::SmallTmpfs> tmpfs_;
  std::string err_path_;
};

// SIGKILL cannot be handled: what is left is what a crash leaves, chunks
// of the append past the last commit. Readers and recovery stop at the
// commit: the file holds its old 16 tokens (or, had the append ended
// before the kill, all 16 + 128), and a retry appends each token once.
// The input is bf16, so the append encodes it (one block of 128 tokens).
TEST_F(Nvfp4Adversity, AppendKilledBySigkillLeavesNoPartOfIt) {
  MakeOld();
  MakeInput(128, "");
  fs::copy_file(P("old.kv"), P("ref.kv"));
  Run("append " + P("ref.kv") + " " + P("turn.safetensors") + " --dtype nvfp4");
  const std::string old = Nvfp4Tokens(P("old.kv"), 0, 16), whole = Nvfp4Tokens(P("ref.kv"), 0, 16 + 128);
  ASSERT_NE(old.front(), '<') << old;
  ASSERT_NE(whole.front(), '<') << whole;
  for (uint64_t grown : {uint64_t{1}, uint64_t{1} << 20}) {  // the first chunk; about half the append
    SCOPED_TRACE("killed once x.kv grew by " + std::to_string(grown) + " bytes");
    fs::copy_file(P("old.kv"), W("x.kv"), fs::copy_options::overwrite_existing);
    StartAndFreezeAppend(grown);
    EXPECT_EQ(child_->SignalAndWait(SIGKILL), 1000 + SIGKILL);
    CliRun info = Kvfile("info --json " + W("x.kv"));
    ASSERT_EQ(info.exit_code, 0) << info.err;
    auto j = nlohmann::json::parse(info.out);
    const uint64_t tokens = j["tokens"];
    ASSERT_TRUE(tokens == 16 || tokens == 16 + 128) << tokens;
    EXPECT_TRUE(Nvfp4Tokens(W("x.kv"), 0, tokens) == (tokens == 16 ? old : whole));
    if (tokens == 16) {
      EXPECT_GT(j["torn_tail_bytes"].get<uint64_t>(), 0u);
    }
    CliRun v = Kvfile("verify " + W("x.kv"));
    EXPECT_EQ(v.exit_code, 0) << v.err;
    if (tokens != 16) continue;  // the append ended first: nothing more to prove
    CliRun again = Kvfile("-q " + AppendArgs());
    ASSERT_EQ(again.exit_code, 0) << again.err;
    EXPECT_EQ(TokenCount(W("x.kv")), 16u + 128);
    EXPECT_TRUE(Nvfp4Tokens(W("x.kv"), 0, 16 + 128) == whole) << "the retry did not append each token once";
  }
  EXPECT_EQ(Names("work"), std::vector<std::string>{"x.kv"});
}

// SIGINT or SIGTERM while the append writes: exit 128 + N, the one line,
// none of the append in the file (for a reader, `verify --strict`, and a
// writer's recovery), no other file; the retry appends the input's codes
// exactly. The input is nvfp4 codes of 800 tokens: two blocks (780 + 20
// tokens for this geometry), the signal lands in the first.
class Nvfp4AppendSignals : public Nvfp4Adversity, public ::testing::WithParamInterface<int> {};

TEST_P(Nvfp4AppendSignals, LeaveOnlyTheOldTokens) {
  const int sig = GetParam();
  MakeOld();
  MakeInput(800, "--codes");
  const std::string old = Nvfp4Tokens(P("old.kv"), 0, 16);
  ASSERT_NE(old.front(), '<') << old;
  StartAndFreezeAppend(1);
  EXPECT_EQ(child_->SignalAndWait(sig), 128 + sig);
  EXPECT_EQ(ReadFile(err_path_),
            "kvfile: error: " + W("x.kv") + ": interrupted by " + (sig == SIGINT ? "SIGINT" : "SIGTERM") + "\n");
  EXPECT_EQ(Names("work"), std::vector<std::string>{"x.kv"});
  EXPECT_EQ(TokenCount(W("x.kv")), 16u);
  EXPECT_TRUE(Nvfp4Tokens(W("x.kv"), 0, 16) == old);
  CliRun v = Kvfile("verify --strict " + W("x.kv"));
  EXPECT_EQ(v.exit_code, 0) << v.err;
  CliRun repair = Kvfile("repair " + W("x.kv"));
  EXPECT_EQ(repair.exit_code, 0) << repair.err;
  EXPECT_EQ(TokenCount(W("x.kv")), 16u);
  CliRun again = Kvfile("-q " + AppendArgs());
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(TokenCount(W("x.kv")), 16u + 800);
  EXPECT_TRUE(Nvfp4Tokens(W("x.kv"), 0, 16) == old);
  EXPECT_TRUE(Nvfp4Tokens(W("x.kv"), 16, 16 + 800) == Nvfp4Tokens(P("src.kv"), 0, 800))
      << "the appended codes differ from the input's";
}

std::string SignalName(const ::testing::TestParamInfo<int>& info) {
  return info.param == SIGINT ? "Sigint" : "Sigterm";
}
INSTANTIATE_TEST_SUITE_P(Signals, Nvfp4AppendSignals, ::testing::Values(SIGINT, SIGTERM), SignalName);

// A signal that arrives once the last block is being written comes after
// the append's last stop point: the append either was stopped before it
// (exit 143, none of it) or finishes (exit 0, all of it). Never an exit
// 143 with the append committed, which a retry would duplicate. One block
// of 128 bf16 tokens: the signal lands in the append's last write.
TEST_F(Nvfp4Adversity, SignalDuringTheLastBlockNeverReportsACommittedAppendAsInterrupted) {
  MakeOld();
  MakeInput(128, "");
  fs::copy_file(P("old.kv"), P("ref.kv"));
  Run("append " + P("ref.kv") + " " + P("turn.safetensors") + " --dtype nvfp4");
  StartAndFreezeAppend(1);
  int code = child_->SignalAndWait(SIGTERM);
  uint64_t tokens = TokenCount(W("x.kv"));
  if (code == 143) {
    EXPECT_EQ(ReadFile(err_path_), "kvfile: error: " + W("x.kv") + ": interrupted by SIGTERM\n");
    EXPECT_EQ(tokens, 16u) << "exit 143 (interrupted), yet the append is in the file";
    EXPECT_TRUE(Nvfp4Tokens(W("x.kv"), 0, 16) == Nvfp4Tokens(P("old.kv"), 0, 16));
  } else {
    EXPECT_EQ(code, 0) << ReadFile(err_path_);
    EXPECT_EQ(ReadFile(err_path_), "");
    EXPECT_EQ(tokens, 16u + 128);
    EXPECT_TRUE(Nvfp4Tokens(W("x.kv"), 0, 16 + 128) == Nvfp4Tokens(P("ref.kv"), 0, 16 + 128));
  }
  EXPECT_EQ(Names("work"), std::vector<std::string>{"x.kv"});
}

// Exit 2 and one line that starts with `start` and says the disk is full.
void ExpectDiskFull(const CliRun& r, const std::string& start) {
  EXPECT_EQ(r.exit_code, 2) << r.err;
  ExpectOneErrorLine(r);
  EXPECT_EQ(r.err.rfind("kvfile: error: " + start, 0), 0u) << r.err;
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
}

// A real full disk (1 MiB tmpfs) under `synth --dtype nvfp4 --force`,
// `convert --dtype nvfp4 --force` and `append --dtype nvfp4` onto an
// nvfp4 file: exit 2, one line, the old file byte for byte, no temporary
// file; new destinations are not created. tiny in nvfp4 is 88 bytes a
// token: 40000 tokens (3.5 MB) never fit.
TEST_F(Nvfp4Adversity, FullDiskLeavesTheOldFileAndNoTemp) {
  if (!MountSmall()) GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  const std::string x = P("small/x.kv");
  Run("synth " + x + " --preset tiny --tokens 1000 --dtype nvfp4");
  const std::string before = ReadFile(x);
  ExpectDiskFull(Kvfile("synth " + x + " --preset tiny --tokens 40000 --dtype nvfp4 --seed 2 --force"), x + ": ");
  EXPECT_TRUE(ReadFile(x) == before) << "a failed synth --force changed the file";
  EXPECT_EQ(Names("small"), std::vector<std::string>{"x.kv"});

  Run("synth " + P("big.kv") + " --preset tiny --tokens 40000");  // e4m3, the same model
  // convert names its input, then the temporary file it was writing.
  ExpectDiskFull(Kvfile("convert " + P("big.kv") + " " + x + " --dtype nvfp4 --force"), P("big.kv") + ": " + x + ".kvtmp-");
  EXPECT_TRUE(ReadFile(x) == before) << "a failed convert --force changed the file";
  EXPECT_EQ(Names("small"), std::vector<std::string>{"x.kv"});

  // An append that fills the disk: the writer cuts the file back to its
  // last commit, byte for byte.
  Run("convert " + P("big.kv") + " " + P("big.safetensors"));
  ExpectDiskFull(Kvfile("append " + x + " " + P("big.safetensors") + " --dtype nvfp4"), x + ": ");
  EXPECT_TRUE(ReadFile(x) == before) << "the failed append left bytes in the file";
  EXPECT_EQ(TokenCount(x), 1000u);

  // New destinations: nothing under the final name, no temp.
  const std::string n = P("small/n.kv");
  ExpectDiskFull(Kvfile("synth " + n + " --preset tiny --tokens 40000 --dtype nvfp4"), n + ": ");
  ExpectDiskFull(Kvfile("convert " + P("big.kv") + " " + n + " --dtype nvfp4"), P("big.kv") + ": " + n + ".kvtmp-");
  EXPECT_EQ(Names("small"), std::vector<std::string>{"x.kv"});
  EXPECT_TRUE(ReadFile(x) == before);
}

// A symlinked destination: `convert --dtype nvfp4 --force` (and `synth
// --dtype nvfp4 --force`) replace the link's target whole; the link stays
// the same link and no temporary file is left beside either.
TEST_F(Nvfp4Adversity, SymlinkedDestinationStaysALink) {
  Run("synth " + P("a.kv") + " --preset tiny --tokens 9");
  Run("convert " + P("a.kv") + " " + P("ref.kv") + " --dtype nvfp4");
  fs::create_directories(dir_ / "real");
  Run("synth " + P("real/t.kv") + " --preset tiny --tokens 5 --dtype nvfp4 --seed 2");
  fs::create_symlink("real/t.kv", dir_ / "link.kv");
  CliRun r = Kvfile("convert " + P("a.kv") + " " + P("link.kv") + " --dtype nvfp4 --force");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_TRUE(fs::is_symlink(dir_ / "link.kv"));
  EXPECT_EQ(fs::read_symlink(dir_ / "link.kv"), "real/t.kv");
  EXPECT_TRUE(Nvfp4Tokens(P("real/t.kv"), 0, 9) == Nvfp4Tokens(P("ref.kv"), 0, 9));
  EXPECT_EQ(TokenCount(P("real/t.kv")), 9u);
  EXPECT_EQ(Names("real"), std::vector<std::string>{"t.kv"});

  CliRun s = Kvfile("synth " + P("link.kv") + " --preset tiny --tokens 7 --dtype nvfp4 --force");
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_TRUE(fs::is_symlink(dir_ / "link.kv"));
  EXPECT_EQ(fs::read_symlink(dir_ / "link.kv"), "real/t.kv");
  Run("synth " + P("ref7.kv") + " --preset tiny --tokens 7 --dtype nvfp4");
  EXPECT_TRUE(Nvfp4Tokens(P("real/t.kv"), 0, 7) == Nvfp4Tokens(P("ref7.kv"), 0, 7));
  EXPECT_EQ(TokenCount(P("real/t.kv")), 7u);
  EXPECT_EQ(Names("real"), std::vector<std::string>{"t.kv"});
  EXPECT_EQ(Names(""), (std::vector<std::string>{"a.kv", "link.kv", "real", "ref.kv", "ref7.kv", "work"}));
}

// A FIFO as the input or the destination of `convert --dtype nvfp4` (and
// the input of `append --dtype nvfp4`): refused at once, exit 2, one line;
// nothing written, the FIFO left. A regression that blocks on the FIFO is
// stopped by `timeout` (exit 124).
TEST_F(Nvfp4Adversity, FifoIsRefusedAtOnce) {
  const std::string t = "timeout 20";
  ASSERT_EQ(::mkfifo(P("f.kv").c_str(), 0644), 0);
  CliRun in = Kvfile("convert " + P("f.kv") + " " + W("out.kv") + " --dtype nvfp4", t);
  EXPECT_EQ(in.exit_code, 2) << in.err;
  EXPECT_EQ(in.err, "kvfile: error: " + P("f.kv") + ": not a regular file (a FIFO)\n");
  EXPECT_EQ(Names("work"), std::vector<std::string>{});

  ASSERT_EQ(::mkfifo(P("f.safetensors").c_str(), 0644), 0);
  Run("synth " + W("x.kv") + " --preset tiny --tokens 5 --dtype nvfp4");
  const std::string before = ReadFile(W("x.kv"));
  CliRun append = Kvfile("append " + W("x.kv") + " " + P("f.safetensors") + " --dtype nvfp4", t);
  EXPECT_EQ(append.exit_code, 2) << append.err;
  EXPECT_EQ(append.err, "kvfile: error: " + P("f.safetensors") + ": not a regular file (a FIFO)\n");
  EXPECT_TRUE(ReadFile(W("x.kv")) == before);

  Run("synth " + P("a.kv") + " --preset tiny --tokens 9");
  ASSERT_EQ(::mkfifo(W("fifo.kv").c_str(), 0644), 0);
  CliRun out = Kvfile("convert " + P("a.kv") + " " + W("fifo.kv") + " --dtype nvfp4 --force", t);
  EXPECT_EQ(out.exit_code, 2) << out.err;
  EXPECT_EQ(out.err, "kvfile: error: " + W("fifo.kv") + ": not a regular file; not replaced\n");
  EXPECT_TRUE(fs::is_fifo(W("fifo.kv")));
  EXPECT_EQ(Names("work"), (std::vector<std::string>{"fifo.kv", "x.kv"}));
}

// An nvfp4 append to a v1 file: the upgrade a writable open does writes
// fp8 only, so the append is refused before the open (exit 2, one line
// saying why), and the v1 file keeps every byte; no upgrade temp is left.
// Asked through --dtype nvfp4 or through nvfp4 codes in the input; a
// stream kept raw by --keep-raw is a plain dtype mismatch (exit 1).
TEST_F(Nvfp4Adversity, AppendOfNvfp4ToAV1FileIsRefusedBeforeTheUpgrade) {
  Run("synth " + P("a.kv") + " --preset tiny --tokens 32");
  Run("convert " + P("a.kv") + " " + W("v1.kv") + " --format v1");
  Run("convert " + P("a.kv") + " " + P("bf16.safetensors"));
  Run("synth " + P("n.kv") + " --preset tiny --tokens 32 --dtype nvfp4");
  Run("convert " + P("n.kv") + " " + P("codes.safetensors") + " --codes");
  const std::string before = ReadFile(W("v1.kv"));
  const std::string why = "' would be appended as nvfp4 (from ";
  const std::string what = "), but a v1 file is upgraded to e4m3 or e5m2 first; write an nvfp4 copy with `kvfile "
                           "convert --dtype nvfp4` and append to that\n";
  struct Case {
    std::string args, stream, input;
  } cases[] = {
      {P("bf16.safetensors") + " --dtype nvfp4", "k", P("bf16.safetensors")},
      {P("codes.safetensors"), "k", P("codes.safetensors")},
      {P("bf16.safetensors") + " --dtype nvfp4 --upgrade-dtype e5m2", "k", P("bf16.safetensors")},
      {P("bf16.safetensors") + " --dtype nvfp4 --keep-raw k", "v", P("bf16.safetensors")},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    CliRun r = Kvfile("append " + W("v1.kv") + " " + c.args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(r.err, "kvfile: error: " + W("v1.kv") + ": stream '" + c.stream + why + c.input + what);
    EXPECT_TRUE(ReadFile(W("v1.kv")) == before) << "a refused append changed the v1 file";
    EXPECT_EQ(Names("work"), std::vector<std::string>{"v1.kv"});
  }
  CliRun raw = Kvfile("append " + W("v1.kv") + " " + P("codes.safetensors") + " --keep-raw k,v");
  EXPECT_EQ(raw.exit_code, 1) << raw.err;
  EXPECT_EQ(raw.err, "kvfile: error: " + W("v1.kv") + ": stream 'k' dtype: file has bf16, expected nvfp4 (from " +
                         P("codes.safetensors") + ")\n");
  EXPECT_TRUE(ReadFile(W("v1.kv")) == before);
  // The way the line gives: an nvfp4 copy takes the append.
  Run("convert " + W("v1.kv") + " " + P("n2.kv") + " --dtype nvfp4");
  Run("append " + P("n2.kv") + " " + P("codes.safetensors") + " --dtype nvfp4");
  EXPECT_TRUE(Nvfp4Tokens(P("n2.kv"), 32, 64) == Nvfp4Tokens(P("n.kv"), 0, 32));
}

}  // namespace
}  // namespace kvfile
