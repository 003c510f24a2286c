#include "apps/simulate.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "apps/expected_error.hpp"
#include "apps/plan.hpp"
#include "config/plan_settings.hpp"
#include "core/accounting/memory.hpp"
#include "core/program/builder.hpp"
#include "sim/cost_model.hpp"
#include "sim/network.hpp"
#include "sim/timed_program.hpp"

namespace megascope::cli {

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

template <class... A>
void addl(std::string& o, fmt::format_string<A...> f, A&&... a) {
  o += fmt::format(f, std::forward<A>(a)...);
  o += '\n';
}
// Ops of every simulated rank (each rank runs its stage's program).
std::size_t simulated_ops(const SimulateOutcome& out) {
  std::size_t n = 0;
  for (const int rank : out.result.simulated_ranks) n += out.program.of_rank(rank).ops.size();
  return n;
}

nlohmann::json varlen_run_json(const sim::VarlenRun& r) {
  nlohmann::json steps = nlohmann::json::array();
  for (const sim::VarlenStep& st : r.steps)
    steps.push_back({{"step", st.step}, {"step_time_s", st.step_s}, {"mean_replica_s", st.mean_replica_s},
                     {"fastest_replica_s", st.fastest_replica_s}, {"sequences", st.sequences}, {"tokens", st.tokens},
                     {"microbatches", st.microbatches}, {"replicas", st.replicas}, {"simulated_replicas", st.simulated},
                     {"model_flops", st.model_flops}});
  return {{"scheduler", r.scheduler}, {"mean_step_s", r.mean_step_s}, {"p50_step_s", r.p50_step_s},
          {"p90_step_s", r.p90_step_s}, {"min_step_s", r.min_step_s}, {"max_step_s", r.max_step_s},
          {"tokens_per_s", r.tokens_per_s}, {"tflops_per_gpu", r.tflops_per_gpu}, {"mfu", r.mfu},
          {"balance", r.balance}, {"steps", steps}};
}

nlohmann::json varlen_json(const Setup& s, const sim::VarlenReport& v) {
  const VarlenSpec& spec = *s.training.varlen;
  nlohmann::json j = {{"distribution", to_string(spec.lengths.kind)}, {"mean_length", v.mean_length},
                      {"packing", to_string(spec.packing)}, {"seed", spec.seed}, {"sampled_steps", spec.steps},
                      {"full_length_step_s", v.fixed_step_s}, {"full_length_tokens_per_s", v.fixed_tokens_per_s},
                      {"run", varlen_run_json(v.run)}};
  if (v.static_cp) {
    j["static_cp"] = varlen_run_json(*v.static_cp);
    j["dynamic_cp_speedup"] = v.run.mean_step_s > 0 ? v.static_cp->mean_step_s / v.run.mean_step_s : 0.0;
  }
  return j;
}

void varlen_text(std::string& t, const Setup& s, const sim::VarlenReport& v) {
  const VarlenSpec& spec = *s.training.varlen;
  addl(t, "");
  addl(t, "  variable-length training: {} lengths (mean {:.0f} tokens, at most {}), {}, {} sampled steps from seed {}",
       to_string(spec.lengths.kind), v.mean_length, s.seq_length,
       spec.packing == Packing::pad ? "each padded to seq_length" : "packed to seq_length tokens per micro-batch",
       spec.steps, spec.seed);
  const auto line = [&](const sim::VarlenRun& r, const char* what) {
    addl(t, "  {:<10} step mean {:.4f} s (p50 {:.4f}, p90 {:.4f}, {:.4f}-{:.4f}); {:.0f} tokens/s ({:.1f} per GPU), "
         "MFU {:.1f}%", what, r.mean_step_s, r.p50_step_s, r.p90_step_s, r.min_step_s, r.max_step_s, r.tokens_per_s,
         r.tokens_per_s / s.world, 100 * r.mfu);
    if (r.scheduler != "pad")
      addl(t, "  {:<10} balance {:.1f}%: the replicas' mean time over the slowest one's (the rest they wait at the "
           "gradient reduction); {} micro-batches per replica in the first step", "", 100 * r.balance,
           r.steps.empty() ? 0 : r.steps.front().microbatches);
  };
  if (v.static_cp) line(*v.static_cp, "static CP");
  line(v.run, v.run.scheduler == "dynamic_cp" ? "dynamic CP" : v.run.scheduler == "pad" ? "padded" : "packed");
  if (v.static_cp && v.run.mean_step_s > 0)
    addl(t, "  {:<10} {:.2f}x the static schedule's throughput on the same batches", "dynamic CP",
         v.run.tokens_per_s / std::max(v.static_cp->tokens_per_s, 1e-30));
  addl(t, "  {:<10} {:.4f} s a step with every sequence at {} tokens ({:.0f} tokens/s)", "full-length", v.fixed_step_s,
       s.seq_length, v.fixed_tokens_per_s);
}

}  // namespace

