// validation_report: predicts the published runs of tests/reference/ with
// the simulator, with no per-row tuning, and writes docs/validation.md
// (markdown on stdout). Run it with scripts/validation-report.sh.
//
//   Narayanan et al. 2021 Table 1: GPT 1.7B-1T on up to 3072 A100s. Plans
//     from the paper's reproduction script: tp, pp, micro-batch, interleaving
//     where the script sets it, full (uniform) recomputation. Compared:
//     TFLOP/s per GPU counted as the paper does (Eq. 3: with recomputation,
//     no causal halving).
//   Megatron-LM README (2024): GPT 1.7B-462B on up to 6144 H100s, with the
//     README's flags: distributed optimizer, overlapped gradient reduce and
//     parameter gather, TP communication overlap (so sequence parallelism).
//     Compared: TFLOP/s per GPU as Megatron-LM counted then (model FLOPs,
//     no causal halving).
// Ablations the papers report, checked as directions.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "apps/scenario.hpp"
#include "apps/simulate.hpp"
#include "config/library.hpp"
#include "config/plan_settings.hpp"
#include "published.hpp"

using namespace megascope;
using namespace megascope::cli;

namespace {

struct Prediction {
  bool ok = false;
  std::string error;
  SimulateOutcome out;
  bool fits = false;
  double peak_gib = 0;
};

Prediction predict(const bench::PublishedRun& run) {
  Prediction p;
  ScenarioOptions o;
  o.model = run.model;
  o.cluster = run.cluster;
  o.gpus = run.gpus;
  o.plan = run.plan;
  o.global_batch = run.batch;
  auto sc = load_scenario(o);
  if (!sc) {
    p.error = sc.error().str();
    return p;
  }
  // The run's number formats (the command line has no option for them).
  TrainingSpec t = sc->setup.training;
  t.params_dtype = run.params_dtype;
  t.grad_dtype = run.grad_dtype;
  auto s = validate_setup(sc->setup.model, sc->setup.cluster, t, sc->setup.plan, run.gpus);
  if (!s) {
    p.error = s.error().str();
    return p;
  }
  sc->setup = std::move(*s);
  auto out = run_simulation(*sc, SimulateOptions{});
  if (!out) {
    p.error = out.error().str();
    return p;
  }
  const nlohmann::json j = simulate_json(*sc, *out, SimulateOptions{});
  p.fits = j["memory"]["fits"].get<bool>();
  p.peak_gib = j["memory"]["peak_bytes"].get<double>() / (1024.0 * 1024 * 1024);
  p.out = std::move(*out);
  p.ok = true;
  return p;
}

// A run of `model` on `gpus` GPUs of `cluster` with `plan` and `batch`, in today's number formats.
bench::PublishedRun run_of(const std::string& model, const std::string& cluster, int gpus, const std::string& plan,
                           std::int64_t batch) {
  bench::PublishedRun run;
  run.model = model;
  run.cluster = cluster;
  run.gpus = gpus;
  run.plan = plan;
  run.batch = batch;
  return run;
}

Prediction predict(const std::string& model, const std::string& cluster, int gpus, const std::string& plan,
                   std::int64_t batch) {
  return predict(run_of(model, cluster, gpus, plan, batch));
}

// The same as Megatron-LM of 2021 ran it (the Narayanan et al. ablations):
// no asynchronous TP all-reduce, no gradient accumulation fusion, pipeline
// tensors scattered and gathered over TP, every pipeline exchange waited for,
// fp16 weights and main gradients.
Prediction predict_2021(const std::string& model, const std::string& cluster, int gpus, const std::string& plan,
                        std::int64_t batch) {
  bench::PublishedRun run = run_of(model, cluster, gpus, plan + ",tp_grad_overlap=off,grad_accum_fusion=off,pp_scatter_gather=on,overlap_p2p_comm=off", batch);
  run.params_dtype = Dtype::fp16;
  run.grad_dtype = Dtype::fp16;
  return predict(run);
}

// Signed relative errors of a table's rows, by label.
using Errors = std::map<std::string, double>;

// "a-b%": the range of |error| over the given rows (those that ran).
std::string range_of(const Errors& e, std::initializer_list<const char*> labels) {
  double lo = 1e300, hi = -1e300;
  for (const char* l : labels) {
    const auto it = e.find(l);
    if (it == e.end()) continue;
    lo = std::min(lo, std::abs(it->second));
    hi = std::max(hi, std::abs(it->second));
  }
  if (lo > hi) return "?";
  return fmt::format("{:.0f}-{:.0f}%", 100 * lo, 100 * hi);
}

// One markdown row per published run (its TFLOP/s per GPU against the
// predicted `metric`); returns the mean absolute error and the rows that ran,
// and fills `errors`.
template <class Add>
std::pair<double, int> add_rows(Add& add, const std::vector<bench::PublishedRun>& runs, double sim::SimReport::*metric, int digits,
                                Errors& errors) {
  double sum_err = 0;
  int n = 0;
  for (const bench::PublishedRun& run : runs) {
    const Prediction p = predict(run);
    const std::string published = fmt::format("{:.{}f}", run.tflops_per_gpu, digits);
    if (!p.ok) {
      add(fmt::format("| {} | {} | `{}` | {} | {} | error: {} | | |", run.label, run.gpus, run.plan, run.batch, published, p.error));
      continue;
    }
    const double predicted = p.out.report.*metric;
    const double err = (predicted - run.tflops_per_gpu) / run.tflops_per_gpu;
    sum_err += std::abs(err);
    ++n;
    errors[run.label] = err;
    add(fmt::format("| {} | {} | `{}` | {} | {} | {:.1f} | {:+.1f}% | {:.1f} GiB{} |", run.label, run.gpus, run.plan,
                    run.batch, published, predicted, 100 * err, p.peak_gib, p.fits ? "" : " (does not fit)"));
  }
  return {n ? sum_err / n : 0, n};
}

}  // namespace

