// SPDX-License-Identifier: Apache-2.0
// A .kv file kept in line with llama.cpp state files (kvfile/formats/llama.h,
// "kvfile llama-server"): SaveState (create, append past the common prefix,
// or replace whole after a divergence) and the checks of a restore.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

#include "kvfile/file.h"
#include "kvfile/formats/llama.h"
#include "kvfile/formats/llama_state.h"
#include "kvfile/reader.h"
#include "kvfile/replace.h"
#include "kvfile/writer.h"

namespace kvfile::llama {

namespace {

Status Stop(const SaveStateOptions& o, const std::string& path) {
  return o.check_stop ? o.check_stop(path) : Status::OK();
}

uint64_t SizeOf(const std::string& path) {
  std::error_code ec;
  uint64_t n = std::filesystem::file_size(path, ec);
  return ec ? 0 : n;
}

// Copies the bytes of `from` into the new file `to` (a PendingReplace's
// temporary file), 8 MiB at a time, asking check_stop before each piece.
Status CopyFileBytes(const std::string& from, const std::string& to, const SaveStateOptions& o) {
  std::unique_ptr<File> in, out;
  KVFILE_RETURN_IF_ERROR(FileSystem::Default()->Open(from, OpenMode::kRead, &in));
  KVFILE_RETURN_IF_ERROR(FileSystem::Default()->Open(to, OpenMode::kCreateExclusive, &out).WithContext(from));
  uint64_t size = 0;
  KVFILE_RETURN_IF_ERROR(in->Size(&size));
  std::vector<char> buf(static_cast<size_t>(std::min<uint64_t>(size, uint64_t{8} << 20)));
  for (uint64_t at = 0; at < size;) {
    KVFILE_RETURN_IF_ERROR(Stop(o, from));
    size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - at));
    KVFILE_RETURN_IF_ERROR(in->ReadAt(at, buf.data(), n));
    KVFILE_RETURN_IF_ERROR(out->WriteAt(at, buf.data(), n).WithContext(from));
    at += n;
  }
  return out->Sync().WithContext(from);
}

}  // namespace

Status SaveState(const std::string& file, const std::string& in, File& f, const StateLayout& s,
                 const SaveStateOptions& o, SaveStateReport* report) {
  SaveStateReport local;
  SaveStateReport& rep = report ? *report : local;
  rep = SaveStateReport{};
  rep.cells = s.cells;
  Geometry g;
  ModelIdentity id;
  KVFILE_RETURN_IF_ERROR(PlanImport(in, s, o.convert, &g, &id));
  id.fingerprint = o.fingerprint;
  bool exists = false;
  KVFILE_RETURN_IF_ERROR(FileSystem::Default()->Exists(file, &exists));
  rep.created = !exists;
  uint64_t keep = 0, before = 0;
  std::vector<uint32_t> old_tokens;  // FILE's, to find it unchanged before a divergent save's rename
  if (exists) {
    std::unique_ptr<Reader> r;
    KVFILE_RETURN_IF_ERROR(Reader::Open(file, {}, &r));
    // Where the cells sat (the slot's cache stream, sequence and first
    // position) is the server's placement, not the model's: a file saved
    // from one slot may be restored into another (restore places it) and
    // saved again from there. The file keeps its own.
    ModelIdentity want = id;
    std::optional<Provenance> fp = ParseModelId(r->identity().model_id);
    std::optional<Provenance> ep = ParseModelId(id.model_id);
    if (fp && ep) {
      ep->n_stream = fp->n_stream;
      ep->stream = fp->stream;
      ep->seq_id = fp->seq_id;
      ep->first_pos = fp->first_pos;
      want.model_id = FormatModelId(*ep);
    }
    if (Status st = CheckExpected(r->identity(), r->geometry(), want, g); !st.ok())
      return Status::Mismatch(file + ": " + st.message() + (o.source.empty() ? "" : " (" + o.source + ")"));
    before = r->token_count();
    auto old = r->tokens();
    old_tokens.assign(old.begin(), old.end());
    while (keep < before && keep < s.cells && old[keep] == s.tokens[keep]) ++keep;
    rep.size_before = SizeOf(file);
  }
  rep.before = before;
  rep.kept = keep;
  WriterOptions opt;
  opt.threads = 0;
  std::unique_ptr<PendingReplace> create;
  std::unique_ptr<Writer> w;
  Status st = Stop(o, file);
  if (st.ok() && exists) {
    st = Writer::Open(file, opt, &w);
    if (st.ok() && w->token_count() != before)
      st = Status::Mismatch(file + ": the file changed while the save was being prepared");
    if (st.ok() && keep < before) {
      // A divergence replaces FILE whole, so that a save that fails or is
      // interrupted leaves it as it was: its bytes are copied (under its
      // writer lock) to a temporary file, which is rewound to the common
      // prefix and appended to, then renamed over FILE once FILE is found
      // unchanged since (below). It costs the session's bytes once; an
      // append costs only the turn's.
      st = PendingReplace::Begin(file, nullptr, &create);
      if (st.ok()) st = CopyFileBytes(file, create->temp_path(), o);
      Status closed = w->Close();
      w.reset();
      if (st.ok()) st = closed;
      if (st.ok()) st = Writer::Open(create->temp_path(), opt, &w).WithContext(file);
      if (st.ok() && w->token_count() != before)
        st = Status::Mismatch(file + ": the file changed while the save was being prepared");
      if (st.ok()) st = w->Rewind(keep).WithContext(file);
    }
  } else if (st.ok()) {
    // The one chunk-size rule, fitted to the state file's size.
    opt.chunk_tokens = FitChunkTokens(g, 256, SizeOf(in));
    st = PendingReplace::Begin(file, nullptr, &create);
    if (st.ok() && create->original().exists)
      st = Status::Busy(file + ": created by another process while the save was being prepared");
    if (st.ok()) st = Writer::Create(create->temp_path(), g, id, opt, &w).WithContext(file);
  }
  if (st.ok() && keep < s.cells) st = AppendCells(in, f, s, 0, keep, s.cells, o.convert, *w);
  // A stop asked for while it ran is what ended it, whatever failed first.
  if (!st.ok())
    if (Status stop = Stop(o, in); !stop.ok()) st = stop;
  if (w) {
    Status closed = w->Close();  // drops an unfinished append
    if (st.ok()) st = create ? closed.WithContext(file) : closed;
  }
  if (st.ok() && create && exists) {
    // FILE's writer lock was let go for the rename (Commit takes it again):
    // a writer that appended or rewound meanwhile is not overwritten.
    std::unique_ptr<Reader> now;
    st = Reader::Open(file, {}, &now);
    if (st.ok() && !std::equal(now->tokens().begin(), now->tokens().end(), old_tokens.begin(), old_tokens.end()))
      st = Status::Busy(file + ": changed by another writer while the save was being written; not replaced");
  }
  if (st.ok() && create) st = create->Commit();
  if (!st.ok()) return st;
  rep.size_after = SizeOf(file);
  return Status::OK();
}

