// validate_setup: every cross-field rule of Megatron-LM that a plan must obey
// (arguments.py validate_args, TransformerConfig.__post_init__, parallel_state
// and the schedules), plus the rules of the schedules Megatron does not ship
// (zero-bubble, DualPipe). Each rule is one `if` with a message that names the
// fields and the rule; docs/validation-rules.md lists them.
#include "core/setup.hpp"

#include "core/pipeline_layout.hpp"
#include "core/rank_grid.hpp"
#include "core/schedule/schedule.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <numeric>
#include <tuple>

namespace megascope {

namespace {

using Err = tl::unexpected<Error>;

// The layers first_stage_layers and last_stage_layers put at n[first_at]
// and n[last_at]; what they leave of the model's L layers (64-bit: the keys
// are any positive int) and for how many entries of n.
struct Ends {
  long long rest = 0;
  int middle = 0;
};
Result<Ends> fix_ends(const PlanSpec& p, std::vector<int>& n, int first_at, int last_at, int L) {
  Ends e{L, static_cast<int>(n.size())};
  for (auto [key, v, at] : {std::tuple{"plan.first_stage_layers", p.first_stage_layers, first_at},
                            std::tuple{"plan.last_stage_layers", p.last_stage_layers, last_at}}) {
    if (!v) continue;
    if (*v < 1) return fail(key, fmt::format("must be >= 1, found {}", *v));
    n[static_cast<std::size_t>(at)] = *v;
    e.rest -= *v;
    --e.middle;
  }
  return e;
}

// Layers held by each pipeline rank (Megatron-LM's even or uneven first/last
// split), before splitting into chunks.
Result<std::vector<int>> layers_per_rank(const ModelSpec& m, const PlanSpec& p, int pp) {
  const int L = m.num_layers;
  std::vector<int> n(static_cast<std::size_t>(pp), 0);
  const bool uneven = p.first_stage_layers || p.last_stage_layers;
  if (!uneven) {
    if (L % pp != 0)
      return fail("plan.pp", fmt::format("num_layers ({}) must be divisible by pp ({}) for an even split; "
                                         "set first_stage_layers/last_stage_layers for an uneven one, or "
                                         "embedding_in_split/loss_in_split, or a layout",
                                         L, pp));
    std::fill(n.begin(), n.end(), L / pp);
    return n;
  }
  if (pp < 2) return fail("plan.first_stage_layers", "uneven pipeline stages need pp >= 2");
  auto ends = fix_ends(p, n, 0, pp - 1, L);
  if (!ends) return Err(ends.error());
  const auto [rest, middle] = *ends;
  if (rest < 0 || (middle == 0) != (rest == 0))
    return fail("plan.first_stage_layers",
                fmt::format("the first/last stage layers leave {} layers for {} middle stages "
                            "(num_layers = {}, pp = {})", rest, middle, L, pp));
  if (middle > 0) {
    if (rest % middle != 0)
      return fail("plan.first_stage_layers",
                  fmt::format("the {} remaining layers must divide evenly over the {} middle stages", rest, middle));
    for (int r = 0; r < pp; ++r) {
      const bool fixed = (r == 0 && p.first_stage_layers) || (r == pp - 1 && p.last_stage_layers);
      if (!fixed) n[static_cast<std::size_t>(r)] = static_cast<int>(rest / middle);
    }
  }
  return n;
}

// Where a virtual stage sits, for error messages.
std::string stage_name(Schedule sch, int pp, int chunks_per_rank, int vs) {
  for (int r = 0; r < pp; ++r)
    for (int c = 0; c < chunks_per_rank; ++c)
      if (virtual_stage(sch, pp, r, c) == vs) return fmt::format("virtual stage {} (pipeline rank {}, chunk {})", vs, r, c);
  return fmt::format("virtual stage {}", vs);
}

// What each virtual stage holds, in forward order: from the plan's layout
// string, or from the split rule its other keys give (even; uneven first/last;
// embedding and loss counted in the split). `stages` = pp x vpp (pp for
// DualPipe, whose two directions run the same stages).
Result<std::vector<LayoutStage>> stage_layout(const ModelSpec& m, const PlanSpec& p, Schedule sch, int stages,
                                              int split_vpp) {
  const int pp = p.pp;
  const int L = m.num_layers;
  const bool v_shape = sch == Schedule::zb_v || sch == Schedule::dualpipev;
  const int chunks_per_rank = sch == Schedule::dualpipe ? 1 : split_vpp;
  const bool uneven = p.first_stage_layers || p.last_stage_layers;
  const bool in_split = p.embedding_in_split || p.loss_in_split;
  std::vector<LayoutStage> out(static_cast<std::size_t>(stages));

  if (p.layout) {
    if (uneven)
      return fail("plan.layout", "give either a layout or first_stage_layers/last_stage_layers, not both");
    if (in_split)
      return fail("plan.layout", "give either a layout or embedding_in_split/loss_in_split, not both");
    auto parsed = parse_pipeline_layout(*p.layout, "plan.layout");
    if (!parsed) return Err(parsed.error());
    if (static_cast<int>(parsed->size()) != stages)
      return fail("plan.layout", fmt::format("the layout has {} stages; {} with pp = {} and vpp = {} needs {}",
                                             parsed->size(), to_string(sch), pp, split_vpp, stages));
    int decoders = 0, mtp = 0;
    for (const LayoutStage& st : *parsed) {
      decoders += st.decoders;
      mtp += st.mtp;
    }
    if (decoders != L)
      return fail("plan.layout", fmt::format("the layout holds {} transformer layers (t); the model has {}", decoders, L));
    if (mtp != m.mtp_num_layers)
      return fail("plan.layout", fmt::format("the layout holds {} MTP layers (m); the model has {}", mtp,
                                             m.mtp_num_layers));
    if (!parsed->front().embedding)
      return fail("plan.layout", fmt::format("the embedding (E) must be in the first stage, {}",
                                             stage_name(sch, pp, chunks_per_rank, 0)));
    if (!parsed->back().loss)
      return fail("plan.layout", fmt::format("the loss (L) must be in the last stage, {}; stages after it hold nothing "
                                             "to run", stage_name(sch, pp, chunks_per_rank, stages - 1)));
    // Megatron-Core's rules (PipelineParallelLayerLayout.validate_layer_layout):
    // every MTP layer in one stage, the last model chunk of its rank. MTP on a
    // rank before the last is its "standalone" MTP: the stages after it pass
    // the main and the MTP hidden states on together to the loss.
    for (int vs = 0; vs < stages; ++vs) {
      const LayoutStage& st = (*parsed)[static_cast<std::size_t>(vs)];
      if (st.mtp == 0) continue;
      if (st.mtp != m.mtp_num_layers)
        return fail("plan.layout", fmt::format("{} holds {} of the {} MTP layers (m); all of them must sit in one stage",
                                               stage_name(sch, pp, chunks_per_rank, vs), st.mtp, m.mtp_num_layers));
      if (st.loss) continue;
      if (sch == Schedule::zb_v || sch == Schedule::dualpipev || sch == Schedule::dualpipe)
        return fail("plan.layout", fmt::format("{} holds the MTP layers apart from the loss (standalone MTP); Megatron-"
                                               "Core places that stage by its interleaving, not {}'s",
                                               stage_name(sch, pp, chunks_per_rank, vs), to_string(sch)));
      if (vs / pp != chunks_per_rank - 1)
        return fail("plan.layout", fmt::format("{} holds the MTP layers apart from the loss; Megatron-Core puts them in "
                                               "the last model chunk of a rank", stage_name(sch, pp, chunks_per_rank, vs)));
      if (vs % pp == 0)
        return fail("plan.layout", fmt::format("{} holds the MTP layers apart from the loss on the embedding's rank; "
                                               "a standalone MTP stage on the first pipeline rank is not modelled",
                                               stage_name(sch, pp, chunks_per_rank, vs)));
    }
    return std::move(*parsed);
  }

  if (uneven && in_split)
    return fail("plan.embedding_in_split", "embedding_in_split/loss_in_split cannot combine with "
                                           "first_stage_layers/last_stage_layers (Megatron-LM refuses both)");
  std::vector<int> n(static_cast<std::size_t>(stages), 0);
  if (v_shape && uneven) {
    // The V: rank 0 holds the first and the last virtual stage; the keys give
    // those two, the other stages share the rest evenly.
    if (pp < 2) return fail("plan.first_stage_layers", "uneven pipeline stages need pp >= 2");
    auto ends = fix_ends(p, n, 0, stages - 1, L);
    if (!ends) return Err(ends.error());
    const auto [rest, middle] = *ends;
    if (rest < 0 || rest % middle != 0)
      return fail("plan.first_stage_layers",
                  fmt::format("with {} the first/last stage layers name virtual stages; they leave {} layers, which "
                              "must divide evenly over the other {} virtual stages",
                              to_string(sch), rest, middle));
    for (int vs = 0; vs < stages; ++vs)
      if ((vs != 0 || !p.first_stage_layers) && (vs != stages - 1 || !p.last_stage_layers))
        n[static_cast<std::size_t>(vs)] = static_cast<int>(rest / middle);
  } else if (in_split) {
    const long long counted = static_cast<long long>(L) + (p.embedding_in_split ? 1 : 0) + (p.loss_in_split ? 1 : 0);
    const char* key = p.embedding_in_split ? "plan.embedding_in_split" : "plan.loss_in_split";
    if (counted % pp != 0)
      return fail(key, fmt::format("num_layers ({}) plus the embedding and loss counted in the split ({}) must be "
                                   "divisible by pp ({})", L, counted, pp));
    const int per_rank = static_cast<int>(counted / pp);
    const int per_chunk = v_shape ? 2 : chunks_per_rank;
    if (per_rank % per_chunk != 0)
      return fail("plan.vpp", fmt::format("each pipeline rank holds {} layers counting the embedding and loss, which "
                                          "must divide into vpp = {} equal chunks", per_rank, per_chunk));
    std::fill(n.begin(), n.end(), per_rank / per_chunk);
    if (p.embedding_in_split) n.front() -= 1;
    if (p.loss_in_split) n.back() -= 1;
    for (int vs : {0, stages - 1})
      if (n[static_cast<std::size_t>(vs)] < 0)
        return fail(key, fmt::format("{} has no transformer layer to give up for the embedding or loss",
                                     stage_name(sch, pp, chunks_per_rank, vs)));
  } else {
    auto per_rank = layers_per_rank(m, p, pp);
    if (!per_rank) return Err(per_rank.error());
    const int per_chunk = v_shape ? 2 : chunks_per_rank;
    for (int r = 0; r < pp; ++r) {
      const int held = (*per_rank)[static_cast<std::size_t>(r)];
      if (held % per_chunk != 0) {
        const bool end = uneven && ((r == 0 && p.first_stage_layers) || (r == pp - 1 && p.last_stage_layers));
        return fail(end ? (r == 0 ? "plan.first_stage_layers" : "plan.last_stage_layers") : "plan.vpp",
                    fmt::format("pipeline rank {} holds {} layers, which must divide into vpp = {} equal chunks{}", r,
                                held, per_chunk,
                                end ? " (Megatron-LM's rule; for fewer layers on the first or last virtual stage only, "
                                      "use embedding_in_split/loss_in_split or a layout)"
                                    : ""));
      }
      for (int c = 0; c < per_chunk; ++c)
        n[static_cast<std::size_t>(virtual_stage(sch == Schedule::dualpipe ? Schedule::one_f_one_b : sch, pp, r, c))] =
            held / per_chunk;
    }
  }
  for (int vs = 0; vs < stages; ++vs) out[static_cast<std::size_t>(vs)].decoders = n[static_cast<std::size_t>(vs)];
  out.front().embedding = true;
  out.back().loss = true;
  out.back().mtp = m.mtp_num_layers;
  return out;
}

}  // namespace

int Setup::layers_on_rank(int pp_rank) const {
  int n = 0;
  for (const ChunkLayers& c : chunks.at(static_cast<std::size_t>(pp_rank))) n += c.count;
  return n;
}

bool Setup::holds_embedding(int pp_rank) const {
  for (const ChunkLayers& c : chunks.at(static_cast<std::size_t>(pp_rank)))
    if (c.embedding) return true;
  return false;
}

bool Setup::holds_output(int pp_rank) const {
  for (const ChunkLayers& c : chunks.at(static_cast<std::size_t>(pp_rank)))
    if (c.loss) return true;
  return false;
}

Result<Setup> validate_setup(const ModelSpec& model_in, const ClusterSpec& cluster_in,
                             const TrainingSpec& training_in, const PlanSpec& p, int devices) {
  auto model = validate_model(model_in);
  if (!model) return Err(model.error());
  auto cluster = validate_cluster(cluster_in);
  if (!cluster) return Err(cluster.error());
  auto training = validate_training(training_in);
  if (!training) return Err(training.error());
  const ModelSpec& m = *model;

  Setup s;
  s.model = m;
  s.cluster = *cluster;
  s.training = *training;
  s.plan = p;

  // Sizes.
  for (auto [field, v] : {std::pair<const char*, int>{"tp", p.tp}, {"pp", p.pp}, {"cp", p.cp}, {"ep", p.ep},
                          {"mbs", p.micro_batch_size}}) {
    if (v < 1) return fail(std::string("plan.") + field, fmt::format("must be >= 1, found {}", v));
  }
  for (auto [field, v] : {std::pair<const char*, std::optional<int>>{"vpp", p.vpp}, {"dp", p.dp}, {"etp", p.etp}}) {
    if (v && *v < 1) return fail(std::string("plan.") + field, fmt::format("must be >= 1, found {}", *v));
  }

  // World size and data parallelism (Megatron: world % (tp*pp*cp) == 0, dp = world / (tp*pp*cp)).
  // No parallel size can exceed the cluster's devices; their products are
  // formed in 64 bits and bounded by it before any 32-bit use.
  const int available = s.cluster.total_devices();
  for (auto [field, v] : {std::pair<const char*, std::optional<int>>{"tp", p.tp}, {"pp", p.pp}, {"cp", p.cp},
                          {"ep", p.ep}, {"dp", p.dp}, {"etp", p.etp}})
    if (v && *v > available)
      return fail(std::string("plan.") + field, fmt::format("{} exceeds the {} devices of cluster '{}'", *v, available,
                                                             s.cluster.name));
  const std::int64_t model_parallel64 = std::int64_t{p.tp} * p.pp * p.cp;
  if (devices == 0) {
    const std::int64_t wanted = p.dp ? std::int64_t{*p.dp} * model_parallel64 : available;
    if (wanted > available)
      return fail("plan.dp", fmt::format("tp x pp x dp x cp = {} exceeds the {} devices of cluster '{}'", wanted,
                                         available, s.cluster.name));
    devices = static_cast<int>(wanted);
  }
  if (devices > available)
    return fail("gpus", fmt::format("the plan needs {} devices but cluster '{}' has {} ({} nodes x {})", devices,
                                    s.cluster.name, available, s.cluster.num_nodes,
                                    s.cluster.node.devices_per_node));
  if (devices % model_parallel64 != 0)
    return fail("plan.tp", fmt::format("the device count ({}) must be divisible by tp x pp x cp = {} x {} x {} = {}",
                                       devices, p.tp, p.pp, p.cp, model_parallel64));
  const int model_parallel = static_cast<int>(model_parallel64);   // at most the device count now
  s.world = devices;
  s.dp = devices / model_parallel;
  if (p.dp && *p.dp != s.dp)
    return fail("plan.dp", fmt::format("tp x pp x dp x cp = {} x {} x {} x {} = {} must equal the device count {}",
                                       p.tp, p.pp, *p.dp, p.cp, model_parallel64 * *p.dp, devices));

  // Tensor parallelism (TransformerConfig, ColumnParallelLinear).
  if (m.num_attention_heads % p.tp != 0)
    return fail("plan.tp", fmt::format("num_attention_heads ({}) must be a multiple of tp ({})",
                                       m.num_attention_heads, p.tp));
  if (m.num_query_groups % p.tp != 0 && p.tp % m.num_query_groups != 0)
    return fail("plan.tp", fmt::format("num_query_groups ({}) must be a multiple or a divisor of tp ({})",
                                       m.num_query_groups, p.tp));
  if (m.ffn_hidden_size % p.tp != 0)
    return fail("plan.tp", fmt::format("ffn_hidden_size ({}) must be divisible by tp ({})", m.ffn_hidden_size, p.tp));

  // Sequence length, context and sequence parallelism.
  s.seq_length = s.training.seq_length.value_or(m.seq_length);
  if (m.position_embedding == PositionEmbedding::learned && s.seq_length > m.seq_length)
    return fail("training.seq_length",
                fmt::format("{} exceeds the model's learned position embeddings ({}): "
                            "max_position_embeddings must be >= seq_length", s.seq_length, m.seq_length));
  if (p.cp > 1 && s.seq_length % (2 * p.cp) != 0)
    return fail("plan.cp", fmt::format("seq_length ({}) must be a multiple of 2 x cp = {} (load-balanced causal CP)",
                                       s.seq_length, 2 * p.cp));
  if (p.cp > 1 && m.window_size > 0 && m.window_size < s.seq_length)
    return fail("plan.cp", fmt::format("context parallelism with sliding-window attention ('{}', window {}) is not "
                                       "modelled: the CP ranks' windowed work is not priced",
                                       m.name, m.window_size));
  if (p.cp > 1 && p.cp_comm == CpCommType::a2a) {
    // Transformer Engine's all-to-all CP scatters the heads of Q, K and V over the CP group.
    const std::int64_t heads = m.num_attention_heads / p.tp;
    const std::int64_t kv_heads = m.mla ? heads : std::max<std::int64_t>(1, m.num_query_groups / p.tp);
    if (heads % p.cp != 0 || kv_heads % p.cp != 0)
      return fail("plan.cp_comm", fmt::format("cp_comm a2a scatters attention heads over the CP group: the heads per TP "
                                              "rank ({} query, {} key/value) must be divisible by cp ({})",
                                              heads, kv_heads, p.cp));
  }
  s.sequence_parallel = p.sequence_parallel && p.tp > 1;
  if (p.sequence_parallel && p.tp == 1)
    s.warnings.push_back("sp=on has no effect with tp = 1; Megatron-LM disables it, and so does Megascope");
  if (s.sequence_parallel && (s.seq_length / p.cp) % p.tp != 0)
    return fail("plan.sp", fmt::format("with sequence parallelism the per-CP-rank sequence ({} / cp {} = {}) must "
                                       "be divisible by tp ({})", s.seq_length, p.cp, s.seq_length / p.cp, p.tp));
  if (p.tp_comm_overlap && !s.sequence_parallel)
    return fail("plan.tp_comm_overlap",
                "tensor-parallel communication overlap needs sequence parallelism (sp=on and tp > 1)");

  // Variable-length training (core/varlen.hpp).
  if (s.training.varlen && s.training.varlen->lengths.max == 0 &&
      s.training.varlen->lengths.kind != LengthDistribution::Kind::histogram) {
    // No max given: the sequence length bounds the lengths.
    auto copy = std::make_shared<VarlenSpec>(*s.training.varlen);
    copy->lengths.max = s.seq_length;
    s.training.varlen = std::move(copy);
  }
  if (const VarlenSpec* v = s.training.varlen.get()) {
    if (auto ok = validate_lengths(v->lengths, s.seq_length); !ok) return tl::unexpected(ok.error());
    if (v->steps < 1 || v->steps > kMaxVarlenSteps)
      return fail("training.lengths.steps", fmt::format("must be in [1, {}], found {}", kMaxVarlenSteps, v->steps));
    if (v->packing == Packing::pack && p.micro_batch_size != 1)
      return fail("plan.mbs", fmt::format("packed sequences (THD) are one pack of up to seq_length tokens per "
                                          "micro-batch, as Megatron-LM packs them: mbs must be 1, found {}",
                                          p.micro_batch_size));
    if (v->packing == Packing::pack && p.attention != AttentionKernel::flash)
      return fail("plan.attention", "packed sequences run through fused attention with per-document lengths "
                                    "(cu_seqlens); unfused attention would compute the whole pack's score matrix");
    if (v->packing == Packing::pack && m.window_size > 0)
      return fail("training.lengths", fmt::format("packed sequences with sliding-window attention ('{}') are not "
                                                  "modelled", m.name));
    if (v->packing == Packing::pack && p.cp > 1 && p.cp_comm != CpCommType::p2p)
      return fail("plan.cp_comm", "packed sequences with CP are priced for the ring (p2p) only, which is what "
                                  "Transformer Engine runs for THD");
  }
  if (p.dynamic_cp && !(s.training.varlen && s.training.varlen->packing == Packing::pack))
    return fail("plan.dynamic_cp", "dynamic context parallelism schedules packed variable-length sequences: it "
                                   "needs [training.lengths] with packing = \"pack\"");

  // Batch (microbatch calculator).
  const std::int64_t per_step = static_cast<std::int64_t>(p.micro_batch_size) * s.dp;
  if (s.training.global_batch_size % per_step != 0)
    return fail("training.global_batch_size",
                fmt::format("global batch ({}) must be divisible by micro-batch size x dp = {} x {} = {}",
                            s.training.global_batch_size, p.micro_batch_size, s.dp, per_step));
  if (p.micro_batch_size > kMaxMicrobatches)
    return fail("plan.mbs", fmt::format("must be at most {}, found {}", kMaxMicrobatches, p.micro_batch_size));
  if (s.training.global_batch_size > (std::int64_t{1} << 50) / s.seq_length)
    return fail("training.global_batch_size",
                fmt::format("{} sequences of {} tokens is more than 2^50 tokens a step", s.training.global_batch_size,
                            s.seq_length));
  if (s.training.global_batch_size / per_step > kMaxMicrobatches)
    return fail("training.global_batch_size",
                fmt::format("global batch {} makes {} micro-batches a step (micro-batch size {} x dp {}); at most {} are "
                            "simulated",
                            s.training.global_batch_size, s.training.global_batch_size / per_step, p.micro_batch_size,
                            s.dp, kMaxMicrobatches));
  s.num_microbatches = static_cast<int>(s.training.global_batch_size / per_step);

  // Experts (parallel_state: expert grid folded onto the same world).
  s.etp = p.etp.value_or(p.tp);
  if (!m.moe) {
    if (p.ep > 1) return fail("plan.ep", fmt::format("ep = {} needs an MoE model; '{}' is dense", p.ep, m.name));
    if (p.etp && *p.etp != p.tp)
      return fail("plan.etp", fmt::format("etp = {} only applies to MoE layers; '{}' is dense", *p.etp, m.name));
    if (p.moe_shared_expert_overlap)
      return fail("plan.moe_shared_expert_overlap",
                  fmt::format("moe_shared_expert_overlap applies to MoE shared experts; '{}' is dense", m.name));
    if (p.moe_ep_overlap)
      return fail("plan.moe_ep_overlap", fmt::format("moe_ep_overlap overlaps MoE all-to-alls; '{}' is dense", m.name));
    if (p.moe_dispatcher != MoeDispatcher::alltoall)
      return fail("plan.moe_dispatcher", fmt::format("moe_dispatcher applies to MoE layers; '{}' is dense", m.name));
  } else {
    const MoeSpec& e = *m.moe;
    if (e.num_experts % p.ep != 0)
      return fail("plan.ep", fmt::format("num_experts ({}) must be a multiple of ep ({})", e.num_experts, p.ep));
    if (e.expert_ffn_hidden % s.etp != 0)
      return fail("plan.etp", fmt::format("expert ffn size ({}) must be divisible by etp ({})",
                                          e.expert_ffn_hidden, s.etp));
    if (e.shared_expert_ffn_hidden % p.tp != 0)
      return fail("plan.tp", fmt::format("shared-expert ffn size ({}) must be divisible by tp ({})",
                                         e.shared_expert_ffn_hidden, p.tp));
    const int stage_ranks = p.tp * p.cp * s.dp;   // world / pp
    if (stage_ranks % (std::int64_t{s.etp} * p.ep) != 0)
      return fail("plan.ep", fmt::format("etp x ep = {} x {} must divide the tp x cp x dp = {} ranks of a pipeline "
                                         "stage (experts live inside DP x CP)", s.etp, p.ep, stage_ranks));
    if (p.ep > 1 && p.tp > 1 && !s.sequence_parallel)
      return fail("plan.sp", "expert parallelism with tensor parallelism needs sequence parallelism (sp=on)");
    if (m.add_bias_linear && s.etp > 1)
      return fail("plan.etp", "MoE layers with linear biases need etp = 1 (Megatron: bias only with ETP == 1)");
    if (p.ep > 1 && s.training.params_dtype == Dtype::fp16)
      return fail("plan.ep", "expert parallelism is not supported with fp16 parameters; use bf16");
    s.expert_load = expert_load_factor(e, p.ep);
    if (p.moe_ep_overlap) {
      // Megatron-Core's TransformerConfig checks for --overlap-moe-expert-parallel-comm.
      if (p.ep < 2) return fail("plan.moe_ep_overlap", "moe_ep_overlap needs expert parallelism (ep > 1)");
      if (p.moe_dispatcher == MoeDispatcher::allgather)
        return fail("plan.moe_ep_overlap", "moe_ep_overlap needs the alltoall or flex dispatcher");
      if (p.schedule != Schedule::one_f_one_b && p.schedule != Schedule::interleaved)
        return fail("plan.moe_ep_overlap",
                    fmt::format("moe_ep_overlap runs with the 1f1b or interleaved schedule, not {}", to_string(p.schedule)));
      if (p.pp > 1 && p.schedule != Schedule::interleaved)
        return fail("plan.moe_ep_overlap", "moe_ep_overlap with pp > 1 needs virtual stages (the interleaved schedule)");
      if (p.recompute.granularity == RecomputeGranularity::full)
        return fail("plan.moe_ep_overlap", "moe_ep_overlap does not run with full recomputation");
      if (p.moe_shared_expert_overlap)
        return fail("plan.moe_ep_overlap", "moe_ep_overlap and moe_shared_expert_overlap exclude each other");
      if (m.mtp_num_layers > 1)
        return fail("plan.moe_ep_overlap", fmt::format("moe_ep_overlap runs with at most one MTP layer, found {}", m.mtp_num_layers));
    }
    if (p.moe_shared_expert_overlap && p.moe_dispatcher == MoeDispatcher::allgather)
      return fail("plan.moe_shared_expert_overlap",
                  "moe_shared_expert_overlap needs the alltoall dispatcher (Megatron-LM: alltoall or flex)");
    if (p.moe_shared_expert_overlap && (e.shared_expert_ffn_hidden == 0 || (p.ep == 1 && s.etp == 1)))
      s.warnings.push_back(e.shared_expert_ffn_hidden == 0
                               ? "moe_shared_expert_overlap has no effect: the model has no shared experts"
                               : "moe_shared_expert_overlap has no effect without expert parallelism: no all-to-all "
                                 "to hide the shared experts behind");
  }
  s.edp = s.world / (s.etp * p.ep * p.pp);
  if (m.moe && p.moe_dispatcher == MoeDispatcher::flex) {
    // DeepEP sends a token once to each other scale-up domain holding any of
    // its experts (to the EP rank at its own position there), then once to
    // each other EP rank of a domain holding any. The EP group must fill
    // whole domains alike, or sit inside one.
    const MoeSpec& e = *m.moe;
    const int domain = std::max(s.cluster.scale_up_domain, s.cluster.node.devices_per_node);
    const RankGrid grid{p.tp, p.cp, s.dp, p.pp, s.etp, p.ep, s.edp};
    // Every EP group (one per rank with EP coordinate 0): D domains of
    // ep / D consecutive members each, the same D for every group.
    int domains = 0;
    for (int r = 0; r < s.world; ++r) {
      if (grid.coord(r).ep != 0) continue;
      const std::vector<int> members = grid.group(r, CommGroup::ep);
      int d = 1;
      for (std::size_t j = 1; j < members.size(); ++j) d += members[j] / domain != members[j - 1] / domain;
      bool alike = p.ep % d == 0 && (domains == 0 || d == domains);
      for (std::size_t j = 0; alike && j < members.size(); ++j) {
        const std::size_t first = j / static_cast<std::size_t>(p.ep / d) * static_cast<std::size_t>(p.ep / d);
        alike = members[j] / domain == members[first] / domain &&
                (first == 0 || members[first] / domain != members[first - 1] / domain);
      }
      if (!alike)
        return fail("plan.moe_dispatcher",
                    fmt::format("moe_dispatcher=flex needs every EP group ({} ranks) to fill its scale-up domains "
                                "equally ({} devices each) or sit in one; the group of rank {} does not",
                                p.ep, domain, r));
      domains = d;
    }
    const auto rail = routing_hit_probability(e, domains);
    const auto rank = routing_hit_probability(e, p.ep);
    if (!rail || !rank)
      return fail("model.moe.num_groups",
                  fmt::format("moe_dispatcher=flex prices group-limited routing when each group lies inside one EP "
                              "rank's or one domain's experts or holds whole ones; {} groups of {} experts over "
                              "{} domains and {} EP ranks do not nest",
                              e.num_groups, e.num_groups > 0 ? e.num_experts / e.num_groups : 0, domains, p.ep));
    s.flex_rail_copies = (domains - 1) * *rail;
    s.flex_domain_copies = (p.ep - domains) * *rank;
    if (p.ep == 1)
      s.warnings.push_back("moe_dispatcher=flex has no effect without expert parallelism: no tokens are exchanged");
  }

  // Optimizer and overlap.
  if (p.overlap_param_gather && !p.distributed_optimizer)
    return fail("plan.overlap_param_gather", "needs the distributed optimizer (distopt=on)");
  if (p.overlap_param_gather && !p.overlap_grad_reduce)
    return fail("plan.overlap_param_gather", "needs overlap_grad_reduce=on as well (Megatron rule)");
  if (s.training.optimizer_precision.enabled && !p.distributed_optimizer)
    return fail("plan.distopt", "the precision-aware optimizer (training.precision_aware_optimizer) needs the distributed "
                                "optimizer (distopt=on), as Megatron-LM asserts");
  // Sharded data parallelism beyond the optimizer state (ZeRO-2/3, FSDP).
  if (p.zero < 0 || p.zero > 3) return fail("plan.zero", fmt::format("zero must be 0, 1, 2 or 3, found {}", p.zero));
  if (p.zero >= 1 && !p.distributed_optimizer)
    return fail("plan.zero", fmt::format("zero={} shards the optimizer state too: it needs distopt=on (or leave "
                                         "distopt unset: zero=1..3 turns it on)", p.zero));
  if (p.zero >= 2) {
    // The gradients (and parameters) are synchronised every micro-batch, per
    // unit, inside the backward: the schedules whose weight gradients run
    // apart from their input gradients (zero-bubble, DualPipe) are not
    // modelled with it, nor run by Megatron-FSDP.
    if (p.schedule != Schedule::gpipe && p.schedule != Schedule::one_f_one_b && p.schedule != Schedule::interleaved)
      return fail("plan.zero", fmt::format("zero={} runs with the gpipe, 1f1b or interleaved schedule, not {} (its "
                                           "weight gradients run apart from the backward that the sharded gradients "
                                           "are reduced in)",
                                           p.zero, to_string(p.schedule)));
    if (p.moe_ep_overlap)
      return fail("plan.zero", fmt::format("zero={} is not modelled with moe_ep_overlap", p.zero));
    if (p.pp > 1 && m.tied_embeddings)
      return fail("plan.zero", fmt::format("zero={} with tied embeddings on two pipeline stages is not modelled (their "
                                           "gradients are summed after the backward, sharded ones in it); untie them "
                                           "or use zero 1",
                                           p.zero));
  }
  if (p.dp_replicas < 1)
    return fail("plan.dp_replicas", fmt::format("dp_replicas must be a positive number of replicas, found {}", p.dp_replicas));
  s.dp_shard = s.dp * p.cp / std::max(1, p.dp_replicas);
  if (p.dp_replicas > 1) {
    if (!p.distributed_optimizer)
      return fail("plan.dp_replicas", "hybrid sharding (dp_replicas > 1) shards the optimizer state: it needs zero 1-3");
    if ((s.dp * p.cp) % p.dp_replicas != 0)
      return fail("plan.dp_replicas", fmt::format("dp_replicas = {} must divide the dp x cp = {} x {} ranks of a stage's "
                                                  "data-parallel group",
                                                  p.dp_replicas, s.dp, p.cp));
    if (m.moe)
      return fail("plan.dp_replicas", "hybrid sharding of a mixture-of-experts model is not modelled (its experts shard "
                                      "over expert-DP)");
  }
  if (p.grad_bucket && *p.grad_bucket < 1)
    return fail("plan.grad_bucket", fmt::format("grad_bucket must be a positive number of parameters, found {}", *p.grad_bucket));
  if (p.fsdp_prefetch < 0 || p.fsdp_prefetch > 64)
    return fail("plan.fsdp_prefetch", fmt::format("fsdp_prefetch must be 0 to 64 units, found {}", p.fsdp_prefetch));
  if (p.zero < 3 && (!p.reshard_after_forward || p.fsdp_prefetch != 1))
    return fail(!p.reshard_after_forward ? "plan.reshard_after_forward" : "plan.fsdp_prefetch",
                "applies to sharded parameters only (zero=3)");
  if (p.zero == 3 && p.overlap_param_gather)
    return fail("plan.overlap_param_gather", "zero=3 gathers the parameters unit by unit in each micro-batch; their "
                                             "overlap is fsdp_prefetch (overlap_param_gather is the end-of-step gather "
                                             "of zero 1 and 2)");
  if (p.fp8_param_gather && s.training.precision != Precision::fp8)
    return fail("plan.fp8_param_gather", "needs FP8 training (training precision fp8)");
  if (p.fp8_param_gather && !p.distributed_optimizer)
    return fail("plan.fp8_param_gather", "needs the distributed optimizer or FSDP (distopt=on or zero=3), as Megatron-LM "
                                         "asserts");

  // Recomputation (TransformerConfig).
  const Recompute& rc = p.recompute;
  if (rc.granularity != RecomputeGranularity::full) {
    if (rc.method)
      return fail("plan.recompute_method",
                  fmt::format("only applies to recompute=full (recompute is {})", to_string(rc.granularity)));
    if (rc.num_layers)
      return fail("plan.recompute_layers",
                  fmt::format("only applies to recompute=full (recompute is {})", to_string(rc.granularity)));
  } else {
    if (!rc.method) return fail("plan.recompute_method", "recompute=full needs recompute_method (uniform or block)");
    if (!rc.num_layers) return fail("plan.recompute_layers", "recompute=full needs recompute_layers");
  }
  if (rc.modules) {
    if (rc.granularity != RecomputeGranularity::selective)
      return fail("plan.recompute_modules",
                  fmt::format("only applies to recompute=selective (recompute is {})", to_string(rc.granularity)));
    if ((*rc.modules & kRecomputeMlaUpProj) && !m.mla)
      return fail("plan.recompute_modules", "mla_up_proj needs multi-latent attention (the model has none)");
    if ((*rc.modules & kRecomputeMoeAct) && !m.moe)
      return fail("plan.recompute_modules", "moe_act needs routed experts (the model has none)");
    if ((*rc.modules & kRecomputeMoe) && !m.moe)
      return fail("plan.recompute_modules", "moe recomputes MoE layers (the model has none; mlp recomputes dense MLPs)");
    if ((*rc.modules & kRecomputeSharedExperts) && !(m.moe && m.moe->shared_expert_ffn_hidden > 0))
      return fail("plan.recompute_modules", "shared_experts needs shared experts (the model has none)");
    if ((*rc.modules & kRecomputeMlp) && m.num_moe_layers() == m.num_layers)
      return fail("plan.recompute_modules",
                  "mlp recomputes dense MLP layers and every layer of the model is a MoE layer (moe recomputes those)");
    if ((*rc.modules & kRecomputeMoe) && p.moe_ep_overlap)
      return fail("plan.recompute_modules",
                  "moe cannot be recomputed with moe_ep_overlap=on (Megatron-Core refuses "
                  "--overlap-moe-expert-parallel-comm with moe in --recompute-modules)");
    if ((*rc.modules & kRecomputeSharedExperts) && p.moe_shared_expert_overlap)
      return fail("plan.recompute_modules",
                  "shared_experts cannot be recomputed with moe_shared_expert_overlap=on (Megatron-Core refuses it)");
  }

  // Precision.
  if (s.training.precision == Precision::fp8 && !s.cluster.device.peak_fp8_flops)
    return fail("training.precision", fmt::format("fp8 needs FP8 tensor cores; {} has none", s.cluster.device.name));
  if (s.training.precision == Precision::fp8 && s.training.fp8_recipe == Fp8Recipe::mxfp8 && !s.cluster.device.mx_formats)
    return fail("training.fp8_recipe",
                fmt::format("mxfp8 scales each 32-element block in the tensor cores' MX (microscaling) formats, which {} "
                            "does not have (Blackwell has them: cluster.device.mx_formats); use tensorwise or blockwise",
                            s.cluster.device.name));

  // Pipeline schedule and virtual stages.
  const Schedule sch = p.schedule;
  std::optional<int> vpp = p.vpp;
  if (!vpp && p.layout && sch != Schedule::dualpipe) {   // Megatron-LM derives vpp from the layout
    auto parsed = parse_pipeline_layout(*p.layout, "plan.layout");
    if (!parsed) return Err(parsed.error());
    if (parsed->size() % static_cast<std::size_t>(p.pp) != 0)
      return fail("plan.layout", fmt::format("the layout has {} stages, which must be a multiple of pp ({})",
                                             parsed->size(), p.pp));
    vpp = static_cast<int>(parsed->size()) / p.pp;
  }
  s.vpp = vpp.value_or(default_vpp(sch));
  if (p.microbatch_group && sch != Schedule::interleaved)
    return fail("plan.microbatch_group", fmt::format("microbatch_group groups the interleaved schedule's micro-batches; "
                                                     "schedule {} has no groups", to_string(sch)));
  if (sch == Schedule::interleaved) {
    if (!vpp || *vpp < 2) return fail("plan.vpp", "the interleaved schedule needs vpp >= 2");
    if (p.pp < 2) return fail("plan.pp", "the interleaved schedule needs pp >= 2");
    if (!p.microbatch_group && s.num_microbatches % p.pp != 0)
      return fail("training.global_batch_size",
                  fmt::format("the interleaved schedule needs the micro-batch count ({}) to be a multiple of pp "
                              "({}) (Megatron's default microbatch_group_size_per_vp_stage = pp)",
                              s.num_microbatches, p.pp));
    s.microbatch_group = p.microbatch_group.value_or(p.pp);
    if (const std::string why = interleaved_group_rule(p.pp, s.num_microbatches, s.microbatch_group); !why.empty())
      return fail("plan.microbatch_group", why + " (Megatron-Core's microbatch_group_size_per_vp_stage)");
  } else if (sch == Schedule::zb_v || sch == Schedule::dualpipev) {
    if (s.vpp != 2)
      return fail("plan.vpp", fmt::format("{} places exactly 2 chunks per rank in a V shape; vpp must be 2, found {}",
                                          to_string(sch), s.vpp));
  } else if (s.vpp != 1) {
    if (!p.vpp && p.layout)
      return fail("plan.layout", fmt::format("the layout's stages make {} per pipeline rank; schedule {} runs one model "
                                             "chunk per rank (use schedule=interleaved)", s.vpp, to_string(sch)));
    return fail("plan.vpp", fmt::format("schedule {} runs one model chunk per rank; use schedule=interleaved for "
                                        "vpp = {}", to_string(sch), s.vpp));
  }
  const bool pipelined = sch != Schedule::gpipe && sch != Schedule::one_f_one_b;
  // Synchronous pipeline communication is modelled on Megatron-LM's
  // communication points, which exist for gpipe, 1f1b and interleaved only.
  s.overlap_p2p_comm = p.overlap_p2p_comm.value_or(default_overlap_p2p_comm(sch));
  if (!s.overlap_p2p_comm && sch != Schedule::gpipe && sch != Schedule::one_f_one_b && sch != Schedule::interleaved)
    return fail("plan.overlap_p2p_comm",
                fmt::format("overlap_p2p_comm=off (Megatron-LM's synchronous pipeline communication) is modelled for "
                            "the gpipe, 1f1b and interleaved schedules, not {}",
                            to_string(sch)));
  if (p.overlap_p2p_warmup_flush && sch != Schedule::interleaved)
    return fail("plan.overlap_p2p_warmup_flush",
                fmt::format("overlaps the interleaved schedule's warm-up and flush transfers; schedule {} has none "
                            "of its own (its transfers follow overlap_p2p_comm)", to_string(sch)));
  if (p.overlap_p2p_warmup_flush && !s.overlap_p2p_comm)
    return fail("plan.overlap_p2p_warmup_flush", "needs overlap_p2p_comm=on (Megatron-Core: overlapping in warm-up and "
                                                 "flush is only compatible with overlap_p2p_comm)");
  if (pipelined && p.pp < 2)
    return fail("plan.schedule", fmt::format("schedule {} needs pp >= 2", to_string(sch)));
  if (sch == Schedule::dualpipe) {
    if (p.pp % 2 != 0) return fail("plan.pp", fmt::format("dualpipe needs an even pp, found {}", p.pp));
    if (s.num_microbatches % 2 != 0 || s.num_microbatches < 2 * p.pp)
      return fail("training.global_batch_size",
                  fmt::format("dualpipe needs an even micro-batch count >= 2 x pp = {}, found {}", 2 * p.pp,
                              s.num_microbatches));
  }
  if (sch == Schedule::dualpipev && s.num_microbatches < 2 * p.pp)
    return fail("training.global_batch_size",
                fmt::format("dualpipev needs at least 2 x pp = {} micro-batches, found {}", 2 * p.pp,
                            s.num_microbatches));
  // Layer layout. DualPipe splits the model into pp stages as 1f1b does
  // (rank r holds stages r and pp - 1 - r in its two directions).
  const int split_vpp = sch == Schedule::dualpipe ? 1 : s.vpp;
  const int chunks_per_rank = sch == Schedule::dualpipe ? 2 : s.vpp;
  s.virtual_stages = p.pp * split_vpp;
  auto layout = stage_layout(m, p, sch, s.virtual_stages, split_vpp);
  if (!layout) return Err(layout.error());
  s.layout = std::move(*layout);
  std::vector<int> stage_first(s.layout.size(), 0);
  for (std::size_t vs = 1; vs < s.layout.size(); ++vs) stage_first[vs] = stage_first[vs - 1] + s.layout[vs - 1].decoders;
  s.chunks.assign(static_cast<std::size_t>(p.pp), {});
  for (int r = 0; r < p.pp; ++r) {
    for (int c = 0; c < chunks_per_rank; ++c) {
      const int vs = virtual_stage(sch, p.pp, r, c);
      const LayoutStage& st = s.layout[static_cast<std::size_t>(vs)];
      s.chunks[static_cast<std::size_t>(r)].push_back(
          ChunkLayers{stage_first[static_cast<std::size_t>(vs)], st.decoders, vs, st.embedding, st.loss, st.mtp});
    }
  }
  if (rc.granularity == RecomputeGranularity::full) {
    int most = 0;   // DualPipe's uneven stages give a rank chunks of two sizes
    for (const auto& rank_chunks : s.chunks)
      for (const ChunkLayers& c : rank_chunks) most = std::max(most, c.count);
    if (*rc.num_layers < 1 || *rc.num_layers > most)
      return fail("plan.recompute_layers", fmt::format("must be between 1 and the layers per model chunk ({}), "
                                                       "found {}", most, *rc.num_layers));
  }

  s.padded_vocab = m.padded_vocab(p.tp);
  return s;
}

}  // namespace megascope
