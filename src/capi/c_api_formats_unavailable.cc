// SPDX-License-Identifier: Apache-2.0
// The C API's functions for the seeds' formats (c_api_formats.cc) in a
// build without KVFILE_WITH_FORMATS: the same symbols (the C ABI does not
// depend on the option), each answering KVFILE_UNSUPPORTED with the last
// error "<function>: built without KVFILE_WITH_FORMATS".
#include <cstdint>
#include <string_view>

#include "capi/c_api_internal.h"
#include "kvfile/c.h"

namespace {

kvfile_status NotBuilt(std::string_view function) noexcept {
  return kvfile::capi::Fail(KVFILE_UNSUPPORTED, function, ": built without KVFILE_WITH_FORMATS");
}

}  // namespace

extern "C" {

kvfile_status kvfile_mooncake_record_size(const kvfile_mooncake_desc*, size_t*) {
  return NotBuilt("kvfile_mooncake_record_size");
}

kvfile_status kvfile_mooncake_encode(const kvfile_mooncake_desc*, const uint16_t*, uint8_t*, size_t, size_t*) {
  return NotBuilt("kvfile_mooncake_encode");
}

kvfile_status kvfile_mooncake_decode(const uint8_t*, size_t, kvfile_mooncake_desc*, uint16_t*, size_t) {
  return NotBuilt("kvfile_mooncake_decode");
}

kvfile_status kvfile_coli_import(const char*, const char*) { return NotBuilt("kvfile_coli_import"); }

kvfile_status kvfile_coli_import_layers(const char*, const char*, const uint32_t*, size_t) {
  return NotBuilt("kvfile_coli_import_layers");
}

kvfile_status kvfile_coli_export(const char*, const char*, uint32_t) { return NotBuilt("kvfile_coli_export"); }

}  // extern "C"
