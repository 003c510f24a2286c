#include "sim/varlen_sim.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <tuple>

#include "core/accounting/flops.hpp"
#include "core/program/builder.hpp"
#include "core/varlen.hpp"
#include "sim/engine.hpp"
#include "sim/timed_program.hpp"

namespace megascope::sim {

namespace {

// What every simulation of one Setup shares.
struct Pricing {
  const Setup& s;
  const CostModel& cost;
  const Topology& topo;
  // Model FLOPs (forward x 3, causal within each document): per token
  // outside the attention scores, and per causal query-key pair.
  double flops_per_token = 0, flops_per_pair = 0;
};

Pricing pricing_of(const Setup& s, const CostModel& cost, const Topology& topo) {
  Pricing p{s, cost, topo};
  const ForwardFlops f = model_forward_flops(s.model, s.seq_length, s.padded_vocab, true);
  p.flops_per_token = 3.0 * (f.total() - f.attention_core) / static_cast<double>(s.seq_length);
  p.flops_per_pair = 3.0 * f.attention_core / causal_pairs(s.seq_length);
  return p;
}

// A micro-batch of documents `docs` whose every document is split over
// `share` ranks, on a ring of `ring` ranks (0: the plan's cp). Its ops are
// shaped at its own tokens per rank (times cp, rounded up to the 2 cp tp
// tokens Transformer Engine's THD split and sequence parallelism need, at
// most seq_length), and its attention is its documents' share of that
// length's causal pairs and tiles.
MicrobatchLoad load_of(const Pricing& p, const std::vector<std::int64_t>& docs, int share, int ring) {
  const Setup& s = p.s;
  double pairs = 0, tiles = 0;
  std::int64_t tokens = 0;
  for (const std::int64_t d : docs) {
    pairs += causal_pairs(d);
    tiles += causal_block_pairs(d);
    tokens += d;
  }
  const std::int64_t cp = s.plan.cp;
  const std::int64_t per_rank = (tokens + share - 1) / share;
  const std::int64_t align = 2 * cp * s.plan.tp;
  const std::int64_t length = std::min(s.seq_length, std::max(align, (per_rank * cp + align - 1) / align * align));
  const double scale = static_cast<double>(cp) / static_cast<double>(share);
  return MicrobatchLoad{length, scale * pairs / causal_pairs(length), scale * tiles / causal_block_pairs(length), ring};
}

// One replica's simulated step, and where each of its micro-batches ended
// on its first stage's representative rank (when `ends` is asked for).
struct ReplicaTime {
  double step_s = 0;
  std::vector<double> mb_end;
};

Result<ReplicaTime> simulate_loads(const Pricing& p, const std::vector<MicrobatchLoad>& loads, bool ends) {
  Setup s = p.s;
  s.num_microbatches = static_cast<int>(loads.size());
  BuildOptions bo;
  bo.loads = &loads;
  auto program = build_program(s, bo);
  if (!program) return tl::unexpected(program.error());
  SimOptions so;
  so.record_trace = ends;
  if (ends) so.trace_ranks = {0};
  auto r = simulate(*program, p.topo, p.cost, so);
  if (!r) return tl::unexpected(r.error());
  ReplicaTime t{r->step_time_s, {}};
  if (ends) {
    t.mb_end.assign(loads.size(), 0.0);
    const StageProgram& sp = program->of_rank(0);
    for (const Span& span : r->spans) {
      const Op& op = sp.ops[span.op];
      if (span.rank == 0 && op.microbatch && *op.microbatch >= 0 &&
          static_cast<std::size_t>(*op.microbatch) < loads.size())
        t.mb_end[static_cast<std::size_t>(*op.microbatch)] =
            std::max(t.mb_end[static_cast<std::size_t>(*op.microbatch)], span.end);
    }
  }
  return t;
}

double total_attention(const std::vector<MicrobatchLoad>& loads) {
  double a = 0;
  for (const MicrobatchLoad& l : loads) a += l.attention;
  return a;
}

// Simulates the heaviest `max_replicas` of `replicas` (each a list of
// micro-batch loads) and fills the step's times.
Result<void> simulate_replicas(const Pricing& p, const std::vector<std::vector<MicrobatchLoad>>& replicas,
                               int max_replicas, VarlenStep& step) {
  std::vector<std::size_t> order(replicas.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return total_attention(replicas[a]) > total_attention(replicas[b]);
  });
  order.resize(std::min(order.size(), static_cast<std::size_t>(std::max(1, max_replicas))));
  step.replicas = static_cast<int>(replicas.size());
  step.simulated = static_cast<int>(order.size());
  step.microbatches = replicas.empty() ? 0 : static_cast<int>(replicas.front().size());
  double sum = 0;
  step.fastest_replica_s = 0;
  for (const std::size_t i : order) {
    auto r = simulate_loads(p, replicas[i], false);
    if (!r) return tl::unexpected(r.error());
    const double t = r->step_s;
    step.step_s = std::max(step.step_s, t);
    step.fastest_replica_s = step.fastest_replica_s == 0 ? t : std::min(step.fastest_replica_s, t);
    sum += t;
  }
  step.mean_replica_s = sum / static_cast<double>(order.size());
  return {};
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

void summarise(const Setup& s, VarlenRun& run) {
  std::vector<double> t;
  double time = 0, tokens = 0, flops = 0, flops_nc = 0, balance = 0;
  for (const VarlenStep& st : run.steps) {
    t.push_back(st.step_s);
    time += st.step_s;
    tokens += static_cast<double>(st.tokens);
    flops += st.model_flops;
    flops_nc += st.model_flops_no_causal;
    balance += st.step_s > 0 ? st.mean_replica_s / st.step_s : 1.0;
  }
  run.mean_step_s = time / static_cast<double>(t.size());
  run.p50_step_s = percentile(t, 0.5);
  run.p90_step_s = percentile(t, 0.9);
  run.min_step_s = *std::min_element(t.begin(), t.end());
  run.max_step_s = *std::max_element(t.begin(), t.end());
  run.tokens_per_s = time > 0 ? tokens / time : 0;
  run.tflops_per_gpu = time > 0 ? flops / time / static_cast<double>(s.world) / 1e12 : 0;
  run.mfu = run.tflops_per_gpu * 1e12 / s.cluster.device.peak_bf16_flops;
  run.tflops_per_gpu_no_causal = time > 0 ? flops_nc / time / static_cast<double>(s.world) / 1e12 : 0;
  run.mfu_no_causal = run.tflops_per_gpu_no_causal * 1e12 / s.cluster.device.peak_bf16_flops;
  run.balance = balance / static_cast<double>(run.steps.size());
}

// The micro-batch multiple Megatron-LM's schedulers keep per step: dp packs
// at a time, and with interleaving whole micro-batch groups of them.
int pack_multiple(const Setup& s) {
  return s.plan.schedule == Schedule::interleaved && s.microbatch_group > 0 ? s.microbatch_group : 1;
}

// Each DP replica's micro-batch loads under static packing.
Result<std::vector<std::vector<MicrobatchLoad>>> static_loads(const Pricing& p, const std::vector<std::int64_t>& lengths) {
  const Setup& s = p.s;
  auto sched = schedule_static(lengths, s.seq_length, s.dp, s.dp * pack_multiple(s));
  if (!sched) return tl::unexpected(sched.error());
  if (sched->microbatches > kMaxMicrobatches)
    return fail("training.global_batch_size", fmt::format("{} packed micro-batches a step; at most {} are simulated",
                                                          sched->microbatches, kMaxMicrobatches));
  std::vector<std::vector<MicrobatchLoad>> replicas;
  for (const auto& packs : sched->packs) {
    std::vector<MicrobatchLoad> loads;
    for (const auto& docs : packs) loads.push_back(load_of(p, docs, s.plan.cp, 0));
    replicas.push_back(std::move(loads));
  }
  return replicas;
}

Result<void> static_step(const Pricing& p, const std::vector<std::int64_t>& lengths, int max_replicas,
                         VarlenStep& step) {
  auto replicas = static_loads(p, lengths);
  if (!replicas) return tl::unexpected(replicas.error());
  return simulate_replicas(p, *replicas, max_replicas, step);
}

Result<DynamicSchedule> dynamic_schedule(const Pricing& p, const std::vector<std::int64_t>& lengths) {
  const Setup& s = p.s;
  auto sched = schedule_dynamic_cp(lengths, s.seq_length / s.plan.cp, s.dp * s.plan.cp, 1, pack_multiple(s));
  if (!sched) return tl::unexpected(sched.error());
  if (sched->microbatches > kMaxMicrobatches)
    return fail("training.global_batch_size", fmt::format("{} micro-batches a step; at most {} are simulated",
                                                          sched->microbatches, kMaxMicrobatches));
  return sched;
}

// Each of the dp x cp ranks' micro-batch loads under dynamic CP.
std::vector<std::vector<MicrobatchLoad>> dynamic_loads(const Pricing& p, const DynamicSchedule& sched) {
  const std::size_t ranks = static_cast<std::size_t>(p.s.dp) * static_cast<std::size_t>(p.s.plan.cp);
  std::vector<std::vector<MicrobatchLoad>> loads(ranks);
  for (const auto& mb : sched.work)
    for (std::size_t r = 0; r < ranks && r < mb.size(); ++r)
      loads[r].push_back(load_of(p, mb[r].docs, mb[r].cp, mb[r].cp));
  return loads;
}

// Dynamic CP. Every rank's micro-batches are simulated as a replica of its
// own (each distinct sequence of loads once). Without pipeline parallelism
// the ranks are then coupled as Megatron-LM runs them: a CP group starts a
// micro-batch when its slowest member has finished its previous one (the
// ring exchanges every layer), each member then takes its own micro-batch's
// time, and the step ends with the last rank's tail (gradient reduction,
// optimizer). With pipeline parallelism (or more than 4,096 distinct rank
// schedules) the `max_replicas` ranks with the most attention work are
// priced as if their group-mates kept pace: a lower bound.
Result<void> dynamic_step(const Pricing& p, const std::vector<std::int64_t>& lengths, int max_replicas,
                          VarlenStep& step) {
  const Setup& s = p.s;
  auto sched = dynamic_schedule(p, lengths);
  if (!sched) return tl::unexpected(sched.error());
  const std::size_t ranks = static_cast<std::size_t>(s.dp) * static_cast<std::size_t>(s.plan.cp);
  std::vector<std::vector<MicrobatchLoad>> per_rank_loads = dynamic_loads(p, *sched);
  // The distinct schedules of loads.
  std::map<std::vector<std::tuple<std::int64_t, double, double, int>>, std::size_t> distinct;
  std::vector<std::size_t> kind(ranks);
  for (std::size_t r = 0; r < ranks; ++r) {
    std::vector<std::tuple<std::int64_t, double, double, int>> key;
    for (const MicrobatchLoad& l : per_rank_loads[r]) key.emplace_back(l.tokens, l.attention, l.attention_tiles, l.cp);
    kind[r] = distinct.emplace(std::move(key), distinct.size()).first->second;
  }
  if (s.plan.pp > 1 || distinct.size() > 4096) return simulate_replicas(p, per_rank_loads, max_replicas, step);
  std::vector<ReplicaTime> times(distinct.size());
  std::vector<bool> done(distinct.size(), false);
  for (std::size_t r = 0; r < ranks; ++r) {
    if (done[kind[r]]) continue;
    auto t = simulate_loads(p, per_rank_loads[r], true);
    if (!t) return tl::unexpected(t.error());
    times[kind[r]] = std::move(*t);
    done[kind[r]] = true;
  }
  const std::size_t M = sched->work.size();
  std::vector<double> finish(ranks, 0.0), next(ranks, 0.0);
  for (std::size_t k = 0; k < M; ++k) {
    // Each group starts when its slowest member is free.
    std::map<int, double> start;
    for (std::size_t r = 0; r < ranks; ++r) {
      const int g = sched->work[k][r].group;
      start[g] = std::max(start[g], finish[r]);
    }
    for (std::size_t r = 0; r < ranks; ++r) {
      const ReplicaTime& t = times[kind[r]];
      const double own = t.mb_end[k] - (k > 0 ? t.mb_end[k - 1] : 0.0);
      next[r] = start[sched->work[k][r].group] + own;
    }
    finish.swap(next);
  }
  step.replicas = static_cast<int>(ranks);
  step.simulated = static_cast<int>(distinct.size());
  step.microbatches = static_cast<int>(M);
  double sum = 0;
  step.step_s = 0;
  step.fastest_replica_s = 0;
  for (std::size_t r = 0; r < ranks; ++r) {
    const ReplicaTime& t = times[kind[r]];
    const double end = finish[r] + (t.step_s - (M > 0 ? t.mb_end[M - 1] : 0.0));   // its tail after the last micro-batch
    step.step_s = std::max(step.step_s, end);
    step.fastest_replica_s = r == 0 ? end : std::min(step.fastest_replica_s, end);
    sum += end;
  }
  step.mean_replica_s = sum / static_cast<double>(ranks);
  return {};
}

}  // namespace

Result<VarlenReport> simulate_varlen(const Setup& s, const CostModel& cost, const Topology& topo, int max_replicas) {
  const VarlenSpec* v = s.training.varlen.get();
  if (!v) return fail("training.lengths", "the training has no length distribution");
  if (s.plan.schedule == Schedule::zb_1p || s.plan.schedule == Schedule::zb_2p)
    return fail("plan.schedule", "variable-length steps with the automatic zero-bubble schedules are not modelled "
                                 "(their order is placed from one step's stage times)");
  const Pricing p = pricing_of(s, cost, topo);
  VarlenReport rep;
  rep.mean_length = mean_length(v->lengths);
  {
    auto timed = build_timed_program(s, cost, topo);
    if (!timed) return tl::unexpected(timed.error());
    SimOptions so;
    so.record_trace = false;
    auto r = simulate(timed->program, topo, cost, so);
    if (!r) return tl::unexpected(r.error());
    rep.fixed_step_s = r->step_time_s;
    rep.fixed_tokens_per_s = static_cast<double>(s.tokens_per_iteration()) / r->step_time_s;
  }
  const auto B = static_cast<std::size_t>(s.training.global_batch_size);
  rep.run.scheduler = v->packing == Packing::pad ? "pad" : s.plan.dynamic_cp ? "dynamic_cp" : "dp_balanced";
  if (s.plan.dynamic_cp) rep.static_cp = VarlenRun{"dp_balanced", {}};
  for (int k = 0; k < v->steps; ++k) {
    const std::vector<std::int64_t> lengths = sample_lengths(v->lengths, v->seed, static_cast<std::uint64_t>(k), B);
    VarlenStep step;
    step.step = k;
    step.sequences = static_cast<std::int64_t>(lengths.size());
    double pairs = 0;
    for (const std::int64_t d : lengths) {
      step.tokens += d;
      pairs += causal_pairs(d);
    }
    step.model_flops = p.flops_per_token * static_cast<double>(step.tokens) + p.flops_per_pair * pairs;
    step.model_flops_no_causal = p.flops_per_token * static_cast<double>(step.tokens) + 2.0 * p.flops_per_pair * pairs;
    if (v->packing == Packing::pad) {
      // Padded to seq_length: every micro-batch is the fixed-length one.
      step.step_s = step.mean_replica_s = step.fastest_replica_s = rep.fixed_step_s;
      step.microbatches = s.num_microbatches;
      step.replicas = step.simulated = s.dp;
      rep.run.steps.push_back(step);
      continue;
    }
    if (s.plan.dynamic_cp) {
      VarlenStep st = step;
      if (auto ok = static_step(p, lengths, max_replicas, st); !ok) return tl::unexpected(ok.error());
      rep.static_cp->steps.push_back(st);
      if (auto ok = dynamic_step(p, lengths, max_replicas, step); !ok) return tl::unexpected(ok.error());
    } else if (auto ok = static_step(p, lengths, max_replicas, step); !ok) {
      return tl::unexpected(ok.error());
    }
    rep.run.steps.push_back(step);
  }
  summarise(s, rep.run);
  if (rep.static_cp) summarise(s, *rep.static_cp);
  return rep;
}

Result<VarlenProgram> slowest_replica_program(const Setup& s, const CostModel& cost, const Topology& topo, int step) {
  const VarlenSpec* v = s.training.varlen.get();
  if (!v) return fail("training.lengths", "the training has no length distribution");
  const Pricing p = pricing_of(s, cost, topo);
  const auto lengths = sample_lengths(v->lengths, v->seed, static_cast<std::uint64_t>(step),
                                      static_cast<std::size_t>(s.training.global_batch_size));
  VarlenProgram out;
  out.setup = s;
  double pairs = 0;
  for (const std::int64_t d : lengths) {
    out.tokens += d;
    pairs += causal_pairs(d);
  }
  out.model_flops = p.flops_per_token * static_cast<double>(out.tokens) + p.flops_per_pair * pairs;
  std::vector<std::vector<MicrobatchLoad>> replicas;
  if (v->packing == Packing::pack && s.plan.dynamic_cp) {
    auto sched = dynamic_schedule(p, lengths);
    if (!sched) return tl::unexpected(sched.error());
    replicas = dynamic_loads(p, *sched);
  } else if (v->packing == Packing::pack) {
    auto r = static_loads(p, lengths);
    if (!r) return tl::unexpected(r.error());
    replicas = std::move(*r);
  }
  out.replicas = static_cast<int>(std::max<std::size_t>(1, replicas.size()));
  if (!replicas.empty()) {
    // The slowest of the 64 with the most attention work.
    std::vector<std::size_t> order(replicas.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return total_attention(replicas[a]) > total_attention(replicas[b]);
    });
    order.resize(std::min<std::size_t>(order.size(), 64));
    double worst = -1;
    for (const std::size_t i : order) {
      auto t = simulate_loads(p, replicas[i], false);
      if (!t) return tl::unexpected(t.error());
      if (t->step_s > worst) {
        worst = t->step_s;
        out.replica = static_cast<int>(i);
      }
    }
    out.loads = std::move(replicas[static_cast<std::size_t>(out.replica)]);
    out.setup.num_microbatches = static_cast<int>(out.loads.size());
  }
  BuildOptions bo;
  if (!out.loads.empty()) bo.loads = &out.loads;
  auto program = build_program(out.setup, bo);
  if (!program) return tl::unexpected(program.error());
  out.program = std::move(*program);
  return out;
}

}  // namespace megascope::sim
