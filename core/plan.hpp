// PlanSpec: how one iteration is split over the devices (Megatron-LM style
// 5-D parallelism) and which memory/overlap options are on.
//
// Fields left unset (std::nullopt) are derived by validate_setup() from the
// rest: dp from the device count, vpp from the schedule, etp from tp. The
// derived values live in Setup, never written back into the user's plan.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace megascope {

// zb_1p and zb_2p: Qi et al.'s automatic zero-bubble schedules, placed from
// the stages' pass times under a memory limit of pp and 2 pp micro-batches'
// activations (core/schedule/zb_auto.cpp).
enum class Schedule { gpipe, one_f_one_b, interleaved, zb_h1, zb_v, dualpipe, dualpipev, zb_h2, zb_1p, zb_2p };
enum class RecomputeGranularity { none, selective, full };
enum class RecomputeMethod { uniform, block };
enum class AttentionKernel { flash, unfused };      // fused (flash/cuDNN) or score matrices kept
// How context parallelism exchanges keys and values (Megatron-LM's
// --cp-comm-type): a ring of KV blocks overlapped with attention (p2p), one
// all-gather of KV before it (all_gather), or all-to-alls that trade the
// sequence split for a head split around attention (a2a, Ulysses-style).
enum class CpCommType { p2p, all_gather, a2a };
// MoE token dispatcher (--moe-token-dispatcher-type): all-to-all of each
// token's top-k copies over EP, or Megatron-LM's default all-gather of every
// token over EP (then each rank keeps its experts' tokens) and a
// reduce-scatter back.
enum class MoeDispatcher { alltoall, allgather, flex };   // flex: Megatron-LM's flex dispatcher on DeepEP

// Megatron-Core's selective recomputation modules (--recompute-modules):
// core_attn (the attention core, its default), layernorm (the input and
// pre-MLP norms' outputs), mla_up_proj (MLA's query and key/value
// up-projections with RoPE), moe_act (the routed experts' activation), mlp
// (a dense layer's whole MLP: fc1, activation, fc2 and their TP collectives),
// moe (a MoE layer's whole MoE block after its norm: router, permutations,
// dispatch and combine, routed and shared experts) and shared_experts (the
// shared experts alone). The last three are checkpoints in Megatron-Core's
// sense: only the submodule's input is kept and its forward runs again,
// collectives included, at the start of its backward.
enum RecomputeModule : unsigned {
  kRecomputeCoreAttn = 1u,
  kRecomputeLayernorm = 2u,
  kRecomputeMlaUpProj = 4u,
  kRecomputeMoeAct = 8u,
  kRecomputeMlp = 16u,
  kRecomputeMoe = 32u,
  kRecomputeSharedExperts = 64u,
};

struct Recompute {
  RecomputeGranularity granularity = RecomputeGranularity::none;
  std::optional<RecomputeMethod> method;            // full only
  std::optional<int> num_layers;                    // full only: layers per group (uniform) or per stage (block)
  std::optional<unsigned> modules = std::nullopt;   // selective only: RecomputeModule bits; absent: core_attn
};

// The modules a selective plan recomputes (none for other granularities).
unsigned recompute_modules(const Recompute& r);
// "core_attn+layernorm+moe_act" (the order of the enum), and back; an unknown
// name is nullopt.
std::string format_recompute_modules(unsigned modules);
std::optional<unsigned> parse_recompute_modules(std::string_view text);
// Megatron-LM's names of the modules, in order.
const char* recompute_module_names();