Result<sim::CostModel> cost_model_for(const Setup& s, const std::optional<std::string>& calibration) {
  auto cost = sim::CostModel::for_device(s.cluster.device);
  if (!cost) return tl::unexpected(cost.error());
  if (calibration)
    if (auto ok = cost->apply_calibration(*calibration); !ok) return tl::unexpected(ok.error());
  return cost;
}

Result<SimulateOutcome> run_simulation(const Scenario& sc, const SimulateOptions& o) {
  const Setup& s = sc.setup;
  const auto t0 = std::chrono::steady_clock::now();
  auto cost = cost_model_for(s, o.calibration);
  if (!cost) return tl::unexpected(cost.error());
  const sim::Topology topo = sim::Topology::build(s.cluster, s.world);
  auto timed = sim::build_timed_program(s, *cost, topo);
  if (!timed) return tl::unexpected(timed.error());
  sim::SimOptions so;
  so.mode = o.mode;
  auto result = sim::simulate(timed->program, topo, *cost, so);
  if (!result) return tl::unexpected(result.error());
  SimulateOutcome out{std::move(timed->program), std::move(*result), {}, cost->profile().source, 0,
                      std::move(timed->inputs), std::move(timed->chosen), std::nullopt};
  out.report = sim::make_report(s, out.program, out.result);
  if (s.training.varlen) {
    auto v = sim::simulate_varlen(s, *cost, topo);
    if (!v) return tl::unexpected(v.error());
    out.varlen = std::move(*v);
  }
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (o.trace)
    if (auto ok = sim::write_trace(*o.trace, out.program, out.result,
                                   {TraceSource::simulated, 0, format_inline_plan(s.plan), s.model.name, s.world});
        !ok)
      return tl::unexpected(ok.error());
  return out;
}

nlohmann::json simulate_json(const Scenario& sc, const SimulateOutcome& out, const SimulateOptions& o) {
  const Setup& s = sc.setup;
  const sim::SimReport& r = out.report;
  const MemoryReport mem = memory_report(s);
  nlohmann::json exposed = nlohmann::json::object();
  for (int k = 0; k < sim::kCommKinds; ++k)
    exposed[sim::to_string(static_cast<sim::CommKind>(k))] = r.exposed_comm_s[static_cast<std::size_t>(k)];
  nlohmann::json stages = nlohmann::json::array();
  for (const sim::StageReport& st : r.stages) {
    nlohmann::json ex = nlohmann::json::object();
    for (int k = 0; k < sim::kCommKinds; ++k)
      ex[sim::to_string(static_cast<sim::CommKind>(k))] = st.exposed_comm_s[static_cast<std::size_t>(k)];
    stages.push_back({{"stage", st.stage}, {"rank", st.rank}, {"compute_busy_s", st.compute_busy_s},
                      {"bubble_s", st.bubble_s}, {"exposed_comm_s", ex}, {"compute_by_label_s", st.compute_by_label_s}});
  }
  PlanSpec plan = s.plan;
  plan.dp = s.dp;
  nlohmann::json j;
  j["setup"] = {{"model", s.model.name}, {"cluster", s.cluster.name}, {"gpus", s.world},
                {"plan", format_inline_plan(plan)}, {"global_batch_size", s.training.global_batch_size},
                {"seq_length", s.seq_length}, {"num_microbatches", s.num_microbatches}};
  if (s.model.moe) j["setup"]["expert_load"] = s.expert_load;
  j["step_time_s"] = r.step_time_s;
  j["makespan_s"] = r.makespan_s;
  j["tokens_per_s"] = r.tokens_per_s;
  j["tflops_per_gpu"] = r.tflops_per_gpu;
  j["mfu"] = r.mfu;
  j["flops_formula"] = "model FLOPs, GEMMs only, causal attention halved (Megatron-LM counter since 2025-03)";
  j["tflops_per_gpu_no_causal_halving"] = r.tflops_per_gpu_no_causal;
  j["mfu_no_causal_halving"] = r.mfu_no_causal;
  j["expected_error"] = expected_error_json(expected_error(s, r.mfu, shipped_regimes()));
  j["hardware_tflops_per_gpu_no_causal_halving"] = r.hardware_tflops_per_gpu_no_causal;
  if (!out.auto_chosen.empty()) {
    const StageTimes& it = out.auto_inputs.times;
    j["auto_schedule"] = {{"memory_limit_microbatches", out.auto_inputs.memory_limit},
                          {"f_s", it.f}, {"b_s", it.b}, {"w_s", it.w}, {"transfer_s", it.comm},
                          {"w_memory", out.auto_inputs.w_memory}, {"chosen", out.auto_chosen}};
  }
  j["bubble_fraction"] = r.bubble_fraction;
  j["busiest_bubble_fraction"] = r.busiest_bubble_fraction;
  j["exposed_comm_s"] = exposed;
  j["stages"] = stages;
  j["memory"] = {{"peak_bytes", mem.peak_bytes}, {"capacity_bytes", mem.capacity_bytes}, {"fits", mem.fits},
                 {"peak_stage", mem.peak_stage}};
  j["notes"] = sc.notes;
  j["simulation"] = {{"mode", o.mode == sim::Mode::full ? "full" : "reduced"},
                     {"simulated_ranks", out.result.simulated_ranks.size()},
                     {"ops_per_stage_total", out.program.op_count()},
                     {"simulated_ops", simulated_ops(out)},
                     {"events", out.result.events},
                     {"wall_s", out.wall_s},
                     {"cost_profile", out.profile_source}};
  if (out.varlen) j["varlen"] = varlen_json(s, *out.varlen);
  j["warnings"] = s.warnings;
  return j;
}

