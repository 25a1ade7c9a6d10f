// SPDX-License-Identifier: Apache-2.0
// Little-endian loads and stores of fixed-width integers and floats.
//
// Every multi-byte field of the format is little-endian; these helpers are
// the only place that knows it, so the code stays correct on a big-endian host.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace kvfile::format {

template <typename T>
inline T LoadLE(const uint8_t* p) {
  static_assert(std::is_integral_v<T>);
  T v;
  std::memcpy(&v, p, sizeof(T));
  if constexpr (std::endian::native == std::endian::big) v = std::byteswap(v);
  return v;
}

template <typename T>
inline void StoreLE(uint8_t* p, T v) {
  static_assert(std::is_integral_v<T>);
  if constexpr (std::endian::native == std::endian::big) v = std::byteswap(v);
  std::memcpy(p, &v, sizeof(T));
}

inline uint16_t LoadU16(const uint8_t* p) { return LoadLE<uint16_t>(p); }
inline uint32_t LoadU32(const uint8_t* p) { return LoadLE<uint32_t>(p); }
inline uint64_t LoadU64(const uint8_t* p) { return LoadLE<uint64_t>(p); }
inline void StoreU16(uint8_t* p, uint16_t v) { StoreLE(p, v); }
inline void StoreU32(uint8_t* p, uint32_t v) { StoreLE(p, v); }
inline void StoreU64(uint8_t* p, uint64_t v) { StoreLE(p, v); }

}  // namespace kvfile::format
