// SPDX-License-Identifier: Apache-2.0
// Every writing path of the seeds' and llama.cpp converters is a
// transaction (issue 13's rule, for issues 19 and 20): export of a .kv to a
// Mooncake record directory, a colibri .coli_kv file, a llama.cpp sequence
// or session file, and the import of each back into a .kv file, under a
// real full disk (a small tmpfs), real signals (SIGKILL, SIGINT, SIGTERM,
// SIGHUP mid-write), real symlinks, hard links, owners, FIFOs and a real
// writer lock held by another process. Each asserts the exit status, the
// one stderr line, the destination's bytes (unchanged, or the whole new
// conversion) and that no temporary file or directory is left.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kvfile/reader.h"
#include "support/adversity.h"
#include "support/cli_run.h"

namespace kvfile {
namespace {

namespace fs = std::filesystem;
using testing::CliRun;
using testing::Kvfile;
using testing::ReadFile;
using testing::Tree;

// One conversion path. Exports read a .kv made by `synth`; imports read
// that .kv exported to the foreign format first (with `make`).
struct Path {
  const char* name;
  const char* out;    // the destination's name
  const char* flags;  // for the conversion under test
  const char* make;   // imports: the export that makes the input ("" for an export)
  const char* input;  // the input's name
  bool dsa;           // synth preset: dsa-mixed (colibri's geometry), else tiny / llama-3.1-8b
  bool dir() const { return std::string(flags).find("mooncake") != std::string::npos; }  // OUT is a directory
  bool in_dir() const { return std::string(make).find("mooncake") != std::string::npos; }  // IN is one
  bool import() const { return *make != 0; }
};

// gtest prints a parameter by its name (also in ctest's test names).
void PrintTo(const Path& p, std::ostream* os) { *os << p.name; }

const Path kPaths[] = {
    {"ExportMooncake", "out", "--format mooncake", "", "in.kv", false},
    {"ExportColi", "out.coli_kv", "--format coli-v2 --vocab 200000", "", "in.kv", true},
    {"ExportLlamaSeq", "out.bin", "--format llama-seq", "", "in.kv", false},
    {"ExportLlamaSession", "out.bin", "--format llama-session --arch llama", "", "in.kv", false},
    {"ImportMooncake", "out.kv", "", "--format mooncake", "in", false},
    {"ImportColi", "out.kv", "", "--format coli-v2 --vocab 200000", "in.coli_kv", true},
    {"ImportLlama", "out.kv", "--head-size 16", "--format llama-seq", "in.bin", false},
};

// The synth arguments of each input size.
std::string SynthArgs(bool dsa, const std::string& size) {
  std::string preset = dsa ? "dsa-mixed" : "tiny";
  uint64_t tokens = 0;
  int seed = 0;
  if (size == "a") tokens = dsa ? 2 : 40, seed = 1;        // the old destination
  if (size == "b") tokens = dsa ? 5 : 300, seed = 2;       // the new one
  if (size == "mid") tokens = dsa ? 40 : 10000, seed = 3;  // over 1.5 MiB in every format
  if (size == "big") {                                     // about a second of work in every direction
    if (!dsa) preset = "llama-3.1-8b";
    tokens = 1024, seed = 4;
  }
  return "--preset " + preset + " --tokens " + std::to_string(tokens) + " --seed " + std::to_string(seed);
}

// A .kv file's content without its per-file bytes (creation stamp,
// checksums): tokens, identity, geometry, every stream's codes and scales
// or raw rows.
std::string KvContent(const std::string& path) {
  std::unique_ptr<Reader> r;
  Status st = Reader::Open(path, {}, &r);
  if (!st.ok()) return "<" + st.ToString() + ">";
  std::string s = r->identity().model_id + "/" + std::to_string(r->identity().fingerprint) + "/";
  for (uint32_t t : r->tokens()) s += std::to_string(t) + ",";
  const Geometry& g = r->geometry();
  uint64_t T = r->token_count();
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t k = 0; k < g.streams.size(); ++k) {
      const StreamSpec& spec = g.streams[k];
      uint64_t rows = T * spec.rows_per_token;
      s += "|" + spec.name + " " + std::to_string(static_cast<int>(spec.dtype)) + " " +
           std::to_string(spec.rows_per_token) + "x" + std::to_string(spec.row_width) + "|";
      if (IsFp8(spec.dtype)) {
        std::string codes(rows * spec.row_width, '\0');
        std::vector<float> scales(rows);
        st = r->ReadCodes(l, k, 0, T, reinterpret_cast<uint8_t*>(codes.data()), scales.data());
        s += codes + std::string(reinterpret_cast<const char*>(scales.data()), rows * 4);
      } else {
        std::string raw(rows * spec.row_width * ElementSize(spec.dtype), '\0');
        st = r->ReadRows(l, k, 0, T, spec.dtype, raw.data());
        s += raw;
      }
      if (!st.ok()) return "<" + st.ToString() + ">";
    }
  return s;
}

// What a conversion wrote at `p`, comparable between two runs.
std::string Content(const fs::path& p) {
  if (p.extension() == ".kv" && fs::is_regular_file(p)) return KvContent(p.string());
  return Tree(p);
}

class ConvertAdversity : public ::testing::TestWithParam<Path> {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("kvfile_convadv_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "in");
    fs::create_directories(dir_ / "d");
  }
  void TearDown() override {
    child_.reset();  // kills a child still running
    if (mounted_) ::umount2(D("").c_str(), MNT_DETACH);
    fs::remove_all(dir_);
  }
  const Path& C() const { return GetParam(); }
  // Inputs live under in/, destinations under d/ (a tmpfs in the full-disk test).
  std::string I(const std::string& name) const { return (dir_ / "in" / name).string(); }
  std::string D(const std::string& name) const { return (dir_ / "d" / name).string(); }
  std::string Out() const { return D(C().out); }

