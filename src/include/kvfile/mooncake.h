// SPDX-License-Identifier: Apache-2.0
// Moved to kvfile/formats/mooncake.h, the experimental tier of the headers
// (docs/api.md, "Header tiers"). This forwarder keeps old includes compiling
// for one more minor release; include kvfile/formats/mooncake.h instead.
#pragma once

#include "kvfile/formats/mooncake.h"
