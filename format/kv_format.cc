// SPDX-License-Identifier: Apache-2.0
// Names of the dtypes (kvfile/dtype.h), both ways.
#include "format/kv_format.h"

#include <string>

namespace kvfile {

const char* DtypeName(Dtype d) {
  switch (d) {
    case Dtype::kE4M3: return "e4m3";
    case Dtype::kE5M2: return "e5m2";
    case Dtype::kBF16: return "bf16";
    case Dtype::kF16: return "f16";
    case Dtype::kF32: return "f32";
    case Dtype::kNvfp4: return "nvfp4";
  }
  return "invalid";
}

Status ParseDtype(std::string_view name, Dtype* out) {
  for (Dtype d : {Dtype::kE4M3, Dtype::kE5M2, Dtype::kBF16, Dtype::kF16, Dtype::kF32, Dtype::kNvfp4}) {
    if (name == DtypeName(d)) {
      *out = d;
      return Status::OK();
    }
  }
  return Status::InvalidArgument("unknown dtype '" + std::string(name) + "' (e4m3, e5m2, bf16, f16, f32 or nvfp4)");
}

}  // namespace kvfile