  // The input of this path of size `size` (see SynthArgs), made once.
  std::string Input(const std::string& size) {
    std::string kv = I(size + ".kv");
    if (!fs::exists(kv)) {
      CliRun r = Kvfile("-q synth " + kv + " " + SynthArgs(C().dsa, size));
      EXPECT_EQ(r.exit_code, 0) << r.err;
    }
    if (!C().import()) return kv;
    std::string in = I(size + "-" + C().input);
    if (!fs::exists(in)) {
      CliRun r = Kvfile("-q convert " + kv + " " + in + " " + C().make);
      EXPECT_EQ(r.exit_code, 0) << r.err;
    }
    return in;
  }
  // The command converting `in` to `out`.
  std::string Args(const std::string& in, const std::string& out, const std::string& extra = "") const {
    return "convert " + in + " " + out + " " + C().flags + extra;
  }
  // What converting input `size` writes (converted once, to a side name).
  std::string Expected(const std::string& size) {
    std::string ref = I("ref-" + size + (C().dir() ? "" : fs::path(C().out).extension().string()));
    if (!fs::exists(ref)) {
      CliRun r = Kvfile(Args(Input(size), ref));
      EXPECT_EQ(r.exit_code, 0) << r.err;
    }
    return Content(ref);
  }
  // The destination holds the conversion of input `size`, made by this path.
  void WriteOld(const std::string& dest, const std::string& size = "a") {
    CliRun r = Kvfile(Args(Input(size), dest));
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  std::set<std::string> Names(const std::string& sub = "d") const {
    std::set<std::string> n;
    for (const auto& e : fs::directory_iterator(dir_ / sub)) n.insert(e.path().filename().string());
    return n;
  }

  // A 1 MiB tmpfs at d/; false if this process may not mount one.
  bool MountSmall() {
    if (::mount("tmpfs", D("").c_str(), "tmpfs", 0, "size=1m") != 0) return false;
    mounted_ = true;
    return true;
  }

  // Starts `kvfile ARGS` (split at spaces) with stdout to /dev/null and
  // stderr to a file.
  void Start(const std::string& args) {
    err_path_ = I("stderr.txt");
    child_ = std::make_unique<testing::KvfileChild>(err_path_);
    child_->Start(args);
  }
  // Polls until a name that `before` lacks appears in d/ (the command's
  // temporary file or directory); false if the child exited first.
  bool WaitForNewName(const std::set<std::string>& before) { return child_->WaitForNewName(dir_ / "d", before); }
  // Sends `sig`; the exit status, or 1000 + the signal that ended it.
  int SignalAndWait(int sig) { return child_->SignalAndWait(sig); }

  fs::path dir_;
  bool mounted_ = false;
  std::unique_ptr<testing::KvfileChild> child_;
  std::string err_path_;
};

std::string PathName(const ::testing::TestParamInfo<Path>& info) { return info.param.name; }

// Exactly one line on stderr.
void ExpectOneLine(const CliRun& r) {
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.rfind("kvfile: error: ", 0), 0u) << r.err;
}

size_t Occurrences(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// 1. A full disk (a real 1 MiB tmpfs): exit 2, one line that names the
// destination (or its temporary name, which starts with it) once and says
// the disk is full; the old destination unchanged; nothing else left.
TEST_P(ConvertAdversity, FullDiskLeavesTheOldDestinationAndNoTemp) {
  if (!MountSmall()) GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  WriteOld(Out());
  std::string before = Tree(Out());
  std::string mid = Input("mid");
  CliRun r = Kvfile(Args(mid, Out(), " --force"));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  ExpectOneLine(r);
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  EXPECT_EQ(Occurrences(r.err, Out()), 1u) << r.err;
  EXPECT_TRUE(Tree(Out()) == before) << "the failed conversion changed " << Out();
  EXPECT_EQ(Names(), std::set<std::string>{C().out});
  // A new destination: nothing under its name, no temp.
  CliRun fresh = Kvfile(Args(mid, D("new" + fs::path(C().out).extension().string())));
  EXPECT_EQ(fresh.exit_code, 2) << fresh.err;
  ExpectOneLine(fresh);
  EXPECT_NE(fresh.err.find("No space left on device"), std::string::npos) << fresh.err;
  EXPECT_EQ(Names(), std::set<std::string>{C().out});
}

// 2. SIGKILL mid-write leaves a temporary file or directory, never a part
// of the destination; the next command writing the destination removes it.
// That one, interrupted by SIGINT, SIGTERM or SIGHUP mid-write, exits
// 130/143/129 with one line and leaves the old destination and no temp; a
// last run writes the whole new destination.
TEST_P(ConvertAdversity, SignalsLeaveTheOldDestinationAndStaleTempsGo) {
  std::string big = Input("big");
  WriteOld(Out());
  std::string before = Tree(Out());
  const std::set<std::string> only_out = {C().out};

  Start(Args(big, Out(), " --force"));
  ASSERT_TRUE(WaitForNewName(only_out)) << ReadFile(err_path_);
  ASSERT_TRUE(child_->Freeze()) << "the conversion finished before it could be stopped";  // mid-write
  ASSERT_EQ(SignalAndWait(SIGKILL), 1000 + SIGKILL);
  std::set<std::string> stale = Names();
  ASSERT_GT(stale.size(), 1u) << "SIGKILL left no temporary file: the kill proves nothing";
  EXPECT_TRUE(Tree(Out()) == before) << "a killed conversion changed " << Out();
  for (const std::string& n : stale)
    if (n != C().out) {
      EXPECT_TRUE(n.starts_with(std::string(C().out) + ".kvtmp-")) << n;
    }

  const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
  const char* names[] = {"SIGINT", "SIGTERM", "SIGHUP"};
  int k = 0;  // each path gets one of the three, by its place in kPaths
  while (std::strcmp(kPaths[k].name, C().name) != 0) ++k;
  k %= 3;
  Start(Args(big, Out(), " --force"));
  ASSERT_TRUE(WaitForNewName(stale)) << ReadFile(err_path_);
  ASSERT_TRUE(child_->Freeze()) << "the conversion finished before it could be stopped";
  EXPECT_EQ(SignalAndWait(sigs[k]), 128 + sigs[k]);
  EXPECT_EQ(ReadFile(err_path_), "kvfile: error: " + Out() + ": interrupted by " + names[k] + "\n");
  EXPECT_TRUE(Tree(Out()) == before) << "an interrupted conversion changed " << Out();
  EXPECT_EQ(Names(), only_out) << "the stale temp of the killed run, or the interrupted run's own, is left";

  CliRun r = Kvfile(Args(Input("b"), Out(), " --force"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(Content(Out()) == Expected("b"));
  EXPECT_EQ(Names(), only_out);
}

// 3. A symlinked destination: --force replaces its target whole and the
// link stays a link, as for .kv (kvfile/replace.h).
TEST_P(ConvertAdversity, SymlinkDestinationStaysALink) {
  fs::create_directories(D("real"));
  WriteOld(D("real/" + std::string(C().out)));
  fs::create_symlink("real/" + std::string(C().out), Out());
  CliRun r = Kvfile(Args(Input("b"), Out(), " --force"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_TRUE(fs::is_symlink(Out()));
  EXPECT_EQ(fs::read_symlink(Out()), "real/" + std::string(C().out));
  EXPECT_TRUE(Content(D("real/" + std::string(C().out))) == Expected("b"));
  EXPECT_EQ(Names("d/real"), std::set<std::string>{C().out});
  EXPECT_EQ(Names(), (std::set<std::string>{C().out, "real"}));
}

// 3b. A destination with a second hard link: --force replaces the name
// given (the other name keeps the old bytes), as `convert` to .kv does. A
// directory has no second link, but a file of the old tree may: removing
// the old tree leaves that file's bytes alone.
TEST_P(ConvertAdversity, HardLinkedDestinationIsReplacedByName) {
  WriteOld(Out());
  std::string linked = C().dir() ? D("out/manifest.json") : Out();
  std::string before = ReadFile(linked);
  fs::create_hard_link(linked, D("other"));
  CliRun r = Kvfile(Args(Input("b"), Out(), " --force"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(Content(Out()) == Expected("b"));
  EXPECT_TRUE(ReadFile(D("other")) == before);
  EXPECT_EQ(fs::hard_link_count(D("other")), 1u);
  EXPECT_EQ(Names(), (std::set<std::string>{C().out, "other"}));
}

// 4. The mode, owner and group of a replaced destination are kept (for a
// directory: its own, and its files' as the old manifest's).
TEST_P(ConvertAdversity, ReplacementKeepsModeAndOwner) {
  WriteOld(Out());
  std::vector<std::pair<std::string, mode_t>> paths = {{Out(), C().dir() ? 0750 : 0640}};
  if (C().dir())
    for (const auto& e : fs::directory_iterator(Out())) paths.push_back({e.path().string(), 0640});
  for (const auto& [p, mode] : paths) {
    ASSERT_EQ(::chmod(p.c_str(), mode), 0);
    if (::chown(p.c_str(), 4321, 8765) != 0) GTEST_SKIP() << "chown needs root: " << std::strerror(errno);
  }
  CliRun r = Kvfile(Args(Input("b"), Out(), " --force"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(Content(Out()) == Expected("b"));
  paths.resize(1);
  if (C().dir())
    for (const auto& e : fs::directory_iterator(Out())) paths.push_back({e.path().string(), 0640});
  for (const auto& [p, mode] : paths) {
    struct stat st;
    ASSERT_EQ(::stat(p.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, mode) << p;
    EXPECT_EQ(st.st_uid, 4321u) << p;
    EXPECT_EQ(st.st_gid, 8765u) << p;
  }
}

// 5. A FIFO as the input and as the destination: refused at once (exit 2,
// one line); a regression that blocks is stopped by `timeout` (exit 124).
TEST_P(ConvertAdversity, FifoIsRefusedAtOnce) {
  const std::string t = "timeout 20";
  std::string fifo_in = I(std::string("f") + (C().import() ? fs::path(C().input).extension().string() : ".kv"));
  std::string unreadable = fifo_in;
  if (C().in_dir()) {
    // A Mooncake directory whose manifest, or one of whose records, is a FIFO.
    fs::path mc = Input("a");
    fs::copy(mc, I("f"), fs::copy_options::recursive);
    fs::copy(mc, I("g"), fs::copy_options::recursive);
    fifo_in = I("f");
    unreadable = I("f/manifest.json");
    fs::remove(unreadable);
    ASSERT_EQ(::mkfifo(unreadable.c_str(), 0644), 0);
    std::string record;
    for (const auto& e : fs::directory_iterator(I("g")))
      if (e.path().filename() != "manifest.json") record = e.path().string();
    fs::remove(record);
    ASSERT_EQ(::mkfifo(record.c_str(), 0644), 0);
    CliRun g = Kvfile(Args(I("g"), Out()), t);
    EXPECT_EQ(g.exit_code, 2) << g.err;
    EXPECT_EQ(g.err, "kvfile: error: " + record + ": not a regular file (a FIFO)\n");
  } else {
    ASSERT_EQ(::mkfifo(fifo_in.c_str(), 0644), 0);
  }
  CliRun in = Kvfile(Args(fifo_in, Out()), t);
  EXPECT_EQ(in.exit_code, 2) << in.err;
  EXPECT_EQ(in.err, "kvfile: error: " + unreadable + ": not a regular file (a FIFO)\n");
  EXPECT_EQ(Names(), std::set<std::string>{});

  ASSERT_EQ(::mkfifo(Out().c_str(), 0644), 0);
  CliRun out = Kvfile(Args(Input("b"), Out(), " --force"), t);
  EXPECT_EQ(out.exit_code, 2) << out.err;
  if (C().dir())
    EXPECT_EQ(out.err, "kvfile: error: " + Out() +
                           ": exists and is not a Mooncake directory written by kvfile convert; not replaced\n");
  else
    EXPECT_EQ(out.err, "kvfile: error: " + Out() + ": not a regular file; not replaced\n");
  EXPECT_TRUE(fs::is_fifo(Out()));
  EXPECT_EQ(Names(), std::set<std::string>{C().out});
}

// 6. An existing destination without --force: refused, unchanged.
TEST_P(ConvertAdversity, ExistingDestinationNeedsForce) {
  WriteOld(Out());
  std::string before = Tree(Out());
  CliRun r = Kvfile(Args(Input("b"), Out()));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.err, "kvfile: error: " + Out() + (C().dir() ? ": exists" : ": file exists") +
                       "; use --force to replace it\n");
  EXPECT_TRUE(Tree(Out()) == before);
  EXPECT_EQ(Names(), std::set<std::string>{C().out});
}

// 7. A writer lock held by another process (as a running `append` holds
// it). On the input of an export: the export reads the committed file, as
// `convert` to .kv does. On the .kv destination of an import with --force:
// refused, unchanged, as `convert` to .kv is.
TEST_P(ConvertAdversity, WriterLockHeldByAnotherProcess) {
  std::string target = C().import() ? Out() : Input("b");
  if (C().import()) WriteOld(Out());
  std::string before = Tree(Out());
  int fd = ::open(target.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  CliRun r = Kvfile(Args(Input("b"), Out(), " --force"));
  ::close(fd);
  if (C().import()) {
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(r.err, "kvfile: error: " + Out() + ": another writer has the file open; not replaced\n");
    EXPECT_TRUE(Tree(Out()) == before);
  } else {
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(Content(Out()) == Expected("b"));
  }
  EXPECT_EQ(Names(), std::set<std::string>{C().out});
}

INSTANTIATE_TEST_SUITE_P(Paths, ConvertAdversity, ::testing::ValuesIn(kPaths), PathName);

// 6, for the Mooncake directory: with --force it replaces only a directory
// that an earlier export wrote; a non-empty directory of something else,
// an empty one and a file where the directory should be are refused, each
// left as it was.
TEST(ConvertAdversityMooncake, ReplacesOnlyItsOwnDirectory) {
  fs::path dir = fs::path(::testing::TempDir()) / ("kvfile_convadv_mc_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "other");
  fs::create_directories(dir / "empty");
  std::ofstream((dir / "other" / "notes.txt").string()) << "keep me";
  std::ofstream((dir / "file").string()) << "a file";
  std::string in = (dir / "in.kv").string();
  ASSERT_EQ(Kvfile("-q synth " + in + " --preset tiny --tokens 9").exit_code, 0);
  for (const char* name : {"other", "empty", "file"}) {
    std::string out = (dir / name).string();
    std::string before = Tree(out);
    CliRun r = Kvfile("convert " + in + " " + out + " --format mooncake --force");
    EXPECT_EQ(r.exit_code, 2) << name;
    EXPECT_EQ(r.err, "kvfile: error: " + out +
                         ": exists and is not a Mooncake directory written by kvfile convert; not replaced\n");
    EXPECT_TRUE(Tree(out) == before) << name;
    r = Kvfile("convert " + in + " " + out + " --format mooncake");
    EXPECT_EQ(r.exit_code, 2) << name;
    EXPECT_EQ(r.err, "kvfile: error: " + out + ": exists; use --force to replace it\n");
  }
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"empty", "file", "in.kv", "other"}));
  fs::remove_all(dir);
}

// Bytes a process has read so far (/proc/PID/io rchar); -1 if gone.
long long BytesRead(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/io");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("rchar:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}

// Issue 27, class 4: an import from a Mooncake directory that a real
// `kvfile convert --force` replaces while the import reads its records.
// The importer is frozen (SIGSTOP) after it has read the manifest and about
// a tenth of the records, the directory is replaced by an export of
// another file of the same model (fingerprint) and token count, whose
// records have the same names, and the importer goes on:
// it refuses (exit 2: no data is at fault, another process changed the
// input) with one line naming the directory, and writes nothing. It read
// the rest of the records from the new directory and wrote a .kv equal to
// neither export, exit 0.
TEST(ConvertAdversityMooncake, ImportRefusesADirectoryReplacedWhileItIsRead) {
  fs::path dir = fs::path(::testing::TempDir()) / ("kvfile_convadv_mcswap_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto p = [&dir](const std::string& n) { return (dir / n).string(); };
  for (const char* seed : {"1", "2"})
    ASSERT_EQ(Kvfile("-q synth " + p(std::string("s") + seed + ".kv") +
                     " --preset llama-3.1-8b --tokens 256 --chunk-tokens 16 --prefix-tokens 16 --prefix-seed 9 --seed " +
                     seed)
                  .exit_code,
              0);
  ASSERT_EQ(Kvfile("-q convert " + p("s1.kv") + " " + p("mc") + " --format mooncake").exit_code, 0);
  uint64_t manifest = fs::file_size(fs::path(p("mc")) / "manifest.json"), records = 0;
  for (const auto& e : fs::directory_iterator(p("mc"))) records += fs::file_size(e.path());
  records -= manifest;
  ASSERT_GT(records, uint64_t{16} << 20);  // 1,024 records of 20 KiB: reading them takes a while
  const std::string tree = Tree(p("mc"));

  testing::KvfileChild child(p("err"));
  // Reads through pread, which /proc/PID/io counts (io_uring's are not).
  ::setenv("KVFILE_IO", "posix", 1);
  child.Start("convert " + p("mc") + " " + p("out.kv"));
  ::unsetenv("KVFILE_IO");
  // The manifest is read twice (the format's detection, then the import).
  const long long mid = static_cast<long long>(2 * manifest + records / 10);
  ASSERT_TRUE(child.WaitUntil([&] { return BytesRead(child.pid()) >= mid; })) << child.err();
  ASSERT_TRUE(child.Freeze());
  ASSERT_LT(BytesRead(child.pid()), static_cast<long long>(2 * manifest + records * 9 / 10))
      << "the importer was not frozen while it read the records";
  CliRun swap = Kvfile("-q convert " + p("s2.kv") + " " + p("mc") + " --format mooncake --force");
  ASSERT_EQ(swap.exit_code, 0) << swap.err;
  ASSERT_FALSE(Tree(p("mc")) == tree);
  EXPECT_EQ(child.SignalAndWait(SIGCONT), 2);
  EXPECT_EQ(child.err(), "kvfile: error: " + p("mc") +
                             ": changed while it was read (another process replaced or removed it); not converted\n");
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"err", "mc", "s1.kv", "s2.kv"}));
  // Undisturbed, the import of either directory succeeds.
  CliRun again = Kvfile("-q convert " + p("mc") + " " + p("out.kv"));
  EXPECT_EQ(again.exit_code, 0) << again.err;
  fs::remove_all(dir);
}

// What killed Mooncake exports leave beside OUT, by hand (no process
// 999999999 exists): a partial temporary tree, and an old tree renamed
// aside by the fallback's first rename with OUT missing. The next export
// puts the old tree back (so without --force it is refused, and OUT is the
// old tree) and removes the rest.
TEST(ConvertAdversityMooncake, StaleTreesOfKilledExportsAreCleanedUp) {
  fs::path dir = fs::path(::testing::TempDir()) / ("kvfile_convadv_mcs_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::string in = (dir / "in.kv").string(), old = (dir / "old").string(), out = (dir / "out").string();
  ASSERT_EQ(Kvfile("-q synth " + in + " --preset tiny --tokens 9").exit_code, 0);
  ASSERT_EQ(Kvfile("-q convert " + in + " " + old + " --format mooncake").exit_code, 0);
  std::string tree = Tree(old);
  fs::rename(old, out + ".kvold-999999999");
  fs::create_directories(out + ".kvtmp-999999999");
  std::ofstream(out + ".kvtmp-999999999/manifest.json") << "{";
  CliRun r = Kvfile("convert " + in + " " + out + " --format mooncake");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvfile: error: " + out + ": exists; use --force to replace it\n");
  EXPECT_TRUE(Tree(out) == tree);
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"in.kv", "out"}));
  fs::remove_all(dir);
}

// Directory (batch) mode: each file is its own transaction. On a full
// disk the file that fits is replaced whole, the one that does not is left
// as it was, exit 2 with one line for it; a FIFO where an output goes is
// refused the same way, and a FIFO in the input tree is not read.
TEST(ConvertAdversityBatch, EachFileIsATransaction) {
  fs::path dir = fs::path(::testing::TempDir()) / ("kvfile_convadv_batch_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "tree");
  fs::create_directories(dir / "small");
  auto p = [&dir](const std::string& n) { return (dir / n).string(); };
  if (::mount("tmpfs", p("small").c_str(), "tmpfs", 0, "size=1m") != 0) {
    fs::remove_all(dir);
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  }
  struct Unmount {  // also when an assertion below returns early
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{p("small")};
  ASSERT_EQ(Kvfile("-q synth " + p("tree/a.kv") + " --preset tiny --tokens 9 --seed 1").exit_code, 0);
  ASSERT_EQ(Kvfile("-q synth " + p("tree/b.kv") + " --preset tiny --tokens 20000 --seed 2").exit_code, 0);
  ASSERT_EQ(Kvfile("-q synth " + p("small/a.kv") + " --preset tiny --tokens 5 --seed 3").exit_code, 0);
  ASSERT_EQ(Kvfile("-q synth " + p("small/b.kv") + " --preset tiny --tokens 5 --seed 4").exit_code, 0);
  ASSERT_EQ(::mkfifo(p("tree/f.kv").c_str(), 0644), 0);
  ASSERT_EQ(Kvfile("-q convert " + p("tree/a.kv") + " " + p("ref.kv") + " --dtype e5m2").exit_code, 0);
  std::string b_before = ReadFile(p("small/b.kv"));
  CliRun r = Kvfile("convert " + p("tree") + " " + p("small") + " --force --dtype e5m2", "timeout 60");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  ExpectOneLine(r);
  EXPECT_EQ(r.err.rfind("kvfile: error: " + p("tree/b.kv") + ": " + p("small/b.kv") + ".kvtmp-", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("converted 1 of 2 files"), std::string::npos) << r.out;
  EXPECT_TRUE(KvContent(p("small/a.kv")) == KvContent(p("ref.kv")));
  EXPECT_TRUE(ReadFile(p("small/b.kv")) == b_before);
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(p("small"))) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"a.kv", "b.kv"}));

  // A FIFO where b.kv's output goes (the other file fits now).
  ASSERT_EQ(::umount2(p("small").c_str(), MNT_DETACH), 0);
  fs::remove(p("tree/b.kv"));
  ASSERT_EQ(Kvfile("-q synth " + p("tree/b.kv") + " --preset tiny --tokens 7 --seed 5").exit_code, 0);
  fs::remove_all(p("small"));
  fs::create_directories(p("small"));
  ASSERT_EQ(::mkfifo(p("small/b.kv").c_str(), 0644), 0);
  r = Kvfile("convert " + p("tree") + " " + p("small") + " --force --dtype e5m2", "timeout 60");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.err, "kvfile: error: " + p("small/b.kv") + ": not a regular file; not replaced\n");
  EXPECT_NE(r.out.find("converted 1 of 2 files"), std::string::npos) << r.out;  // f.kv in IN is not read
  EXPECT_TRUE(fs::is_fifo(p("small/b.kv")));
  EXPECT_TRUE(KvContent(p("small/a.kv")) == KvContent(p("ref.kv")));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvfile
