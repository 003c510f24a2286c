// FLOPs of one training iteration, GEMMs only (norms, softmax and element-wise
// ops are not counted, as in Megatron-LM and the papers).
//
// Forward FLOPs per sequence are counted GEMM by GEMM (2 FLOPs per
// multiply-add); model FLOPs = 3 x forward (backward = 2 x forward); hardware
// FLOPs add the forward work that recomputation repeats. Conventions:
//   causal = true   Megatron-LM since 2025-03: causal attention counts half
//                   the QK^T and PV work (megatron_formulas.md section 2.1);
//   causal = false  Megatron-LM before 2025-03 and Korthikanti Eq. 7/8,
//                   Narayanan Eq. 3 (the published tables use this).
// docs/accounting.md section 2 derives every term.
#pragma once

#include <cstdint>

#include "core/model.hpp"
#include "core/setup.hpp"

namespace megascope {

// Forward FLOPs of one sequence of length s through the model.
struct ForwardFlops {
  double attention_proj = 0;   // QKV (or MLA projections) and the output projection
  double attention_core = 0;   // QK^T and attention-over-V
  double mlp = 0;              // dense MLPs and shared experts
  double experts = 0;          // routed experts (top-k of them per token)
  double logits = 0;           // output layer (and the MTP layers' output layers)
  double mtp_proj = 0;         // MTP eh-projections
  [[nodiscard]] double layers() const { return attention_proj + attention_core + mlp + experts; }
  [[nodiscard]] double total() const { return layers() + logits + mtp_proj; }
};

// One transformer layer, one sequence of length s, forward.
ForwardFlops layer_forward_flops(const ModelSpec& m, int layer, std::int64_t s, bool causal);
// MLA's up-projections (the query's, when it has a latent, and the keys'
// and values') of one layer, one sequence: what recompute_modules
// mla_up_proj repeats. 0 without MLA.
double mla_up_proj_flops(const ModelSpec& m, std::int64_t s);
// The whole model for one sequence (layers, MTP layers, logits with `vocab`).
ForwardFlops model_forward_flops(const ModelSpec& m, std::int64_t s, std::int64_t vocab, bool causal);

struct IterationFlops {
  double model = 0;            // 3 x forward, causal halving (current Megatron-LM counter)
  double hardware = 0;         // model + recomputed forward work, same convention
  double model_no_causal = 0;  // 3 x forward without causal halving (Megatron <= 2025-02, Korthikanti Eq. 7)
  double hardware_no_causal = 0;
  ForwardFlops forward;        // forward FLOPs of the whole batch, causal halving
};

IterationFlops iteration_flops(const Setup& s);

}  // namespace megascope
