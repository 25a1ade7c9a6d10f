// SPDX-License-Identifier: Apache-2.0
// Names of the dtypes (kvfile/dtype.h's table), both ways.
#include "format/kv_format.h"

#include <string>

namespace kvfile {

const char* DtypeName(Dtype d) {
  const DtypeInfo* info = FindDtype(d);
  return info ? info->name : "invalid";
}

Status ParseDtype(std::string_view name, Dtype* out) {
  for (const DtypeInfo& info : kDtypeTable) {
    if (name == info.name) {
      *out = info.dtype;
      return Status::OK();
    }
  }
  return Status::InvalidArgument("unknown dtype '" + std::string(name) + "' (e4m3, e5m2, bf16, f16, f32 or nvfp4)");
}

}  // namespace kvfile
