// SPDX-License-Identifier: Apache-2.0
// Intact tokens and the command that keeps them (see damage_advice.h).
#include "damage_advice.h"

#include <algorithm>
#include <memory>

#include "kvfile/reader.h"
#include "stdin_copy.h"

namespace kvfile::cli {

int64_t IntactTokens(const std::string& path, const VerifyReport& report) {
  std::unique_ptr<Reader> r;
  if (!Reader::Open(path, {}, &r).ok()) return -1;
  int64_t intact = -1;
  for (const VerifyFinding& f : report.findings) {
    if (!f.error || f.chunk < 0 || static_cast<uint64_t>(f.chunk) >= r->chunks().size()) continue;
    auto first = static_cast<int64_t>(r->chunks()[static_cast<size_t>(f.chunk)].first_token);
    intact = intact < 0 ? first : std::min(intact, first);
  }
  return intact;
}

std::string IntactAdvice(const std::string& path, const std::string& shown, const VerifyReport& report) {
  int64_t n = IntactTokens(path, report);
  if (n < 0) return "";
  if (n == 0) return "no token before the damage is intact";
  return "tokens 0-" + std::to_string(n - 1) + " are intact; keep them: kvfile rewind " + shown + " --to " +
         std::to_string(n);
}

std::string ShortTruncation(const std::string& path, const std::string& keep) {
  std::unique_ptr<Reader> r;
  if (!Reader::Open(path, {}, &r).ok() || !r->tail().committed_data_missing) return "";
  const TailInfo& t = r->tail();
  return path + ": file truncated: committed data missing: the file ends at offset " + std::to_string(t.file_size) +
         " (chunk " + std::to_string(r->chunks().size()) + " at offset " + std::to_string(t.valid_end) + "); " +
         std::to_string(t.committed_tokens_missing) + " committed tokens gone; " + keep + " the " +
         std::to_string(r->token_count()) + " before it";
}

Status CutInsideCommittedData(const std::string& opened, const std::string& shown) {
  std::string cut = ShortTruncation(opened);
  if (cut.empty()) return Status::OK();
  return RenamePath(Status::Corruption(cut), opened, shown);
}

}  // namespace kvfile::cli
