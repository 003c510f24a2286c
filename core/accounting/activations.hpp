// Activation memory, tensor by tensor (Korthikanti et al. 2022, section 4.1),
// generalised to GQA, SwiGLU, MoE, MLA, context parallelism, fused (flash)
// attention and every recomputation mode.
//
// Each term is the bytes one rank keeps for one micro-batch between a
// layer's forward and its backward. With tp = 1, cp = 1, MHA, GeLU, f = 4h,
// dropout on and unfused attention the terms add up to Korthikanti's
// s*b*h*(34 + 5*a*s/h); docs/accounting.md section 3 lists every term.
#pragma once

#include <string>
#include <vector>

#include "core/setup.hpp"

namespace megascope {

struct ActivationTerm {
  std::string name;     // "qkv_input", "softmax_output", ...
  double bytes = 0;
};

struct LayerActivations {
  std::vector<ActivationTerm> terms;   // what a stored (not recomputed) layer keeps
  double stored = 0;                   // sum of terms
  double checkpoint = 0;               // what a fully recomputed layer keeps: its input
  double weight_grad_state = 0;        // what zero-bubble schedules keep between B and W:
                                       // linear-layer inputs and output gradients
};

// One layer (index in [0, num_layers)) with the plan's TP/SP/CP/EP, the
// micro-batch size and selective recomputation / attention kernel applied.
LayerActivations layer_activations(const Setup& s, int layer);

// Per micro-batch on the first stage: input ids (int64) and the embedding
// dropout mask. On the last stage: final-norm input, output-layer input and
// fp32 logits kept by the vocab-parallel cross entropy.
struct EdgeActivations {
  std::vector<ActivationTerm> embedding;
  std::vector<ActivationTerm> output;
  [[nodiscard]] double embedding_bytes() const;
  [[nodiscard]] double output_bytes() const;
};
EdgeActivations edge_activations(const Setup& s);

}  // namespace megascope
