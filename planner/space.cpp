#include "planner/space.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <numeric>

namespace megascope::planner {

namespace {

using Err = tl::unexpected<Error>;

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

std::optional<int> to_int(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v < 1) return std::nullopt;
  return v;
}

int scale_up_size(const ClusterSpec& c) {
  return c.scale_up_domain > 0 ? c.scale_up_domain : c.node.devices_per_node;
}

bool allowed(const std::optional<bool>& fixed, bool v) { return !fixed || *fixed == v; }

}  // namespace

const char* to_string(UnevenStages u) {
  switch (u) {
    case UnevenStages::off: return "off";
    case UnevenStages::automatic: return "auto";
    case UnevenStages::on: return "on";
  }
  return "?";
}

std::optional<UnevenStages> parse_uneven_stages(std::string_view s) {
  for (UnevenStages u : {UnevenStages::off, UnevenStages::automatic, UnevenStages::on})
    if (s == to_string(u)) return u;
  return std::nullopt;
}

bool IntSet::contains(int v) const {
  if (!values.empty() && std::find(values.begin(), values.end(), v) == values.end()) return false;
  if (lo && v < *lo) return false;
  if (hi && v > *hi) return false;
  return true;
}

Result<IntSet> parse_int_set(const std::string& text, const std::string& option) {
  IntSet s;
  const auto bad = [&] {
    return Err(Error{fmt::format("'{}' is not a value set: use N, A-B, <=N, >=N or a list A,B,C of positive integers",
                                 text),
                     option, std::nullopt});
  };
  std::string_view t = text;
  if (t.rfind("<=", 0) == 0 || t.rfind(">=", 0) == 0) {
    auto v = to_int(t.substr(2));
    if (!v) return bad();
    (t[0] == '<' ? s.hi : s.lo) = *v;
    return s;
  }
  if (auto dash = t.find('-'); dash != std::string_view::npos) {
    auto a = to_int(t.substr(0, dash)), b = to_int(t.substr(dash + 1));
    if (!a || !b || *a > *b) return bad();
    s.lo = *a;
    s.hi = *b;
    return s;
  }
  while (true) {
    const auto comma = t.find(',');
    auto v = to_int(t.substr(0, comma));
    if (!v) return bad();
    s.values.push_back(*v);
    if (comma == std::string_view::npos) break;
    t.remove_prefix(comma + 1);
  }
  return s;
}

PlanSpec to_plan(const Candidate& c) {
  PlanSpec p;
  p.tp = c.tp;
  p.pp = c.pp;
  if (c.schedule == Schedule::interleaved || c.vpp != default_vpp(c.schedule)) p.vpp = c.vpp;
  p.dp = c.dp;
  p.cp = c.cp;
  p.ep = c.ep;
  if (c.etp != c.tp) p.etp = c.etp;
  p.micro_batch_size = c.mbs;
  if (c.first_layers > 0) p.first_stage_layers = c.first_layers;
  if (c.last_layers > 0) p.last_stage_layers = c.last_layers;
  p.embedding_in_split = c.embedding_in_split;
  p.loss_in_split = c.loss_in_split;
  p.sequence_parallel = c.sp;
  p.recompute.granularity = c.recompute;
  if (c.recompute == RecomputeGranularity::full) {
    p.recompute.method = c.recompute_method;
    p.recompute.num_layers = c.recompute_layers;
  }
  if (c.recompute == RecomputeGranularity::selective && c.recompute_modules != 0) p.recompute.modules = c.recompute_modules;
  p.distributed_optimizer = c.distopt;
  if (c.zero >= 2) p.zero = c.zero;
  p.dp_replicas = c.dp_replicas;
  p.fp8_param_gather = c.fp8_param_gather;
  p.overlap_grad_reduce = c.overlap_grad_reduce;
  p.overlap_param_gather = c.overlap_param_gather;
  p.tp_comm_overlap = c.tp_comm_overlap;
  p.moe_shared_expert_overlap = c.shared_expert_overlap;
  p.overlap_p2p_warmup_flush = c.p2p_warmup_flush;
  p.schedule = c.schedule;
  p.post_validation = c.post_validation;
  return p;
}

