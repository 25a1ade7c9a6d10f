// SPDX-License-Identifier: Apache-2.0
// Moved to kvfile/formats/safetensors.h, the experimental tier of the headers
// (docs/api.md, "Header tiers"). This forwarder keeps old includes compiling
// for one more minor release; include kvfile/formats/safetensors.h instead.
#pragma once

#include "kvfile/formats/safetensors.h"
