// SPDX-License-Identifier: Apache-2.0
// AppendSafetensors (kvfile/append.h): the plan (PlanAppend), the checks of
// the input and of the file's identity, the one chunk-size rule, and the
// transaction around AppendAll: a new file through PendingReplace, an
// existing one through the writer's own append (dropped whole on failure).
#include "kvfile/append.h"

#include <filesystem>
#include <memory>

#include "convert/driver.h"
#include "kvfile/file.h"
#include "kvfile/formats/safetensors.h"
#include "kvfile/formats/safetensors_append.h"
#include "kvfile/reader.h"
#include "kvfile/replace.h"

namespace kvfile {

namespace {

using safetensors::KvStream;
using safetensors::KvTensors;
using safetensors::SafetensorsFile;

Status Stage(const AppendOptions& o, AppendStage stage, const AppendReport& r) {
  return o.on_stage ? o.on_stage(stage, r) : Status::OK();
}

std::vector<std::string> StreamNames(const Geometry& g) {
  std::vector<std::string> names;
  for (const StreamSpec& s : g.streams) names.push_back(s.name);
  return names;
}

// Bytes a token takes while one block is in flight: the input's values,
// their f32 copy and the codes, per element of every stream and layer.
uint64_t BlockBytesPerToken(const Geometry& g) {
  uint64_t per_token = 0;
  for (const StreamSpec& s : g.streams) per_token += s.ElementsPerToken() * 12;
  return per_token * g.layers;
}

}  // namespace

Status AppendSafetensors(const std::string& path, const std::string& input, const AppendOptions& o,
                         AppendReport* report) {
  AppendReport local;
  AppendReport& r = report ? *report : local;
  r = AppendReport{};
  FileSystem* fs = o.fs ? o.fs : FileSystem::Default();
  safetensors::AppendPlanOptions plan_options;
  plan_options.dtype = o.dtype;
  plan_options.upgrade_dtype = o.upgrade_dtype;
  plan_options.keep_raw = o.keep_raw;

  // The input: its structure, its token ids.
  std::unique_ptr<SafetensorsFile> in;
  KVFILE_RETURN_IF_ERROR(SafetensorsFile::Open(input, nullptr, &in));
  KvTensors kv;
  KVFILE_RETURN_IF_ERROR(safetensors::DescribeKv(in->header(), &kv).WithContext(input));
  std::vector<uint32_t> ids;
  KVFILE_RETURN_IF_ERROR(safetensors::ReadTokenIds(*in, kv, &ids));
  r.input_tokens = kv.tokens;

  // The plan, and the identity each side has.
  bool exists = false;
  KVFILE_RETURN_IF_ERROR(fs->Exists(path, &exists));
  r.created = !exists;
  safetensors::AppendPlan plan;
  ModelIdentity id;
  if (exists) {
    std::unique_ptr<Reader> reader;
    ReaderOptions ro;
    ro.fs = o.fs;
    KVFILE_RETURN_IF_ERROR(Reader::Open(path, ro, &reader));
    r.major_before = reader->major_version();
    r.minor_before = reader->minor_version();
    r.geometry_before = reader->geometry();
    KVFILE_RETURN_IF_ERROR(convert::CheckKeepRaw(o.keep_raw, StreamNames(reader->geometry()), path));
    KVFILE_RETURN_IF_ERROR(
        safetensors::PlanAppend(kv, &reader->geometry(), reader->major_version(), plan_options, path, input, &plan));
    id = reader->identity();
    // An input that names no model matches any file of its geometry.
    if (!o.model && !kv.model_id && !kv.fingerprint)
      r.notes.push_back(path + ": " + input + " names no model (no kvfile.model or kvfile.fingerprint metadata, no "
                        "--model): appended to model '" + id.model_id + "' on its geometry alone");
    ModelIdentity want_id{o.model ? *o.model : kv.model_id.value_or(id.model_id),
                          kv.fingerprint.value_or(id.fingerprint)};
    if (Status st = CheckExpected(id, plan.file, want_id, plan.want); !st.ok())
      return Status::Mismatch(path + ": " + st.message() + " (from " + input + ")");
  } else {
    std::vector<std::string> names;
    for (const KvStream& s : kv.streams) names.push_back(s.name);
    KVFILE_RETURN_IF_ERROR(convert::CheckKeepRaw(o.keep_raw, names, input));
    id = {o.model ? *o.model : kv.model_id.value_or(""), kv.fingerprint.value_or(0)};
    KVFILE_RETURN_IF_ERROR(safetensors::PlanAppend(kv, nullptr, 0, plan_options, path, input, &plan));
  }
  KVFILE_RETURN_IF_ERROR(safetensors::CheckValues(*in, kv));

  WriterOptions wo;
  wo.threads = o.threads;
  wo.sync = o.sync;
  wo.fs = o.fs;
  wo.upgrade_dtype = plan.upgrade_dtype;
  wo.keep_raw = o.keep_raw;
  if (!exists) {
    // The one chunk-size rule, fitted to the input's size.
    std::error_code ec;
    uint64_t input_bytes = std::filesystem::file_size(input, ec);
    wo.chunk_tokens = o.chunk_tokens ? *o.chunk_tokens : FitChunkTokens(plan.file, 256, ec ? 0 : input_bytes);
  }
  // A new FILE is written under a temporary name and renamed into place
  // when complete and durable (sync mode close at least): a failure leaves
  // no FILE.
  std::unique_ptr<PendingReplace> create;
  std::unique_ptr<Writer> w;
  KVFILE_RETURN_IF_ERROR(Stage(o, AppendStage::kOpening, r));
  if (exists) {
    KVFILE_RETURN_IF_ERROR(Writer::Open(path, wo, &w));
  } else {
    if (wo.sync == SyncMode::kNone) wo.sync = SyncMode::kClose;
    KVFILE_RETURN_IF_ERROR(PendingReplace::Begin(path, o.fs, &create));
    if (create->original().exists)
      return Status::Busy(path + ": created by another process while appending was being prepared");
    KVFILE_RETURN_IF_ERROR(Writer::Create(create->temp_path(), plan.file, id, wo, &w).WithContext(path));
  }
  r.upgraded_from_v1 = w->recovery().upgraded_from_v1;
  r.geometry = w->geometry();
  r.tokens_before = w->token_count();
  // An error from here on closes the writer first: Close() drops an append
  // left unfinished (an interrupt between blocks), committing nothing of it,
  // and after an I/O error the writer has cut the file back to its last
  // commit itself. A new file's messages name FILE, not its temporary name.
  auto fail = [&](Status st) {
    (void)w->Close();
    return create ? st.WithContext(path) : st;
  };
  if (w->geometry() != plan.file)  // replaced between the check and the open
    return fail(Status::Mismatch(path + ": the file changed while appending was being prepared"));
  if (Status st = Stage(o, AppendStage::kAppending, r); !st.ok()) return fail(st);
  const uint64_t block = safetensors::BlockTokens(BlockBytesPerToken(plan.file), o.block_bytes);
  // AppendAll calls back after each block but the last, and once more
  // just before the last (the Append that completes the append, so that a
  // stop there still leaves none of it).
  const uint64_t before_last = (kv.tokens == 0 ? 0 : (kv.tokens - 1) / block) * block;
  uint64_t calls = 0;
  Status st = safetensors::AppendAll(*in, kv, ids, plan.stream_of, *w, block, [&] {
    ++calls;
    return o.on_progress ? o.on_progress(std::min(calls * block, before_last)) : Status::OK();
  });
  if (!st.ok()) return fail(st);
  // The append is complete (committed, durable with sync close once
  // closed): nothing can take it back any more, so kSyncing's status is
  // not looked at.
  (void)Stage(o, AppendStage::kSyncing, r);
  st = w->Close();
  if (!st.ok()) return create ? st.WithContext(path) : st;  // the writer names the temporary file
  if (create) KVFILE_RETURN_IF_ERROR(create->Commit());
  return Status::OK();
}

}  // namespace kvfile
