// SPDX-License-Identifier: Apache-2.0
// kvfile llama-server save|restore: a llama-server slot kept in a .kv file
// through the server's own HTTP API (POST /slots/ID?action=save|restore),
// without changing the server (docs/llama.md, "llama-server sessions").
//
// save asks the server to write the slot into a temporary file of its slot
// directory (--slot-dir, the server's --slot-save-path), imports it, and
// creates FILE, or appends to FILE only the tokens past the longest common
// prefix of FILE's tokens and the slot's (one durable append; a divergence
// is a durable rewind to that prefix first). restore exports FILE (or
// PACK:MEMBER) into a temporary file there in the cache types, V layout and
// stream the server uses, asks the server to restore it and checks
// n_restored. The temporary files are removed whatever happens; one left by
// a kvfile killed outright is removed by the next run in that directory.
//
// What the server would misread is refused before it is asked: another
// model (the .kv keeps a fingerprint of the server's /v1/models entry), a
// cache that is quantized on one side only (llama.cpp Hadamard-rotates the
// rows of quantized caches), other layer counts or widths. The server's
// cache is learnt by saving the slot into a probe file first.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "cli_common.h"
#include "progress.h"
#include "kvfile/convert.h"
#include "kvfile/formats/llama.h"
#include "kvfile/formats/llama_state.h"
#include "kvfile/reader.h"
#include "kvfile/replace.h"
#include "kvfile/writer.h"
#include "pack_member.h"
#include "signals.h"

#if KVFILE_HAVE_CURL
#include <curl/curl.h>
#endif
#include <nlohmann/json.hpp>

