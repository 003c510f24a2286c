// The search space: every legal plan for a model, a cluster, a batch and a
// set of GPU counts, under the user's constraints.
//
// A Candidate is a PlanSpec in compact form (no optionals, no strings) so
// that stage 1 can evaluate millions of them. enumerate() walks the space in
// a fixed order and applies exactly the rules of validate_setup() that the
// enumerated dimensions touch (tests/planner checks the two agree on every
// combination of small cases), counting what it rejects and why.
//
// What is enumerated: tp, cp, pp (even layer split), ep and etp (MoE), dp
// (the rest of the GPUs), micro-batch size, schedule with vpp (1f1b,
// interleaved with every vpp dividing the layers per stage, gpipe, zb-h1,
// zb-v, dualpipe, dualpipev), sequence parallelism, recomputation (none,
// selective, full-uniform over every layer, full-block over the first k
// layers of each chunk for every k), distributed optimizer, overlap of the DP
// gradient reduce, of the parameter gather, and of TP communication. Options
// that change nothing are not enumerated twice: sp at tp = 1, distopt and
// the DP overlaps when there is no DP, tp_comm_overlap without SP.
// Uneven pipeline stages (Megatron-LM's --decoder-first/last-pipeline-num-
// layers): the first and last stage hold up to `uneven_depth` layers fewer
// than the middle ones, in every split whose middle stages are equal; by
// default (auto) only for pipeline sizes that do not divide the layer count,
// where no even split exists. In the same cases, the splits that count the
// embedding, the loss or both as a layer (--account-for-embedding/loss-in-
// pipeline-split), which keep interleaving possible. Not enumerated: explicit
// layout strings, unfused attention, the CP
// all-gather variant (flash attention and ring CP are never slower here), and
// the options that only old Megatron-LM lacked: tp_grad_overlap and
// grad_accum_fusion off (never faster); nor pp_scatter_gather, which only
// pre-Core Megatron-LM has (the plan must run on today's); nor the allgather
// MoE dispatcher (every plan takes alltoall, and its Megatron-LM arguments
// name it).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/cluster.hpp"
#include "core/model.hpp"
#include "core/plan.hpp"
#include "core/result.hpp"
#include "core/setup.hpp"
#include "core/training.hpp"

