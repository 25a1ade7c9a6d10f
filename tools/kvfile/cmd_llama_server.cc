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
//
// The file's side is the library's (kvfile/formats/llama.h): save's
// create, append or divergent replace is llama::SaveState, restore's checks
// llama::CheckRestorable and CheckRestoreInto, its export llama::Export.
// This file holds the server's HTTP calls, the temporary slot files, the
// flags, progress and words.
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
  llama::SaveStateOptions so;
  so.convert = o;
  so.fingerprint = model.fingerprint;
  so.source = "slot " + std::to_string(a.slot) + " of " + ServerUrl(a) + ", model " + model.name;
  so.check_stop = [](const std::string& path) { return CheckInterrupt(path); };
  llama::SaveStateReport rep;
  Status st = llama::SaveState(a.file, tmp.path(), *f, s, so, &rep);
  bars.Finish();
  if (!st.ok()) return ReportError(st);
  const uint64_t keep = rep.kept, before = rep.before;
  std::string what = rep.created ? "created with " + std::to_string(s.cells) + " tokens"
                     : keep < before ? "rewound to the " + std::to_string(keep) +
                                           " tokens it shares with the slot, appended " +
                                           std::to_string(s.cells - keep)
                     : keep == s.cells ? "up to date (" + std::to_string(s.cells) + " tokens)"
                                       : "appended " + std::to_string(s.cells - keep) + " tokens";
  std::printf("%s: %s from slot %u of %s (%llu tokens in total; file %+lld bytes)\n", a.file.c_str(), what.c_str(),
              a.slot, ServerUrl(a).c_str(), static_cast<unsigned long long>(s.cells),
              static_cast<long long>(rep.size_after) - static_cast<long long>(rep.size_before));
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
  if (Status st = llama::CheckRestorable(a.file, *r); !st.ok()) return ReportError(st);
  ServedModel model;
  if (Status st = GetModel(a, &model); !st.ok()) return ReportError(st);
  if (model.fingerprint != r->identity().fingerprint)
    return ReportError(Status::Mismatch(a.file + ": saved from another model than the one " + ServerUrl(a) +
                                        " serves (" + model.name + ", fingerprint " + Hex16(model.fingerprint) +
                                        "; the file's " + Hex16(r->identity().fingerprint) + "); not restored"));
  llama::StateLayout srv;
  if (Status st = ProbeServer(a, r->tokens()[0], &srv); !st.ok()) return ReportError(st);
  if (Status st = llama::CheckRestoreInto(a.file, *r, srv); !st.ok()) return ReportError(st);
  const llama::CacheType kt = srv.k[0].type;
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