namespace kvfile::cli {

namespace {
namespace llama_server_verb {  // its own names in the unity build of tools/kvfile/

struct ServerArgs {
  std::string url;
  uint32_t slot = 0;
  std::string file;
  std::string slot_dir;
  std::optional<std::string> dtype;
  std::optional<uint32_t> head_size;  // else the served model's GGUF says it
  uint32_t timeout = 600;
};

#if KVFILE_HAVE_CURL

constexpr std::string_view kTempPrefix = "kvfile-tmp-";

std::string ServerUrl(const ServerArgs& a) {
  std::string u = a.url;
  while (!u.empty() && u.back() == '/') u.pop_back();
  return u;
}

size_t CollectBody(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

// A signal ends the transfer (the progress callback aborts it).
int AbortOnSignal(void*, curl_off_t, curl_off_t, curl_off_t, curl_off_t) { return PendingSignal() ? 1 : 0; }

// One HTTP request (GET, or POST of a JSON body) answered by a JSON object:
// the object, or one line naming the server and what went wrong (the
// server's own error message when it sent one).
Status Call(const ServerArgs& a, const std::string& path, const std::string* post, nlohmann::json* out) {
  static const CURLcode global = curl_global_init(CURL_GLOBAL_DEFAULT);
  std::string url = ServerUrl(a) + path;
  if (global != CURLE_OK) return Status::IOError(url + ": libcurl does not start: " + curl_easy_strerror(global));
  std::unique_ptr<CURL, void (*)(CURL*)> c(curl_easy_init(), curl_easy_cleanup);
  if (!c) return Status::IOError(url + ": libcurl does not start");
  std::string body;
  char err[CURL_ERROR_SIZE] = {0};
  struct curl_slist* headers = nullptr;
  curl_easy_setopt(c.get(), CURLOPT_URL, url.c_str());
  curl_easy_setopt(c.get(), CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c.get(), CURLOPT_WRITEFUNCTION, CollectBody);
  curl_easy_setopt(c.get(), CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(c.get(), CURLOPT_ERRORBUFFER, err);
  curl_easy_setopt(c.get(), CURLOPT_TIMEOUT, static_cast<long>(a.timeout));
  curl_easy_setopt(c.get(), CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c.get(), CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c.get(), CURLOPT_XFERINFOFUNCTION, AbortOnSignal);
  if (post) {
    headers = curl_slist_append(headers, "Content-Type: application/json");
    curl_easy_setopt(c.get(), CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(c.get(), CURLOPT_POSTFIELDS, post->c_str());
  }
  CURLcode rc = curl_easy_perform(c.get());
  curl_slist_free_all(headers);
  if (rc == CURLE_ABORTED_BY_CALLBACK) return CheckInterrupt(url);
  if (rc != CURLE_OK)
    return Status::IOError(url + ": llama-server did not answer: " + (err[0] ? err : curl_easy_strerror(rc)));
  long code = 0;
  curl_easy_getinfo(c.get(), CURLINFO_RESPONSE_CODE, &code);
  nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (code != 200) {
    std::string why = "HTTP " + std::to_string(code);
    if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
        j["error"]["message"].is_string())
      why = j["error"]["message"].get<std::string>() + " (" + why + ")";
    return Status::IOError(url + ": llama-server: " + why);
  }
  if (!j.is_object()) return Status::IOError(url + ": llama-server's reply is not a JSON object");
  *out = std::move(j);
  return Status::OK();
}

Status SlotAction(const ServerArgs& a, const char* action, const std::string& name, nlohmann::json* reply) {
  std::string body = nlohmann::json{{"filename", name}}.dump();
  return Call(a, "/slots/" + std::to_string(a.slot) + "?action=" + action, &body, reply);
}

uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

// The model the server serves: its /v1/models entry (the model's file name,
// without its directory; vocabulary, sizes; not the slot context, which may
// differ between servers of one model), as a fingerprint and a name for
// messages. llama-server exposes no
// hash of the weights: two files of one name and shape are not told apart.
struct ServedModel {
  std::string name;
  uint64_t fingerprint = 0;
};
Status GetModel(const ServerArgs& a, ServedModel* out) {
  nlohmann::json j;
  KVFILE_RETURN_IF_ERROR(Call(a, "/v1/models", nullptr, &j));
  if (!j.contains("data") || !j["data"].is_array() || j["data"].empty() || !j["data"][0].is_object() ||
      !j["data"][0].contains("id") || !j["data"][0]["id"].is_string())
    return Status::IOError(ServerUrl(a) + "/v1/models: llama-server's reply names no model");
  const nlohmann::json& m = j["data"][0];
  nlohmann::json meta = m.contains("meta") && m["meta"].is_object() ? m["meta"] : nlohmann::json::object();
  meta.erase("n_ctx");
  out->name = m["id"].get<std::string>();  // the -m path: its file name only, so that a copy elsewhere matches
  if (size_t slash = out->name.find_last_of('/'); slash != std::string::npos) out->name.erase(0, slash + 1);
  out->fingerprint = Fnv1a(out->name + "\n" + meta.dump());
  if (out->fingerprint == 0) out->fingerprint = 1;  // 0 means "no fingerprint" in a .kv file
  return Status::OK();
}

// The model file the server loaded (GET /props: model_path), which gives
// the head size; refused when this machine cannot read it.
Status ServedModelPath(const ServerArgs& a, std::optional<std::string>* path) {
  nlohmann::json j;
  KVFILE_RETURN_IF_ERROR(Call(a, "/props", nullptr, &j));
  if (!j.contains("model_path") || !j["model_path"].is_string() || j["model_path"].get<std::string>().empty())
    return Status::InvalidArgument(ServerUrl(a) + "/props: llama-server names no model file, which gives the head "
                                   "size; give --head-size");
  std::string p = j["model_path"].get<std::string>();
  if (::access(p.c_str(), R_OK) != 0)
    return Status::InvalidArgument(ServerUrl(a) + ": the served model " + p + " is not readable here (" +
                                   std::strerror(errno) + "); it gives the head size: give --head-size");
  *path = p;
  return Status::OK();
}

bool ProcessGone(long pid) { return pid > 0 && kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH; }

// A temporary slot file "kvfile-tmp-PID-N.slot" in the slot directory:
// removed when this object goes; ones of processes that are gone (a kvfile
// killed outright) are removed by Sweep.
class TempSlot {
 public:
  TempSlot(const std::string& dir, const char* what) {
    static std::atomic<int> n{0};
    name_ = std::string(kTempPrefix) + std::to_string(getpid()) + "-" + std::to_string(n++) + "-" + what + ".slot";
    path_ = (std::filesystem::path(dir) / name_).string();
  }
  ~TempSlot() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  TempSlot(const TempSlot&) = delete;
  TempSlot& operator=(const TempSlot&) = delete;
  const std::string& name() const { return name_; }
  const std::string& path() const { return path_; }

  static void Sweep(const std::string& dir) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      std::string n = e.path().filename().string();
      if (!n.starts_with(kTempPrefix)) continue;
      long pid = std::strtol(n.c_str() + kTempPrefix.size(), nullptr, 10);
      if (!ProcessGone(pid) || !std::filesystem::remove(e.path(), ec)) continue;
      PrintLine("note", e.path().string() + ": removed a temporary slot file of kvfile process " +
                            std::to_string(pid) + ", which is gone");
    }
  }

 private:
  std::string name_, path_;
};

Status CheckSlotDir(const ServerArgs& a) {
  std::error_code ec;
  if (!std::filesystem::is_directory(a.slot_dir, ec))
    return Status::InvalidArgument(a.slot_dir + ": --slot-dir is not a directory (it must be the server's "
                                   "--slot-save-path, on this machine)");
  TempSlot::Sweep(a.slot_dir);
  return Status::OK();
}

// Asks the server to save the slot into `t` and parses what it wrote.
Status SaveSlot(const ServerArgs& a, const TempSlot& t, std::unique_ptr<File>* f, llama::StateLayout* s) {
  nlohmann::json reply;
  KVFILE_RETURN_IF_ERROR(SlotAction(a, "save", t.name(), &reply));
  KVFILE_RETURN_IF_ERROR(CheckInterrupt(a.file));
  if (reply.value("n_saved", uint64_t{0}) == 0)
    return Status::InvalidArgument(ServerUrl(a) + ": slot " + std::to_string(a.slot) +
                                   " holds no tokens; nothing to save into " + a.file);
  Status st = FileSystem::Default()->Open(t.path(), OpenMode::kRead, f);
  if (st.ok()) st = llama::ParseState(**f, t.path(), s);
  if (!st.ok()) return st.WithContext("slot " + std::to_string(a.slot) + " of " + ServerUrl(a));
  return Status::OK();
}

// Copies the bytes of `from` into the new file `to` (a PendingReplace's
// temporary file), 8 MiB at a time, stopping at a signal.
Status CopyFileBytes(const std::string& from, const std::string& to) {
  std::unique_ptr<File> in, out;
  KVFILE_RETURN_IF_ERROR(FileSystem::Default()->Open(from, OpenMode::kRead, &in));
  KVFILE_RETURN_IF_ERROR(FileSystem::Default()->Open(to, OpenMode::kCreateExclusive, &out).WithContext(from));
  uint64_t size = 0;
  KVFILE_RETURN_IF_ERROR(in->Size(&size));
  std::vector<char> buf(static_cast<size_t>(std::min<uint64_t>(size, uint64_t{8} << 20)));
  for (uint64_t at = 0; at < size;) {
    KVFILE_RETURN_IF_ERROR(CheckInterrupt(from));
    size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - at));
    KVFILE_RETURN_IF_ERROR(in->ReadAt(at, buf.data(), n));
    KVFILE_RETURN_IF_ERROR(out->WriteAt(at, buf.data(), n).WithContext(from));
    at += n;
  }
  return out->Sync().WithContext(from);
}

int RunSave(const ServerArgs& a) {
  InstallSignalHandlers();
  SetCurrentPath(a.file);
  if (Status st = RefusePackMemberTarget(a.file); !st.ok()) return ReportError(st);
  if (Status st = CheckSlotDir(a); !st.ok()) return ReportError(st);
  TempSlot tmp(a.slot_dir, "save");
  std::unique_ptr<File> f;
  llama::StateLayout s;
  if (Status st = SaveSlot(a, tmp, &f, &s); !st.ok()) return ReportError(st);
  ServedModel model;
  if (Status st = GetModel(a, &model); !st.ok()) return ReportError(st);
  ConvertOptions o;
  ProgressReports bars;
  o.interrupted = [] { return PendingSignal() != 0; };
  o.progress = bars.Callback();
  if (a.dtype) {
    o.dtype.emplace();
    if (Status st = ParseDtype(*a.dtype, &*o.dtype); !st.ok()) return UsageError(st.message());
  } else {
    o.keep_raw = {"k", "v"};  // lossless: the cache's own values
  }
  o.llama.head_size = a.head_size;
  if (!a.head_size) {
    // The head size is the model's: read from the GGUF file the server
    // loaded (its /props model_path), as `convert --model` reads it.
    if (Status st = ServedModelPath(a, &o.llama.model); !st.ok()) return ReportError(st);
  }
  Geometry g;
  ModelIdentity id;
  if (Status st = llama::PlanImport(tmp.path(), s, o, &g, &id); !st.ok()) return ReportError(st);
  id.fingerprint = model.fingerprint;
  bool exists = false;
  if (Status st = FileSystem::Default()->Exists(a.file, &exists); !st.ok()) return ReportError(st);
  uint64_t keep = 0, before = 0, size_before = 0;
  std::vector<uint32_t> old_tokens;  // FILE's, to find it unchanged before a divergent save's rename
  if (exists) {
    std::unique_ptr<Reader> r;
    Status st = Reader::Open(a.file, {}, &r);
    if (!st.ok()) return ReportError(st);
    // Where the cells sat (the slot's cache stream, sequence and first
    // position) is the server's placement, not the model's: a file saved
    // from one slot may be restored into another (restore places it) and
    // saved again from there. The file keeps its own.
    ModelIdentity want = id;
    std::optional<llama::Provenance> fp = llama::ParseModelId(r->identity().model_id);
    std::optional<llama::Provenance> ep = llama::ParseModelId(id.model_id);
    if (fp && ep) {
      ep->n_stream = fp->n_stream;
      ep->stream = fp->stream;
      ep->seq_id = fp->seq_id;
      ep->first_pos = fp->first_pos;
      want.model_id = llama::FormatModelId(*ep);
    }
    st = CheckExpected(r->identity(), r->geometry(), want, g);
    if (!st.ok())
      return ReportError(Status::Mismatch(a.file + ": " + st.message() + " (slot " + std::to_string(a.slot) + " of " +
                                          ServerUrl(a) + ", model " + model.name + ")"));
    before = r->token_count();
    auto old = r->tokens();
    old_tokens.assign(old.begin(), old.end());
    while (keep < before && keep < s.cells && old[keep] == s.tokens[keep]) ++keep;
    std::error_code ec;
    size_before = std::filesystem::file_size(a.file, ec);
  }
  WriterOptions opt;
  opt.threads = 0;
  std::unique_ptr<PendingReplace> create;
  std::unique_ptr<Writer> w;
  Status st = CheckInterrupt(a.file);
  if (st.ok() && exists) {
    st = Writer::Open(a.file, opt, &w);
    if (st.ok() && w->token_count() != before)
      st = Status::Mismatch(a.file + ": the file changed while the save was being prepared");
    if (st.ok() && keep < before) {
      // A divergence replaces FILE whole, so that a save that fails or is
      // interrupted leaves it as it was: its bytes are copied (under its
      // writer lock) to a temporary file, which is rewound to the common
      // prefix and appended to, then renamed over FILE once FILE is found
      // unchanged since (below). It costs the session's bytes once; an
      // append costs only the turn's.
      st = PendingReplace::Begin(a.file, nullptr, &create);
      if (st.ok()) st = CopyFileBytes(a.file, create->temp_path());
      Status closed = w->Close();
      w.reset();
      if (st.ok()) st = closed;
      if (st.ok()) st = Writer::Open(create->temp_path(), opt, &w).WithContext(a.file);
      if (st.ok() && w->token_count() != before)
        st = Status::Mismatch(a.file + ": the file changed while the save was being prepared");
      if (st.ok()) st = w->Rewind(keep).WithContext(a.file);
    }
  } else if (st.ok()) {
    opt.chunk_tokens = BoundedChunkTokens(g, 256, tmp.path());
    st = PendingReplace::Begin(a.file, nullptr, &create);
    if (st.ok() && create->original().exists)
      st = Status::Busy(a.file + ": created by another process while the save was being prepared");
    if (st.ok()) st = Writer::Create(create->temp_path(), g, id, opt, &w).WithContext(a.file);
  }
  if (st.ok() && keep < s.cells) st = llama::AppendCells(tmp.path(), *f, s, 0, keep, s.cells, o, *w);
  bars.Finish();
  if (!st.ok() && PendingSignal()) st = CheckInterrupt(tmp.path());
  if (w) {
    Status closed = w->Close();  // drops an unfinished append
    if (st.ok()) st = create ? closed.WithContext(a.file) : closed;
  }
  if (st.ok() && create && exists) {
    // FILE's writer lock was let go for the rename (Commit takes it again):
    // a writer that appended or rewound meanwhile is not overwritten.
    std::unique_ptr<Reader> now;
    st = Reader::Open(a.file, {}, &now);
    if (st.ok() && !std::equal(now->tokens().begin(), now->tokens().end(), old_tokens.begin(), old_tokens.end()))
      st = Status::Busy(a.file + ": changed by another writer while the save was being written; not replaced");
  }
  if (st.ok() && create) st = create->Commit();
  if (!st.ok()) return ReportError(st);
  std::error_code ec;
  uint64_t size_after = std::filesystem::file_size(a.file, ec);
  std::string what = !exists ? "created with " + std::to_string(s.cells) + " tokens"
                     : keep < before ? "rewound to the " + std::to_string(keep) +
                                           " tokens it shares with the slot, appended " +
                                           std::to_string(s.cells - keep)
                     : keep == s.cells ? "up to date (" + std::to_string(s.cells) + " tokens)"
                                       : "appended " + std::to_string(s.cells - keep) + " tokens";
  std::printf("%s: %s from slot %u of %s (%llu tokens in total; file %+lld bytes)\n", a.file.c_str(), what.c_str(),
              a.slot, ServerUrl(a).c_str(), static_cast<unsigned long long>(s.cells),
              static_cast<long long>(size_after) - static_cast<long long>(size_before));
  return kExitOk;
}

// What the server's cache holds for a slot, learnt from a probe save (one
// token evaluated first when the slot is empty, so that the file has the
// layers).
Status ProbeServer(const ServerArgs& a, uint32_t token, llama::StateLayout* s) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    TempSlot probe(a.slot_dir, "probe");
    std::unique_ptr<File> f;
    nlohmann::json reply;
    KVFILE_RETURN_IF_ERROR(SlotAction(a, "save", probe.name(), &reply));
    KVFILE_RETURN_IF_ERROR(CheckInterrupt(a.file));
    if (reply.value("n_saved", 0) > 0) {
      Status st = FileSystem::Default()->Open(probe.path(), OpenMode::kRead, &f);
      if (st.ok()) st = llama::ParseState(*f, probe.path(), s);
      if (!st.ok()) return st.WithContext("slot " + std::to_string(a.slot) + " of " + ServerUrl(a) + " (probe)");
      return Status::OK();
    }
    if (attempt) break;
    std::string body = nlohmann::json{{"prompt", nlohmann::json::array({token})},
                                      {"n_predict", 1},
                                      {"id_slot", a.slot},
                                      {"cache_prompt", true}}
                           .dump();
    KVFILE_RETURN_IF_ERROR(Call(a, "/completion", &body, &reply));
  }
  return Status::IOError(ServerUrl(a) + ": slot " + std::to_string(a.slot) + " holds no cells after one token "
                         "(cannot learn the server's cache types)");
}

