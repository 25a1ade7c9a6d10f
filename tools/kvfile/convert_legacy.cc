// SPDX-License-Identifier: Apache-2.0
// TEMPORARY: llama.cpp conversions until foreign28's driver merges (see
// convert_legacy.h).
#include "convert_legacy.h"

#include <algorithm>

#include "damage_advice.h"
#include "kvfile/reader.h"
#include "kvfile/replace.h"
#include "kvfile/verify.h"

namespace kvfile::cli {

bool IsLlamaInput(const std::string& path) { return IsLlamaStateFile(path); }

namespace {

// The .kv IN check of kvfile::Convert (src/convert/convert.cc), for the
// llama.cpp export that does not go through it yet.
Status CheckInput(const std::string& in, const Reader& r, bool salvage, uint64_t* tokens,
                  std::vector<std::string>* warnings) {
  *tokens = r.token_count();
  VerifyReport rep;
  VerifyOptions vo;
  vo.threads = 4;
  KVFILE_RETURN_IF_ERROR(VerifyFile(in, vo, &rep));
  const VerifyFinding* first = nullptr;
  for (const VerifyFinding& f : rep.findings) {
    if (!f.error) continue;
    if (!first) first = &f;
    if (f.chunk >= 0 && static_cast<uint64_t>(f.chunk) < r.chunks().size())
      *tokens = std::min<uint64_t>(*tokens, r.chunks()[static_cast<size_t>(f.chunk)].first_token);
  }
  if (!first) return Status::OK();
  if (!salvage && r.tail().committed_data_missing) {
    std::string cut = ShortTruncation(in, "--salvage converts");
    if (!cut.empty()) return Status::Corruption(cut);
  }
  if (!salvage)
    return Status::Corruption(in + ": " + first->message + "; not converted (kvfile verify fails on it; --salvage "
                              "converts the " + std::to_string(*tokens) + " tokens before the damage)");
  uint64_t committed = r.tail().committed_tokens_missing;
  for (const ChunkInfo& c : r.chunks())
    if (c.committed) committed += c.live_tokens;
  warnings->push_back(in + ": --salvage: converted the verified prefix of " + std::to_string(*tokens) + " tokens; " +
                      std::to_string(committed - std::min(committed, *tokens)) + " committed tokens were dropped (" +
                      first->message + ")");
  return Status::OK();
}

}  // namespace

Status LegacyLlamaConvert(const std::string& in, const std::string& out, bool export_to_llama,
                          const ConvertOptions& o, std::string* summary, std::vector<std::string>* warnings) {
  const LlamaExport e{o.llama.session, o.llama.type, o.llama.v_trans, o.llama.arch, o.llama.rotated, o.llama.n_stream};
  std::unique_ptr<PendingReplace> replace;
  KVFILE_RETURN_IF_ERROR(PendingReplace::Begin(out, nullptr, &replace));
  if (replace->original().exists && !o.force)
    return Status::InvalidArgument(out + ": file exists; use --force to replace it");
  const std::string& tmp = replace->temp_path();
  if (export_to_llama) {
    std::unique_ptr<Reader> r;
    KVFILE_RETURN_IF_ERROR(Reader::Open(in, {}, &r));
    uint64_t T = 0;
    KVFILE_RETURN_IF_ERROR(CheckInput(in, *r, o.salvage, &T, warnings));
    std::string w;
    KVFILE_RETURN_IF_ERROR(ExportLlama(in, *r, T, tmp, e, summary, &w));
    if (!w.empty()) warnings->push_back(w);
  } else {
    KVFILE_RETURN_IF_ERROR(ImportLlama(in, tmp,
                                       {o.dtype, o.keep_raw, o.llama.head_size, o.chunk_tokens, o.kv_major,
                                        o.llama.model, o.llama.rotated, o.llama.unrotate},
                                       summary));
  }
  return replace->Commit();
}

}  // namespace kvfile::cli
