// Names of the wire enums.
#include "kvfile/format/kv_format.h"

namespace kvfile::format {

const char* DtypeName(Dtype d) {
  switch (d) {
    case Dtype::kE4M3: return "e4m3";
    case Dtype::kE5M2: return "e5m2";
    case Dtype::kBF16: return "bf16";
    case Dtype::kF16: return "f16";
    case Dtype::kF32: return "f32";
  }
  return "invalid";
}

}  // namespace kvfile::format
