// Helpers of the Program builder's tests (program_test.cpp, moe_program_test.cpp).
#pragma once

#include <cstddef>
#include <optional>

#include "core/program/program.hpp"

namespace megascope::test {

// FLOPs of every kernel of every rank: each stage program runs on tp x cp x dp ranks.
inline double program_flops(const Program& p) {
  double total = 0;
  for (const StageProgram& s : p.stages)
    for (const Op& op : s.ops) total += op.flops;
  return total * p.grid.tp * p.grid.cp * p.grid.dp;
}

inline std::size_t count(const Program& p, int stage, OpKind kind, std::optional<OpLabel> label = std::nullopt) {
  std::size_t n = 0;
  for (const Op& op : p.stages.at(static_cast<std::size_t>(stage)).ops)
    if (op.kind == kind && (!label || op.label == *label)) ++n;
  return n;
}

}  // namespace megascope::test
