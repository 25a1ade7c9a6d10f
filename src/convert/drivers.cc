// SPDX-License-Identifier: Apache-2.0
// The table of drivers (driver.h): one row per Format, in Format order.
#include "convert/driver.h"

#include <array>
#include <cstdlib>
#include <iterator>

namespace kvfile::convert {

namespace {

const Driver* const kTable[] = {&kKvDriver, &kSafetensorsDriver, &kLlamaDriver, &kMooncakeDriver, &kColiDriver};
static_assert(std::size(kTable) == kFormatCount, "every Format has one row");

// Drivers() hands out rows, not pointers: a copy of the table, made once.
std::array<Driver, kFormatCount> Rows() {
  std::array<Driver, kFormatCount> rows{};
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i] = *kTable[i];
    if (static_cast<size_t>(rows[i].format) != i) std::abort();  // the rows are in Format order
  }
  return rows;
}

}  // namespace

std::span<const Driver> Drivers() {
  static const std::array<Driver, kFormatCount> rows = Rows();
  return rows;
}

const Driver& DriverFor(Format f) { return Drivers()[static_cast<size_t>(f)]; }

}  // namespace kvfile::convert
