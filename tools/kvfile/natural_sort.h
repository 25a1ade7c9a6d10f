// SPDX-License-Identifier: Apache-2.0
// Natural order of file names: digit runs compare as numbers, so doc2
// comes before doc10 (as `ls -v` and `sort -V` list them).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvfile::cli {

// True when `a` sorts before `b`: runs of digits compare by value (then by
// fewer leading zeros), everything else byte by byte.
bool NaturalLess(std::string_view a, std::string_view b);

void NaturalSort(std::vector<std::string>* names);

}  // namespace kvfile::cli
