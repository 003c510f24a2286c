// docs/validation.md's sections on today's hardware: the Megatron-Bridge /
// NeMo dense rows (H100, B200, GB200) and the sustained clock fitted to each
// GPU generation's published runs (validation_report.cpp assembles the page).
#include <fmt/format.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "config/library.hpp"
#include "published_predict.hpp"
#include "sim/cost_model.hpp"
#include "validation_sections.hpp"

using namespace megascope;

namespace {

using bench::Prediction;
using bench::predict;

// The Megatron-Bridge / NeMo rows, in tokens/s per GPU: one markdown row
// each, tallied by class.
struct BridgeTally {
  double sum_abs = 0, sum_signed = 0;
  int n = 0;
  void add(double e) {
    sum_abs += std::abs(e);
    sum_signed += e;
    ++n;
  }
  [[nodiscard]] std::string str() const {
    if (n == 0) return "no rows";
    return fmt::format("**{:.1f}%** mean absolute error, signed mean {:+.1f}%, over {} rows", 100 * sum_abs / n,
                       100 * sum_signed / n, n);
  }
};

template <class Add>
void add_bridge_rows(Add& add, const std::vector<bench::PublishedRun>& runs, BridgeTally& h100, BridgeTally& blackwell,
                     BridgeTally& cp) {
  for (const bench::PublishedRun& run : runs) {
    const Prediction p = predict(run);
    const std::string what = fmt::format("| {} | {} | {} | `{}` | {} | {:.0f} |", run.label, run.gpu, run.gpus, run.plan,
                                         run.batch, run.tokens_per_s_per_gpu);
    if (!p.ok) {
      add(fmt::format("{} error: {} | | |", what, p.error));
      continue;
    }
    const double predicted = bench::predicted_throughput(run, p.out.report);
    const double err = bench::throughput_error(run, p.out.report);
    (run.cp > 1 ? cp : run.gpu == "H100" ? h100 : blackwell).add(err);
    add(fmt::format("{} {:.0f} | {:+.1f}% | {:.1f} GiB{} |", what, predicted, 100 * err, p.peak_gib,
                    p.fits ? "" : " (does not fit)"));
  }
}

}  // namespace

namespace megascope {

std::string bridge_nemo_section(const std::string& ref) {
  std::string md;
  auto add = [&](const std::string& s) { md += s + "\n"; };
  BridgeTally bridge_h100, bridge_bw, bridge_cp;
  {
    add("## Megatron-Bridge and NeMo performance summaries, dense rows (H100, B200, GB200)");
    add("");
    add("Tokens/s per GPU as published (`megatron_bridge_nemo_perf_summary.csv`: Megatron-Bridge 25.09-26.02 and");
    add("NeMo 24.07). Every dense row of a shipped model (Llama 2 and 3, NeMo's GPT-3, Nemotron with its squared-ReLU");
    add("MLP) on a shipped cluster");
    add("(`dgx-h100`, `dgx-b200`, `gb200-nvl72`), BF16 or FP8; FSDP rows (not modelled) and NVFP4 rows are left");
    add("out. Plans: the published tp, pp, cp, vp, micro-batch and batch with what every recipe turns on");
    add("(sequence parallelism and TP communication overlap with tp > 1, the distributed optimizer, overlapped");
    add("gradient reduce and parameter gather, interleaving with vp > 1, no recomputation); Llama 3.1 405B counts");
    add("the embedding and the loss in its pipeline split, as its recipe does. FP8 recipe: delayed scaling for");
    add("NeMo 24.07, current (tensorwise) scaling for Megatron-Bridge's FP8 and FP8-CS, mxfp8 for MXFP8.");
    add("");
    add("| run | GPU | GPUs | plan | batch | published | predicted | error | peak memory |");
    add("|---|---|---|---|---|---|---|---|---|");
    add_bridge_rows(add, bench::bridge_nemo_dense(ref), bridge_h100, bridge_bw, bridge_cp);
    add("");
    add(fmt::format("- H100 rows without context parallelism: {} (target 5%, signed within +-2%).", bridge_h100.str()));
    add(fmt::format("- B200 and GB200 rows without context parallelism: {} (target 7%).", bridge_bw.str()));
    add(fmt::format("- Rows with context parallelism (cp 2): {} (target 6%).", bridge_cp.str()));
    add("");
    add("Context parallelism is priced as Megatron-Core runs it (load-balanced chunks, `docs/simulator.md`), so the CP");
    add("rows carry the same errors as the others of their GPU. What these rows run and the simulator does not price");
    add("yet as mechanisms of their own: NCCL kernels taking SMs and memory bandwidth from overlapped GEMMs, host");
    add("launch time and the CUDA graphs that remove it (the Blackwell Llama 3 8B recipes capture the whole");
    add("iteration), FP8 weight casts and amax reductions; the sustained clock fitted per generation (below) takes");
    add("up what of them is common to a generation. The NeMo 24.07 rows (2024 software) come out faster than");
    add("published more than the Megatron-Bridge 25.x rows do. Rows marked as not fitting ran in the published");
    add("memory; what the memory accounting counts that these recipes do not keep is not yet identified.");
    add("");
  }
  return md;
}

std::string sustained_clock_section(const std::string& ref) {
  std::string md;
  auto add = [&](const std::string& s) { md += s + "\n"; };
  {
    add("## Sustained clocks, fitted per GPU generation");
    add("");
    add("`[profile] sustained_clock`: the fraction of the clock the profile's efficiencies were measured at that the");
    add("tensor cores hold under training load; GEMMs' compute term and fused attention take 1 / sustained_clock as");
    add("long. One value per generation, fitted on every dense published run of it above (the Megatron-LM README H100");
    add("table and the Megatron-Bridge / NeMo rows), least squares in log throughput; leave-one-model-out: each");
    add("model's rows predicted at the value fitted without them. The fit takes up whatever else the simulator does");
    add("not price yet in these runs and is common to the generation (NCCL kernels' SMs beside GEMMs, host time, FP8");
    add("scaling work), so it is a lower bound on the clock, not a measurement of it.");
    add("");
    add("| generation | rows | fitted | shipped | in sample: mean abs (signed) | leave one model out: mean abs (signed) | fitted without each model |");
    add("|---|---|---|---|---|---|---|");
    for (const auto& [gen, cluster] : {std::pair<const char*, const char*>{"hopper", "dgx-h100"}, {"blackwell", "dgx-b200"}}) {
      const bench::ClockFit f = bench::fit_sustained_clock(ref, gen);
      const auto c = resolve_cluster(cluster);
      const auto cost = c ? sim::CostModel::for_device(c->device) : Result<sim::CostModel>(tl::unexpected(c.error()));
      std::string without;
      for (const auto& [m, x] : f.lomo_clock_by_model) without += fmt::format("{}{} {:.3f}", without.empty() ? "" : ", ", m, x);
      if (!f.error.empty()) {
        add(fmt::format("| {} | | error: {} | | | | |", gen, f.error));
        continue;
      }
      add(fmt::format("| {} | {} | {:.3f} | {} | {:.1f}% ({:+.1f}%) | {:.1f}% ({:+.1f}%) | {} |", gen, f.rows, f.clock,
                      cost ? fmt::format("{:.3f}", cost->profile().sustained_clock) : "?", 100 * f.mean_abs,
                      100 * f.signed_mean, 100 * f.lomo_mean_abs, 100 * f.lomo_signed_mean, without));
    }
    add("");
  }
  return md;
}

}  // namespace megascope
