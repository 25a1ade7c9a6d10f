// SPDX-License-Identifier: Apache-2.0
// kvfile bench: every path of the library side by side with this machine's
// own limits, measured in the same run, and with what a user would do
// instead (write and read the KV raw as bf16).
//
// Each figure is the median of --reps repetitions (min and max beside it).
// Ratios compare a path with the limit that bounds it (docs/performance.md
// says which and why); peak memory is the rise of the resident high-water
// mark during the path, over the buffers the bench holds throughout.
#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "bench_support.h"
#include "fidelity.h"
#include "cli_common.h"
#include "kvfile/codec.h"
#include "kvfile/presets.h"
#include "kvfile/reader.h"
#include "kvfile/verify.h"
#include "kvfile/writer.h"
#include "signals.h"
#include "synth_data.h"

namespace kvfile::cli {

namespace {

using bench::BigBuffer;
using bench::Now;

struct BenchArgs {
  std::string preset = "llama-3.1-8b";
  uint64_t tokens = 16384;
  std::string dir = ".";
  bool json = false;
  int reps = 3;
  uint32_t open_chunks = 10000;
  bool fidelity = false;
  uint32_t layers = 0;  // --fidelity: the first N layers (0: all)
};

// --fidelity without --tokens: enough tokens for stable figures, fast.
constexpr uint64_t kFidelityTokens = 2048;
// --fidelity: the attention sharpnesses, as fractions of log(tokens) that
// the softmax entropy is set to (fidelity.h).
const std::vector<double> kSharpness = {0.9, 0.5, 0.1};

// One line of the table.
struct Row {
  std::string path{};      // what was measured
  unsigned threads = 1;
  double bytes = 0;        // bytes the GB/s figure counts
  std::string bytes_of{};  // which bytes those are
  std::vector<double> seconds{};
  std::string limit{};     // the row it is compared with, or ""
  double ratio = 0;        // limit's median time for the same bytes / this median time
  std::string target{};    // e.g. ">= 0.85", or ""
  double target_ratio = 0; // 0: no target
  bool target_is_max_ms = false;  // the target bounds milliseconds, not a ratio
  int64_t peak_bytes = -1;
  std::string note{};
};

double Gbps(const Row& r) { return r.bytes / bench::Summarize(r.seconds).median / 1e9; }

// The session in memory: bf16 rows of every (layer, stream), each one
// contiguous ([tokens][rows][width]) as an engine's per-layer cache is.
struct Session {
  Geometry g;
  uint64_t tokens = 0;
  BigBuffer rows;
  std::vector<size_t> offsets;  // of (layer, stream) blocks in `rows`
  std::vector<uint32_t> token_ids;

  size_t Block(uint32_t l, uint32_t s) const { return static_cast<size_t>(l) * g.streams.size() + s; }
  size_t ElementsPerToken(uint32_t s) const { return g.streams[s].ElementsPerToken(); }
  const uint16_t* BlockRows(size_t block) const {
    return reinterpret_cast<const uint16_t*>(rows.data() + offsets[block]);
  }
};

Status MakeSession(const std::string& preset, uint64_t tokens, Session* s) {
  KVFILE_RETURN_IF_ERROR(GetPreset(preset, Dtype::kE4M3, &s->g));
  // The measured paths read and compare every (layer, stream) of the session.
  if (s->g.HasLayerSets())
    return Status::InvalidArgument("preset " + preset +
                                   " has a stream in some layers only; bench measures presets whose streams are in "
                                   "every layer (--fidelity takes it)");
  s->tokens = tokens;
  size_t total = 0;
  for (uint32_t l = 0; l < s->g.layers; ++l)
    for (uint32_t st = 0; st < s->g.streams.size(); ++st) {
      s->offsets.push_back(total);
      total += tokens * s->ElementsPerToken(st) * 2;
    }
  s->rows = BigBuffer(total);
  if (!s->rows.ok()) return Status::Failed("cannot map " + std::to_string(total) + " bytes for the session");
  // Generated on both cores: synthetic data is not what is measured.
  auto fill = [&](uint32_t parity) {
    for (uint32_t l = parity; l < s->g.layers; l += 2)
      for (uint32_t st = 0; st < s->g.streams.size(); ++st)
        synth::GenerateRows(s->g, 1, l, st, 0, tokens,
                            reinterpret_cast<uint16_t*>(s->rows.data() + s->offsets[s->Block(l, st)]));
  };
  std::thread other(fill, 1u);
  fill(0u);
  other.join();
  s->token_ids.resize(tokens);
  synth::GenerateTokens(1, 0, tokens, s->token_ids.data());
  return Status::OK();
}

// Appends tokens [0, n) of the session (token t taking the rows of token
// t % session tokens) in batches of `batch` tokens, then closes.
// `g` is the session's geometry or the same with other stream dtypes.
Status WriteSession(const Session& s, const Geometry& g, const std::string& path, const WriterOptions& options,
                    uint64_t n, uint32_t batch) {
  std::unique_ptr<Writer> w;
  KVFILE_RETURN_IF_ERROR(Writer::Create(path, g, {"kvfile-bench", 1}, options, &w));
  std::vector<uint32_t> ids(batch);
  AppendBatch b;
  b.blocks.resize(s.offsets.size());
  for (uint64_t t = 0; t < n; t += batch) {
    uint64_t count = std::min<uint64_t>(batch, n - t);
    uint64_t from = t % s.tokens;
    if (from + count > s.tokens) count = s.tokens - from;
    for (uint64_t i = 0; i < count; ++i) ids[i] = s.token_ids[(t + i) % s.tokens];
    b.tokens = std::span<const uint32_t>(ids.data(), count);
    for (uint32_t l = 0; l < s.g.layers; ++l)
      for (uint32_t st = 0; st < s.g.streams.size(); ++st) {
        size_t k = s.Block(l, st);
        b.blocks[k] = {Dtype::kBF16, s.BlockRows(k) + from * s.ElementsPerToken(st), nullptr};
      }
    KVFILE_RETURN_IF_ERROR(w->Append(b));
    KVFILE_RETURN_IF_ERROR(CheckInterrupt(path));
    if (count < batch) t -= batch - count;  // wrapped around the session: continue from token 0
  }
  return w->Close();
}

// Runs `body` reps times (after `before`, untimed, each time); the last
// repetition's peak memory is recorded.
Status Measure(int reps, Row* row, const std::function<Status()>& body,
               const std::function<Status()>& before = nullptr) {
  bench::PeakMemory peak;
  for (int i = 0; i < reps; ++i) {
    KVFILE_RETURN_IF_ERROR(CheckInterrupt(CurrentPath()));
    if (before) KVFILE_RETURN_IF_ERROR(before());
    if (i == reps - 1) peak.Start();
    double t0 = Now();
    KVFILE_RETURN_IF_ERROR(body());
    row->seconds.push_back(Now() - t0);
  }
  row->peak_bytes = peak.ExtraBytes();
  return Status::OK();
}

// Splits [0, n) into `threads` parts and runs fn(begin, end) on each, the
// last part on the calling thread.
void Parallel(unsigned threads, size_t n, const std::function<void(size_t, size_t)>& fn) {
  std::vector<std::thread> pool;
  size_t per = (n + threads - 1) / threads;
  for (unsigned i = 1; i < threads; ++i) {
    size_t b = std::min(n, per * i), e = std::min(n, per * (i + 1));
    pool.emplace_back(fn, b, e);
  }
  fn(0, std::min(n, per));
  for (auto& t : pool) t.join();
}

class Bench {
 public:
  Bench(const BenchArgs& a) : a_(a) {}
  int Run();