int RunRestore(const ServerArgs& a) {
  InstallSignalHandlers();
  SetCurrentPath(a.file);
  if (Status st = CheckSlotDir(a); !st.ok()) return ReportError(st);
  PackMemberInputs members;
  std::string opened;
  if (Status st = members.Resolve(a.file, &opened); !st.ok()) return ReportError(st);
  std::unique_ptr<Reader> r;
  if (Status st = Reader::Open(opened, {}, &r); !st.ok()) return ReportError(members.Name(st));
  std::optional<llama::Provenance> prov = llama::ParseModelId(r->identity().model_id);
  if (!prov || r->identity().fingerprint == 0)
    return ReportError(Status::Mismatch(a.file + ": not saved by kvfile llama-server save (model '" +
                                        r->identity().model_id + "', fingerprint " +
                                        Hex16(r->identity().fingerprint) + ")"));
  if (r->token_count() == 0) return ReportError(Status::InvalidArgument(a.file + ": no tokens to restore"));
  ServedModel model;
  if (Status st = GetModel(a, &model); !st.ok()) return ReportError(st);
  if (model.fingerprint != r->identity().fingerprint)
    return ReportError(Status::Mismatch(a.file + ": saved from another model than the one " + ServerUrl(a) +
                                        " serves (" + model.name + ", fingerprint " + Hex16(model.fingerprint) +
                                        "; the file's " + Hex16(r->identity().fingerprint) + "); not restored"));
  llama::StateLayout srv;
  if (Status st = ProbeServer(a, r->tokens()[0], &srv); !st.ok()) return ReportError(st);
  const Geometry& g = r->geometry();
  std::optional<uint32_t> ks = g.FindStream("k"), vs = g.FindStream("v");
  if (!ks || !vs || srv.layers != g.layers || srv.k_width != g.streams[*ks].ElementsPerToken() ||
      srv.v_width != g.streams[*vs].ElementsPerToken())
    return ReportError(Status::Mismatch(
        a.file + ": the server's cache has " + std::to_string(srv.layers) + " layers of " +
        std::to_string(srv.k_width) + " K and " + std::to_string(srv.v_width) + " V values per token; the file " +
        std::to_string(g.layers) + " layers of another shape; not restored"));
  llama::CacheType kt = srv.k[0].type, vt = srv.v[0].type;
  if (llama::IsQuantized(kt) != llama::IsQuantized(prov->k_type) ||
      llama::IsQuantized(vt) != llama::IsQuantized(prov->v_type))
    return ReportError(Status::Mismatch(
        a.file + ": saved from a " + llama::CacheTypeName(prov->k_type) + "/" + llama::CacheTypeName(prov->v_type) +
        " cache, the server's is " + llama::CacheTypeName(kt) + "/" + llama::CacheTypeName(vt) +
        ": llama.cpp Hadamard-rotates the rows of quantized caches only, the server would misread them; "
        "not restored"));
  if (kt != vt)
    return ReportError(Status::Unsupported(a.file + ": the server's K and V caches differ in type (" +
                                           llama::CacheTypeName(kt) + "/" + llama::CacheTypeName(vt) +
                                           "): kvfile exports one type for both; not restored"));
  TempSlot tmp(a.slot_dir, "restore");
  ConvertOptions o;
  ProgressReports bars;
  o.interrupted = [] { return PendingSignal() != 0; };
  o.progress = bars.Callback();
  o.llama.type = llama::CacheTypeName(kt);
  o.llama.v_trans = srv.v_trans ? 1 : 0;
  llama::Placement at{srv.n_stream, srv.stream, srv.seq_id};
  std::string summary, warning;
  uint64_t tokens = r->token_count();
  Status st = llama::Export(opened, *r, tokens, tmp.path(), o, &summary, &warning, &at);
  bars.Finish();
  if (!st.ok() && PendingSignal()) st = CheckInterrupt(opened);
  if (!st.ok()) return ReportError(members.Name(st));
  if (Status c = CheckInterrupt(a.file); !c.ok()) return ReportError(c);
  nlohmann::json reply;
  st = SlotAction(a, "restore", tmp.name(), &reply);
  if (!st.ok()) return ReportError(st);
  uint64_t restored = reply.value("n_restored", uint64_t{0});
  if (restored != tokens)
    return ReportError(Status::IOError(ServerUrl(a) + ": llama-server restored " + std::to_string(restored) +
                                       " tokens of the " + std::to_string(tokens) + " of " + a.file));
  std::printf("%s: restored %llu tokens into slot %u of %s (%s)\n", a.file.c_str(),
              static_cast<unsigned long long>(tokens), a.slot, ServerUrl(a).c_str(), summary.c_str());
  return kExitOk;
}