std::string simulate_text(const Scenario& sc, const SimulateOutcome& out, const SimulateOptions& o) {
  const Setup& s = sc.setup;
  const sim::SimReport& r = out.report;
  const MemoryReport mem = memory_report(s);
  PlanSpec plan = s.plan;
  plan.dp = s.dp;
  std::string t;
  addl(t, "Megascope simulate: {} on {} ({} x {}), from {}", s.model.name, s.cluster.name, s.world,
       s.cluster.device.name, sc.source);
  addl(t, "  plan       {}", format_inline_plan(plan));
  addl(t, "  batch      global {} x seq {}: {} micro-batches per pipeline", s.training.global_batch_size, s.seq_length,
       s.num_microbatches);
  if (const std::string tt = training_text(s.training); !tt.empty()) addl(t, "  training   {}", tt);
  if (s.model.moe && s.expert_load != 1.0)
    addl(t, "  experts    the busiest EP rank's experts take {:.2f}x their balanced share of tokens; every EP rank is "
         "priced at it", s.expert_load);
  if (!mem.fits)
    addl(t, "  memory     DOES NOT FIT: {:.2f} GiB at the peak (stage {}), {:.2f} GiB more than a GPU's {:.2f} GiB; the "
         "times below are for a GPU that could hold it", mem.peak_bytes / kGiB, mem.peak_stage,
         (mem.peak_bytes - mem.capacity_bytes) / kGiB, mem.capacity_bytes / kGiB);
  for (const auto& n : sc.notes) addl(t, "  note       {}", n);
  if (out.varlen)
    addl(t, "  lengths    variable: the step below has every sequence at {} tokens; the sampled steps follow it",
         s.seq_length);
  addl(t, "");
  if (s.plan.post_validation)
    addl(t, "  step time  {:.4f} s (post-validation: the longest rank's own span; first op to last op of any rank "
         "{:.4f} s)", r.step_time_s, r.makespan_s);
  else
    addl(t, "  step time  {:.4f} s", r.step_time_s);
  addl(t, "  throughput {:.0f} tokens/s ({:.1f} per GPU)", r.tokens_per_s, r.tokens_per_s / s.world);
  addl(t, "  MFU        {:.1f}% ({:.1f} TFLOP/s per GPU of {:.1f}; model FLOPs, causal attention halved as Megatron-LM "
       "counts since 2025-03)", 100 * r.mfu, r.tflops_per_gpu, s.cluster.device.peak_bf16_flops / 1e12);
  addl(t, "             {:.1f}% ({:.1f} TFLOP/s) without causal halving, as the published tables count;", 100 * r.mfu_no_causal,
       r.tflops_per_gpu_no_causal);
  addl(t, "             {:.1f} TFLOP/s with recomputation counted (Narayanan et al.'s convention)",
       r.hardware_tflops_per_gpu_no_causal);
  addl(t, "  expected   {}", expected_error_text(expected_error(s, r.mfu, shipped_regimes())));
  if (!out.auto_chosen.empty()) {
    const StageTimes& it = out.auto_inputs.times;
    const auto ms = [](const std::vector<double>& v) {
      const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
      return fmt::format("{:.2f}-{:.2f}", 1e3 * *lo, 1e3 * *hi);
    };
    addl(t, "  order      {} within {} micro-batches' activations, from the stages' times F {} ms, B {} ms, W {} ms, "
         "transfer {:.3f} ms: {}", to_string(s.plan.schedule), out.auto_inputs.memory_limit, ms(it.f),
         ms(it.b), ms(it.w), 1e3 * it.comm, out.auto_chosen);
  }
  addl(t, "  bubble     {:.1f}% of the step (mean idle over stages); {:.1f}% at the busiest stage (the zero-bubble "
       "paper's bubble rate)", 100 * r.bubble_fraction, 100 * r.busiest_bubble_fraction);
  std::string ex;
  for (int k = 0; k < sim::kCommKinds; ++k)
    ex += fmt::format("{}{} {:.1f} ms", k ? ", " : "", sim::to_string(static_cast<sim::CommKind>(k)),
                      1e3 * r.exposed_comm_s[static_cast<std::size_t>(k)]);
  addl(t, "  exposed    {} (mean per rank)", ex);
  if (out.varlen) varlen_text(t, s, *out.varlen);
  addl(t, "");
  addl(t, "  {:>5} {:>10} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8}   compute by part", "stage", "compute s", "bubble %",
       "tp ms", "cp ms", "ep ms", "dp ms", "pp ms");
  for (const sim::StageReport& st : r.stages) {
    std::string parts;
    for (const auto& [label, sec] : st.compute_by_label_s) parts += fmt::format("{} {:.3f}  ", label, sec);
    addl(t, "  {:>5} {:>10.4f} {:>9.1f} {:>8.1f} {:>8.1f} {:>8.1f} {:>8.1f} {:>8.1f}   {}", st.stage, st.compute_busy_s,
         100 * st.bubble_s / std::max(r.step_time_s, 1e-30), 1e3 * st.exposed_comm_s[0], 1e3 * st.exposed_comm_s[1],
         1e3 * st.exposed_comm_s[2], 1e3 * st.exposed_comm_s[3], 1e3 * st.exposed_comm_s[4], parts);
  }
  addl(t, "");
  addl(t, "  memory per rank, GiB (capacity {:.2f}):", mem.capacity_bytes / kGiB);
  addl(t, "  {:>5} {:>9} {:>9} {:>9} {:>11} {:>8} {:>9}", "stage", "weights", "grads", "optimizer", "activations", "other",
       "total");
  for (const StageMemory& st : mem.stages)
    addl(t, "  {:>5} {:>9.2f} {:>9.2f} {:>9.2f} {:>11.2f} {:>8.2f} {:>9.2f}", st.stage, st.weights_bytes / kGiB,
         st.grads_bytes / kGiB, st.optimizer_bytes / kGiB, st.activations_bytes / kGiB, st.other_bytes / kGiB,
         st.total_bytes / kGiB);
  addl(t, "  peak       {:.2f} GiB on stage {}: {}", mem.peak_bytes / kGiB, mem.peak_stage,
       mem.fits ? "fits" : "DOES NOT FIT");
  // An event can cover many ops (a region of local ops, docs/simulator.md).
  addl(t, "  simulated  {} mode, {} ranks, {} ops in {} events, {:.3f} s; cost profile: {}",
       o.mode == sim::Mode::full ? "full" : "reduced", out.result.simulated_ranks.size(), simulated_ops(out),
       out.result.events, out.wall_s, out.profile_source);
  if (o.trace) addl(t, "  trace      {} (open in ui.perfetto.dev)", *o.trace);
  for (const auto& w : s.warnings) addl(t, "warning: {}", w);
  return t;
}

}  // namespace megascope::cli
