// SPDX-License-Identifier: Apache-2.0
// Geometry validation and the expected-vs-actual comparison.
#include "format/geometry.h"

#include <algorithm>
#include <set>

namespace kvfile {

using format::kMaxLayers;
using format::kMaxRowsPerToken;
using format::kMaxRowWidth;
namespace hdr = format::hdr;
namespace sd = format::sd;

bool IsValidStreamName(std::string_view name) {
  if (name.empty() || name.size() >= sd::kNameCapacity) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

Status Geometry::Validate() const {
  if (layers == 0 || layers > kMaxLayers)
    return Status::InvalidArgument("layer count " + std::to_string(layers) + " outside 1.." +
                                   std::to_string(kMaxLayers));
  if (streams.empty() || streams.size() > hdr::kMaxStreams)
    return Status::InvalidArgument("stream count " + std::to_string(streams.size()) +
                                   " outside 1.." + std::to_string(hdr::kMaxStreams));
  std::set<std::string_view> names;
  for (const StreamSpec& s : streams) {
    if (!IsValidStreamName(s.name))
      return Status::InvalidArgument("stream name '" + s.name +
                                     "' is not 1-31 characters of [a-z0-9_.-]");
    if (!names.insert(s.name).second)
      return Status::InvalidArgument("stream name '" + s.name + "' appears twice");
    if (!IsValidDtype(static_cast<uint8_t>(s.dtype)))
      return Status::InvalidArgument("stream '" + s.name + "' has an invalid dtype");
    if (s.rows_per_token == 0 || s.rows_per_token > kMaxRowsPerToken)
      return Status::InvalidArgument("stream '" + s.name + "': rows per token " +
                                     std::to_string(s.rows_per_token) + " outside 1.." +
                                     std::to_string(kMaxRowsPerToken));
    if (s.row_width == 0 || s.row_width > kMaxRowWidth)
      return Status::InvalidArgument("stream '" + s.name + "': row width " +
                                     std::to_string(s.row_width) + " outside 1.." +
                                     std::to_string(kMaxRowWidth));
    if (IsNvfp4(s.dtype) && s.ElementsPerToken() % 16 != 0)
      return Status::InvalidArgument("stream '" + s.name + "': nvfp4 needs rows x width (" +
                                     std::to_string(s.ElementsPerToken()) +
                                     ") to be a multiple of 16 (one block scale per 16 elements)");
    for (size_t i = 0; i < s.layers.size(); ++i) {
      if (s.layers[i] >= layers)
        return Status::InvalidArgument("stream '" + s.name + "': layer " + std::to_string(s.layers[i]) +
                                       " outside 0.." + std::to_string(layers - 1));
      if (i > 0 && s.layers[i] <= s.layers[i - 1])
        return Status::InvalidArgument("stream '" + s.name + "': its layers are not ascending without repeats");
    }
    if (s.layers.size() == layers)
      return Status::InvalidArgument("stream '" + s.name +
                                     "': lists every layer (a stream in every layer has no layer list)");
  }
  return Status::OK();
}

bool Geometry::InLayer(uint32_t layer, uint32_t stream) const {
  const std::vector<uint32_t>& ls = streams[stream].layers;
  return ls.empty() ? layer < layers : std::binary_search(ls.begin(), ls.end(), layer);
}

uint32_t Geometry::StreamLayers(uint32_t stream) const {
  const std::vector<uint32_t>& ls = streams[stream].layers;
  return ls.empty() ? layers : static_cast<uint32_t>(ls.size());
}

bool Geometry::HasLayerSets() const {
  for (const StreamSpec& s : streams)
    if (!s.layers.empty()) return true;
  return false;
}

uint64_t Geometry::SectionCount() const {
  uint64_t n = 0;
  for (uint32_t s = 0; s < streams.size(); ++s) n += StreamLayers(s);
  return n;
}

Status ParseLayerList(std::string_view text, std::vector<uint32_t>* out) {
  std::vector<uint32_t> layers;
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("layer list '" + std::string(text) + "': " + why);
  };
  auto number = [&](std::string_view t, uint32_t* v) {
    if (t.empty() || t.size() > 4) return false;
    uint32_t n = 0;
    for (char c : t) {
      if (c < '0' || c > '9') return false;
      n = n * 10 + static_cast<uint32_t>(c - '0');
    }
    *v = n;
    return true;
  };
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string_view item = text.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    size_t dots = item.find("..");
    uint32_t a, b;
    if (dots == std::string_view::npos ? !number(item, &a) : !number(item.substr(0, dots), &a) || !number(item.substr(dots + 2), &b))
      return bad("'" + std::string(item) + "' is not a layer number or a range A..B");
    if (dots == std::string_view::npos) b = a;
    if (b < a) return bad("range '" + std::string(item) + "' runs backwards");
    if (b >= kMaxLayers) return bad("layer " + std::to_string(b) + " is past the format's " + std::to_string(kMaxLayers) + " layers");
    for (uint32_t l = a; l <= b; ++l) {
      if (!layers.empty() && l <= layers.back()) return bad("layers are not ascending without repeats");
      layers.push_back(l);
    }
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  *out = std::move(layers);
  return Status::OK();
}

std::string FormatLayerList(const std::vector<uint32_t>& layers) {
  std::string s;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    if (!s.empty()) s += ',';
    s += std::to_string(layers[i]);
    if (j > i) s += (j == i + 1 ? "," : "..") + std::to_string(layers[j]);
    i = j + 1;
  }
  return s;
}