int main(int argc, char** argv) {
  const std::string ref = argc > 1 ? argv[1] : "tests/reference";
  const auto t0 = std::chrono::steady_clock::now();
  std::string md;
  auto add = [&](const std::string& s) { md += s + "\n"; };
  add("# Validation: predicted vs published throughput");
  add("");
  add("Generated by `scripts/validation-report.sh` (do not edit by hand). Every row is simulated with the");
  add("shipped model, cluster and cost profile, no per-row tuning; the plan is the published one.");
  add("");

  // --- Narayanan Table 1 ---
  add("## Narayanan et al. 2021, Table 1 (A100, `dgx-a100`)");
  add("");
  add("TFLOP/s per GPU as the paper counts them (Eq. 3: hardware FLOPs with full recomputation, no causal halving).");
  add("Plans: the sc21 scripts' tp/pp/mbs/virtual stages as Megatron-LM of 2021 ran them: unfused attention, full");
  add("recomputation of every layer, no asynchronous TP all-reduce (`tp_grad_overlap=off`) and no gradient");
  add("accumulation fusion (`grad_accum_fusion=off`: each micro-batch's weight gradients added to the main");
  add("gradients by a separate kernel; the sc21 code had neither), pipeline tensors sent as 1/tp slices and");
  add("all-gathered over TP after the receive (`pp_scatter_gather=on`, removed in Megatron-Core), every");
  add("pipeline exchange waited for (`overlap_p2p_comm=off` on the interleaved rows: the 2021 code batched each");
  add("step's sends and receives, waited for them and synchronized the device; its 1F1B always waits), PyTorch");
  add("DDP's overlapped gradient all-reduce on the rows that used it (`ddp_impl` torch), and fp16 weights and");
  add("main gradients (the scripts' `--fp16` without `--accumulate-allreduce-grads-in-fp32`).");
  add("");
  add("| model | GPUs | plan | batch | published | predicted | error | peak memory |");
  add("|---|---|---|---|---|---|---|---|");
  Errors a100, h100;
  const auto [mae_a100, rows_a100] =
      add_rows(add, bench::narayanan_table1(ref), &sim::SimReport::hardware_tflops_per_gpu_no_causal, 0, a100);
  add("");
  add(fmt::format("Mean absolute error: **{:.1f}%** over {} rows (target 5%).", 100 * mae_a100, rows_a100));
  add("");

  // --- Narayanan Table 2, PTD-P rows ---
  add("## Narayanan et al. 2021, Table 2, PTD-P rows (A100, `dgx-a100`)");
  add("");
  add("The same paper's comparison with ZeRO-3: GPT-3 175B and the 530B model, each at one global batch on");
  add("three GPU counts (strong scaling), TFLOP/s per GPU as in Table 1. The table gives t x p (96 and 280 with");
  add("t = 8) and the micro-batch; no script for it was published, so the rest follows the paper's other runs of");
  add("the same models and software as above: 530B as its Table 1 row (vpp 3), 175B as the interleaved case of");
  add("Figure 12 (`run_figure_12.sh`: two layers per virtual stage, vpp 4), Megatron's non-overlapped DDP as in");
  add("every pipelined sc21 run. The ZeRO-3 rows are not simulated: Megascope does not model ZeRO-3 sharding.");
  add("");
  add("| model | GPUs | plan | batch | published | predicted | error | peak memory |");
  add("|---|---|---|---|---|---|---|---|");
  Errors a100_t2;
  const auto [mae_t2, rows_t2] =
      add_rows(add, bench::narayanan_table2_ptdp(ref), &sim::SimReport::hardware_tflops_per_gpu_no_causal, 0, a100_t2);
  add("");
  add(fmt::format("Mean absolute error: **{:.1f}%** over {} rows (target 5%).", 100 * mae_t2, rows_t2));
  add("");
  {
    // The strong-scaling slope (four times fewer micro-batches per pipeline
    // from the fewest GPUs to the most), published and predicted, and what the
    // schedule assumed above moves: the same rows without interleaving.
    struct Point {
      double published, predicted, bubble_interleaved, bubble_1f1b;
    };
    std::map<std::string, std::vector<Point>> by_model;   // label -> its rows, by GPUs
    std::string flat;
    for (const bench::PublishedRun& run : bench::narayanan_table2_ptdp(ref)) {
      const Prediction p = predict(run);
      const int pp = run.label == "174.6B" ? 12 : 35, vpp = run.label == "174.6B" ? 4 : 3;
      bench::PublishedRun f = run;
      f.plan = bench::megatron_2021_plan(8, pp, 1, 1, false);
      const Prediction q = predict(f);
      if (!p.ok || !q.ok) continue;
      const double m = static_cast<double>(run.batch) / (run.gpus / (8 * pp));   // micro-batches per pipeline (mbs 1)
      by_model[run.label].push_back({run.tflops_per_gpu, p.out.report.hardware_tflops_per_gpu_no_causal,
                                     (pp - 1) / (vpp * m), (pp - 1) / m});
      const double err = (q.out.report.hardware_tflops_per_gpu_no_causal - run.tflops_per_gpu) / run.tflops_per_gpu;
      flat += fmt::format("{}{} on {} GPUs {:+.1f}%", flat.empty() ? "" : ", ", run.label, run.gpus, 100 * err);
    }
    std::string slopes;
    for (const auto& [label, v] : by_model) {
      if (v.size() < 2) continue;
      slopes += fmt::format("{}{}: published {:+.1f}%, predicted {:+.1f}% (the bubble formula's growth: {:.1f} points "
                            "interleaved, {:.1f} without)",
                            slopes.empty() ? "" : "; ", label, 100 * (v.back().published / v.front().published - 1),
                            100 * (v.back().predicted / v.front().predicted - 1),
                            100 * (v.back().bubble_interleaved - v.front().bubble_interleaved),
                            100 * (v.back().bubble_1f1b - v.front().bubble_1f1b));
    }
    add("From the fewest GPUs to the most (four times fewer micro-batches per pipeline), TFLOP/s per GPU");
    add(fmt::format("change by {}. The", slopes));
    add("published losses are closer to a pipeline without interleaving, whose bubble is (p - 1)/m instead of");
    add(fmt::format("(p - 1)/(v m). Without interleaving (`vpp` 1, everything else as above) the rows would be {}.", flat));
    add("Nothing published says which schedule these runs used, so the table above keeps the paper's other runs'.");
    add("");
  }

  // --- Megatron-LM README H100 ---
  add("## Megatron-LM README, H100 weak scaling (`dgx-h100`)");
  add("");
  add("TFLOP/s per GPU as Megatron-LM counted them in 2024 (model FLOPs, no causal halving). Plans: the table's");
  add("tp/pp/dp with the README's flags (distributed optimizer, overlapped gradient reduce and parameter gather,");
  add("TP communication overlap with sequence parallelism), micro-batch 1, no recomputation.");
  add("");
  add("| model | GPUs | plan | batch | published | predicted | error | peak memory |");
  add("|---|---|---|---|---|---|---|---|");
  const auto [mae_h100, rows_h100] = add_rows(add, bench::megatron_h100(ref), &sim::SimReport::tflops_per_gpu_no_causal, 1, h100);
  add("");
  add(fmt::format("Mean absolute error: **{:.1f}%** over {} rows (target 5%).", 100 * mae_h100, rows_h100));
  add("");

  // --- Ablations ---
  add("## Published ablations (directions)");
  add("");
  add("| claim | setups | predicted | reproduced |");
  add("|---|---|---|---|");
  {
    // Narayanan Fig. 12: GPT-3 175B, 96 GPUs, tp 8 pp 12, interleaved (2 layers per virtual stage) vs 1F1B.
    std::string cells;
    bool all = true;
    for (int batch : {12, 24, 48}) {
      const Prediction a = predict_2021("gpt3-175b", "dgx-a100", 96, "tp=8,pp=12,mbs=1,recompute=full,recompute_method=uniform,recompute_layers=1,attention=unfused", batch);
      const Prediction b = predict_2021("gpt3-175b", "dgx-a100", 96,
                                   "tp=8,pp=12,vpp=4,schedule=interleaved,mbs=1,recompute=full,recompute_method=uniform,recompute_layers=1,attention=unfused", batch);
      if (!a.ok || !b.ok) {
        cells += fmt::format("batch {}: error {} ", batch, a.ok ? b.error : a.error);
        all = false;
        continue;
      }
      const double gain = a.out.report.step_time_s / b.out.report.step_time_s - 1;
      cells += fmt::format("batch {}: {:+.1f}%; ", batch, 100 * gain);
      all = all && gain > 0;
    }
    add(fmt::format("| interleaved beats 1F1B at small batch (Narayanan Fig. 12) | GPT-3 175B, 96 A100, tp 8 pp 12, v 4 | {} | {} |",
                    cells, all ? "yes" : "no"));
  }
  {
    // Narayanan Fig. 13: 162B (32 layers, h 20480), 64 GPUs, tp x pp = 64: best at tp = 8.
    std::string cells;
    double best = 0;
    int best_tp = 0;
    for (int tp : {2, 4, 8, 16, 32}) {
      const std::string model_file = "/tmp/megascope-validation-162b.toml";
      std::ofstream(model_file) << "[model]\nname = \"gpt-162b\"\nnum_layers = 32\nhidden_size = 20480\nffn_hidden_size = 81920\n"
                                   "num_attention_heads = 128\nvocab_size = 51200\nseq_length = 2048\nactivation = \"gelu\"\n"
                                   "norm = \"layernorm\"\nposition_embedding = \"learned\"\nadd_bias_linear = true\n"
                                   "tied_embeddings = true\nhidden_dropout = 0.1\nattention_dropout = 0.1\n";
      const Prediction p = predict_2021(model_file, "dgx-a100", 64,
                                   fmt::format("tp={},pp={},mbs=1,recompute=full,recompute_method=uniform,recompute_layers=1,attention=unfused", tp, 64 / tp), 128);
      if (!p.ok) {
        cells += fmt::format("tp {}: error; ", tp);
        continue;
      }
      const double thr = p.out.report.tokens_per_s;
      cells += fmt::format("tp {}: {:.0f} tok/s; ", tp, thr);
      if (thr > best) {
        best = thr;
        best_tp = tp;
      }
    }
    add(fmt::format("| TP = 8 beats other TP x PP splits of 64 GPUs for the 162B model (Narayanan Fig. 13) | 32 layers, h 20480, batch 128 | {} | {} |",
                    cells, best_tp == 8 ? "yes" : fmt::format("no (best tp {})", best_tp)));
  }
  {
    // Korthikanti et al. 2022 Table 4: selective recomputation (+SP) vs full, GPT-3 175B, tp 8 pp 8, ~30% faster.
    const std::string base = "tp=8,pp=8,mbs=1,sp=on,vpp=3,schedule=interleaved,attention=unfused";
    const Prediction sel = predict("gpt3-175b", "dgx-a100", 64, base + ",recompute=selective", 64);
    const Prediction full = predict("gpt3-175b", "dgx-a100", 64, base + ",recompute=full,recompute_method=uniform,recompute_layers=1", 64);
    if (sel.ok && full.ok) {
      const double gain = full.out.report.step_time_s / sel.out.report.step_time_s - 1;
      add(fmt::format("| selective recomputation beats full by about 30% (Korthikanti Table 4: 175B +29%) | GPT-3 175B, 64 A100, tp 8 pp 8 SP | {:+.1f}% | {} |",
                      100 * gain, gain > 0.2 && gain < 0.4 ? "yes" : "no"));
    } else {
      add(fmt::format("| selective vs full recomputation | GPT-3 175B | error: {} | no |", sel.ok ? full.error : sel.error));
    }
  }
  add("");
  add("## Why the errors are what they are");
  add("");
  add("No table meets the 5% target yet. The errors are systematic, not noise:");
  add("");
  add("- **A100 rows are all over-predicted.** The pipelined rows (39.1B-1T, 12 to 512 micro-batches)");
  add(fmt::format("  by {}; the rows without a pipeline (1.7B-18.4B, one to four micro-batches of 8-16 sequences)",
                  range_of(a100, {"39.1B", "76.1B", "145.6B", "310.1B", "529.6B", "1008.0B"})));
  add(fmt::format("  by {}. The simulator prices every kernel with cuBLASLt/HBM/attention microbenchmarks",
                  range_of(a100, {"1.7B", "3.6B", "7.5B", "18.4B"})));
  add("  measured with CUDA 12 software and adds 1 us per kernel; it does not model the 2021 software's host");
  add("  overheads, the SMs that NCCL kernels take from concurrent compute, or fp16 loss-scaling work.");
  add("  Unfused attention (much of the compute of the smaller models: score matrices of 8-16 sequences)");
  add("  is priced at the rate PyTorch's standard attention reaches on the A100 (fitted to one Azure");
  add("  measurement, docs/cost-model.md 4.5); Megatron's own fused scale-mask-softmax and dropout");
  add("  kernels of 2021 have no published measurement, so how far they differ from it is not known.");
  add("  One known optimistic term remains: the TP all-reduces, not overlapped in 2021 (76.1B: about 2 s of");
  add("  a 14-15 s step), are 67-270 MB, where the NCCL model runs faster than Azure's 8-GPU A100");
  add("  measurements (+7.2% at 64 MiB, +1.1% at 256 MiB, tests/sim/collective_nccl_test.cpp; one LL128");
  add("  fit shared with GB200). The errors grow with the TP degree of the rows without a pipeline (tp 1: +1.9%,");
  add("  tp 8: +9.0%). One candidate, not verified: the kernels TP does not split (norms, dropout, residual adds,");
  add("  replicated without SP) weigh more as TP grows, and their 2021 versions are priced at today's bandwidth");
  add("  fits. Waiting on each pipeline exchange (`overlap_p2p_comm=off`) takes 0.5-1.3 points off the");
  add("  interleaved rows' error against overlapped transfers.");
  add(fmt::format("- **H100 rows split in two.** Small models (1.7B, 7.1B, tp <= 2) are over-predicted by {},",
                  range_of(h100, {"1.7B", "7.1B"})));
  add("  for the same missing per-kernel overheads, which weigh most when GEMMs are small. Rows with");
  add(fmt::format("  tp = 8 and pp <= 2 (32B, 70B) are under-predicted by {}: with only 4 micro-batches per",
                  range_of(h100, {"32B", "70B"})));
  add("  iteration most of the fp32 gradient reduce-scatter over one 400 Gb/s NIC per GPU cannot hide");
  add("  behind the last backward. Either those runs moved fewer bytes (bf16 gradient reduction, larger");
  add("  buckets started earlier) or NCCL reached more bandwidth than one rail; the README does not say.");
  {
    // Nor does it give the micro-batch size (1 is assumed above): how much
    // that choice moves the rows under-predicted, two sequences per
    // micro-batch (half as many micro-batches, a longer last backward).
    std::string moved;
    for (const bench::PublishedRun& run : bench::megatron_h100(ref)) {
      if (run.label != "32B" && run.label != "70B") continue;
      bench::PublishedRun two = run;
      const auto at = two.plan.find("mbs=1");
      if (at == std::string::npos) continue;
      two.plan.replace(at, 5, "mbs=2");
      const Prediction p = predict(two);
      if (!p.ok) continue;
      const double err = (p.out.report.tflops_per_gpu_no_causal - run.tflops_per_gpu) / run.tflops_per_gpu;
      moved += fmt::format("{}{} {:+.1f}%", moved.empty() ? "" : ", ", run.label, 100 * err);
    }
    if (!moved.empty()) {
      add("  Nor does it give the micro-batch size; one sequence is assumed. With two (`mbs=2`: half as many");
      add(fmt::format("  micro-batches, a longer last backward to hide the reduce-scatter) the errors would be {}.", moved));
      add("  The table is not tuned to that: nothing says which the runs used.");
    }
  }
  {
    const std::string r = range_of(h100, {"16B", "119B", "177B", "314B", "462B"});
    add(fmt::format("  The other rows (16B, 119B-462B) are within {}.", r.substr(r.find('-') + 1)));
  }
  add("- **Interleaving.** The pipelined A100 rows the sc21 scripts ran interleaved (76.1B-529.6B) are");
  add(fmt::format("  over-predicted by {}, those they ran without (39.1B, 1T) by {}; Table 2's strong-scaling",
                  range_of(a100, {"76.1B", "145.6B", "310.1B", "529.6B"}), range_of(a100, {"39.1B", "1008.0B"})));
  add("  losses are larger than simulated (above); and the simulated interleaving gain of");
  add("  Figure 12 is larger than the paper's \"10+%\" at the smallest batch. All three point the same way: the");
  add("  2021 interleaved schedule gained less over 1F1B than the simulator's does. What it lost is not known: the");
  add("  simulator already waits on each of its v times as many pipeline exchanges.");
  add("- The published ablations are reproduced in direction.");
  add("");
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  add(fmt::format("_Report generated in {:.1f} s._", wall));
  std::fputs(md.c_str(), stdout);
  return 0;
}