std::optional<Candidate> from_plan(const PlanSpec& p, int gpus, int dp) {
  if (p.first_stage_layers.has_value() != p.last_stage_layers.has_value() || p.layout ||
      (p.microbatch_group && *p.microbatch_group != p.pp) || p.attention != AttentionKernel::flash ||
      (p.cp > 1 && p.cp_comm != CpCommType::p2p) || (!p.tp_grad_overlap && p.tp > 1) ||
      !p.grad_accum_fusion || p.pp_scatter_gather || p.moe_dispatcher != MoeDispatcher::alltoall ||
      (p.pp > 1 && p.overlap_p2p_comm && *p.overlap_p2p_comm != default_overlap_p2p_comm(p.schedule)) ||
      !p.reshard_after_forward || p.fsdp_prefetch != 1 || p.grad_bucket)
    return std::nullopt;
  Candidate c;
  c.gpus = gpus;
  c.tp = static_cast<std::int16_t>(p.tp);
  c.pp = static_cast<std::int16_t>(p.pp);
  c.vpp = static_cast<std::int16_t>(p.vpp.value_or(default_vpp(p.schedule)));
  c.cp = static_cast<std::int16_t>(p.cp);
  c.ep = static_cast<std::int16_t>(p.ep);
  c.etp = static_cast<std::int16_t>(p.etp.value_or(p.tp));
  c.dp = dp;
  c.mbs = p.micro_batch_size;
  c.first_layers = static_cast<std::int16_t>(p.first_stage_layers.value_or(0));
  c.last_layers = static_cast<std::int16_t>(p.last_stage_layers.value_or(0));
  c.embedding_in_split = p.embedding_in_split;
  c.loss_in_split = p.loss_in_split;
  c.schedule = p.schedule;
  c.recompute = p.recompute.granularity;
  c.recompute_method = p.recompute.method.value_or(RecomputeMethod::uniform);
  c.recompute_layers = static_cast<std::int16_t>(p.recompute.num_layers.value_or(0));
  if (const unsigned mods = recompute_modules(p.recompute); mods != 0 && mods != kRecomputeCoreAttn)
    c.recompute_modules = static_cast<std::uint8_t>(mods);
  c.sp = p.sequence_parallel && p.tp > 1;
  c.distopt = p.distributed_optimizer;
  c.zero = static_cast<std::int8_t>(zero_stage(p));
  c.dp_replicas = static_cast<std::int16_t>(p.dp_replicas);
  c.fp8_param_gather = p.fp8_param_gather;
  c.overlap_grad_reduce = p.overlap_grad_reduce;
  c.overlap_param_gather = p.overlap_param_gather;
  c.tp_comm_overlap = p.tp_comm_overlap;
  c.shared_expert_overlap = p.moe_shared_expert_overlap;
  c.p2p_warmup_flush = p.overlap_p2p_warmup_flush;
  c.post_validation = p.post_validation;
  return c;
}

std::optional<Candidate> from_setup(const Setup& s) {
  PlanSpec p = s.plan;
  if (p.first_stage_layers || p.last_stage_layers) {
    p.first_stage_layers = s.layers_on_rank(0);
    p.last_stage_layers = s.layers_on_rank(p.pp - 1);
  }
  return from_plan(p, s.world, s.dp);
}

