// Megatron-LM's own memory estimator (megatron/training/
// theoretical_memory_usage.py), restated from megatron_formulas.md section 1
// so that Megascope's accounting can be compared with it term by term.
// This is a reference, not Megascope's model: where it is known to be wrong
// (full recomputation, CP, MoE activations, biases) memory_report() is right
// and docs/accounting.md section 5 says by how much they differ.
#pragma once

#include "core/setup.hpp"

namespace megascope {

struct MegatronMemoryEstimate {
  double weight_and_optimizer_bytes = 0;   // first pipeline stage
  double activation_bytes = 0;             // first pipeline stage
  [[nodiscard]] double total_bytes() const { return weight_and_optimizer_bytes + activation_bytes; }
};

MegatronMemoryEstimate megatron_theoretical_memory(const Setup& s);

}  // namespace megascope