#else  // !KVFILE_HAVE_CURL

int NotBuiltIn(const ServerArgs&) {
  return UsageError("llama-server: not built in (this kvfile was built without libcurl; install "
                    "libcurl4-openssl-dev and rebuild)");
}
int RunSave(const ServerArgs& a) { return NotBuiltIn(a); }
int RunRestore(const ServerArgs& a) { return NotBuiltIn(a); }

#endif

void AddCommon(CLI::App* cmd, ServerArgs* a, const char* file_help) {
  cmd->add_option("URL", a->url, "the server, e.g. http://127.0.0.1:8080")->required();
  cmd->add_option("SLOT", a->slot, "the slot id")->required()->check(Count(0, 65535));
  cmd->add_option("FILE", a->file, file_help)->required();
  cmd->add_option("--slot-dir", a->slot_dir,
                  "the server's --slot-save-path, on this machine (temporary files go there)")
      ->required();
  cmd->add_option("--timeout", a->timeout, "seconds each server request may take")
      ->check(Count(1, 86400))
      ->capture_default_str();
}

}  // namespace llama_server_verb
}  // namespace

void RegisterLlamaServer(CLI::App& app, int* exit_code) {
  using namespace llama_server_verb;
  CLI::App* top = app.add_subcommand(
      "llama-server",
      "Keep a llama-server slot in a .kv file through the server's HTTP API (its --slot-save-path\n"
      "directory must be readable and writable here): save appends each turn's new tokens, restore\n"
      "puts the file back into a slot. Example: kvfile llama-server save http://127.0.0.1:8080 0 chat.kv\n"
      "--slot-dir /srv/slots");
  top->require_subcommand(1);
  auto save = std::make_shared<ServerArgs>();
  CLI::App* s = top->add_subcommand(
      "save",
      "Save slot SLOT into FILE: created if missing, else only the tokens past the longest common prefix\n"
      "of FILE and the slot are appended (one durable append; a divergence rewinds FILE to that prefix\n"
      "first). Lossless (the cache's values) unless --dtype. A refusal or failure leaves FILE as it was.");
  AddCommon(s, save.get(), "the .kv file");
  s->add_option("--dtype", save->dtype, "store fp8 rows (e4m3 or e5m2) instead of the cache's own values")
      ->check(CLI::IsMember({"e4m3", "e5m2"}));
  s->add_option("--head-size", save->head_size,
                "values per KV head (default: read from the model file the server loaded, its /props model_path)")->check(Count(1, 65536));
  s->callback([save, exit_code] { *exit_code = RunSave(*save); });
  auto restore = std::make_shared<ServerArgs>();
  CLI::App* r = top->add_subcommand(
      "restore",
      "Restore FILE (or PACK:MEMBER) into slot SLOT, in the cache types the server uses. Another model,\n"
      "a cache quantized on one side only (rotation) or another shape is refused before the server is asked.");
  AddCommon(r, restore.get(), "the .kv file (or PACK:MEMBER)");
  r->callback([restore, exit_code] { *exit_code = RunRestore(*restore); });
}

}  // namespace kvfile::cli
