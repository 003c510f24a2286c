#include "apps/estimate.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "apps/plan.hpp"
#include "config/plan_settings.hpp"
#include "core/accounting/flops.hpp"
#include "core/accounting/megatron_estimator.hpp"
#include "core/accounting/memory.hpp"
#include "core/accounting/params.hpp"

namespace megascope::cli {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string effective_plan(const Setup& s) {
  // The user's plan with the derived sizes filled in, so the report shows the whole split.
  PlanSpec p = s.plan;
  p.dp = s.dp;
  if (s.vpp != 1 || p.vpp) p.vpp = s.vpp;
  return format_inline_plan(p);
}

std::string billions(double n) { return fmt::format("{:.3f} B", n / 1e9); }

template <class... A>
void addl(std::string& o, fmt::format_string<A...> f, A&&... a) {
  o += fmt::format(f, std::forward<A>(a)...);
  o += '\n';
}

}  // namespace

nlohmann::json estimate_json(const Scenario& sc) {
  const Setup& s = sc.setup;
  const ModelParams mp = model_params(s.model);
  const IterationFlops fl = iteration_flops(s);
  const MemoryReport mem = memory_report(s);
  const MegatronMemoryEstimate meg = megatron_theoretical_memory(s);
  nlohmann::json j;
  j["setup"] = {{"model", s.model.name},
                {"cluster", s.cluster.name},
                {"device", s.cluster.device.name},
                {"gpus", s.world},
                {"plan", effective_plan(s)},
                {"tp", s.plan.tp},
                {"pp", s.plan.pp},
                {"dp", s.dp},
                {"cp", s.plan.cp},
                {"ep", s.plan.ep},
                {"etp", s.etp},
                {"vpp", s.vpp},
                {"micro_batch_size", s.plan.micro_batch_size},
                {"num_microbatches", s.num_microbatches},
                {"global_batch_size", s.training.global_batch_size},
                {"seq_length", s.seq_length},
                {"padded_vocab_size", s.padded_vocab},
                {"schedule", to_string(s.plan.schedule)}};
  if (s.model.moe) j["setup"]["expert_load"] = s.expert_load;
  if (const VarlenSpec* v = s.training.varlen.get())
    j["setup"]["lengths"] = {{"distribution", to_string(v->lengths.kind)}, {"mean_length", mean_length(v->lengths)},
                             {"packing", to_string(v->packing)}};
  j["params_total"] = mp.total();
  j["params_active"] = active_params(s.model);
  j["params"] = {{"embedding", mp.embedding}, {"output", mp.output}, {"final_norm", mp.final_norm},
                 {"layers_dense", mp.layers.dense}, {"layers_expert", mp.layers.expert},
                 {"mtp", mp.mtp.total()}};
  j["flops_per_iteration"] = fl.model;
  j["flops"] = {{"model", fl.model},
                {"hardware", fl.hardware},
                {"model_no_causal_halving", fl.model_no_causal},
                {"hardware_no_causal_halving", fl.hardware_no_causal},
                {"forward", {{"attention_proj", fl.forward.attention_proj},
                             {"attention_core", fl.forward.attention_core},
                             {"mlp", fl.forward.mlp},
                             {"experts", fl.forward.experts},
                             {"logits", fl.forward.logits},
                             {"mtp_proj", fl.forward.mtp_proj}}}};
  j["fits"] = mem.fits;
  nlohmann::json stages = nlohmann::json::array();
  for (const StageMemory& st : mem.stages) {
    nlohmann::json acts = nlohmann::json::object(), other = nlohmann::json::object();
    for (const auto& t : st.activation_terms) acts[t.name] = t.bytes;
    for (const auto& t : st.other_terms) other[t.name] = t.bytes;
    stages.push_back({{"stage", st.stage},
                      {"params", st.params},
                      {"weights_bytes", st.weights_bytes},
                      {"grads_bytes", st.grads_bytes},
                      {"optimizer_bytes", st.optimizer_bytes},
                      {"activations_bytes", st.activations_bytes},
                      {"other_bytes", st.other_bytes},
                      {"total_bytes", st.total_bytes},
                      {"inflight_microbatches", st.inflight_microbatches},
                      {"activations", acts},
                      {"other", other}});
  }
  j["memory"] = {{"capacity_bytes", mem.capacity_bytes},
                 {"peak_bytes", mem.peak_bytes},
                 {"peak_stage", mem.peak_stage},
                 {"per_stage", stages}};
  j["megatron_estimator"] = {{"weight_and_optimizer_bytes", meg.weight_and_optimizer_bytes},
                             {"activation_bytes", meg.activation_bytes},
                             {"total_bytes", meg.total_bytes()}};
  j["warnings"] = s.warnings;
  j["notes"] = sc.notes;
  return j;
}