Result<SearchInputs> check_inputs(SearchInputs in) {
  auto m = validate_model(in.model);
  if (!m) return Err(m.error());
  auto c = validate_cluster(in.cluster);
  if (!c) return Err(c.error());
  auto t = validate_training(in.training);
  if (!t) return Err(t.error());
  in.model = *m;
  in.cluster = *c;
  in.training = *t;
  if (in.gpu_counts.empty()) return fail("gpus", "no GPU count to search");
  for (int n : in.gpu_counts) {
    if (n < 1) return fail("gpus", fmt::format("must be >= 1, found {}", n));
    if (n > in.cluster.total_devices())
      return fail("gpus", fmt::format("{} GPUs exceed cluster '{}' ({} nodes x {})", n, in.cluster.name,
                                      in.cluster.num_nodes, in.cluster.node.devices_per_node));
  }
  const std::int64_t seq = in.training.seq_length.value_or(in.model.seq_length);
  if (in.model.position_embedding == PositionEmbedding::learned && seq > in.model.seq_length)
    return fail("training.seq_length",
                fmt::format("{} exceeds the model's learned position embeddings ({})", seq, in.model.seq_length));
  if (in.training.precision == Precision::fp8 && !in.cluster.device.peak_fp8_flops)
    return fail("training.precision", fmt::format("fp8 needs FP8 tensor cores; {} has none", in.cluster.device.name));
  if (in.constraints.headroom_bytes < 0) return fail("headroom", "must be >= 0");
  if (in.constraints.max_mbs < 1) return fail("mbs", "the largest micro-batch must be >= 1");
  if (in.constraints.uneven_depth < 0) return fail("uneven-depth", "must be >= 0");
  if (in.constraints.schedules.empty()) return fail("schedules", "no schedule allowed");
  if (in.constraints.recompute.empty()) return fail("recompute", "no recomputation mode allowed");
  return in;
}

std::vector<int> counts_up_to(const ClusterSpec& c, int n) {
  std::vector<int> out;
  const int node = c.node.devices_per_node;
  for (int k = 1; k < node && k <= n; k *= 2) out.push_back(k);
  for (int k = node; k <= n; k += node) out.push_back(k);
  return out;
}

