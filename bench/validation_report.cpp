// validation_report: predicts the published runs of tests/reference/ with
// the simulator, with no per-row tuning, and writes docs/validation.md
// (markdown on stdout). Run it with scripts/validation-report.sh.
//
//   Narayanan et al. 2021 Table 1: GPT 1.7B-1T on up to 3072 A100s. Plans
//     from the paper's reproduction script: tp, pp, micro-batch, interleaving
//     where the script sets it, full (uniform) recomputation. Compared:
//     TFLOP/s per GPU counted as the paper does (Eq. 3: with recomputation,
//     no causal halving).
//   Narayanan et al. 2021 Table 2, its PTD-P rows: GPT-3 175B and 530B at
//     three GPU counts each, in the same 2021 software (published.hpp says
//     which settings follow which of the paper's scripts).
//   Megatron-LM README (2024): GPT 1.7B-462B on up to 6144 H100s, with the
//     README's flags: distributed optimizer, overlapped gradient reduce and
//     parameter gather, TP communication overlap (so sequence parallelism).
//     Compared: TFLOP/s per GPU as Megatron-LM counted then (model FLOPs,
//     no causal halving).
// Ablations the papers report, checked as directions. The predictions come
// from published_predict.hpp, which tests/apps/validation_test.cpp shares.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "config/library.hpp"
#include "config/plan_settings.hpp"
#include "sim/cost_model.hpp"
#include "published_predict.hpp"
#include "validation_sections.hpp"

using namespace megascope;
using namespace megascope::cli;
namespace fs = std::filesystem;

