// SPDX-License-Identifier: Apache-2.0
// Named geometries of real model families, used by the CLI and the tests.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kvfile/export.h"
#include "kvfile/geometry.h"

namespace kvfile {

// Fills *out with the preset's geometry; its fp8 streams use `fp8_dtype`
// (kE4M3 or kE5M2), raw streams keep their dtype. kInvalidArgument for an
// unknown name (the message lists the known ones).
KVFILE_EXPORT Status GetPreset(std::string_view name, Dtype fp8_dtype, Geometry* out);
KVFILE_EXPORT std::vector<std::string> PresetNames();

}  // namespace kvfile
