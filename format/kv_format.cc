// SPDX-License-Identifier: Apache-2.0
// Names of the dtypes (kvfile/dtype.h).
#include "format/kv_format.h"

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

}  // namespace kvfile
