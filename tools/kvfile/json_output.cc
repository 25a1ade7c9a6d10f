// SPDX-License-Identifier: Apache-2.0
// JSON output of the CLI (see json_output.h).
#include "json_output.h"

#include <cstdio>

#include "cli_common.h"

namespace kvfile::cli {

void PrintJson(const nlohmann::ordered_json& j) {
  std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

int ReportErrorAsJson(const std::string& path, const Status& st) {
  nlohmann::ordered_json j;
  j["path"] = path;
  j["ok"] = false;
  j["error"] = st.message();
  PrintJson(j);
  return ReportError(st);
}

}  // namespace kvfile::cli