Status CheckRestorable(const std::string& name, const Reader& r) {
  std::optional<Provenance> prov = ParseModelId(r.identity().model_id);
  if (!prov || r.identity().fingerprint == 0) {
    char hex[20];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(r.identity().fingerprint));
    return Status::Mismatch(name + ": not saved by kvfile llama-server save (model '" + r.identity().model_id +
                            "', fingerprint " + hex + ")");
  }
  if (r.token_count() == 0) return Status::InvalidArgument(name + ": no tokens to restore");
  return Status::OK();
}

Status CheckRestoreInto(const std::string& name, const Reader& r, const StateLayout& server) {
  std::optional<Provenance> prov = ParseModelId(r.identity().model_id);
  if (!prov) return CheckRestorable(name, r);
  const Geometry& g = r.geometry();
  std::optional<uint32_t> ks = g.FindStream("k"), vs = g.FindStream("v");
  if (!ks || !vs || server.layers != g.layers || server.k_width != g.streams[*ks].ElementsPerToken() ||
      server.v_width != g.streams[*vs].ElementsPerToken())
    return Status::Mismatch(name + ": the server's cache has " + std::to_string(server.layers) + " layers of " +
                            std::to_string(server.k_width) + " K and " + std::to_string(server.v_width) +
                            " V values per token; the file " + std::to_string(g.layers) +
                            " layers of another shape; not restored");
  CacheType kt = server.k[0].type, vt = server.v[0].type;
  if (IsQuantized(kt) != IsQuantized(prov->k_type) || IsQuantized(vt) != IsQuantized(prov->v_type))
    return Status::Mismatch(name + ": saved from a " + CacheTypeName(prov->k_type) + "/" +
                            CacheTypeName(prov->v_type) + " cache, the server's is " + CacheTypeName(kt) + "/" +
                            CacheTypeName(vt) +
                            ": llama.cpp Hadamard-rotates the rows of quantized caches only, the server would "
                            "misread them; not restored");
  if (kt != vt)
    return Status::Unsupported(name + ": the server's K and V caches differ in type (" + CacheTypeName(kt) + "/" +
                               CacheTypeName(vt) + "): kvfile exports one type for both; not restored");
  return Status::OK();
}

}  // namespace kvfile::llama