namespace {

using bench::Prediction;
using bench::predict;

// Signed relative errors of a table's rows, by label.
using Errors = std::map<std::string, double>;

// "label +x%, ...": the signed errors of the given rows (all when `labels`
// is empty), in the table's order of labels.
std::string signed_list(const Errors& e, std::initializer_list<const char*> labels = {}) {
  std::string out;
  const auto one = [&](const std::string& label, double err) {
    out += fmt::format("{}{} {:+.1f}%", out.empty() ? "" : ", ", label, 100 * err);
  };
  if (labels.size() == 0) {
    std::vector<std::pair<double, std::string>> by_size;   // labels are sizes ("1.7B"): order by number
    for (const auto& [label, err] : e) by_size.emplace_back(std::stod(label), label);
    std::sort(by_size.begin(), by_size.end());
    for (const auto& [size, label] : by_size) one(label, e.at(label));
  } else {
    for (const char* l : labels)
      if (const auto it = e.find(l); it != e.end()) one(l, it->second);
  }
  return out;
}

// A sensitivity: the given rows (all when `labels` is empty) simulated with
// a cost-profile overlay (a calibration file's text, laid over the shipped
// profile as simulate --calibration does), against `shipped`, the table's
// errors. Returns "label +x% (from +y%), ..." and the overlay's mean
// absolute error over the rows that ran.
std::pair<std::string, double> with_overlay(const std::vector<bench::PublishedRun>& runs, const Errors& shipped,
                                            const std::vector<std::string>& labels, const std::string& overlay,
                                            double sim::SimReport::*metric = &sim::SimReport::tflops_per_gpu_no_causal) {
  const bench::TempFile file("megascope-validation-overlay.toml", overlay);
  std::string moved;
  double sum = 0;
  int n = 0;
  for (const bench::PublishedRun& run : runs) {
    if (!labels.empty() && std::find(labels.begin(), labels.end(), run.label) == labels.end()) continue;
    const auto before = shipped.find(run.label);
    const Prediction p = predict(run, file.path());
    if (!p.ok || before == shipped.end()) continue;
    const double err = (p.out.report.*metric - run.tflops_per_gpu) / run.tflops_per_gpu;
    moved += fmt::format("{}{} {:+.1f}% (from {:+.1f}%)", moved.empty() ? "" : ", ", run.label, 100 * err,
                         100 * before->second);
    sum += std::abs(err);
    ++n;
  }
  return {moved, n ? sum / n : 0.0};
}

// One markdown row per published run (its TFLOP/s per GPU against the
// predicted `metric`); returns the mean absolute error and the rows that ran,
// and fills `errors` and, if given, `predicted` (per run, in order; nullopt
// where the simulation failed).
template <class Add>
std::pair<double, int> add_rows(Add& add, const std::vector<bench::PublishedRun>& runs, double sim::SimReport::*metric, int digits,
                                Errors& errors, std::vector<std::optional<double>>* predicted_out = nullptr) {
  double sum_err = 0;
  int n = 0;
  for (const bench::PublishedRun& run : runs) {
    const Prediction p = predict(run);
    if (predicted_out) predicted_out->push_back(p.ok ? std::optional<double>(p.out.report.*metric) : std::nullopt);
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

// A run of megatron_2021_plan without interleaving, everything else as run
// (the interleaving options come last in its plan string).
bench::PublishedRun without_interleaving(const bench::PublishedRun& run) {
  bench::PublishedRun f = run;
  if (const auto at = f.plan.find(",vpp="); at != std::string::npos) f.plan.resize(at);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string ref = argc > 1 ? argv[1] : "tests/reference";
  // `validation_report REF - moe`: the MoE section alone, on standard output.
  if (argc > 3 && std::string(argv[3]) == "moe") {
    fmt::print("{}", moe_section(ref));
    return 0;
  }
  // `validation_report REF - schedules`: the pipeline-schedule section alone.
  if (argc > 3 && std::string(argv[3]) == "schedules") {
    fmt::print("{}", schedules_section(ref));
    return 0;
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::string md;
  auto add = [&](const std::string& s) { md += s + "\n"; };
  add("# Validation: predicted vs published throughput");
  add("");
  add("Generated by `scripts/validation-report.sh` (do not edit by hand). Every row is simulated with the");
  add("shipped model, cluster and cost profile, no per-row tuning; the plan is the published one, and where a");
  add("publication leaves part of it unsaid, its section says what is assumed.");
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
  add("every pipelined sc21 run. The ZeRO-3 rows are in the section on sharded data parallelism below.");
  add("");
  add("| model | GPUs | plan | batch | published | predicted | error | peak memory |");
  add("|---|---|---|---|---|---|---|---|");
  Errors a100_t2;
  const std::vector<bench::PublishedRun> table2 = bench::narayanan_table2_ptdp(ref);
  std::vector<std::optional<double>> predicted_t2;
  const auto [mae_t2, rows_t2] =
      add_rows(add, table2, &sim::SimReport::hardware_tflops_per_gpu_no_causal, 0, a100_t2, &predicted_t2);
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
    for (std::size_t i = 0; i < table2.size(); ++i) {
      const bench::PublishedRun& run = table2[i];
      const auto plan = parse_inline_plan(run.plan);
      const Prediction q = predict(without_interleaving(run));
      if (!predicted_t2[i] || !plan || !q.ok) continue;
      const int pp = plan->pp, vpp = plan->vpp.value_or(1);
      const double m = static_cast<double>(run.batch) /
                       (run.gpus / (plan->tp * pp) * plan->micro_batch_size);   // micro-batches per pipeline
      by_model[run.label].push_back({run.tflops_per_gpu, *predicted_t2[i], (pp - 1) / (vpp * m), (pp - 1) / m});
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

  md += sharding_section(ref);
  md += shoeybi_section();

  // --- Megatron-LM README H100 ---
  add("## Megatron-LM README, H100 weak scaling (`dgx-h100`)");
  add("");
  add("TFLOP/s per GPU as Megatron-LM counted them in 2024 (model FLOPs, no causal halving). The table gives tp, pp,");
  add("dp and the batch, its text the flags (distributed optimizer, overlapped gradient reduce and parameter gather,");
  add("TP communication overlap with sequence parallelism); neither gives the micro-batch size or the pipeline");
  add("schedule. Plans: those fixed, no recomputation, and the micro-batch size and schedule (1F1B, or interleaved");
  add("with any number of virtual stages) the planner picks (`plan --tp .. --pp .. --dp .. --cp 1 --zero 1 --hsdp off");
  add("--recompute none` with the flags fixed; `tuned` in `bench/published_predict.hpp`), as whoever ran the");
  add("benchmark tuned them. The pick is made once, with the shipped cost profile.");
  add("");
  add("| model | GPUs | plan | batch | published | predicted | error | peak memory |");
  add("|---|---|---|---|---|---|---|---|");
  const auto [mae_h100, rows_h100] = add_rows(add, bench::megatron_h100_tuned(ref), &sim::SimReport::tflops_per_gpu_no_causal, 1, h100);
  add("");
  add(fmt::format("Mean absolute error: **{:.1f}%** over {} rows (target 5%).", 100 * mae_h100, rows_h100));
  add("");
  {
    // The plans as far as the table states them: one sequence per
    // micro-batch and 1F1B, a sensitivity.
    std::string stated;
    double sum = 0, signed_sum = 0;
    int n = 0;
    for (const bench::PublishedRun& run : bench::megatron_h100(ref)) {
      const Prediction p = predict(run);
      if (!p.ok) continue;
      const double err = (p.out.report.tflops_per_gpu_no_causal - run.tflops_per_gpu) / run.tflops_per_gpu;
      stated += fmt::format("{}{} {:+.1f}%", stated.empty() ? "" : ", ", run.label, 100 * err);
      sum += std::abs(err);
      signed_sum += err;
      ++n;
    }
    if (n > 0) {
      add("Why tuned: with one sequence per micro-batch and 1F1B instead, the rows would be");
      add(fmt::format("{} (mean absolute error {:.1f}%, signed {:+.1f}%). Each batch leaves 4 micro-batches of", stated,
                      100 * sum / n, 100 * signed_sum / n));
      add("one sequence per pipeline stage, so at tp 8 most of the fp32 gradient reduce-scatter over one 400 Gb/s NIC");
      add("per GPU cannot hide behind the last backward, and 1F1B's bubble ((p - 1)/(m + p - 1), 19% at the 462B row's");
      add("16 stages) alone would hold the pipelined rows below the published MFU. The published figures are out of");
      add("reach of such plans.");
      add("");
    }
  }

  md += strong_scaling_section();

  // --- Megatron-Bridge / NeMo dense rows, and the sustained clocks fitted to them ---
  md += bridge_nemo_section(ref);
  md += sustained_clock_section(ref);
  md += moe_section(ref);

  md += interference_section(ref);

  // --- Qi et al. 2024 Table 9: per-stage F, B, W ---
  double fitted_fwd = 0, shipped_fwd = 0;
  std::pair<std::string, double> t1_unit, t2_unit;   // Tables 1 and 2 at forward_efficiency 1
  {
    const std::vector<bench::StageTimeRow> rows = bench::zero_bubble_stage_times(ref);
    const std::string unit_overlay = "[passes]\nforward_efficiency = 1\n";
    const bench::TempFile unit_file("megascope-validation-unit-forward.toml", unit_overlay);
    const bench::TempFile zb_model("megascope-validation-zb.toml", "");
    std::vector<bench::StageTimes> unit, shipped;
    double lo_flash_b = 1e300, hi_flash_b = -1e300;   // B's error with fused attention priced instead
    for (const bench::StageTimeRow& row : rows) {
      unit.push_back(bench::zero_bubble_stage(row, zb_model.path(), unit_file.path()));
      shipped.push_back(bench::zero_bubble_stage(row, zb_model.path()));
      const bench::StageTimes flash = bench::zero_bubble_stage(row, zb_model.path(), std::nullopt, "flash");
      if (flash.ok) {
        lo_flash_b = std::min(lo_flash_b, flash.b_s / row.b_s - 1);
        hi_flash_b = std::max(hi_flash_b, flash.b_s / row.b_s - 1);
      }
    }
    if (auto e = bench::fitted_forward_efficiency(rows, unit)) fitted_fwd = *e;
    if (auto a100_cluster = resolve_cluster("dgx-a100"))
      if (auto a100_cost = sim::CostModel::for_device(a100_cluster->device)) shipped_fwd = a100_cost->forward_efficiency();
    add("## Per-stage compute: Qi et al. 2024, Table 9 (A100, `dgx-a100`)");
    add("");
    add("The forward (F), input-gradient (B) and weight-gradient (W) time of one micro-batch on one pipeline stage,");
    add("as the zero-bubble paper's Megatron-LM fork profiled them on A100 80GB (ms): GPTs of 1024 tokens from its");
    add("Table 3, tp 1, one GPU per stage, ZB-H1 (B and W apart), fp16, one fewer layer on the first and last stages");
    add("(as the fork recommends); predicted for a middle stage with Megatron-LM's unfused attention (the paper does");
    if (lo_flash_b <= hi_flash_b)
      add(fmt::format("not say which attention ran; with fused attention priced instead, B would be {:+.0f}% to {:+.0f}%).",
                      100 * lo_flash_b, 100 * hi_flash_b));
    else
      add("not say which attention ran; priced with fused attention instead, the rows failed).");
    add("");
    add("| model | stages | micro-batches x size | F published | F predicted | error | B published | B predicted | error | W published | W predicted | error |");
    add("|---|---|---|---|---|---|---|---|---|---|---|---|");
    double sum_f = 0, sum_b = 0, sum_w = 0;
    double sum_f1 = 0, signed_f1 = 0, lo_f1 = 1e300, hi_f1 = -1e300;   // F's error at forward_efficiency 1
    int n = 0, n1 = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const bench::StageTimeRow& r = rows[i];
      const bench::StageTimes& t = shipped[i];
      if (!t.ok) {
        add(fmt::format("| {} | {} | {} x {} | error: {} | | | | | | | | |", r.model, r.pp, r.microbatches, r.mbs, t.error));
        continue;
      }
      const double ef = t.f_s / r.f_s - 1, eb = t.b_s / r.b_s - 1, ew = t.w_s / r.w_s - 1;
      sum_f += std::abs(ef);
      sum_b += std::abs(eb);
      sum_w += std::abs(ew);
      if (unit[i].ok) {
        const double e1 = unit[i].f_s / r.f_s - 1;
        sum_f1 += std::abs(e1);
        signed_f1 += e1;
        lo_f1 = std::min(lo_f1, e1);
        hi_f1 = std::max(hi_f1, e1);
        ++n1;
      } else {
        add(fmt::format("| {} | {} | {} x {} | (at forward_efficiency 1: error: {}) | | | | | | | | |", r.model, r.pp,
                        r.microbatches, r.mbs, unit[i].error));
      }
      ++n;
      add(fmt::format("| {} | {} | {} x {} | {:.2f} | {:.2f} | {:+.1f}% | {:.2f} | {:.2f} | {:+.1f}% | {:.2f} | {:.2f} | {:+.1f}% |",
                      r.model, r.pp, r.microbatches, r.mbs, 1e3 * r.f_s, 1e3 * t.f_s, 100 * ef, 1e3 * r.b_s, 1e3 * t.b_s,
                      100 * eb, 1e3 * r.w_s, 1e3 * t.w_s, 100 * ew));
    }
    add("");
    if (n > 0)
      add(fmt::format("Mean absolute error: F {:.1f}%, B {:.1f}%, W {:.1f}% over {} rows.", 100 * sum_f / n, 100 * sum_b / n,
                      100 * sum_w / n, n));
    add("");
    add("W is GEMMs alone, so it checks the GEMM fit (section 4.1 of `docs/cost-model.md`) on training's shapes;");
    add("B adds the attention core's and the element-wise kernels' backwards. Neither is fitted.");
    if (n1 > 0) {
      add(fmt::format("Priced at their kernels alone, the forward passes come out {:.1f}% {} on average (by row {:+.1f}% to",
                      100 * std::abs(signed_f1 / n1), signed_f1 < 0 ? "under" : "over", 100 * lo_f1));
      add(fmt::format("{:+.1f}%; mean absolute error {:.1f}%). What a forward costs beyond its kernels is not known. The fork",
                      100 * hi_f1, 100 * sum_f1 / n1));
      add("times each pass with Megatron-LM's timers, which synchronize the device at start and stop, so host time the");
      add("GPU waits on is counted; Megatron-LM's forward runs in Python, its backward mostly in autograd's C++ engine.");
    }
    if (fitted_fwd > 0)
      add(fmt::format("The `a100` profile prices forward passes (and full recomputation's second forward) at `[passes]"
                      " forward_efficiency` = {:.3f} of their kernels' speed; fitted to these forward times: {:.3f}. The",
                      shipped_fwd, fitted_fwd));
    else
      add(fmt::format("The `a100` profile prices forward passes at `[passes] forward_efficiency` = {:.3f}; the fit to these"
                      " rows failed (above). The", shipped_fwd));
    add("other profiles have no such measurement and keep 1. The 12 rows are 4 models at 3 micro-batch counts each, which");
    add("a stage's times do not depend on: 4 points for one parameter.");
    t1_unit = with_overlay(bench::narayanan_table1(ref), a100, {}, unit_overlay, &sim::SimReport::hardware_tflops_per_gpu_no_causal);
    t2_unit = with_overlay(table2, a100_t2, {}, unit_overlay, &sim::SimReport::hardware_tflops_per_gpu_no_causal);
    add(fmt::format("At 1 (kernels alone) Table 1's mean absolute error would be {:.1f}% (from {:.1f}%) and Table 2's {:.1f}%",
                    100 * t1_unit.second, 100 * mae_a100, 100 * t2_unit.second));
    add(fmt::format("(from {:.1f}%).", 100 * mae_t2));
    add("");
  }

  md += schedules_section(ref);

  // --- Ablations ---
  add("## Published ablations (directions)");
  add("");
  add("| claim | setups | predicted | reproduced |");
  std::vector<std::string> reproduced, missed;   // the claims, for the summary below
  const auto tally = [&](bool ok, const char* claim) { (ok ? reproduced : missed).push_back(claim); };
  add("|---|---|---|---|");
  {
    // Narayanan Fig. 12: GPT-3 175B, 96 GPUs, tp 8 pp 12, interleaved (2 layers per virtual stage) vs 1F1B.
    std::string cells;
    bool all = true;
    for (int batch : {12, 24, 48}) {
      std::string error;
      const std::optional<double> gain = bench::interleaving_gain(batch, &error);
      if (!gain) {
        cells += fmt::format("batch {}: error {} ", batch, error);
        all = false;
        continue;
      }
      cells += fmt::format("batch {}: {:+.1f}%; ", batch, 100 * *gain);
      all = all && *gain > 0;
    }
    add(fmt::format("| interleaved beats 1F1B at small batch (Narayanan Fig. 12) | GPT-3 175B, 96 A100, tp 8 pp 12, v 4 | {} | {} |",
                    cells, all ? "yes" : "no"));
    tally(all, "interleaving ahead at small batch (Fig. 12)");
  }
  {
    // Narayanan on Fig. 12: without scatter/gather, 1F1B beats the interleaved schedule at large batch.
    std::string cells;
    bool ok = true;
    for (int batch : {12, 60}) {
      const std::optional<double> gain = bench::interleaving_gain(batch, nullptr, false);
      cells += gain ? fmt::format("batch {}: {:+.1f}%; ", batch, 100 * *gain) : fmt::format("batch {}: error; ", batch);
      ok = ok && gain;
      if (gain && batch == 60) ok = ok && *gain < 0;
    }
    add(fmt::format("| without scatter/gather, 1F1B beats interleaved at large batch (Narayanan, text on Fig. 12) | the same, "
                    "pipeline tensors sent whole; interleaved over 1F1B | {} | {} |",
                    cells, ok ? "yes" : "no: interleaved stays ahead at batch 60"));
    tally(ok, "1F1B ahead at large batch without scatter/gather (text on Fig. 12)");
  }
  const auto sweep_cells = [](const bench::Sweep& sweep, const char* name, const char* unit) {
    std::string cells;
    for (const auto& [value, thr] : sweep)
      cells += thr ? fmt::format("{} {}: {:.0f}{}; ", name, value, *thr, unit) : fmt::format("{} {}: error; ", name, value);
    return cells;
  };
  const std::string model_file = "/tmp/megascope-validation-ablation.toml";
  {
    // Narayanan Fig. 13: 162B (32 layers, h 20480), 64 GPUs, tp x pp = 64: best at tp = 8.
    const bench::Sweep sweep = bench::tp_split_throughputs(model_file);
    const int best_tp = bench::best_of(sweep);
    add(fmt::format("| TP = 8 beats other TP x PP splits of 64 GPUs for the 162B model (Narayanan Fig. 13) | 32 layers, h 20480, batch 128 | {} | {} |",
                    sweep_cells(sweep, "tp", " tok/s"), best_tp == 8 ? "yes" : fmt::format("no (best tp {})", best_tp)));
    tally(best_tp == 8, "TP 8 for the 162B model (Fig. 13)");
  }
  {
    // Narayanan Fig. 14: 5.9B, 64 GPUs, tp 1, pp x dp = 64: throughput falls as pp grows.
    std::string cells;
    bool all = true;
    for (int batch : {32, 512}) {
      const bench::Sweep sweep = bench::pp_dp_throughputs(model_file, batch);
      cells += fmt::format("batch {}: {}", batch, sweep_cells(sweep, "pp", ""));
      all = all && bench::falling(sweep);
    }
    add(fmt::format("| throughput falls as pp grows, dp = 64 / pp (Narayanan Fig. 14) | 5.9B (32 layers, h 3840), 64 A100, tp 1, mbs 1; tok/s | "
                    "{} | {} |",
                    cells, all ? "yes" : "no"));
    tally(all, "throughput falling with pp (Fig. 14)");
  }
  {
    // Narayanan Fig. 15: 5.9B, 64 GPUs, pp 1, tp x dp = 64: throughput falls as tp grows.
    std::string cells;
    bool all = true;
    for (int batch : {32, 128, 512}) {
      const bench::Sweep sweep = bench::tp_dp_throughputs(model_file, batch);
      cells += fmt::format("batch {}: {}", batch, sweep_cells(sweep, "tp", ""));
      all = all && bench::falling(sweep);
    }
    add(fmt::format("| throughput falls as tp grows, dp = 64 / tp (Narayanan Fig. 15) | 5.9B, 64 A100, pp 1, mbs 1; tok/s | {} | {} |", cells,
                    all ? "yes" : "no"));
    tally(all, "throughput falling with tp (Fig. 15)");
  }
  {
    // Narayanan Fig. 16: 91B, (t, p) = (8, 8), 64 GPUs: the best micro-batch size is 2.
    std::string cells;
    std::string verdict;
    for (int batch : {128, 512}) {
      const bench::Sweep sweep = bench::microbatch_throughputs(model_file, batch);
      cells += fmt::format("batch {}: {}", batch, sweep_cells(sweep, "mbs", ""));
      const int best = bench::best_of(sweep);
      if (best != 2) verdict += fmt::format("{}batch {}: best mbs {}", verdict.empty() ? "" : ", ", batch, best);
      if (best != 2 && best != 0) {
        const auto at = [&](int mbs) {
          for (const auto& [v, thr] : sweep)
            if (v == mbs) return *thr;
          return 0.0;
        };
        verdict += fmt::format(" ({:.1f}% above mbs 2)", 100 * (at(best) / at(2) - 1));
      }
    }
    add(fmt::format("| the best micro-batch size is 2 (Narayanan Fig. 16) | 91B (32 layers, h 15360), 64 A100, tp 8 pp 8; tok/s | {} | {} |", cells,
                    verdict.empty() ? "yes" : "no: " + verdict));
    tally(verdict.empty(), "the best micro-batch size, 2 (Fig. 16)");
  }
  std::filesystem::remove(model_file);
  {
    // Narayanan Fig. 18: scatter/gather of pipeline tensors, GPT-3 175B on 96 GPUs, interleaved: up to 11% faster.
    std::string cells;
    double most = 0;
    bool all = true;
    for (int batch : {12, 36, 60}) {
      const std::optional<double> gain = bench::scatter_gather_gain(batch);
      cells += gain ? fmt::format("batch {}: {:+.1f}%; ", batch, 100 * *gain) : fmt::format("batch {}: error; ", batch);
      all = all && gain && *gain > 0;
      if (gain) most = std::max(most, *gain);
    }
    add(fmt::format("| scatter/gather of pipeline tensors gains up to 11% (Narayanan Fig. 18) | GPT-3 175B, 96 A100, tp 8 pp 12, v 4 | {} | {} |",
                    cells, all ? fmt::format("in direction; up to {:.1f}% against 11%", 100 * most) : "no"));
    tally(all, "a gain from scatter/gather (Fig. 18)");
    tally(all && most > 0.09 && most < 0.13, "scatter/gather's 11% (Fig. 18)");
  }
  {
    // Korthikanti et al. 2022 Table 4: selective recomputation (+SP) vs full, GPT-3 175B, tp 8 pp 8, ~30% faster.
    std::string error;
    const std::optional<double> gain = bench::selective_recompute_gain(&error);
    if (gain) {
      add(fmt::format("| selective recomputation beats full by about 30% (Korthikanti Table 4: 175B +29%) | GPT-3 175B, 64 A100, tp 8 pp 8 SP | {:+.1f}% | {} |",
                      100 * *gain, *gain > 0.2 && *gain < 0.4 ? "yes" : "no"));
      tally(*gain > 0.2 && *gain < 0.4, "selective recomputation's 30% (Korthikanti)");
    } else {
      tally(false, "selective recomputation's 30% (Korthikanti)");
      add(fmt::format("| selective vs full recomputation | GPT-3 175B | error: {} | no |", error));
    }
  }
  add("");
  add("## Why the errors are what they are");
  add("");
  {
    std::vector<std::string> met, missed_tables;
    (mae_a100 <= 0.05 ? met : missed_tables).push_back(fmt::format("Narayanan Table 1 ({:.1f}%)", 100 * mae_a100));
    (mae_t2 <= 0.05 ? met : missed_tables).push_back(fmt::format("Narayanan Table 2 ({:.1f}%)", 100 * mae_t2));
    (mae_h100 <= 0.05 ? met : missed_tables).push_back(fmt::format("the H100 table ({:.1f}%)", 100 * mae_h100));
    const auto join = [](const std::vector<std::string>& v) {
      std::string out;
      for (std::size_t i = 0; i < v.size(); ++i) out += (i == 0 ? "" : i + 1 == v.size() ? " and " : ", ") + v[i];
      return out;
    };
    if (missed_tables.empty())
      add(fmt::format("Every table meets the 5% target: {}.", join(met)));
    else if (met.empty())
      add(fmt::format("No table meets the 5% target yet: {}. The errors are systematic, not noise:", join(missed_tables)));
    else
      add(fmt::format("{} meet{} the 5% target; {} do{} not. The errors are systematic, not noise:", join(met),
                      met.size() == 1 ? "s" : "", join(missed_tables), missed_tables.size() == 1 ? "es" : ""));
  }
  add("");
  add(fmt::format("- **A100 rows.** Table 1's rows are {}; Table 2's are in its table above.", signed_list(a100)));
  add(fmt::format("  With every kernel priced from microbenchmarks alone they were over-predicted ({:.1f}% and {:.1f}% mean",
                  100 * t1_unit.second, 100 * t2_unit.second));
  add("  absolute error); the A100 profile now prices forward passes (and their recomputation, every layer's here)");
  add(fmt::format("  at {:.3f} of their kernels' speed, as Qi et al. measured forward passes on A100s (the per-stage section", shipped_fwd));
  add("  above). That measurement comes from 2023's Megatron-LM, not the 2021 code these runs used, and what the");
  add("  forward costs beyond its kernels is not known. The value was fitted to Qi et al.'s times, not to these rows;");
  add("  that it is one factor on the whole pass, rather than a cost on one kind of kernel, was chosen with these rows");
  add("  in view (docs/cost-model.md 4.7).");
  add("  The simulator does not model the 2021 software's host overheads, the SMs that NCCL kernels take from");
  add("  concurrent compute, or fp16 loss-scaling work. Unfused attention (much of the compute of the smaller");
  add("  models: score matrices of 8-16 sequences) is priced at the rate PyTorch's standard attention reaches on");
  add("  the A100 (fitted to one Azure measurement, docs/cost-model.md 4.5), Megatron's own fused");
  add("  scale-mask-softmax and dropout kernels at the same rate. The TP all-reduces, not overlapped in 2021");
  add("  (76.1B: about 2 s of a 14-15 s step), are 67-270 MB, where the NCCL model runs faster than Azure's");
  add("  8-GPU A100 measurements (+7.2% at 64 MiB, +1.1% at 256 MiB, tests/sim/collective_nccl_test.cpp; one");
  add("  LL128 fit shared with GB200). Waiting on each pipeline exchange (`overlap_p2p_comm=off`) takes 0.5-1.3");
  add("  points off the interleaved rows' error against overlapped transfers.");
  // Measured once on one H100 SXM (2026-11-27) with bench/torch_gpt_reference.py:
  // figures of that run, quoted, not computed here. The simulator's side is
  // computed: the 1.7B row's compute per micro-batch (its one stage's busy
  // time over its micro-batches) and the profile's fused attention rates.
  double sim_ms = 0;
  for (const bench::PublishedRun& run : bench::megatron_h100(ref))
    if (run.label == "1.7B") {
      const Prediction p = predict(run);
      if (p.ok && !p.out.report.stages.empty() && p.out.program.microbatches > 0)
        sim_ms = 1e3 * p.out.report.stages.front().compute_busy_s / p.out.program.microbatches;
    }
  const auto h100_cluster = resolve_cluster("dgx-h100");
  const auto h100_cost = h100_cluster ? sim::CostModel::for_device(h100_cluster->device)
                                      : Result<sim::CostModel>(tl::unexpected(h100_cluster.error()));
  double fwd_tf = 0, bwd_tf = 0, fwd_drop_tf = 0, bwd_drop_tf = 0;
  if (h100_cost) {
    const sim::CostProfile& cp = h100_cost->profile();
    const double peak = h100_cost->device().peak_bf16_flops / 1e12;
    fwd_tf = peak * cp.attention_fwd_efficiency;
    bwd_tf = peak * cp.attention_bwd_efficiency;
    fwd_drop_tf = fwd_tf * cp.attention_fwd_dropout_factor;
    bwd_drop_tf = bwd_tf * cp.attention_bwd_dropout_factor;
  }
  add("- **H100 rows, one GPU's kernels.** Measured on one H100, kernel launches do not bound a plain implementation of these models: PyTorch");
  add("  2.11 running the 1.7B model (eager, bf16, cuDNN flash attention with dropout, unfused element-wise kernels;");
  add("  `bench/torch_gpt_reference.py`) spends 96% of a micro-batch's 98.6-99.5 ms in GPU kernels (1,569");
  add("  kernels, 60 us each on average; one GPU's share of the 7.1B row at tp 2: 98%). Those kernels take");
  add(fmt::format("  94.4-96.0 ms, and the simulator prices the micro-batch's compute at {:.1f} ms (one sequence): above the", sim_ms));
  add("  measured kernels by the fitted Hopper sustained clock, which takes up what the published runs spend");
  add("  beyond one GPU's kernels of a plain implementation (host work, NCCL kernels beside GEMMs, the optimizer).");
  add("  Attention dropout is priced from a measurement: the same H100's cuDNN fused attention (SDPA,");
  add("  seq 4096, head dim 128, causal, 16-64 heads; `ATTENTION=1 bench/torch_gpt_reference.py`) runs its");
  add("  forward at 460-585 TFLOP/s without dropout and 220-272 with dropout 0.1, its backward at 388-474 and");
  add("  321-395; the H100 profile prices cuDNN's attention from the same measurement (its size curve,");
  add("  docs/cost-model.md) and applies those ratios (forward x 0.474, backward x 0.820): at large calls and");
  add(fmt::format("  the measurement's clock, {:.0f} forward and {:.0f} backward TFLOP/s without dropout, {:.0f} and {:.0f} with it",
                  fwd_tf, bwd_tf, fwd_drop_tf, bwd_drop_tf));
  add("  (these rows' models assume Megatron-LM's default attention dropout, 0.1).");
  {
    const auto [moved, mae] = with_overlay(bench::megatron_h100_tuned(ref), h100, {},
                                           "[profile]\nsource = \"attention dropout not priced\"\n"
                                           "[attention]\nfwd_dropout_factor = 1\nbwd_dropout_factor = 1\n");
    if (!moved.empty())
      add(fmt::format("  With dropout not priced (both factors 1) the rows would be {} (mean absolute error {:.1f}%).", moved,
                      100 * mae));
  }
  {
    // Gradients reduced in bf16 (Megatron-LM's --grad-reduce-in-bf16; fp32
    // is its default with bf16 weights), every row, as a sensitivity.
    std::string moved;
    double sum = 0;
    int n = 0;
    for (const bench::PublishedRun& run : bench::megatron_h100_tuned(ref)) {
      bench::PublishedRun half = run;
      half.grad_dtype = Dtype::bf16;
      const Prediction p = predict(half);
      if (!p.ok) continue;
      const double err = (p.out.report.tflops_per_gpu_no_causal - run.tflops_per_gpu) / run.tflops_per_gpu;
      moved += fmt::format("{}{} {:+.1f}%", moved.empty() ? "" : ", ", run.label, 100 * err);
      sum += std::abs(err);
      ++n;
    }
    if (n > 0) {
      add("  With the gradients reduced in bf16 instead (`--grad-reduce-in-bf16`; fp32 is Megatron-LM's default");
      add(fmt::format("  with bf16 weights), the same plans would be {} (mean absolute error {:.1f}%).", moved, 100 * sum / n));
    }
  }
  add("- **Interleaving.** The pipelined A100 rows the sc21 scripts ran interleaved (76.1B-529.6B) are");
  add(fmt::format("  predicted {}, those they ran without (39.1B, 1T) {}; Table 2's strong-scaling",
                  signed_list(a100, {"76.1B", "145.6B", "310.1B", "529.6B"}), signed_list(a100, {"39.1B", "1008.0B"})));
  add("  losses are larger than simulated (above); and the simulated interleaving gain of");
  add("  Figure 12 is larger than the paper's \"10+%\" at the smallest batch. All three point the same way: the");
  add("  2021 interleaved schedule gained less over 1F1B than the simulator's does. What it lost is not known: the");
  add("  simulator already waits on each of its v times as many pipeline exchanges.");
  {
    // How far: Table 1's interleaved rows simulated without interleaving
    // (vpp 1, everything else as run), a sensitivity, not a correction.
    std::string flat;
    Errors as_1f1b = a100;   // the table's errors with these rows replaced
    for (const bench::PublishedRun& run : bench::narayanan_table1(ref)) {
      if (run.plan.find(",vpp=") == std::string::npos) continue;
      const Prediction q = predict(without_interleaving(run));
      if (!q.ok) continue;
      const double err = (q.out.report.hardware_tflops_per_gpu_no_causal - run.tflops_per_gpu) / run.tflops_per_gpu;
      flat += fmt::format("{}{} {:+.1f}%", flat.empty() ? "" : ", ", run.label, 100 * err);
      as_1f1b[run.label] = err;
    }
    if (!flat.empty()) {
      double sum = 0;
      for (const auto& [label, e] : as_1f1b) sum += std::abs(e);
      add(fmt::format("  Simulated without interleaving (vpp 1, all else as run), those rows would be {} (the table's", flat));
      add(fmt::format("  mean absolute error {:.1f}%). Not adopted: the scripts set interleaving, so the table keeps it.",
                      100 * sum / static_cast<double>(as_1f1b.size())));
    }
  }
  {
    // The pipeline observations together: the share of the NIC rate that
    // pipeline sends between nodes would need for Fig. 18's published gain
    // (11%, at its largest batch, 60), and what that share does elsewhere.
    // A sensitivity, not a correction.
    const std::string file = "/tmp/megascope-validation-p2p.toml";
    const auto gain_at = [&](double eff) { return bench::scatter_gather_gain(60, true, nullptr, bench::a100_with_p2p_efficiency(file, eff)); };
    double lo = 0.2, hi = 1.0;   // the gain falls as the efficiency rises
    const std::optional<double> g_lo = gain_at(lo), g_hi = gain_at(hi);
    if (g_lo && g_hi && *g_lo > 0.11 && *g_hi < 0.11) {
      for (int i = 0; i < 10; ++i) {
        const double mid = 0.5 * (lo + hi);
        const std::optional<double> g = gain_at(mid);
        if (!g) break;
        (*g > 0.11 ? lo : hi) = mid;
      }
      const double eff = std::round(100 * 0.5 * (lo + hi)) / 100;
      const std::string cluster = bench::a100_with_p2p_efficiency(file, eff);
      const std::optional<double> nosg = bench::interleaving_gain(60, nullptr, false, cluster);
      const std::optional<double> nosg_shipped = bench::interleaving_gain(60, nullptr, false);
      const auto mae_with = [&](const std::vector<bench::PublishedRun>& runs) {
        double sum = 0;
        int n = 0;
        for (bench::PublishedRun run : runs) {
          run.cluster = cluster;
          const Prediction q = predict(run);
          if (!q.ok) return std::optional<double>();
          sum += std::abs(q.out.report.hardware_tflops_per_gpu_no_causal - run.tflops_per_gpu) / run.tflops_per_gpu;
          ++n;
        }
        return std::optional<double>(sum / n);
      };
      const std::optional<double> t1 = mae_with(bench::narayanan_table1(ref)), t2 = mae_with(bench::narayanan_table2_ptdp(ref));
      add("  Two of the ablations above say the same of the 2021 pipeline sends between nodes: they were slower than");
      add("  the collectives' rate on the same NIC. Scatter/gather gains less than published (Fig. 18), and without it");
      add("  interleaving stays ahead of 1F1B at batch 60 where the paper finds it behind. NCCL's maintainers said in");
      add("  2021 that a lone send/recv \"might not achieve peak bandwidth\" (NVIDIA/nccl#464), but no measurement of");
      add(fmt::format("  one between A100 nodes is in the references. At {:.2f} of the collectives' rate", eff));
      add(fmt::format("  (`[cluster.scale_out] p2p_efficiency = {:.2f}`; 1 by default), Fig. 18's gain at batch 60 would be the", eff));
      if (nosg && nosg_shipped && t1 && t2) {
        add(fmt::format("  published 11%, interleaving without scatter/gather would lead 1F1B at batch 60 by {:.1f}% (from {:.1f}%),",
                        100 * *nosg, 100 * *nosg_shipped));
        add(fmt::format("  and the mean absolute errors would be {:.1f}% (Table 1, from {:.1f}%) and {:.1f}% (Table 2, from {:.1f}%).", 100 * *t1,
                        100 * mae_a100, 100 * *t2, 100 * mae_t2));
        add("  Not adopted: it rests on one ablation's magnitude, and modern NCCL's send/recv may differ.");
      } else {
        add("  published 11% (the other runs with it failed).");
      }
    } else {
      add("  (The p2p_efficiency sensitivity could not bracket Fig. 18's 11%.)");
    }
    std::filesystem::remove(file);
  }
  {
    const auto list = [](const std::vector<std::string>& v) {
      std::string out;
      for (std::size_t i = 0; i < v.size(); ++i) out += (i == 0 ? "" : i + 1 == v.size() ? " and " : ", ") + v[i];
      return out;
    };
    add(fmt::format("- **Ablations.** {} of {} published claims reproduced: {}.", reproduced.size(), reproduced.size() + missed.size(),
                    list(reproduced)));
    if (!missed.empty()) add(fmt::format("  Not reproduced: {} (the table above says by how much).", list(missed)));
  }
  add("");
  // The errors by class of run, for simulate and plan to state (topologies/validation/regimes.toml).
  if (argc > 2) {
    std::ofstream out(argv[2]);
    cli::write_regimes(out, bench::regime_stats(ref));
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  add(fmt::format("_Report generated in {:.1f} s._", wall));
  std::fputs(md.c_str(), stdout);
  return 0;
}