std::string estimate_text(const Scenario& sc) {
  const Setup& s = sc.setup;
  const ModelParams mp = model_params(s.model);
  const IterationFlops fl = iteration_flops(s);
  const MemoryReport mem = memory_report(s);
  const MegatronMemoryEstimate meg = megatron_theoretical_memory(s);
  std::string o;

  addl(o, "Megascope estimate: {} on {} ({} x {}), from {}", s.model.name, s.cluster.name, s.world,
       s.cluster.device.name, sc.source);
  addl(o, "  plan      {}", effective_plan(s));
  addl(o, "  grid      {} devices = tp {} x pp {} x dp {} x cp {}{}", s.world, s.plan.tp, s.plan.pp, s.dp, s.plan.cp,
       s.model.moe ? fmt::format("; experts: ep {} x etp {} x expert-dp {}", s.plan.ep, s.etp, s.edp) : std::string());
  addl(o, "  batch     global {} x seq {}: {} micro-batches of {} per pipeline, schedule {}{}",
       s.training.global_batch_size, s.seq_length, s.num_microbatches, s.plan.micro_batch_size,
       to_string(s.plan.schedule), s.vpp > 1 ? fmt::format(" (vpp {})", s.vpp) : std::string());
  if (const std::string tt = training_text(s.training); !tt.empty()) addl(o, "  training  {}", tt);
  if (const VarlenSpec* v = s.training.varlen.get())
    addl(o, "  lengths   {} (mean {:.0f} tokens), {}: the FLOPs below are full-length sequences'; a {} holds at most "
         "{} tokens, so the memory below bounds every micro-batch (simulate prices sampled steps, docs/varlen.md)",
         to_string(v->lengths.kind), mean_length(v->lengths), v->packing == Packing::pack ? "packed" : "padded",
         v->packing == Packing::pack ? "pack" : "padded sequence", s.seq_length);
  if (!mem.fits)
    addl(o, "  memory    DOES NOT FIT: {:.2f} GiB at the peak (stage {}), {:.2f} GiB more than a GPU's {:.2f} GiB",
         mem.peak_bytes / kGiB, mem.peak_stage, (mem.peak_bytes - mem.capacity_bytes) / kGiB, mem.capacity_bytes / kGiB);
  addl(o, "");
  addl(o, "Parameters");
  addl(o, "  total     {}  (tokenizer vocab {}; padded to {} for tp {})", billions(mp.total()), s.model.vocab_size,
       s.padded_vocab, s.plan.tp);
  if (s.model.moe) addl(o, "  active    {} per token (top-{} of {} experts)", billions(active_params(s.model)),
                        s.model.moe->top_k, s.model.moe->num_experts);
  addl(o, "  parts     embedding {}, layers {}, output {}, MTP {}", billions(mp.embedding),
       billions(mp.layers.total() + mp.final_norm), billions(mp.output), billions(mp.mtp.total()));
  addl(o, "");
  addl(o, "FLOPs per iteration (GEMMs only)");
  addl(o, "  model     {:.4e}  = 3 x forward, causal attention halved (Megatron-LM >= 2025-03 counter)", fl.model);
  addl(o, "  hardware  {:.4e}  {}", fl.hardware,
       s.plan.recompute.granularity == RecomputeGranularity::none
           ? std::string("= model (no recomputation)")
           : fmt::format("model + recomputed forward ({} recomputation)", to_string(s.plan.recompute.granularity)));
  addl(o, "  model     {:.4e}  without causal halving (Megatron-LM <= 2025-02, Korthikanti Eq. 7)", fl.model_no_causal);
  addl(o, "");
  addl(o, "Memory per rank, GiB (capacity {:.2f} GiB)", mem.capacity_bytes / kGiB);
  addl(o, "  {:>5} {:>9} {:>9} {:>9} {:>11} {:>8} {:>9} {:>9}", "stage", "weights", "grads", "optimizer",
       "activations", "other", "total", "in-flight");
  for (const StageMemory& st : mem.stages)
    addl(o, "  {:>5} {:>9.2f} {:>9.2f} {:>9.2f} {:>11.2f} {:>8.2f} {:>9.2f} {:>9}", st.stage, st.weights_bytes / kGiB,
         st.grads_bytes / kGiB, st.optimizer_bytes / kGiB, st.activations_bytes / kGiB, st.other_bytes / kGiB,
         st.total_bytes / kGiB, st.inflight_microbatches);
  const double spare = mem.capacity_bytes - mem.peak_bytes;
  addl(o, "  peak      stage {}: {:.2f} GiB of {:.2f} GiB: {} ({:.2f} GiB {})", mem.peak_stage, mem.peak_bytes / kGiB,
       mem.capacity_bytes / kGiB, mem.fits ? "FITS" : "DOES NOT FIT", std::abs(spare) / kGiB,
       mem.fits ? "free" : "short");
  const StageMemory& peak = mem.stages[static_cast<std::size_t>(mem.peak_stage)];
  std::vector<ActivationTerm> terms = peak.activation_terms;
  std::sort(terms.begin(), terms.end(), [](const auto& a, const auto& b) { return a.bytes > b.bytes; });
  std::string top;
  for (std::size_t i = 0; i < std::min<std::size_t>(5, terms.size()); ++i)
    top += fmt::format("{}{} {:.2f}", i ? ", " : "", terms[i].name, terms[i].bytes / kGiB);
  addl(o, "  largest activations on stage {}: {}", mem.peak_stage, top);
  std::string other;
  for (const ActivationTerm& t : peak.other_terms) other += fmt::format("{}{} {:.2f}", other.empty() ? "" : ", ", t.name, t.bytes / kGiB);
  addl(o, "  other on stage {}: {}", mem.peak_stage, other);
  addl(o, "  Megatron-LM's own estimator, first stage: weights+optimizer {:.2f} GiB, activations {:.2f} GiB{}",
       meg.weight_and_optimizer_bytes / kGiB, meg.activation_bytes / kGiB,
       zero_stage(s.plan) >= 2 ? " (it shards the optimizer state only)" : "");
  for (const auto& w : s.warnings) addl(o, "warning: {}", w);
  for (const auto& n : sc.notes) addl(o, "note: {}", n);
  return o;
}

}  // namespace megascope::cli
