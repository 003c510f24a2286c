// Memory per rank, per pipeline stage: weights, gradients, optimizer state,
// activations and runtime overheads, against the device's capacity.
//
// Bytes per parameter (docs/accounting.md section 4; Megatron's
// dist_optimizer.md table): weights in params_dtype (+1 byte for the FP8
// copy with precision fp8), main gradients in grad_dtype, and Adam's state:
// fp32 master weights (unless the weights are fp32), two fp32 moments, and an
// fp32 gradient copy when the main gradients are 16-bit. With the
// distributed optimizer the optimizer state is divided by dp x cp (dense) or
// by the expert-data-parallel size (routed experts); zero 2 divides the
// gradients likewise and zero 3 the weights too, and adds the unsharded
// working set of the units being gathered (fsdp_working_set).
#pragma once

#include <string>
#include <vector>

#include "core/accounting/activations.hpp"
#include "core/setup.hpp"

namespace megascope {

struct StageMemory {
  int stage = 0;                       // pipeline rank
  double params = 0;                   // parameters held by one rank of the stage
  double weights_bytes = 0;
  double grads_bytes = 0;
  double optimizer_bytes = 0;
  double activations_bytes = 0;        // at the stage's peak
  double other_bytes = 0;              // CUDA context, NCCL buffers, fragmentation
  double total_bytes = 0;
  int inflight_microbatches = 0;       // summed over the rank's chunks
  std::vector<ActivationTerm> activation_terms;   // activations_bytes split by tensor
  std::vector<ActivationTerm> other_terms;        // other_bytes split by cause
};

struct MemoryReport {
  std::vector<StageMemory> stages;     // one per pipeline rank
  double capacity_bytes = 0;           // device memory
  double peak_bytes = 0;               // max over stages
  int peak_stage = 0;
  bool fits = false;                   // peak <= capacity
};

MemoryReport memory_report(const Setup& s);

// Bytes per parameter of each kind, for the given optimizer sharding divisor.
struct BytesPerParam {
  double weights = 0;
  double grads = 0;
  double optimizer = 0;                // before division by the sharding group
};
BytesPerParam bytes_per_param(const Setup& s);

// Bytes per parameter a data-parallel parameter all-gather moves: the
// weights' dtype, or one with fp8_param_gather.
double param_gather_bytes(const TrainingSpec& t, const PlanSpec& p);

// Sharded data parallelism (zero 2 and 3): the parameters held unsharded at
// the rank's peak on top of their shards (the units being gathered and
// computed, the root unit of embedding and output layer) and the unsharded
// gradients of the units whose weight gradients are computed and reduced.
struct FsdpWorkingSet {
  double params = 0;
  double grads = 0;
};
FsdpWorkingSet fsdp_working_set(const Setup& s, int pp_rank);

// Bytes the optimizer step moves per parameter it updates (a fused Adam:
// gradient read, master weights, both moments read and written, the
// weight written, and read where it is or holds part of the master). Without the precision-aware optimizer a flat 30 (fp32
// gradient, master weights and moments, 2-byte weights: 4 + 8 + 8 + 8 + 2).
double optimizer_step_bytes_per_param(const TrainingSpec& t);

}  // namespace megascope