namespace megascope::planner {

// A set of allowed values for one integer dimension: a list, or a closed
// range with optional ends; empty = anything.
struct IntSet {
  std::vector<int> values;          // non-empty: exactly these
  std::optional<int> lo, hi;        // bounds (inclusive)
  [[nodiscard]] bool contains(int v) const;
  [[nodiscard]] bool empty() const { return values.empty() && !lo && !hi; }
};
// "8", "2-16", "1,2,4", "<=8", ">=2"; the error names `option`.
Result<IntSet> parse_int_set(const std::string& text, const std::string& option);

// Which pipeline sizes get uneven first/last stages: none, those that do not
// divide the layer count (auto), or all.
enum class UnevenStages : std::uint8_t { off, automatic, on };
const char* to_string(UnevenStages u);
std::optional<UnevenStages> parse_uneven_stages(std::string_view s);

struct Constraints {
  IntSet tp, pp, vpp, dp, cp, ep, etp, mbs;
  int max_mbs = 16;                                // when mbs is unbounded
  std::vector<Schedule> schedules = {Schedule::one_f_one_b, Schedule::interleaved};
  std::vector<RecomputeGranularity> recompute = {RecomputeGranularity::none, RecomputeGranularity::selective,
                                                 RecomputeGranularity::full};
  bool block_recompute = true;                      // full recomputation of the first k layers of a chunk, k < chunk
  // Selective recomputation also with module sets other than the default
  // core_attn: every non-empty set of layernorm and, where the model has
  // them, mla_up_proj and moe_act (Megatron-LM's --recompute-modules).
  bool recompute_modules = true;
  std::optional<bool> sp, distopt, overlap_grad_reduce, overlap_param_gather, tp_comm_overlap;
  // ZeRO stages searched (0: no sharding, 1: the distributed optimizer, 2:
  // gradients too, 3: parameters too, FSDP); distopt, when set, keeps those
  // it allows. All four by default; plan --zero narrows them.
  std::vector<int> zero = {0, 1, 2, 3};
  // Hybrid sharding (HSDP, Megatron-LM's --num-distributed-optimizer-instances):
  // beside sharding over all of DP x CP, shard inside each scale-up domain
  // and replicate across them, for dense plans with stages 1-3.
  bool hsdp = true;
  double headroom_bytes = 2.0 * 1024 * 1024 * 1024;  // memory kept free on every GPU
  int min_dp = 1;
  bool tp_in_scale_up = true;                       // TP groups inside one NVLink domain
  UnevenStages uneven = UnevenStages::automatic;    // uneven first/last pipeline stages
  int uneven_depth = 4;                             // layers the first/last stage may hold fewer than the middle
};

struct Candidate {
  int gpus = 0;
  std::int16_t tp = 1, pp = 1, vpp = 1, cp = 1, ep = 1, etp = 1;
  int dp = 1, mbs = 1;
  std::int16_t first_layers = 0, last_layers = 0;   // uneven stages: layers of the first and last; 0: even split
  bool embedding_in_split = false, loss_in_split = false;   // counted as a layer each in the split
  Schedule schedule = Schedule::one_f_one_b;
  RecomputeGranularity recompute = RecomputeGranularity::none;
  RecomputeMethod recompute_method = RecomputeMethod::uniform;   // full only
  std::int16_t recompute_layers = 0;                             // full only
  std::uint8_t recompute_modules = 0;   // selective only: RecomputeModule bits; 0: the default (core_attn)
  bool sp = false, distopt = false, overlap_grad_reduce = false, overlap_param_gather = false,
       tp_comm_overlap = false;
  std::int8_t zero = 0;   // ZeRO stage: 1 with distopt alone, 2 and 3 sharded further (distopt on)
  // Hybrid sharding: replicas of the sharded state over DP x CP (1: one, sharded over all of it).
  std::int16_t dp_replicas = 1;
  // --fp8-param-gather: set with FP8 training and a sharded optimizer (half
  // the gather bytes and no 16-bit weight copy: never slower nor larger here).
  bool fp8_param_gather = false;
  // --moe-shared-expert-overlap: not enumerated; set wherever it applies
  // (shared experts and an all-to-all to hide them behind), never slower here.
  bool shared_expert_overlap = false;
  // --overlap-p2p-communication-warmup-flush: set with the interleaved
  // schedule (its warm-up and flush transfers overlapped, never slower).
  bool p2p_warmup_flush = false;
  // Optimizer post-validation: set with zb-h2 and zb-2p (Qi et al. run ZB-2p with it),
  // and nowhere else (no other schedule's iteration gets shorter with it here).
  bool post_validation = false;
};

PlanSpec to_plan(const Candidate& c);
// The candidate of a user's plan (a layout string, unfused attention, the CP all-gather, TP
// without tp_grad_overlap, unfused gradient accumulation, the allgather MoE
// dispatcher and an uneven split that sets only one of first/last are not
// representable: nullopt).
std::optional<Candidate> from_plan(const PlanSpec& p, int gpus, int dp);
// The same for a validated setup: an uneven split that sets only one of
// first/last gets the other from the setup's layout (the form enumerate()
// emits, both set).
std::optional<Candidate> from_setup(const Setup& s);

// Why candidates left the search, by count.
struct Rejections {
  std::uint64_t structural = 0;    // (gpus, tp, cp, pp, split, ep, etp, mbs, schedule, vpp) tuples looked at
  std::uint64_t divisibility = 0;  // ... of which break a rule of the model, batch or schedule
  std::uint64_t constraint = 0;    // ... of which the user's constraints exclude
  std::uint64_t memory = 0;        // plans (all options) that do not fit with the headroom
};

struct SearchInputs {
  ModelSpec model;
  ClusterSpec cluster;             // large enough for the largest GPU count
  TrainingSpec training;
  std::vector<int> gpu_counts;
  Constraints constraints;
};

// Validates the model, cluster and training, and that every GPU count fits
// the cluster; returns the inputs with validated specs.
Result<SearchInputs> check_inputs(SearchInputs in);

// GPU counts for "at most N": every multiple of the node size up to N, and
// the powers of two below one node.
std::vector<int> counts_up_to(const ClusterSpec& c, int n);

// Calls `visit` for every legal candidate, in a fixed order; counts the
// structural rejections in `rej`.
void enumerate(const SearchInputs& in, Rejections& rej, const std::function<void(const Candidate&)>& visit);

}  // namespace megascope::planner