 private:
  Row& Add(Row r) {
    rows_.push_back(std::move(r));
    return rows_.back();
  }
  const Row* Find(const std::string& path, unsigned threads = 1) const {
    for (const Row& r : rows_)
      if (r.path == path && r.threads == threads) return &r;
    return nullptr;
  }
  // Sets the row's ratio against `limit` (same bytes per second basis:
  // limit time for the row's bytes / the row's time).
  void CompareTo(Row& r, const std::string& limit, unsigned limit_threads = 1) {
    const Row* l = Find(limit, limit_threads);
    if (!l || l->seconds.empty() || r.seconds.empty()) return;
    r.limit = limit;
    r.ratio = Gbps(r) / Gbps(*l);
  }
  std::string P(const std::string& name) const { return a_.dir + "/kvbench-" + name; }

  Status Limits();
  Status Codec();
  // The encode and decode rows (scalar, best ISA, best ISA on 2 threads) of
  // one stored form: encode/decode(isa, first row, end row) over `rows` rows.
  Status CodecRows(const std::string& dtype, size_t rows, double bf16_bytes,
                   const std::function<bool(codec::Isa, size_t, size_t)>& encode,
                   const std::function<void(codec::Isa, size_t, size_t)>& decode);
  Status AppendPaths();
  Status ReadPaths();
  Status UpgradePath();
  Status OpenPath();
  void Print() const;
  void PrintJson() const;

