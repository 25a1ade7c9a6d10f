// SPDX-License-Identifier: Apache-2.0
// The C API's functions for the seeds' formats (kvfile/c.h): Mooncake
// records and colibri files, over kvfile/formats/. Built with
// KVFILE_WITH_FORMATS; without it c_api_formats_unavailable.cc defines the
// same functions, which answer KVFILE_UNSUPPORTED.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "capi/c_api_internal.h"
#include "kvfile/c.h"
#include "kvfile/formats/coli_kv.h"
#include "kvfile/formats/mooncake.h"

using kvfile::Status;
using namespace kvfile::capi;

namespace {

kvfile_status ToDesc(std::string_view function, const kvfile_mooncake_desc* in, kvfile::mooncake::RecordDesc* out) {
  if (in == nullptr) return NullArgument(function, "desc");
  if (in->rank > 8) return Fail(KVFILE_INVALID_ARGUMENT, std::string(function), ": rank above 8");
  out->dtype = static_cast<kvfile::mooncake::SourceDtype>(in->source_dtype);
  out->group_size = in->group_size;
  out->shape.assign(in->shape, in->shape + in->rank);
  return KVFILE_OK;
}

}  // namespace

extern "C" {

kvfile_status kvfile_mooncake_record_size(const kvfile_mooncake_desc* desc, size_t* bytes) {
  return Guarded([&] {
    if (bytes == nullptr) return NullArgument("kvfile_mooncake_record_size", "bytes");
    kvfile::mooncake::RecordDesc d;
    if (kvfile_status st = ToDesc("kvfile_mooncake_record_size", desc, &d); st != KVFILE_OK) return st;
    uint64_t n = 0, size = 0;
    if (kvfile_status st = Report(kvfile::mooncake::RecordSize(d, &n, &size)); st != KVFILE_OK) return st;
    if (size > SIZE_MAX) return Fail(KVFILE_INVALID_ARGUMENT, "kvfile_mooncake_record_size: the record exceeds SIZE_MAX");
    *bytes = static_cast<size_t>(size);
    return KVFILE_OK;
  });
}

kvfile_status kvfile_mooncake_encode(const kvfile_mooncake_desc* desc, const uint16_t* values, uint8_t* out,
                                     size_t capacity, size_t* size) {
  return Guarded([&] {
    if (size == nullptr) return NullArgument("kvfile_mooncake_encode", "size");
    kvfile::mooncake::RecordDesc d;
    if (kvfile_status st = ToDesc("kvfile_mooncake_encode", desc, &d); st != KVFILE_OK) return st;
    uint64_t n = 0, bytes = 0;
    if (kvfile_status st = Report(kvfile::mooncake::RecordSize(d, &n, &bytes)); st != KVFILE_OK) return st;
    if (kvfile_status st = CheckCapacity("kvfile_mooncake_encode: capacity", bytes, capacity); st != KVFILE_OK)
      return st;
    if (values == nullptr) return NullArgument("kvfile_mooncake_encode", "values");
    if (out == nullptr) return NullArgument("kvfile_mooncake_encode", "out");
    std::vector<uint8_t> rec;
    if (kvfile_status st = Report(kvfile::mooncake::EncodeValues(d, values, &rec)); st != KVFILE_OK) return st;
    std::memcpy(out, rec.data(), rec.size());
    *size = rec.size();
    return KVFILE_OK;
  });
}

kvfile_status kvfile_mooncake_decode(const uint8_t* record, size_t record_bytes, kvfile_mooncake_desc* desc,
                                     uint16_t* dst, size_t dst_count) {
  return Guarded([&] {
    if (desc == nullptr) return NullArgument("kvfile_mooncake_decode", "desc");
    if (record == nullptr && record_bytes > 0) return NullArgument("kvfile_mooncake_decode", "record");
    kvfile::mooncake::RecordView v;
    if (kvfile_status st = Report(kvfile::mooncake::ParseRecord({record, record_bytes}, &v)); st != KVFILE_OK)
      return st;
    if (dst != nullptr || dst_count != 0) {
      if (kvfile_status st = CheckCapacity("kvfile_mooncake_decode: dst_count", v.elements, dst_count);
          st != KVFILE_OK)
        return st;
      if (dst == nullptr) return NullArgument("kvfile_mooncake_decode", "dst");
      kvfile::mooncake::DecodeValues(v, dst);
    }
    *desc = kvfile_mooncake_desc{};
    desc->source_dtype = static_cast<uint8_t>(v.desc.dtype);
    desc->rank = static_cast<uint8_t>(v.desc.shape.size());
    desc->group_size = v.desc.group_size;
    std::copy(v.desc.shape.begin(), v.desc.shape.end(), desc->shape);
    return KVFILE_OK;
  });
}

kvfile_status kvfile_coli_import(const char* coli_path, const char* kv_path) {
  return kvfile_coli_import_layers(coli_path, kv_path, nullptr, 0);
}

kvfile_status kvfile_coli_import_layers(const char* coli_path, const char* kv_path, const uint32_t* indexer_layers,
                                        size_t count) {
  return Guarded([&] {
    if (coli_path == nullptr) return NullArgument("kvfile_coli_import", "coli_path");
    if (kv_path == nullptr) return NullArgument("kvfile_coli_import", "kv_path");
    if (indexer_layers == nullptr && count > 0) return NullArgument("kvfile_coli_import_layers", "indexer_layers");
    kvfile::FileSystem* fs = kvfile::FileSystem::Default();
    if (kvfile_status st = RefuseExisting(fs, kv_path); st != KVFILE_OK) return st;
    kvfile::coli::ImportOptions o;
    o.fs = fs;
    if (indexer_layers != nullptr) o.indexer_layers = std::vector<uint32_t>(indexer_layers, indexer_layers + count);
    kvfile::coli::ImportResult res;
    Status st = kvfile::coli::Import(coli_path, kv_path, o, &res);
    if (!st.ok()) (void)fs->Remove(kv_path);
    return Report(st);
  });
}

kvfile_status kvfile_coli_export(const char* kv_path, const char* coli_path, uint32_t vocab) {
  return Guarded([&] {
    if (kv_path == nullptr) return NullArgument("kvfile_coli_export", "kv_path");
    if (coli_path == nullptr) return NullArgument("kvfile_coli_export", "coli_path");
    kvfile::FileSystem* fs = kvfile::FileSystem::Default();
    if (kvfile_status st = RefuseExisting(fs, coli_path); st != KVFILE_OK) return st;
    kvfile::coli::ExportOptions o;
    if (vocab != 0) o.vocab = vocab;
    uint64_t tokens = 0;
    Status st = kvfile::coli::Export(kv_path, coli_path, o, &tokens);
    if (!st.ok()) (void)fs->Remove(coli_path);  // created by Export, if it got that far
    return Report(st);
  });
}

}  // extern "C"
