// Public names for the geometry and identity types (defined with the format).
#pragma once

#include "kvfile/format/geometry.h"

namespace kvfile {
using format::CheckExpected;
using format::Dtype;
using format::Geometry;
using format::ModelIdentity;
using format::StreamSpec;
}  // namespace kvfile