  BenchArgs a_;
  Session s_;
  BigBuffer out_;  // decoded rows land here (bf16, same shape as the session)
  std::vector<Row> rows_;
  uint64_t kv_bytes_ = 0;
  uint64_t staging_bytes_ = 0;
  bool cold_ok_ = true;
  double cold_resident_ = 0;
};

Status Bench::Limits() {
  size_t n = std::min<size_t>(s_.rows.size(), size_t{256} << 20);
  BigBuffer dst(n);
  Row r{.path = "limit: memcpy", .bytes = static_cast<double>(n), .bytes_of = "copied"};
  KVFILE_RETURN_IF_ERROR(Measure(std::max(a_.reps, 5), &r, [&] {
    std::memcpy(dst.data(), s_.rows.data(), n);
    return Status::OK();
  }));
  Add(r);
  return Status::OK();
}

Status Bench::Codec() {
  // A slice of the session's first stream: rows as the writer sees them
  // (fp8: one scale per row of row_width; nvfp4: one row per token).
  const StreamSpec& spec = s_.g.streams[0];
  size_t width = spec.row_width;
  size_t rows = std::min<size_t>(s_.tokens * spec.rows_per_token, (size_t{64} << 20) / (2 * width));
  const uint16_t* src = s_.BlockRows(0);
  BigBuffer codes(rows * width), scales(rows * 4), decoded(rows * width * 2);
  auto* sc = reinterpret_cast<float*>(scales.data());
  KVFILE_RETURN_IF_ERROR(CodecRows(
      "e4m3", rows, static_cast<double>(rows * width * 2),
      [&](codec::Isa isa, size_t b, size_t e) {
        size_t bad;
        return codec::QuantizeRows(Dtype::kE4M3, Dtype::kBF16, src + b * width, e - b, width,
                                   codes.data() + b * width, sc + b, &bad, isa);
      },
      [&](codec::Isa isa, size_t b, size_t e) {
        codec::DequantizeRows(Dtype::kE4M3, codes.data() + b * width, sc + b, e - b, width, Dtype::kBF16,
                              decoded.data() + b * width * 2, isa);
      }));
  size_t token = spec.ElementsPerToken();
  if (token % codec::kNvfp4Block != 0) return Status::OK();  // not storable as nvfp4
  size_t tokens = rows * width / token;
  auto* blocks = codes.data() + tokens * token / 2;  // after the packed codes
  return CodecRows(
      "nvfp4", tokens, static_cast<double>(tokens * token * 2),
      [&](codec::Isa isa, size_t b, size_t e) {
        size_t bad;
        return codec::QuantizeNvfp4Rows(Dtype::kBF16, src + b * token, e - b, token, codes.data() + b * token / 2,
                                        blocks + b * token / codec::kNvfp4Block, sc + b, &bad, isa);
      },
      [&](codec::Isa isa, size_t b, size_t e) {
        codec::DequantizeNvfp4Rows(codes.data() + b * token / 2, blocks + b * token / codec::kNvfp4Block, sc + b,
                                   e - b, token, Dtype::kBF16, decoded.data() + b * token * 2, isa);
      });
}

Status Bench::CodecRows(const std::string& dtype, size_t rows, double bf16_bytes,
                        const std::function<bool(codec::Isa, size_t, size_t)>& encode,
                        const std::function<void(codec::Isa, size_t, size_t)>& decode) {
  struct Variant {
    codec::Isa isa;
    unsigned threads;
  };
  std::vector<Variant> variants = {{codec::Isa::kScalar, 1}, {codec::BestIsa(), 1}, {codec::BestIsa(), 2}};
  for (const Variant& v : variants) {
    std::string isa = codec::IsaName(v.isa);
    Row enc{.path = "codec: encode bf16->" + dtype + " (" + isa + ")", .threads = v.threads, .bytes = bf16_bytes,
            .bytes_of = "bf16 in"};
    bool finite = true;
    KVFILE_RETURN_IF_ERROR(Measure(std::max(a_.reps, 5), &enc, [&] {
      Parallel(v.threads, rows, [&](size_t b, size_t e) {
        if (!encode(v.isa, b, e)) finite = false;
      });
      return finite ? Status::OK() : Status::Failed("synthetic rows were not finite");
    }));
    CompareTo(enc, "limit: memcpy");
    if (v.threads == 1 && v.isa != codec::Isa::kScalar) {
      enc.target = ">= 0.5";
      enc.target_ratio = 0.5;
    }
    Add(enc);
    Row dec{.path = "codec: decode " + dtype + "->bf16 (" + isa + ")", .threads = v.threads, .bytes = bf16_bytes,
            .bytes_of = "bf16 out"};
    KVFILE_RETURN_IF_ERROR(Measure(std::max(a_.reps, 5), &dec, [&] {
      Parallel(v.threads, rows, [&](size_t b, size_t e) { decode(v.isa, b, e); });
      return Status::OK();
    }));
    CompareTo(dec, "limit: memcpy");
    if (v.threads == 1 && v.isa != codec::Isa::kScalar) {
      dec.target = ">= 0.5";
      dec.target_ratio = 0.5;
    }
    Add(dec);
  }
  return Status::OK();
}

Status Bench::AppendPaths() {
  std::string kv = P("session.kv");
  WriterOptions o;
  o.overwrite = true;
  Row app{.path = "append (durable at close)", .bytes_of = ".kv file"};
  KVFILE_RETURN_IF_ERROR(Measure(a_.reps, &app, [&] { return WriteSession(s_, s_.g, kv, o, s_.tokens, 256); }));
  kv_bytes_ = bench::FileSize(kv);
  app.bytes = static_cast<double>(kv_bytes_);
  {
    std::unique_ptr<Reader> r;
    KVFILE_RETURN_IF_ERROR(Reader::Open(kv, {}, &r));
    if (!r->chunks().empty()) staging_bytes_ = r->chunks()[0].bytes;
  }
  Row raw{.path = "limit: raw write + fdatasync", .bytes = static_cast<double>(kv_bytes_), .bytes_of = ".kv file"};
  KVFILE_RETURN_IF_ERROR(Measure(a_.reps, &raw, [&] {
    return bench::RawWrite(P("raw.bin"), s_.rows.data(), s_.rows.size(), kv_bytes_);
  }));
  Add(raw);
  CompareTo(app, raw.path);
  app.target = ">= 0.85";
  app.target_ratio = 0.85;
  app.note = "peak bound: 2 staging buffers + 16 MiB = " +
             std::to_string((2 * staging_bytes_ + (16u << 20)) >> 20) + " MiB";
  Add(app);
  Row user{.path = "instead: raw bf16 write + fdatasync", .bytes = static_cast<double>(s_.rows.size()),
           .bytes_of = "bf16 KV"};
  KVFILE_RETURN_IF_ERROR(Measure(a_.reps, &user, [&] {
    return bench::RawWrite(P("raw-bf16.bin"), s_.rows.data(), s_.rows.size(), s_.rows.size());
  }));
  Add(user);
  // Persisting the session: kvfile's time against the raw bf16 dump's.
  Row vs{.path = "append vs raw bf16 write", .bytes = user.bytes, .bytes_of = "bf16 KV",
         .seconds = app.seconds, .limit = user.path, .target = ">= 1.7", .target_ratio = 1.7};
  vs.ratio = Gbps(vs) / Gbps(user);
  vs.peak_bytes = app.peak_bytes;
  Add(vs);
  std::filesystem::remove(P("raw.bin"));
  return Status::OK();
}

// Runs this kvfile binary with `args` (stdout to /dev/null) and waits.
Status RunSelf(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  std::string self = "kvfile";
  argv.push_back(self.data());
  std::vector<std::string> copy = args;
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  pid_t pid = ::fork();
  if (pid < 0) return Status::IOError("bench: fork failed");
  if (pid == 0) {
    int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) ::dup2(null, STDOUT_FILENO);
    ::execv("/proc/self/exe", argv.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return Status::Failed("bench: kvfile " + args[1] + " failed (status " + std::to_string(status) + ")");
  return Status::OK();
}

Status Bench::ReadPaths() {
  std::string kv = P("session.kv"), raw = P("raw-bf16.bin");
  double bf16 = static_cast<double>(s_.rows.size());
  out_ = BigBuffer(s_.rows.size());
  std::vector<RowsTarget> all;
  for (uint32_t l = 0; l < s_.g.layers; ++l)
    for (uint32_t st = 0; st < s_.g.streams.size(); ++st)
      all.push_back({l, st, out_.data() + s_.offsets[s_.Block(l, st)]});

  auto resume_whole = [&](unsigned threads) {
    return [&, threads] {
      std::unique_ptr<Reader> r;
      KVFILE_RETURN_IF_ERROR(Reader::Open(kv, {}, &r));
      return r->ReadMany(all, 0, s_.tokens, Dtype::kBF16, threads);
    };
  };
  auto resume_layers = [&](unsigned threads) {
    return [&, threads] {
      std::unique_ptr<Reader> r;
      KVFILE_RETURN_IF_ERROR(Reader::Open(kv, {}, &r));
      size_t S = s_.g.streams.size();
      for (uint32_t l = 0; l < s_.g.layers; ++l)
        KVFILE_RETURN_IF_ERROR(r->ReadMany(std::span(all).subspan(l * S, S), 0, s_.tokens, Dtype::kBF16, threads));
      return Status::OK();
    };
  };
  auto warm = [&] {
    KVFILE_RETURN_IF_ERROR(bench::WarmPageCache(kv));
    return bench::WarmPageCache(raw);
  };
  auto drop = [&](const std::string& path) {
    return [&, path] {
      KVFILE_RETURN_IF_ERROR(bench::DropFromPageCache(path, &cold_resident_));
      if (cold_resident_ > 0.05) cold_ok_ = false;
      return Status::OK();
    };
  };

  // Limits and the user's raw read, hot.
  Row read_kv{.path = "limit: raw read, hot", .bytes = static_cast<double>(kv_bytes_), .bytes_of = ".kv file"};
  KVFILE_RETURN_IF_ERROR(Measure(a_.reps, &read_kv, [&] { return bench::RawRead(kv, out_.data(), kv_bytes_); }, warm));
  Add(read_kv);
  Row read_raw{.path = "instead: raw bf16 read, hot", .bytes = bf16, .bytes_of = "bf16 KV"};
  KVFILE_RETURN_IF_ERROR(Measure(a_.reps, &read_raw, [&] { return bench::RawRead(raw, out_.data(), s_.rows.size()); }, warm));
  Add(read_raw);

  for (unsigned threads : {1u, 2u}) {
    Row r{.path = "resume whole session, hot", .threads = threads, .bytes = bf16, .bytes_of = "bf16 KV"};
    KVFILE_RETURN_IF_ERROR(Measure(a_.reps, &r, resume_whole(threads), warm));
    CompareTo(r, read_raw.path);
    r.target = ">= 1.0";
    r.target_ratio = 1.0;
    Add(r);
  }
  for (unsigned threads : {1u, 2u}) {
    Row r{.path = "resume layer by layer, hot", .threads = threads, .bytes = bf16, .bytes_of = "bf16 KV"};
    KVFILE_RETURN_IF_ERROR(Measure(a_.reps, &r, resume_layers(threads), warm));
    CompareTo(r, read_raw.path);
    Add(r);
  }
  // Values check, once: what the reader decoded is the session's bf16 rows
  // through the codec (tested bit for bit elsewhere; here a spot check
  // that the bench measured real work).
  {
    const StreamSpec& spec = s_.g.streams[0];
    size_t n = spec.row_width;
    std::vector<uint8_t> codes(n);
    float scale;
    size_t bad;
    std::vector<uint16_t> back(n);
    codec::QuantizeRows(Dtype::kE4M3, Dtype::kBF16, s_.BlockRows(0), 1, n, codes.data(), &scale, &bad);
    codec::DequantizeRows(Dtype::kE4M3, codes.data(), &scale, 1, n, Dtype::kBF16, back.data());
    if (spec.dtype == Dtype::kE4M3 && std::memcmp(back.data(), out_.data(), n * 2) != 0)
      return Status::Failed("bench: the resumed rows differ from the session's");
  }

  Row verify1{.path = "verify", .bytes = static_cast<double>(kv_bytes_), .bytes_of = ".kv file"};
  for (unsigned threads : {1u, 2u}) {
    Row v = verify1;
    v.threads = threads;
    auto verify = [&, threads] {
      VerifyOptions vo;
      vo.threads = threads;
      VerifyReport rep;
      Status st = VerifyFile(kv, vo, &rep);
      if (st.ok() && (rep.HasErrors() || rep.HasWarnings())) st = Status::Failed("bench: verify found damage");
      return st;
    };
    KVFILE_RETURN_IF_ERROR(Measure(a_.reps, &v, verify, warm));
    CompareTo(v, read_kv.path);
    v.target = ">= 0.85";
    v.target_ratio = 0.85;
    Add(v);
  }

  // What a user runs: the kvfile binary itself (a process of its own, all
  // cores), next to the same limits. `kvfile verify FILE` vs reading the
  // file (cat); `kvfile convert FILE OUT.safetensors` (decoded bf16) vs a
  // copy of the bf16 bytes (cp; both end with an fsync).
  {
    Row v{.path = "kvfile verify FILE (command)", .threads = std::max(1u, std::thread::hardware_concurrency()),
          .bytes = static_cast<double>(kv_bytes_), .bytes_of = ".kv file"};
    KVFILE_RETURN_IF_ERROR(Measure(a_.reps, &v, [&] { return RunSelf({"-q", "verify", kv}); }, warm));
    CompareTo(v, read_kv.path);
    v.target = ">= 0.85";
    v.target_ratio = 0.85;
    Add(v);
    std::string copy = P("copy-bf16.bin"), exported = P("export.safetensors");
    std::vector<uint8_t> scratch;
    Row cp{.path = "limit: copy of the bf16 KV + fsync (cp)", .bytes = bf16, .bytes_of = "bf16 KV"};
    KVFILE_RETURN_IF_ERROR(Measure(a_.reps, &cp, [&] {
      std::filesystem::remove(copy);
      return bench::RawCopy(raw, copy, &scratch);
    }, warm));
    Add(cp);
    std::filesystem::remove(copy);
    Row ex{.path = "kvfile convert FILE OUT.safetensors (bf16)", .threads = v.threads, .bytes = bf16,
           .bytes_of = "bf16 KV"};
    KVFILE_RETURN_IF_ERROR(
        Measure(a_.reps, &ex, [&] { return RunSelf({"-q", "convert", kv, exported, "--force"}); }, warm));
    CompareTo(ex, cp.path);
    ex.target = ">= 0.8";
    ex.target_ratio = 0.8;
    Add(ex);
    // The import of that bf16 safetensors file (durable) against a copy of
    // it with fsync on the same disk (what `dd conv=fsync` does): the .kv is
    // about half the bytes, so the goal is 1.5x.
    std::string imported = P("import.kv");
    auto warm_exported = [&] { return bench::WarmPageCache(exported); };
    Row dd{.path = "limit: dd of the safetensors, fsync", .bytes = bf16, .bytes_of = "bf16 KV"};
    KVFILE_RETURN_IF_ERROR(Measure(a_.reps, &dd, [&] { return bench::RawCopy(exported, copy, &scratch); }, warm_exported));
    Add(dd);
    std::filesystem::remove(copy);
    Row im{.path = "kvfile convert (import), durable", .threads = v.threads, .bytes = bf16,
           .bytes_of = "bf16 KV"};
    KVFILE_RETURN_IF_ERROR(
        Measure(a_.reps, &im, [&] { return RunSelf({"-q", "convert", exported, imported, "--force"}); }, warm_exported));
    CompareTo(im, dd.path);
    im.target = ">= 1.5";
    im.target_ratio = 1.5;
    Add(im);
    std::filesystem::remove(imported);
    // The export into memory (tmpfs), where the disk does not set the pace:
    // against a copy of the same bytes into the same tmpfs.
    const std::string shm = "/dev/shm";
    if (std::filesystem::is_directory(shm)) {
      std::string shm_copy = shm + "/kvbench-" + std::to_string(::getpid()) + "-copy.safetensors";
      std::string shm_out = shm + "/kvbench-" + std::to_string(::getpid()) + "-export.safetensors";
      Row cps{.path = "limit: cp of the bf16 KV into tmpfs", .bytes = bf16, .bytes_of = "bf16 KV"};
      Status st = Measure(a_.reps, &cps, [&] { return bench::RawCopy(exported, shm_copy, &scratch); }, [&] {
        std::filesystem::remove(shm_copy);
        return warm();
      });
      std::filesystem::remove(shm_copy);
      KVFILE_RETURN_IF_ERROR(st);
      Add(cps);
      Row ext{.path = "kvfile convert (export) into tmpfs", .threads = v.threads, .bytes = bf16,
              .bytes_of = "bf16 KV"};
      st = Measure(a_.reps, &ext, [&] { return RunSelf({"-q", "convert", kv, shm_out}); }, [&] {
        std::filesystem::remove(shm_out);
        return warm();
      });
      std::filesystem::remove(shm_out);
      KVFILE_RETURN_IF_ERROR(st);
      CompareTo(ext, cps.path);
      ext.target = ">= 0.8";
      ext.target_ratio = 0.8;
      Add(ext);
    }
    std::filesystem::remove(exported);
  }

  // Cold: the page cache dropped before each repetition.
  Row cold_kv{.path = "limit: raw read, cold", .bytes = static_cast<double>(kv_bytes_), .bytes_of = ".kv file"};
  KVFILE_RETURN_IF_ERROR(Measure(a_.reps, &cold_kv, [&] { return bench::RawRead(kv, out_.data(), kv_bytes_); }, drop(kv)));
  Row cold_raw{.path = "instead: raw bf16 read, cold", .bytes = bf16, .bytes_of = "bf16 KV"};
  KVFILE_RETURN_IF_ERROR(Measure(a_.reps, &cold_raw, [&] { return bench::RawRead(raw, out_.data(), s_.rows.size()); }, drop(raw)));
  std::vector<Row> colds;
  for (unsigned threads : {1u, 2u}) {
    Row r{.path = "resume whole session, cold", .threads = threads, .bytes = bf16, .bytes_of = "bf16 KV"};
    KVFILE_RETURN_IF_ERROR(Measure(a_.reps, &r, resume_whole(threads), drop(kv)));
    colds.push_back(r);
  }
  std::string cold_note = cold_ok_ ? "" : "page cache not dropped (" + std::to_string(static_cast<int>(cold_resident_ * 100)) +
                                              "% resident): not a cold figure";
  for (Row* r : {&cold_kv, &cold_raw}) {
    r->note = cold_note;
    Add(*r);
  }
  for (Row& r : colds) {
    CompareTo(r, cold_raw.path);
    r.target = ">= 1.6";
    r.target_ratio = 1.6;
    r.note = cold_note;
    Add(r);
  }
  return Status::OK();
}

Status Bench::UpgradePath() {
  // The same session as a v1 file (raw bf16 rows), upgraded in place.
  std::string v1 = P("session-v1.kv"), work = P("upgrade.kv"), copy = P("copy.kv");
  WriterOptions o;
  o.overwrite = true;
  o.format_major = 1;
  Geometry g = s_.g;
  for (auto& st : g.streams) st.dtype = Dtype::kBF16;
  KVFILE_RETURN_IF_ERROR(WriteSession(s_, g, v1, o, s_.tokens, 256));
  double v1_bytes = static_cast<double>(bench::FileSize(v1));
  std::vector<uint8_t> scratch;
  Row copy_row{.path = "limit: raw copy + fdatasync", .bytes = v1_bytes, .bytes_of = "v1 file"};
  KVFILE_RETURN_IF_ERROR(Measure(a_.reps, &copy_row, [&] { return bench::RawCopy(v1, copy, &scratch); }));
  Add(copy_row);
  Row up{.path = "upgrade v1 -> v2 (open)", .bytes = v1_bytes, .bytes_of = "v1 file"};
  auto upgrade = [&] {
    std::unique_ptr<Writer> w;
    Status st = Writer::Open(work, {}, &w);
    if (st.ok() && !w->recovery().upgraded_from_v1) st = Status::Failed("bench: the v1 file was not upgraded");
    return st.ok() ? w->Close() : st;
  };
  KVFILE_RETURN_IF_ERROR(Measure(a_.reps, &up, upgrade, [&] { return bench::RawCopy(v1, work, &scratch); }));
  CompareTo(up, copy_row.path);
  up.target = ">= 0.8";
  up.target_ratio = 0.8;
  Add(up);
  for (const auto& p : {v1, work, copy}) std::filesystem::remove(p);
  return Status::OK();
}

Status Bench::OpenPath() {
  std::string many = P("chunks.kv");
  WriterOptions o;
  o.overwrite = true;
  o.chunk_tokens = 1;  // committed at close: the open reads chunk heads only
  KVFILE_RETURN_IF_ERROR(WriteSession(s_, s_.g, many, o, a_.open_chunks, 1));
  KVFILE_RETURN_IF_ERROR(bench::WarmPageCache(many));
  for (const auto& [path, named] : {std::pair{"open, " + std::to_string(a_.open_chunks) + " chunks", many},
                                    std::pair{std::string("open, the session file"), P("session.kv")}}) {
    const std::string& file = named;  // a lambda may not capture a structured binding before C++20 in clang 14
    Row r{.path = path, .bytes = static_cast<double>(bench::FileSize(file)), .bytes_of = "file"};
    uint64_t chunks = 0;
    auto open = [&] {
      std::unique_ptr<Reader> reader;
      Status st = Reader::Open(file, {}, &reader);
      if (st.ok()) chunks = reader->chunks().size();
      return st;
    };
    KVFILE_RETURN_IF_ERROR(Measure(std::max(a_.reps, 5), &r, open));
    double ms = bench::Summarize(r.seconds).median * 1e3;
    char note[128];
    std::snprintf(note, sizeof note, "%.2f ms, %llu chunks, %.2f us per chunk", ms,
                  static_cast<unsigned long long>(chunks), ms * 1e3 / static_cast<double>(std::max<uint64_t>(chunks, 1)));
    r.note = note;
    if (r.path != "open, the session file") {
      r.target = "<= 20 ms";
      r.target_ratio = 20;
      r.target_is_max_ms = true;
    }
    Add(r);
  }
  std::filesystem::remove(many);
  return Status::OK();
}

bool Meets(const Row& r) {
  if (r.target_is_max_ms) return bench::Summarize(r.seconds).median * 1e3 <= r.target_ratio;
  return r.ratio >= r.target_ratio;
}

void Bench::Print() const {
  std::printf("%-38s %3s %9s %21s %7s %9s %9s  %s\n", "path", "thr", "GB/s", "(min - max)", "ratio", "target",
              "peak MiB", "vs / note");
  for (const Row& r : rows_) {
    bench::Summary t = bench::Summarize(r.seconds);
    double med = r.bytes / t.median / 1e9, lo = r.bytes / t.max / 1e9, hi = r.bytes / t.min / 1e9;
    char ratio[16] = "", peak[16] = "-", target[24] = "";
    if (!r.limit.empty()) std::snprintf(ratio, sizeof ratio, "%.2f", r.ratio);
    if (r.peak_bytes >= 0) std::snprintf(peak, sizeof peak, "%.1f", static_cast<double>(r.peak_bytes) / (1 << 20));
    if (!r.target.empty()) std::snprintf(target, sizeof target, "%s%s", r.target.c_str(), Meets(r) ? "" : " !");
    std::string vs = r.limit.empty() ? "" : "vs " + r.limit;
    if (!r.note.empty()) vs += (vs.empty() ? "" : "; ") + r.note;
    char range[32];
    std::snprintf(range, sizeof range, "(%.2f - %.2f)", lo, hi);
    std::printf("%-38s %3u %9.2f %21s %7s %9s %9s  %s\n", r.path.c_str(), r.threads, med, range, ratio, target, peak,
                vs.c_str());
  }
  std::printf("GB/s of the bytes named in --json (bytes_of); ratio = this path's speed / the speed of the path after "
              "\"vs\" for the same work; \"!\" marks a target not met.\n");
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

void Bench::PrintJson() const {
  nlohmann::json doc;
  struct utsname u;
  uname(&u);
  doc["machine"] = {{"cpu", CpuModel()},
                    {"cores", std::thread::hardware_concurrency()},
                    {"kernel", std::string(u.release)},
                    {"codec_isa", codec::IsaName(codec::BestIsa())}};
  doc["config"] = {{"preset", a_.preset}, {"tokens", a_.tokens}, {"reps", a_.reps}, {"dir", a_.dir},
                   {"kv_file_bytes", kv_bytes_}, {"bf16_bytes", s_.rows.size()}, {"staging_buffer_bytes", staging_bytes_}};
  doc["rows"] = nlohmann::json::array();
  for (const Row& r : rows_) {
    bench::Summary t = bench::Summarize(r.seconds);
    nlohmann::json j = {{"path", r.path},
                        {"threads", r.threads},
                        {"bytes", r.bytes},
                        {"bytes_of", r.bytes_of},
                        {"seconds", {{"median", t.median}, {"min", t.min}, {"max", t.max}, {"all", r.seconds}}},
                        {"gbps", {{"median", r.bytes / t.median / 1e9}, {"min", r.bytes / t.max / 1e9}, {"max", r.bytes / t.min / 1e9}}}};
    if (!r.limit.empty()) j["ratio"] = {{"vs", r.limit}, {"value", r.ratio}};
    if (!r.target.empty()) j["target"] = {{"text", r.target}, {"met", Meets(r)}};
    j["peak_bytes"] = r.peak_bytes >= 0 ? nlohmann::json(r.peak_bytes) : nlohmann::json(nullptr);
    if (!r.note.empty()) j["note"] = r.note;
    doc["rows"].push_back(j);
  }
  std::printf("%s\n", doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

int Bench::Run() {
  InstallSignalHandlers();
  SetCurrentPath(a_.dir);
  std::error_code ec;
  if (!std::filesystem::is_directory(a_.dir, ec)) return UsageError(a_.dir + ": not a directory");
  auto step = [&](const char* what, const std::function<Status()>& fn) {
    if (!a_.json) std::fprintf(stderr, "kvfile bench: %s\n", what);
    Status st = CheckInterrupt(a_.dir);
    return st.ok() ? fn() : st;
  };
  Status st = step("generating the session", [&] { return MakeSession(a_.preset, a_.tokens, &s_); });
  if (st.ok()) st = step("memory copy", [&] { return Limits(); });
  if (st.ok()) st = step("codec", [&] { return Codec(); });
  if (st.ok()) st = step("append and raw writes", [&] { return AppendPaths(); });
  if (st.ok()) st = step("resume, verify and raw reads", [&] { return ReadPaths(); });
  if (st.ok()) st = step("upgrade v1 -> v2", [&] { return UpgradePath(); });
  if (st.ok()) st = step("open", [&] { return OpenPath(); });
  // Every file a step writes (one that failed or was interrupted leaves its own).
  for (const char* name : {"session.kv", "raw-bf16.bin", "raw.bin", "session-v1.kv", "upgrade.kv", "copy.kv",
                           "chunks.kv", "upgrade.kv.kvupgrade", "copy-bf16.bin", "export.safetensors"})
    std::filesystem::remove(P(name), ec);
  if (!st.ok()) return ReportError(st);
  if (a_.json) {
    PrintJson();
  } else {
    std::printf("kvfile bench: %s, %llu tokens (%.2f GB as bf16, %.2f GB as .kv), %d repetitions, %s, codec %s, "
                "%u cores\n",
                a_.preset.c_str(), static_cast<unsigned long long>(a_.tokens), static_cast<double>(s_.rows.size()) / 1e9,
                static_cast<double>(kv_bytes_) / 1e9, a_.reps, CpuModel().c_str(), codec::IsaName(codec::BestIsa()),
                std::thread::hardware_concurrency());
    Print();
  }
  return kExitOk;
}


// `kvfile bench --fidelity`: fidelity.h's measures for one preset or all.
int RunFidelity(const BenchArgs& a) {
  SetCurrentPath(a.dir);
  std::vector<std::string> presets = a.preset == "all" ? PresetNames() : std::vector<std::string>{a.preset};
  nlohmann::json doc = nlohmann::json::array();
  for (const std::string& preset : presets) {
    fidelity::Result r;
    Status st = fidelity::Measure({.preset = preset, .tokens = a.tokens, .layers = a.layers, .sharpness = kSharpness},
                                  &r);
    if (!st.ok()) return ReportError(st);
    if (a.json) {
      nlohmann::json p = {{"preset", r.preset}, {"tokens", r.tokens}, {"layers", r.layers},
                          {"queries_per_layer", r.heads}, {"key_dim", r.key_dim}, {"entropy_fractions", r.sharpness}};
      for (const fidelity::DtypeResult& d : r.dtypes) {
        nlohmann::json j = {{"dtype", d.dtype}, {"bits_per_element", d.bits_per_element}};
        for (size_t i = 0; i < d.streams.size(); ++i)
          j["element"][d.streams[i]] = {{"median", d.element[i].median}, {"max", d.element[i].max}};
        for (size_t i = 0; i < d.attention.size(); ++i)
          j["attention"].push_back({{"entropy_fraction", r.sharpness[i]}, {"median", d.attention[i].median},
                                    {"max", d.attention[i].max}});
        p["dtypes"].push_back(j);
      }
      doc.push_back(p);
      continue;
    }
    std::printf("kvfile bench --fidelity: %s, %llu tokens, %u layers, %zu %s per layer (key dim %zu)\n",
                r.preset.c_str(), static_cast<unsigned long long>(r.tokens), r.layers, r.heads,
                r.heads == 1 ? "query" : "queries", r.key_dim);
    std::printf("%-6s %8s", "dtype", "bits/el");
    for (const std::string& name : r.dtypes[0].streams) std::printf(" %15s", name.c_str());
    for (double f : r.sharpness) std::printf("   attn H=%.2f", f);
    std::printf("\n");
    for (const fidelity::DtypeResult& d : r.dtypes) {
      std::printf("%-6s %8.2f", d.dtype.c_str(), d.bits_per_element);
      auto cell = [](const fidelity::Spread& x) {
        char text[32];
        std::snprintf(text, sizeof text, "%.2f / %.2f", 100 * x.median, 100 * x.max);
        std::printf(" %15s", text);
      };
      for (const fidelity::Spread& x : d.element) cell(x);
      for (const fidelity::Spread& x : d.attention) cell(x);
      std::printf("\n");
    }
  }
  if (a.json) {
    std::printf("%s\n", nlohmann::json{{"fidelity", doc}}.dump(2).c_str());
  } else {
    std::printf("Relative L2 error in %%, median / max over layers: of each stream's elements, and of the attention "
                "output softmax(q K^T / sqrt(d)) V of one query per key head, scaled so that the softmax entropy "
                "over the exact keys is H x log(tokens) (H near 1: spread over every token; near 0: a few).\n");
  }
  return kExitOk;
}

}  // namespace

void RegisterBench(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "Measure every path against this machine's limits, in one run (medians of --reps).\n"
      "Example: kvfile bench --dir /dev/shm --preset llama-3.1-8b --tokens 4096 --reps 3");
  cmd->add_option("--preset", args->preset, "geometry of the synthetic session")->capture_default_str();
  cmd->add_option("--tokens", args->tokens, "tokens in the session")
      ->check(Count(1, uint64_t{1} << 32))
      ->capture_default_str();
  cmd->add_option("--dir", args->dir, "directory for the files it writes (removed after)")->capture_default_str();
  cmd->add_option("--reps", args->reps, "repetitions of each figure (median, min, max)")
      ->check(Count(1, 1000))
      ->capture_default_str();
  cmd->add_option("--open-chunks", args->open_chunks, "chunks in the file the open figure uses")
      ->check(Count(1, UINT32_MAX))
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "one JSON document on stdout instead of the table");
  CLI::Option* tokens = cmd->get_option("--tokens");
  cmd->add_flag("--fidelity", args->fidelity,
                "instead of speed: the error of e4m3, e5m2 and nvfp4 on the preset's synthetic rows "
                "(--preset all: every preset; --tokens defaults to " + std::to_string(kFidelityTokens) + ")");
  cmd->add_option("--layers", args->layers, "with --fidelity: the first N layers only")->check(Count(1, UINT32_MAX));
  cmd->callback([args, exit_code, tokens] {
    if (args->fidelity) {
      if (tokens->count() == 0) args->tokens = kFidelityTokens;
      *exit_code = RunFidelity(*args);
      return;
    }
    *exit_code = Bench(*args).Run();
  });
}

}  // namespace kvfile::cli