struct PlanSpec {
  int tp = 1;                                       // tensor parallel
  int pp = 1;                                       // pipeline parallel (devices in a pipeline)
  std::optional<int> vpp;                           // model chunks per pipeline rank (interleaving)
  // The interleaved schedule's micro-batches per group: each group runs on
  // chunk 0, then chunk 1, ... (Megatron-Core's --microbatch-group-size-per-
  // virtual-pipeline-stage; absent: pp). Between pp and the micro-batch count.
  std::optional<int> microbatch_group;
  std::optional<int> first_stage_layers;            // uneven PP: layers on the first stage
  std::optional<int> last_stage_layers;             // uneven PP: layers on the last stage
  // The embedding and the loss counted as one layer each in the pipeline
  // split (Megatron-LM's --account-for-embedding-in-pipeline-split and
  // --account-for-loss-in-pipeline-split): the first (last) virtual stage holds
  // one transformer layer fewer.
  bool embedding_in_split = false;
  bool loss_in_split = false;
  // An explicit layout (Megatron-Core's --pipeline-model-parallel-layout,
  // core/pipeline_layout.hpp), kept as the user wrote it; the virtual stages in
  // forward order.
  std::optional<std::string> layout;
  std::optional<int> dp;                            // data parallel; absent: devices / (tp*pp*cp)
  int cp = 1;                                       // context parallel
  int ep = 1;                                       // expert parallel
  std::optional<int> etp;                           // expert tensor parallel; absent: tp
  int micro_batch_size = 1;                         // sequences per micro-batch
  bool sequence_parallel = false;                   // SP with TP
  Recompute recompute;
  bool distributed_optimizer = false;               // ZeRO-1: optimizer state sharded over DP x CP
  // Data-parallel sharding beyond the optimizer state (ZeRO, Rajbhandari et
  // al. 2020; Megatron-FSDP's --data-parallel-sharding-strategy optim_grads
  // and optim_grads_params; PyTorch FSDP): 2 shards the main gradients too,
  // reduce-scattered after every micro-batch's backward, 3 the parameters
  // too, all-gathered unit by unit (a transformer layer; the embedding and
  // output layer as one more) before each micro-batch's forward and again
  // before its backward. 0 or 1: only what distributed_optimizer says
  // (validate_setup: 2 and 3 need it on). zero_stage() reads both.
  int zero = 0;
  // Stage 3: the parameters freed after a unit's forward and gathered again
  // for its backward (FSDP's reshard_after_forward). Off: kept gathered from
  // the forward to the backward of the micro-batch.
  bool reshard_after_forward = true;
  // Stage 3: units whose gathers run ahead of the unit computing (FSDP's
  // forward/backward prefetch, Megatron-FSDP's overlapped all-gathers); 0
  // gathers each unit when it is needed.
  int fsdp_prefetch = 1;
  // Parameters all-gathered in FP8 (--fp8-param-gather, with precision fp8):
  // one byte per parameter on the wire, and the FP8 copy is the only compute
  // weight kept (no 16-bit copy).
  bool fp8_param_gather = false;
  // Parameters per gradient-reduction bucket (DeepSpeed's reduce_bucket_size).
  // Absent: Megatron-LM DDP's max(40M, 1M x dp) at zero 0 and 1, and one
  // unit (a layer) at zero 2 and 3, as Megatron-FSDP reduces them.
  std::optional<int> grad_bucket;
  // Hybrid sharded data parallelism (HSDP; Megatron-LM's
  // --num-distributed-optimizer-instances, DeepSpeed's MiCS): the DP x CP
  // ranks form this many replicas of consecutive ranks; each shards the
  // optimizer state (and the gradients and parameters at zero 2 and 3) over
  // its own ranks, reduce-scatters and gathers inside them, and the
  // replicas all-reduce their shards of the gradients once a step. 1: one
  // replica, sharded over all of DP x CP. Needs zero 1-3; not with MoE.
  int dp_replicas = 1;
  bool overlap_grad_reduce = false;                 // DP gradient reduce overlapped with backward
  bool overlap_param_gather = false;                // distopt parameter all-gather overlapped with forward
  bool tp_comm_overlap = false;                     // TP communication overlapped with GEMMs
  // A layer backward's last TP collective (the input gradient's all-reduce,
  // or reduce-scatter with SP) overlapped with the layer's weight-gradient
  // GEMMs: Megatron-LM's asynchronous tensor-parallel all-reduce, the default
  // since 2022 (--no-async-tensor-model-parallel-allreduce turned it off).
  bool tp_grad_overlap = true;
  // Weight-gradient GEMMs accumulate straight into the main gradient
  // (Megatron-LM's gradient accumulation fusion, on by default since the
  // sc21 runs; --no-gradient-accumulation-fusion turns it off). Off: each GEMM
  // writes its gradient in the weights' dtype and a separate kernel adds it
  // to the main gradient, once per micro-batch.
  bool grad_accum_fusion = true;
  // Pipeline transfers without sequence parallelism and tp > 1: Megatron-LM
  // before Megatron-Core (the sc21 runs) sent each TP rank's 1/tp slice and
  // all-gathered it over TP after the receive (scatter_gather_tensors_in_
  // pipeline, then on by default); Megatron-Core sends the whole activation
  // from every TP rank. Off: Megatron-Core's way.
  bool pp_scatter_gather = false;
  // Pipeline sends and receives overlapped with compute. Off: Megatron-LM's
  // synchronous pipeline communication, where the compute stream waits for
  // each communication point's sends and receives (batched, and before 2022
  // followed by a device synchronize). Absent: Megatron-LM's behaviour for the
  // schedule, off for gpipe and 1f1b (their p2p calls always wait) and on for
  // the others (--overlap-p2p-communication, the interleaved default).
  std::optional<bool> overlap_p2p_comm;
  // The interleaved schedule's warm-up and flush transfers overlapped too
  // (--overlap-p2p-communication-warmup-flush, off by default in Megatron-
  // Core). Off, with overlap_p2p_comm on: after each warm-up forward the rank
  // sends its output and receives the next input and waits for both, and
  // after each flush backward likewise for the gradients; only the steady
  // state overlaps. Needs the interleaved schedule and overlap_p2p_comm.
  bool overlap_p2p_warmup_flush = false;
  // MoE shared experts computed beside the EP all-to-alls
  // (--moe-shared-expert-overlap): their fc1 during the dispatch, their fc2
  // during the combine, on a stream of their own. No effect without shared
  // experts or without EP.
  bool moe_shared_expert_overlap = false;
  // Megatron-Core's EP all-to-all overlap (--overlap-moe-expert-parallel-comm,
  // its "combined 1F1B"): in the steady state each forward runs together
  // with the backward after it, of another micro-batch, their ops
  // interleaved so that one's dispatch and combine run while the other
  // computes, as DualPipe's F&B units (core/program/stage_writer.hpp
  // FbUnit). Needs EP, the alltoall or flex dispatcher, the 1F1B or
  // interleaved schedule (vpp > 1 when pp > 1), no full recomputation and no
  // moe_shared_expert_overlap (Megatron-Core's TransformerConfig checks).
  bool moe_ep_overlap = false;
  Schedule schedule = Schedule::one_f_one_b;
  // The optimizer step validated after the fact (Qi et al. 2024, Sec. 4):
  // no synchronisation across pipeline stages ends the iteration (gradient
  // norm, NaN/Inf checks and clipping are checked during the next one and
  // the step rolled back if needed), so each stage starts its next iteration
  // when it has finished this one, and an iteration takes the longest
  // stage's own span (first op to last) rather than the whole makespan. What
  // ZB-H2's parallelogram needs to pay off. Megatron-LM has no such option.
  bool post_validation = false;
  // Megatron-Core's dynamic context parallelism (--dynamic-context-parallel,
  // --sequence-packing-scheduler default_dynamic_cp): with variable-length
  // training, each micro-batch regroups the dp x cp ranks into CP groups
  // sized per sequence (the fewest ranks, a power of two, that hold it at
  // seq_length / cp tokens each) and balances their causal work
  // (core/varlen.hpp schedule_dynamic_cp). Needs packed variable-length
  // training ([training.lengths] with packing "pack").
  bool dynamic_cp = false;
  AttentionKernel attention = AttentionKernel::flash;
  CpCommType cp_comm = CpCommType::p2p;
  MoeDispatcher moe_dispatcher = MoeDispatcher::alltoall;
};

