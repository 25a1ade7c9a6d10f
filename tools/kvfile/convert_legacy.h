// SPDX-License-Identifier: Apache-2.0
// TEMPORARY (issue 28), until foreign28's llama.cpp driver merges: a
// conversion from or to a llama.cpp state file, through convert_llama.cc,
// written atomically. cmd_convert.cc calls it for those conversions only;
// every other one goes through kvfile::Convert. At that merge this file
// and its .cc are deleted and cmd_convert.cc's two calls go.
#pragma once

#include <string>
#include <vector>

#include "convert_llama.h"
#include "kvfile/convert.h"
#include "kvfile/status.h"

namespace kvfile::cli {

// True if `path` holds a llama.cpp state (by its magic).
bool IsLlamaInput(const std::string& path);

// IN -> OUT where IN or OUT (export) is a llama.cpp state file.
// o.llama: the llama.cpp options (import and export).
Status LegacyLlamaConvert(const std::string& in, const std::string& out, bool export_to_llama,
                          const ConvertOptions& o, std::string* summary, std::vector<std::string>* warnings);

}  // namespace kvfile::cli
