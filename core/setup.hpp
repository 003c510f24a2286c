// Setup: a model, a cluster, a training setup and a plan that passed every
// cross-field rule Megatron-LM enforces, plus the values derived from them
// (data-parallel size, micro-batch count, padded vocab, layer placement).
//
// validate_setup() is the one place those rules live; each failure names the
// fields involved and the rule. See docs/validation-rules.md for the list.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/cluster.hpp"
#include "core/model.hpp"
#include "core/pipeline_layout.hpp"
#include "core/plan.hpp"
#include "core/result.hpp"
#include "core/training.hpp"

namespace megascope {

// The layers one model chunk holds: [first, first + count) in model order.
// The embedding sits in virtual stage 0 and the loss (with the MTP layers) in
// the last: every layout Megascope accepts places them so (Megatron-Core's
// layouts too, apart from standalone MTP stages, which are refused).
struct ChunkLayers {
  int first = 0;
  int count = 0;
  int virtual_stage = 0;        // position of the chunk in the forward order of the model
  bool embedding = false;       // holds the embedding (virtual stage 0)
  bool loss = false;            // holds the output layer and the loss (the last virtual stage)
  int mtp = 0;                  // MTP layers it holds (with the loss, or standalone before it)
};

struct Setup {
  ModelSpec model;
  ClusterSpec cluster;
  TrainingSpec training;
  PlanSpec plan;                // as the user gave it

  // Derived (never stored in the user's plan).
  int world = 0;                // devices used = tp * pp * dp * cp
  int dp = 0;
  int vpp = 1;                  // chunks per pipeline rank in the model split
  int microbatch_group = 0;     // interleaved: micro-batches per virtual-stage group (the plan's, or pp); else 0
  int etp = 1;                  // expert tensor parallel
  int edp = 1;                  // expert data parallel = world / (etp * ep * pp)
  // The ranks of DP x CP the sharded state spans: all of them, or with
  // dp_replicas (HSDP) dp * cp / dp_replicas.
  int dp_shard = 1;
  bool sequence_parallel = false;  // effective SP (off when tp == 1)
  double expert_load = 1.0;     // MoE: the busiest EP rank's expert tokens over the balanced share (expert_load_factor)
  // The flex dispatcher (DeepEP), per routed token: the copies a rank sends
  // to other scale-up domains (one per other domain holding any of the
  // token's experts) and within domains (one per other EP rank holding any,
  // from the token's rank or the one it reached in that domain).
  double flex_rail_copies = 0, flex_domain_copies = 0;
  bool overlap_p2p_comm = true;   // effective: the plan's, or the schedule's default (PlanSpec)
  std::int64_t seq_length = 0;  // tokens per sequence
  int num_microbatches = 0;     // m = global batch / (micro-batch * dp)
  std::int64_t padded_vocab = 0;
  int virtual_stages = 0;       // model split: pp * vpp (dualpipe: pp)
  // What each virtual stage holds, in forward order: the one layout every
  // consumer reads, whichever plan keys gave it (core/pipeline_layout.hpp).
  std::vector<LayoutStage> layout;
  // chunks[r] lists the chunks pipeline rank r holds, in chunk order (the
  // layout's stages placed by the schedule).
  std::vector<std::vector<ChunkLayers>> chunks;
  std::vector<std::string> warnings;  // accepted but noteworthy (e.g. SP disabled at tp = 1)

  [[nodiscard]] int layers_on_rank(int pp_rank) const;
  [[nodiscard]] bool holds_embedding(int pp_rank) const;     // the chunk with the embedding
  [[nodiscard]] bool holds_output(int pp_rank) const;        // the chunk with the output layer and loss
  [[nodiscard]] std::int64_t tokens_per_iteration() const {
    return training.global_batch_size * seq_length;
  }
};

// The most micro-batches one step may have (per pipeline): every rank's ops
// are held for each, so the simulator's memory and time grow with it.
inline constexpr std::int64_t kMaxMicrobatches = 65536;
// Variable-length training: the most sampled steps a simulation prices.
inline constexpr int kMaxVarlenSteps = 1024;

// Validates each spec and every cross-field rule. `devices` is the number of
// devices the plan runs on (<= the cluster's); 0 means all of the cluster.
Result<Setup> validate_setup(const ModelSpec& model, const ClusterSpec& cluster,
                             const TrainingSpec& training, const PlanSpec& plan, int devices = 0);

}  // namespace megascope
