// SPDX-License-Identifier: Apache-2.0
// The geometry types inside the format code: the public ones
// (kvfile/geometry.h) under their format:: names.
#pragma once

#include "format/kv_format.h"
#include "kvfile/geometry.h"

namespace kvfile::format {
using kvfile::CheckExpected;
using kvfile::Geometry;
using kvfile::IsValidStreamName;
using kvfile::ModelIdentity;
using kvfile::StreamSpec;
}  // namespace kvfile::format
