// Shared helpers of the Megatron-LM argument tests.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "config/megatron_args.hpp"

namespace megascope::test {

inline bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

inline Error import_error(std::string_view line) {
  auto r = import_megatron_args(line);
  REQUIRE_FALSE(r.has_value());
  return r.error();
}

inline MegatronLaunch import_ok(std::string_view line) {
  auto r = import_megatron_args(line);
  if (!r) FAIL(r.error().field << ": " << r.error().message);
  return *r;
}

// A minimal valid model line to which single flags are appended.
inline const std::string kSmall =
    "--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
    "--max-position-embeddings 1024 --vocab-size 32000 --micro-batch-size 1 --global-batch-size 8 --bf16 ";

}  // namespace megascope::test