void enumerate(const SearchInputs& in, Rejections& rej, const std::function<void(const Candidate&)>& visit) {
  const ModelSpec& m = in.model;
  const Constraints& k = in.constraints;
  const std::int64_t seq = in.training.seq_length.value_or(m.seq_length);
  const std::int64_t gbs = in.training.global_batch_size;
  const int L = m.num_layers;
  const int domain = scale_up_size(in.cluster);
  const bool moe = m.moe.has_value();
  const bool need_distopt = in.training.optimizer_precision.enabled;
  const bool fp8 = in.training.precision == Precision::fp8;
  const bool packed = in.training.varlen && in.training.varlen->packing == Packing::pack;
  bool zero_allowed[4] = {false, false, false, false};
  for (int z : k.zero)
    if (z >= 0 && z <= 3) zero_allowed[z] = true;
  // Selective recomputation's module sets: the default (0: core_attn), then
  // every non-empty set of the other modules the model has. Not core_attn
  // with others: with fused attention (all the planner enumerates) it saves
  // only the softmax statistics and costs a second attention forward, so a
  // set with it is slower than the same set without it for a few bytes.
  // A MoE model's whole MoE block (moe) is tried instead of moe_act, which
  // it contains: the memory of the routed tokens for a second dispatch.
  std::vector<std::uint8_t> module_sets = {0};
  if (k.recompute_modules) {
    const unsigned others = kRecomputeLayernorm | (m.mla ? kRecomputeMlaUpProj : 0u) |
                            (moe ? kRecomputeMoeAct | kRecomputeMoe : 0u);
    for (unsigned set = 1; set <= others; ++set)
      if ((set & ~others) == 0 && (set & (kRecomputeMoeAct | kRecomputeMoe)) != (kRecomputeMoeAct | kRecomputeMoe))
        module_sets.push_back(static_cast<std::uint8_t>(set));
  }

  // Layer splits for a pipeline of pp ranks: the even one (rejected below
  // when pp does not divide the layers), then the uneven ones the
  // constraints ask for: the first and last rank i and j layers below the
  // middle ones (0 <= i, j <= depth), the middle ranks equal. `unit` is what
  // every rank's layer count is a multiple of (vpp must divide it).
  struct Split {
    int first = 0, last = 0;   // 0: the even split
    int unit = 0;
    bool embedding = false, loss = false;   // counted as a layer each (then unit counts them too)
  };
  std::vector<Split> splits;
  const auto splits_for = [&](int pp) {
    splits.assign(1, Split{0, 0, L % pp == 0 ? L / pp : 0});
    const bool uneven = pp >= 2 && (k.uneven == UnevenStages::on || (k.uneven == UnevenStages::automatic && L % pp != 0));
    if (!uneven) return;
    // The embedding and/or the loss counted as a layer (Megatron-LM's
    // --account-for-*-in-pipeline-split): the first/last virtual stage gives
    // up a layer, so interleaving stays possible where the ranks' layer
    // counts differ (Llama 3 405B: 126 layers, pp 16, 7 + 14 x 8 + 7).
    for (int e = 0; e < 2; ++e)
      for (int l = 0; l < 2; ++l)
        if ((e || l) && (L + e + l) % pp == 0 && (L + e + l) / pp >= 1)
          splits.push_back({0, 0, (L + e + l) / pp, e != 0, l != 0});
    for (int i = 0; i <= k.uneven_depth; ++i)
      for (int j = 0; j <= k.uneven_depth; ++j) {
        if ((L + i + j) % pp != 0) continue;
        const int mid = (L + i + j) / pp;
        const int first = mid - i, last = mid - j;
        if (first < 1 || last < 1) continue;
        if (L % pp == 0 && first == L / pp && last == L / pp) continue;   // the even split
        if (std::any_of(splits.begin(), splits.end(),
                        [&](const Split& x) { return x.first == first && x.last == last && !x.embedding && !x.loss; }))
          continue;   // pp = 2: (i, j) and (i + 1, j + 1) give the same split
        splits.push_back({first, last, pp > 2 ? std::gcd(std::gcd(first, last), mid) : std::gcd(first, last)});
      }
  };

  // Schedules with their vpp values for a pipeline of pp ranks and a split.
  struct Sched {
    Schedule s;
    int vpp;
  };
  std::vector<Sched> scheds;
  const auto schedules_for = [&](int pp, const Split& split) {
    scheds.clear();
    const bool uneven = split.first > 0;
    for (Schedule s : k.schedules) {
      if (s == Schedule::gpipe && pp == 1 &&
          std::find(k.schedules.begin(), k.schedules.end(), Schedule::one_f_one_b) != k.schedules.end())
        continue;   // the same plan as 1f1b at pp = 1
      if (uneven && (s == Schedule::zb_v || s == Schedule::dualpipev))
        continue;   // their V placements need equal chunks (DualPipe holds whole stages)
      if (s == Schedule::interleaved) {
        if (pp < 2 || split.unit == 0) {
          scheds.push_back({s, 2});   // rejected below
          continue;
        }
        for (int v = 2; v <= split.unit; ++v)
          if (split.unit % v == 0) scheds.push_back({s, v});
      } else {
        scheds.push_back({s, default_vpp(s)});
      }
    }
  };

  for (int N : in.gpu_counts) {
    for (int tp : divisors(N)) {
      for (int cp : divisors(N / tp)) {
        for (int pp : divisors(N / (tp * cp))) {
          const int dp = N / (tp * cp * pp);
          splits_for(pp);
          for (const Split& split : splits) {
            schedules_for(pp, split);
            const std::vector<int> eps = moe ? divisors(tp * cp * dp) : std::vector<int>{1};
            for (int ep : eps) {
              const std::vector<int> etps = moe ? divisors(tp * cp * dp / ep) : std::vector<int>{tp};
              for (int etp : etps) {
                const int mbs_lo = k.mbs.lo.value_or(1);
                // No micro-batch beyond the batch's share of one replica (mbs x dp
                // divides the global batch): a huge --mbs bound walks no further.
                const int mbs_hi = static_cast<int>(std::min<std::int64_t>(
                    k.mbs.hi ? *k.mbs.hi
                    : !k.mbs.values.empty() ? *std::max_element(k.mbs.values.begin(), k.mbs.values.end())
                                            : k.max_mbs,
                    in.training.global_batch_size / dp));
                for (int mbs = mbs_lo; mbs <= mbs_hi; ++mbs) {
                  for (const Sched& sc : scheds) {
                    ++rej.structural;
                    const int vpp = sc.vpp;
                    // The user's constraints.
                    if (!k.tp.contains(tp) || !k.cp.contains(cp) || !k.pp.contains(pp) || !k.dp.contains(dp) ||
                        !k.mbs.contains(mbs) || !k.vpp.contains(vpp) || (moe && (!k.ep.contains(ep) || !k.etp.contains(etp))) ||
                        (k.tp_in_scale_up && domain % tp != 0) || dp < k.min_dp) {
                      ++rej.constraint;
                      continue;
                    }
                    // validate_setup's rules (same order of concerns; see core/setup.cpp).
                    bool ok = m.num_attention_heads % tp == 0 &&
                              (m.num_query_groups % tp == 0 || tp % m.num_query_groups == 0) &&
                              m.ffn_hidden_size % tp == 0 && (cp == 1 || seq % (2 * cp) == 0) &&
                              (cp == 1 || m.window_size <= 0 || m.window_size >= seq) &&   // CP with windows: refused
                              gbs % (static_cast<std::int64_t>(mbs) * dp) == 0 &&
                              // packed variable-length sequences: one pack a micro-batch, no sliding window
                              !(packed && (mbs != 1 || m.window_size > 0));
                    if (ok && moe) {
                      const MoeSpec& e = *m.moe;
                      ok = e.num_experts % ep == 0 && e.expert_ffn_hidden % etp == 0 &&
                           e.shared_expert_ffn_hidden % tp == 0 && (tp * cp * dp) % (etp * ep) == 0 &&
                           !(m.add_bias_linear && etp > 1) && !(ep > 1 && in.training.params_dtype == Dtype::fp16);
                    }
                    const int mb = ok ? static_cast<int>(gbs / (static_cast<std::int64_t>(mbs) * dp)) : 0;
                    const Schedule s = sc.s;
                    // Variable-length steps are not priced with the schedules placed from one step's times.
                    if (in.training.varlen && (s == Schedule::zb_1p || s == Schedule::zb_2p)) ok = false;
                    if (ok) {
                      const bool pipelined = s != Schedule::gpipe && s != Schedule::one_f_one_b;
                      ok = split.unit > 0 && !(pipelined && pp < 2);
                      if (s == Schedule::interleaved) ok = ok && mb % pp == 0;
                      if (s == Schedule::dualpipe) ok = ok && pp % 2 == 0 && mb % 2 == 0 && mb >= 2 * pp;
                      if (s == Schedule::dualpipev) ok = ok && mb >= 2 * pp;
                      const int split_vpp = s == Schedule::dualpipe ? 1 : vpp;
                      ok = ok && split.unit % split_vpp == 0;
                    }
                    if (!ok) {
                      ++rej.divisibility;
                      continue;
                    }
                    // Block recomputation: every k below the largest chunk (min(k, chunk) per chunk);
                    // the middle ranks hold the most layers (pp = 2: the larger of first and last).
                    const int rank_layers = split.embedding || split.loss ? split.unit
                                            : split.first == 0            ? L / pp
                                            : pp > 2 ? (L - split.first - split.last) / (pp - 2)
                                                     : std::max(split.first, split.last);
                    const int chunk_layers = rank_layers / (s == Schedule::dualpipe ? 1 : vpp);

                    Candidate c;
                    c.gpus = N;
                    c.tp = static_cast<std::int16_t>(tp);
                    c.pp = static_cast<std::int16_t>(pp);
                    c.vpp = static_cast<std::int16_t>(vpp);
                    c.cp = static_cast<std::int16_t>(cp);
                    c.ep = static_cast<std::int16_t>(ep);
                    c.etp = static_cast<std::int16_t>(etp);
                    c.shared_expert_overlap = m.moe && m.moe->shared_expert_ffn_hidden > 0 && (ep > 1 || etp > 1);
                    c.dp = dp;
                    c.mbs = mbs;
                    c.first_layers = static_cast<std::int16_t>(split.first);
                    c.last_layers = static_cast<std::int16_t>(split.last);
                    c.embedding_in_split = split.embedding;
                    c.loss_in_split = split.loss;
                    c.schedule = s;
                    const bool zero_schedule = s == Schedule::gpipe || s == Schedule::one_f_one_b || s == Schedule::interleaved;
                    c.post_validation = s == Schedule::zb_h2 || s == Schedule::zb_2p;
                    c.p2p_warmup_flush = s == Schedule::interleaved;
                    const bool has_dp = dp * cp > 1 || (moe && N / (etp * ep * pp) > 1);
                    // The DP x CP members of a scale-up domain (consecutive, tp apart) as
                    // one replica, where that is a proper divisor of DP x CP of two or more.
                    const int node_shard = domain % tp == 0 ? domain / tp : 0;
                    const int hsdp_replicas = k.hsdp && !moe && node_shard >= 2 && node_shard < dp * cp &&
                                                      (dp * cp) % node_shard == 0
                                                  ? dp * cp / node_shard
                                                  : 1;
                    for (int sp = 0; sp < 2; ++sp) {
                      if (sp && (tp == 1 || (seq / cp) % tp != 0)) continue;
                      if (!sp && ep > 1 && tp > 1) continue;   // EP with TP needs SP
                      if (!allowed(k.sp, sp != 0) && tp > 1) continue;
                      c.sp = sp != 0;
                      for (RecomputeGranularity g : k.recompute) {
                        c.recompute = g;
                        // Full: uniform over every layer (one per group), or block over the first j layers;
                        // selective: each module set.
                        const int variants = g == RecomputeGranularity::full && k.block_recompute ? chunk_layers
                                             : g == RecomputeGranularity::selective
                                                 ? static_cast<int>(module_sets.size())
                                                 : 1;
                        for (int j = 0; j < variants; ++j) {
                          c.recompute_modules = 0;
                          if (g == RecomputeGranularity::full) {
                            c.recompute_method = j == 0 ? RecomputeMethod::uniform : RecomputeMethod::block;
                            c.recompute_layers = static_cast<std::int16_t>(j == 0 ? 1 : j);
                          } else {
                            c.recompute_method = RecomputeMethod::uniform;
                            c.recompute_layers = 0;
                            if (g == RecomputeGranularity::selective) c.recompute_modules = module_sets[static_cast<std::size_t>(j)];
                          }
                          for (int z = 0; z <= 3; ++z) {
                            const bool d = z >= 1;
                            // distopt changes nothing without DP, but the precision-aware optimizer needs it.
                            if ((need_distopt ? !d : d && !has_dp) || !allowed(k.distopt, d)) continue;
                            if (!zero_allowed[z]) continue;
                            // Sharded gradients and parameters: synchronised in each backward, with the
                            // schedules that keep weight gradients in it (validate_setup).
                            if (z >= 2 && (!has_dp || !zero_schedule || (pp > 1 && m.tied_embeddings))) continue;
                            c.distopt = d;
                            c.zero = static_cast<std::int8_t>(z);
                            c.fp8_param_gather = d && fp8;
                            for (int hs = 0; hs < 2; ++hs) {
                              // Hybrid sharding: one replica per scale-up domain's DP x CP members.
                              c.dp_replicas = static_cast<std::int16_t>(hs ? hsdp_replicas : 1);
                              if (hs && (!d || c.dp_replicas <= 1)) continue;
                              for (int o = 0; o < 2; ++o) {
                                if ((o && !has_dp) || !allowed(k.overlap_grad_reduce, o != 0)) continue;
                                c.overlap_grad_reduce = o != 0;
                                for (int g2 = 0; g2 < 2; ++g2) {
                                  if ((g2 && !(c.distopt && c.overlap_grad_reduce && c.zero < 3)) ||
                                      !allowed(k.overlap_param_gather, g2 != 0))
                                    continue;
                                  c.overlap_param_gather = g2 != 0;
                                  for (int t = 0; t < 2; ++t) {
                                    if ((t && !c.sp) || !allowed(k.tp_comm_overlap, t != 0)) continue;
                                    c.tp_comm_overlap = t != 0;
                                    visit(c);
                                  }
                                }
                              }
                            }
                          }
                        }
                      }
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace megascope::planner
