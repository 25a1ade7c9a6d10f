// SPDX-License-Identifier: Apache-2.0
// WriteTinyKv: a small real .kv file with chosen token ids and model
// identity (one layer, one bf16 stream of four zeros per token), for the
// tests that care about token ids only (prefix lookup).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvfile/writer.h"

namespace kvfile::testing {

inline void WriteTinyKv(const std::string& path, const std::vector<uint32_t>& tokens, const ModelIdentity& id) {
  Geometry g;
  g.layers = 1;
  g.streams = {{"k", 1, 4, Dtype::kBF16}};
  WriterOptions wo;
  wo.chunk_tokens = 4;
  wo.sync = SyncMode::kNone;
  wo.overwrite = true;
  std::unique_ptr<Writer> w;
  ASSERT_TRUE(Writer::Create(path, g, id, wo, &w).ok()) << path;
  if (!tokens.empty()) {
    std::vector<uint16_t> rows(tokens.size() * 4, 0);
    AppendBatch b;
    b.tokens = tokens;
    b.blocks = {RowBlock{Dtype::kBF16, rows.data(), nullptr}};
    ASSERT_TRUE(w->Append(b).ok()) << path;
  }
  ASSERT_TRUE(w->Close().ok()) << path;
}

}  // namespace kvfile::testing