const char* to_string(Schedule s);
const char* to_string(RecomputeGranularity g);
const char* to_string(RecomputeMethod m);
const char* to_string(AttentionKernel k);
const char* to_string(CpCommType c);
const char* to_string(MoeDispatcher d);
std::optional<Schedule> parse_schedule(std::string_view s);
std::optional<RecomputeGranularity> parse_recompute_granularity(std::string_view s);
std::optional<RecomputeMethod> parse_recompute_method(std::string_view s);
std::optional<AttentionKernel> parse_attention_kernel(std::string_view s);
std::optional<CpCommType> parse_cp_comm(std::string_view s);
std::optional<MoeDispatcher> parse_moe_dispatcher(std::string_view s);
// The accepted spellings, for error messages: "gpipe, 1f1b, interleaved, ...".
const char* schedule_names();
// Every schedule, in the order the planner lists them with --schedules all.
const std::vector<Schedule>& all_schedules();

// overlap_p2p_comm when the plan leaves it unset: Megatron-LM's behaviour,
// off for gpipe and 1f1b (their transfers are always waited for), on for the
// other schedules.
bool default_overlap_p2p_comm(Schedule s);

// The ZeRO stage the plan runs: zero, or 1 with the distributed optimizer alone.
inline int zero_stage(const PlanSpec& p) { return p.zero >= 2 ? p.zero : (p.distributed_optimizer ? 1 : 0); }

// Model chunks per pipeline rank a schedule implies when vpp is not given:
// 2 for the V-shaped schedules (zb-v, dualpipev), otherwise 1.
int default_vpp(Schedule s);

}  // namespace megascope
