// SPDX-License-Identifier: Apache-2.0
// Moved to kvfile/formats/coli_kv.h, the experimental tier of the headers
// (docs/api.md, "Header tiers"). This forwarder keeps old includes compiling
// for one more minor release; include kvfile/formats/coli_kv.h instead.
#pragma once

#include "kvfile/formats/coli_kv.h"
