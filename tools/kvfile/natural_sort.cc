// SPDX-License-Identifier: Apache-2.0
// Natural order of file names (see natural_sort.h).
#include "natural_sort.h"

#include <algorithm>

namespace kvfile::cli {

namespace {
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
}  // namespace

bool NaturalLess(std::string_view a, std::string_view b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (IsDigit(a[i]) && IsDigit(b[j])) {
      size_t i0 = i, j0 = j;
      while (i < a.size() && a[i] == '0') ++i;
      while (j < b.size() && b[j] == '0') ++j;
      size_t is = i, js = j;
      while (i < a.size() && IsDigit(a[i])) ++i;
      while (j < b.size() && IsDigit(b[j])) ++j;
      std::string_view na = a.substr(is, i - is), nb = b.substr(js, j - js);
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      if (is - i0 != js - j0) return is - i0 < js - j0;
      continue;
    }
    if (a[i] != b[j]) return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[j]);
    ++i, ++j;
  }
  return a.size() - i < b.size() - j;
}

void NaturalSort(std::vector<std::string>* names) {
  std::stable_sort(names->begin(), names->end(),
                   [](const std::string& x, const std::string& y) { return NaturalLess(x, y); });
}

}  // namespace kvfile::cli
