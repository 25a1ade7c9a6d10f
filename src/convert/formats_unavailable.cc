// SPDX-License-Identifier: Apache-2.0
// The foreign formats' rows of the driver table (driver.h) in a build
// without KVFILE_WITH_FORMATS: each keeps its suffix and, where that is a
// check of the first bytes, its sniff (sniff.cc), so that Convert still
// names the format, and has no import or export, so that Convert answers
// "PATH: this build does not read (write) FORMAT files". A Mooncake
// directory is found by parsing its manifest, which needs the format's
// code: without it no directory is taken for one.
#include "convert/driver.h"
#include "kvfile/append.h"

namespace kvfile::convert {

extern const Driver kSafetensorsDriver = {Format::kSafetensors, false, ".safetensors", SniffSafetensors, nullptr,
                                          nullptr};
extern const Driver kLlamaDriver = {Format::kLlamaState, false, nullptr, SniffLlama, nullptr, nullptr};
extern const Driver kMooncakeDriver = {Format::kMooncake, true, nullptr, nullptr, nullptr, nullptr};
extern const Driver kColiDriver = {Format::kColi, false, ".coli_kv", SniffColi, nullptr, nullptr};

}  // namespace kvfile::convert

namespace kvfile {

Status AppendSafetensors(const std::string&, const std::string& input, const AppendOptions&, AppendReport* report) {
  if (report) *report = AppendReport{};
  return Status::Unsupported(input + ": this build does not read safetensors files");
}

}  // namespace kvfile

namespace kvfile::convert {

// Convert reaches these only for a format whose export exists: none here.
Status BeginDirectoryOutput(const Driver&, const std::string& out, bool, std::string*) {
  return Status::Unsupported(out + ": this build does not write directory formats");
}
Status CommitDirectoryOutput(const Driver&, const std::string&, const std::string& out) {
  return Status::Unsupported(out + ": this build does not write directory formats");
}

}  // namespace kvfile::convert