std::optional<uint32_t> Geometry::FindStream(std::string_view name) const {
  for (size_t i = 0; i < streams.size(); ++i)
    if (streams[i].name == name) return static_cast<uint32_t>(i);
  return std::nullopt;
}

uint64_t Geometry::PayloadBytesPerToken() const {
  uint64_t total = 0;
  for (uint32_t i = 0; i < streams.size(); ++i) {
    const StreamSpec& s = streams[i];
    uint64_t bytes;
    if (IsNvfp4(s.dtype)) {
      // Codes, block scales and one row scale per token.
      bytes = s.ElementsPerToken() / 2 + s.ElementsPerToken() / 16 + 4;
    } else {
      uint64_t row_bytes = uint64_t{s.row_width} * ElementSize(s.dtype) + (IsFp8(s.dtype) ? 4 : 0);
      bytes = row_bytes * s.rows_per_token;
    }
    total += bytes * StreamLayers(i);
  }
  return total;
}

namespace {
std::string Quote(const std::string& s) { return "'" + s + "'"; }
std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}
}  // namespace

Status CheckExpected(const ModelIdentity& fid, const Geometry& fg, const ModelIdentity& eid,
                     const Geometry& eg) {
  auto differ = [](const std::string& what, const std::string& file, const std::string& want) {
    return Status::Mismatch(what + ": file has " + file + ", expected " + want);
  };
  if (fid.model_id != eid.model_id) return differ("model id", Quote(fid.model_id), Quote(eid.model_id));
  if (fid.fingerprint != eid.fingerprint)
    return differ("model fingerprint", Hex(fid.fingerprint), Hex(eid.fingerprint));
  if (fg.layers != eg.layers)
    return differ("layer count", std::to_string(fg.layers), std::to_string(eg.layers));
  if (fg.streams.size() != eg.streams.size())
    return differ("stream count", std::to_string(fg.streams.size()),
                  std::to_string(eg.streams.size()));
  for (size_t i = 0; i < fg.streams.size(); ++i) {
    const StreamSpec& f = fg.streams[i];
    const StreamSpec& e = eg.streams[i];
    std::string where = "stream " + std::to_string(i);
    if (f.name != e.name) return differ(where + " name", Quote(f.name), Quote(e.name));
    where = "stream '" + f.name + "'";
    if (f.rows_per_token != e.rows_per_token)
      return differ(where + " rows per token", std::to_string(f.rows_per_token),
                    std::to_string(e.rows_per_token));
    if (f.row_width != e.row_width)
      return differ(where + " row width", std::to_string(f.row_width), std::to_string(e.row_width));
    if (f.dtype != e.dtype) return differ(where + " dtype", DtypeName(f.dtype), DtypeName(e.dtype));
    auto layer_text = [&](const StreamSpec& x) {
      return x.layers.empty() ? std::string("every layer") : "layers " + FormatLayerList(x.layers);
    };
    if (f.layers != e.layers) return differ(where + " layers", layer_text(f), layer_text(e));
  }
  return Status::OK();
}

}  // namespace kvfile
