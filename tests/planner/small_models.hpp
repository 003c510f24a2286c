// Small models for exhaustive planner tests: a GQA GPT of 8 layers and an
// MoE model of 4 layers whose first layer is dense.
#pragma once

#include <catch2/catch.hpp>

#include "core/models.hpp"

namespace megascope::test {

inline ModelSpec small_gpt() {
  ModelSpec m = test::gpt(8, 512, 8, 1000, 256);
  m.num_query_groups = 2;   // GQA: tp must divide or be divided by 2
  m.kv_channels = 64;
  m.name = "small-gqa";
  return *validate_model(m);
}

inline ModelSpec small_moe() {
  ModelSpec m = test::gpt_no_bias(4, 256, 4);
  m.seq_length = 128;
  MoeSpec e;
  e.num_experts = 4;
  e.top_k = 2;
  e.expert_ffn_hidden = 512;
  e.moe_layers = {false, true, true, true};   // a dense first layer, as DeepSeek-V3
  m.moe = e;
  m.name = "small-moe";
  auto v = validate_model(m);
  if (!v) FAIL(v.error().str());
  return *v;
}

}  // namespace megascope::test
