// End-to-end accuracy against published runs, as docs/validation.md reports
// it (bench/published_predict.hpp computes both): every row of Narayanan
// et al. 2021 Tables 1 and 2 (PTD-P) and of the Megatron-LM README H100 table
// predicted within a bound, each table's mean absolute error held at most
// where it stands, and the published ablations reproduced in direction. The
// A100 tables meet the 5% target, the H100 table does not yet
// (docs/validation.md says by how much and why); these bounds keep what is
// validated from sliding back. The A100 profile's forward-pass efficiency is
// refitted here from Qi et al.'s per-stage times, which it comes from.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bench/published_predict.hpp"
#include "support.hpp"

namespace {

using megascope::bench::PublishedRun;

// Predicts every row of a table, in TFLOP/s per GPU as the table counts
// them: the hardware FLOPs with recomputation (Narayanan et al. Eq. 3) or the
// model FLOPs (Megatron-LM of 2024), neither halving causal attention. Every
// row must fit and be within `worst` of the published figure, and the mean
// absolute error at most `mean`.
void check_table(const std::vector<PublishedRun>& runs, std::size_t rows, bool hardware_flops, double worst, double mean) {
  REQUIRE(runs.size() == rows);
  double sum = 0;
  for (const PublishedRun& run : runs) {
    INFO(run.table << " " << run.label << " on " << run.gpus << " GPUs: " << run.plan);
    const megascope::bench::Prediction p = megascope::bench::predict(run);
    REQUIRE(p.error == "");
    REQUIRE(p.ok);
    CHECK(p.fits);
    const double predicted = hardware_flops ? p.out.report.hardware_tflops_per_gpu_no_causal : p.out.report.tflops_per_gpu_no_causal;
    const double err = std::abs(predicted - run.tflops_per_gpu) / run.tflops_per_gpu;
    INFO("published " << run.tflops_per_gpu << ", predicted " << predicted);
    CHECK(err < worst);
    sum += err;
  }
  CHECK(sum / static_cast<double>(runs.size()) < mean);
}

}  // namespace

TEST_CASE("Narayanan Table 1 (10 A100 runs): every row within 8 percent, mean absolute error at most 3 percent", "[validation]") {
  check_table(megascope::bench::narayanan_table1(MEGASCOPE_REFERENCE_DIR), 10, true, 0.08, 0.03);
}

TEST_CASE("Narayanan Table 2 PTD-P (6 A100 runs of 175B and 530B): every row within 7 percent, mean absolute error at most 3 percent",
          "[validation]") {
  check_table(megascope::bench::narayanan_table2_ptdp(MEGASCOPE_REFERENCE_DIR), 6, true, 0.07, 0.03);
}

TEST_CASE("Megatron-Bridge rows with Megatron-FSDP (6 runs on H100 and GB200): every row within 18 percent, mean absolute "
          "error at most 9 percent",
          "[validation][zero]") {
  const std::vector<PublishedRun> runs = megascope::bench::bridge_fsdp(MEGASCOPE_REFERENCE_DIR);
  REQUIRE(runs.size() == 6);
  double sum = 0;
  for (const PublishedRun& run : runs) {
    INFO(run.label << " on " << run.gpus << " GPUs: " << run.plan);
    const megascope::bench::Prediction p = megascope::bench::predict(run);
    REQUIRE(p.error == "");
    const double err = std::abs(megascope::bench::predicted_throughput(run, p.out.report) / run.tokens_per_s_per_gpu - 1);
    INFO("published " << run.tokens_per_s_per_gpu << " tokens/s per GPU, error " << err);
    CHECK(err < 0.18);
    // Llama 3 8B needs no activation offload: it fits; the 70B and 405B
    // recipes offload activations to the host, which is not modelled.
    if (run.model == "llama3-8b") CHECK(p.fits);
    sum += err;
  }
  CHECK(sum / static_cast<double>(runs.size()) < 0.09);
}

TEST_CASE("Megatron-LM README H100 (9 runs, micro-batch and schedule as the planner tunes them): every row within 11 "
          "percent, mean absolute error at most 5 percent",
          "[validation]") {
  check_table(megascope::bench::megatron_h100_tuned(MEGASCOPE_REFERENCE_DIR), 9, false, 0.11, 0.05);
}

TEST_CASE("Shoeybi et al. 2019 (3 V100 runs): the scaling from one GPU to 8 and 512 is within 5 percent of the published, "
          "the one-GPU rate held where it stands",
          "[validation]") {
  const auto runs = megascope::bench::shoeybi_2019();
  REQUIRE(runs.size() == 3);
  std::vector<double> predicted;
  for (const PublishedRun& run : runs) {
    INFO(run.label << " on " << run.gpus << " GPUs: " << run.plan);
    const megascope::bench::Prediction p = megascope::bench::predict(run);
    REQUIRE(p.error == "");
    CHECK(p.fits);
    predicted.push_back(p.out.report.hardware_tflops_per_gpu_no_causal);
  }
  // Published: 77% of linear scaling on 8 GPUs; 15.1 PFLOP/s on 512 against 512 x 39 TFLOP/s.
  INFO("predicted TFLOP/s per GPU: " << predicted[0] << ", " << predicted[1] << ", " << predicted[2]);
  CHECK(std::abs(predicted[1] / predicted[0] / 0.77 - 1) < 0.05);
  CHECK(std::abs(predicted[2] / predicted[0] / (15.1e3 / 512 / 39.0) - 1) < 0.05);
  // Not at the target: the 2019 software's one-GPU rate is over-predicted (docs/validation.md).
  CHECK(predicted[0] / 39.0 - 1 < 0.40);
  CHECK(predicted[0] / 39.0 - 1 > 0.0);
}

TEST_CASE("Megatron-LM README H100 strong scaling (177B, 96 to 4,608 GPUs): the published MFUs bound the schedule to at "
          "least 4 virtual stages, and with them the MFU lost is within 5 points of the published 10.6",
          "[validation]") {
  const megascope::bench::StrongScaling s = megascope::bench::readme_strong_scaling();
  INFO(s.error);
  REQUIRE(s.error.empty());
  // (p - 1) / (v m + p - 1) at p 6, m 12 under 1 - 42/47 (1 - 5/581): v 4 is the first divisor of 16 there.
  CHECK(s.bubble_bound == Approx(1 - 0.42 / 0.47 * (1 - 5.0 / 581)).epsilon(1e-12));
  CHECK(s.vpp == 4);
  REQUIRE(s.points.size() == 8);
  CHECK(s.points.front().microbatches == 576);
  CHECK(s.points.back().microbatches == 12);
  CHECK(s.published_loss == Approx(1 - 42.0 / 47));
  INFO("predicted loss: 1F1B " << s.loss_1f1b << ", interleaved " << s.loss_interleaved);
  CHECK(std::abs(s.loss_interleaved - s.published_loss) < 0.05);
  // As 1F1B the pipeline's bubble at 12 micro-batches is far beyond what the published loss allows.
  CHECK(s.loss_1f1b > s.published_loss + 0.15);
  // More data parallelism never makes a GPU faster at a fixed batch.
  for (std::size_t i = 1; i < s.points.size(); ++i) {
    CHECK(s.points[i].mfu_1f1b <= s.points[i - 1].mfu_1f1b * (1 + 1e-9));
    CHECK(s.points[i].mfu_interleaved <= s.points[i - 1].mfu_interleaved * (1 + 1e-9));
  }
}

TEST_CASE("Qi et al. Table 9 (12 A100 pipeline stages): the a100 profile's forward efficiency is the fit to the published forward times, and B and W are within 8 percent",
          "[validation]") {
  const std::vector<megascope::bench::StageTimeRow> rows = megascope::bench::zero_bubble_stage_times(MEGASCOPE_REFERENCE_DIR);
  REQUIRE(rows.size() == 12);
  // The files go whichever way the test ends.
  const megascope::bench::TempFile unit_overlay("megascope-test-unit-forward.toml", "[passes]\nforward_efficiency = 1\n");
  const megascope::bench::TempFile model_tmp("megascope-test-zb-model.toml", "");
  const std::string& unit_file = unit_overlay.path();
  const std::string& model_file = model_tmp.path();
  std::vector<megascope::bench::StageTimes> unit;
  double ratio_sum = 0;
  for (const megascope::bench::StageTimeRow& row : rows) {
    INFO(row.model << ", " << row.microbatches << " micro-batches");
    unit.push_back(megascope::bench::zero_bubble_stage(row, model_file, unit_file));
    REQUIRE(unit.back().ok);
    const megascope::bench::StageTimes t = megascope::bench::zero_bubble_stage(row, model_file);
    REQUIRE(t.ok);
    INFO("F " << t.f_s << " s against " << row.f_s << ", B " << t.b_s << " against " << row.b_s << ", W " << t.w_s
              << " against " << row.w_s);
    // B and W are not fitted: the kernels' prices alone.
    CHECK(t.b_s == Approx(unit.back().b_s).epsilon(1e-12));
    CHECK(t.w_s == Approx(unit.back().w_s).epsilon(1e-12));
    CHECK(std::abs(t.b_s / row.b_s - 1) < 0.08);
    CHECK(std::abs(t.w_s / row.w_s - 1) < 0.08);
    CHECK(std::abs(t.f_s / row.f_s - 1) < 0.08);
    ratio_sum += t.f_s / row.f_s;
  }
  const std::optional<double> fitted = megascope::bench::fitted_forward_efficiency(rows, unit);
  REQUIRE(fitted);
  auto cost = megascope::sim::CostModel::for_device(megascope::test::shipped_cluster("dgx-a100").device);
  REQUIRE(cost);
  CHECK(cost->forward_efficiency() == Approx(*fitted).epsilon(0.002));
  // Fitted, the forward times are right on average.
  CHECK(ratio_sum / static_cast<double>(rows.size()) == Approx(1.0).epsilon(0.01));
}

TEST_CASE("Narayanan Fig. 12: the interleaved schedule beats 1F1B on GPT-3 175B at batch 12, 24 and 48, by less as the batch grows",
          "[validation]") {
  double previous = 1e9;
  for (int batch : {12, 24, 48}) {
    std::string error;
    const std::optional<double> gain = megascope::bench::interleaving_gain(batch, &error);
    INFO("batch " << batch << ": " << error);
    REQUIRE(gain);
    CHECK(*gain > 0);
    CHECK(*gain < previous);
    previous = *gain;
  }
}

namespace {

// A model file of the sweeps, removed after the test.
struct TempModel {
  std::string path;
  explicit TempModel(const char* name) : path((std::filesystem::temp_directory_path() / name).string()) {}
  ~TempModel() { std::filesystem::remove(path); }
};

// Every point of a sweep simulated; `what` names the sweep in the failure message.
void require_every_point(const megascope::bench::Sweep& sweep, std::size_t points, const std::string& what) {
  REQUIRE(sweep.size() == points);
  for (const auto& [value, thr] : sweep) {
    INFO(what << " " << value);
    REQUIRE(thr);
  }
}

}  // namespace

TEST_CASE("Narayanan Fig. 13: TP 8 is the fastest TP x PP split of 64 A100s for the 162B model", "[validation]") {
  const TempModel file("megascope-validation-test-162b.toml");
  const megascope::bench::Sweep sweep = megascope::bench::tp_split_throughputs(file.path);
  require_every_point(sweep, 5, "tp");
  CHECK(megascope::bench::best_of(sweep) == 8);
}

TEST_CASE("Narayanan Figs. 14 and 15: on 64 A100s the 5.9B model loses throughput as pp (tp 1) or tp (pp 1) takes GPUs from dp",
          "[validation]") {
  const TempModel file("megascope-validation-test-5.9b.toml");
  const auto show = [](const megascope::bench::Sweep& sweep) {
    std::string out;
    for (const auto& [v, thr] : sweep) out += std::to_string(v) + ": " + std::to_string(*thr) + " tokens/s; ";
    return out;
  };
  for (int batch : {32, 512}) {
    const megascope::bench::Sweep sweep = megascope::bench::pp_dp_throughputs(file.path, batch);
    require_every_point(sweep, 5, "Fig. 14, batch " + std::to_string(batch) + ", pp");
    INFO("Fig. 14, batch " << batch << ", by pp: " << show(sweep));
    CHECK(megascope::bench::falling(sweep));
  }
  for (int batch : {32, 128, 512}) {
    const megascope::bench::Sweep sweep = megascope::bench::tp_dp_throughputs(file.path, batch);
    require_every_point(sweep, 5, "Fig. 15, batch " + std::to_string(batch) + ", tp");
    INFO("Fig. 15, batch " << batch << ", by tp: " << show(sweep));
    CHECK(megascope::bench::falling(sweep));
  }
}

// Fig. 16 is not reproduced exactly: the simulator's best is 1 sequence per
// micro-batch at batch 128 and 4 at 512, each within 1% of 2
// (docs/validation.md). This holds how close it is: 2 within 1% of the best
// at both batches, and 8 at least 2% worse.
TEST_CASE("Narayanan Fig. 16: on the 91B model (tp 8, pp 8) two sequences per micro-batch are within 1 percent of the best at batch 128 and 512",
          "[validation]") {
  const TempModel file("megascope-validation-test-91b.toml");
  for (int batch : {128, 512}) {
    const megascope::bench::Sweep sweep = megascope::bench::microbatch_throughputs(file.path, batch);
    require_every_point(sweep, 4, "batch " + std::to_string(batch) + ", mbs");
    double best = 0;
    for (const auto& [mbs, thr] : sweep) best = std::max(best, *thr);
    INFO("batch " << batch << ": mbs 1, 2, 4, 8: " << *sweep[0].second << ", " << *sweep[1].second << ", " << *sweep[2].second << ", "
                  << *sweep[3].second << " tokens/s");
    REQUIRE(sweep[1].first == 2);
    CHECK(*sweep[1].second > 0.99 * best);
    CHECK(*sweep[3].second < 0.98 * *sweep[1].second);
  }
}

TEST_CASE("Narayanan Fig. 18: scattering pipeline tensors over TP speeds up the interleaved GPT-3 175B on 96 A100s (published: up to 11 percent)",
          "[validation]") {
  for (int batch : {12, 60}) {
    std::string error;
    const std::optional<double> gain = megascope::bench::scatter_gather_gain(batch, true, &error);
    INFO("batch " << batch << ": " << error);
    REQUIRE(gain);
    CHECK(*gain > 0.02);
    CHECK(*gain < 0.15);
  }
}

TEST_CASE("Korthikanti Table 4: selective recomputation beats full by 20-40 percent on GPT-3 175B (published: 29)", "[validation]") {
  std::string error;
  const std::optional<double> gain = megascope::bench::selective_recompute_gain(&error);
  INFO(error);
  REQUIRE(gain);
  CHECK(*gain > 0.20);
  CHECK(*gain < 0.40);
}

TEST_CASE("Megatron-Bridge and NeMo dense rows (28 runs on H100, B200 and GB200): each class's error held where it "
          "stands, and context-parallel rows priced like the rest",
          "[validation]") {
  // Tokens/s per GPU against the published figures, by class: H100 without
  // CP, Blackwell without CP, CP 2 on either. Each class meets
  // docs/validation.md's target (H100 5%, Blackwell 7%, CP 6%); these bounds
  // hold today's levels.
  const std::vector<PublishedRun> runs = megascope::bench::bridge_nemo_dense(MEGASCOPE_REFERENCE_DIR);
  REQUIRE(runs.size() == 28);
  struct Tally {
    double abs = 0, sum = 0;
    int n = 0;
  } h100, blackwell, cp, h100_cp;
  for (const PublishedRun& run : runs) {
    INFO(run.label << " on " << run.gpus << " " << run.gpu << ": " << run.plan);
    const megascope::bench::Prediction p = megascope::bench::predict(run);
    REQUIRE(p.error == "");
    const double err = megascope::bench::throughput_error(run, p.out.report);
    INFO("published " << run.tokens_per_s_per_gpu << ", error " << err);
    CHECK(std::abs(err) < 0.11);
    for (Tally* t : {run.cp > 1 ? &cp : run.gpu == "H100" ? &h100 : &blackwell}) {
      t->abs += std::abs(err);
      t->sum += err;
      ++t->n;
    }
    if (run.cp > 1 && run.gpu == "H100") {
      h100_cp.sum += err;
      ++h100_cp.n;
    }
  }
  REQUIRE(h100.n == 13);
  REQUIRE(blackwell.n == 8);
  REQUIRE(cp.n == 7);
  CHECK(h100.abs / h100.n < 0.05);             // the target: 5%
  CHECK(std::abs(h100.sum / h100.n) < 0.02);   // the target: within 2%
  CHECK(blackwell.abs / blackwell.n < 0.03);   // the target: 7%
  CHECK(cp.abs / cp.n < 0.04);                 // the target: 6%
  // Priced as (2 - 1/cp) times the load-balanced work, the H100 CP rows came
  // out 10 points less optimistic than the other H100 rows: the overpriced
  // attention hid the same optimism. Priced as Megatron-Core runs it, they
  // sit within 5 points of the other H100 rows.
  CHECK(std::abs(h100_cp.sum / h100_cp.n - h100.sum / h100.n) < 0.05);
}

TEST_CASE("The shipped regimes file holds today's validation: every class's errors as the published tables give them",
          "[validation]") {
  // scripts/validation-report.sh writes topologies/validation/regimes.toml
  // from the same predictions; a change that moves a table must rerun it.
  auto shipped = megascope::cli::load_regimes(megascope::cli::regimes_path());
  REQUIRE(shipped.has_value());
  const std::vector<megascope::cli::RegimeStats> now = megascope::bench::regime_stats(MEGASCOPE_REFERENCE_DIR);
  REQUIRE(shipped->size() == now.size());
  for (const megascope::cli::RegimeStats& n : now) {
    INFO(megascope::cli::describe(n.regime));
    const auto it = std::find_if(shipped->begin(), shipped->end(), [&](const auto& s) { return s.regime == n.regime; });
    REQUIRE(it != shipped->end());
    CHECK(it->rows == n.rows);
    CHECK(it->mean_abs_error == Approx(n.mean_abs_error).margin(1e-4));
    CHECK(it->signed_mean_error == Approx(n.signed_mean_error).margin(1e-4));
    CHECK(it->worst_abs_error == Approx(n.worst_abs_error).margin(1e-4));
    CHECK(it->max_published_mfu == Approx(n.max_published_mfu).margin(1e-4));
    CHECK(it->tables == n.tables);
  }
}

TEST_CASE("The shipped sustained clocks are the fit to each generation's dense published runs, and leaving a model out "
          "moves the fit by little",
          "[validation]") {
  for (const auto& [gen, cluster] :
       {std::pair<const char*, const char*>{"hopper", "dgx-h100"}, {"blackwell", "dgx-b200"}, {"blackwell", "gb200-nvl72"}}) {
    INFO(gen << " on " << cluster);
    const megascope::bench::ClockFit f = megascope::bench::fit_sustained_clock(MEGASCOPE_REFERENCE_DIR, gen);
    REQUIRE(f.error == "");
    REQUIRE(f.rows >= 10);
    const auto c = megascope::resolve_cluster(cluster);
    REQUIRE(c);
    const auto cost = megascope::sim::CostModel::for_device(c->device);
    REQUIRE(cost);
    CHECK(cost->profile().sustained_clock == Approx(f.clock).margin(0.0015));
    // A physical clock: below the clock the efficiencies were measured at, not far below.
    CHECK(f.clock < 1.0);
    CHECK(f.clock > 0.7);
    for (const auto& [model, clock] : f.lomo_clock_by_model) {
      INFO("without " << model);
      CHECK(std::abs(clock - f.clock) < 0.02);
    }
    // Held out, each model's rows are predicted about as well as in sample.
    CHECK(f.lomo_mean_abs < f.mean_abs + 0.01);
  }
}

TEST_CASE("Megatron-Bridge MoE rows (32 runs on H100, B200 and GB200): errors held where they stand, GB200 within 14 "
          "percent on average, dropless and token-dropping runs apart, and most pairs of one model's runs ordered as published",
          "[validation]") {
  const std::vector<PublishedRun> runs = megascope::bench::bridge_nemo_moe(MEGASCOPE_REFERENCE_DIR);
  REQUIRE(runs.size() == 32);
  double sum_abs = 0, blackwell_abs = 0, gb200_abs = 0;
  int blackwell = 0, gb200 = 0;
  std::map<std::pair<std::string, std::string>, std::vector<std::pair<double, double>>> groups;   // (published, predicted)
  std::map<std::string, double> qwen_b200_mbs1;   // Qwen3-30B-A3B on 8 B200s at mbs 1: dropless and token-dropping
  for (const PublishedRun& run : runs) {
    INFO(run.label << " on " << run.gpus << " " << run.gpu << ": " << run.plan);
    const megascope::bench::Prediction p = megascope::bench::predict(run);
    REQUIRE(p.error == "");
    const double err = megascope::bench::throughput_error(run, p.out.report);
    const double predicted = megascope::bench::predicted_throughput(run, p.out.report);
    INFO("published " << run.tokens_per_s_per_gpu << ", error " << err);
    sum_abs += std::abs(err);
    if (run.gpu != "H100") {
      blackwell_abs += std::abs(err);
      ++blackwell;
    }
    if (run.gpu == "GB200") {
      CHECK(std::abs(err) < 0.45);
      gb200_abs += std::abs(err);
      ++gb200;
    }
    // DeepSeek-V3 on 1,024 H100s with its script's DeepEP dispatcher, EP
    // all-to-all overlap and recomputed dense MLPs (33% slow without them).
    if (run.model == "deepseek-v3" && run.gpu == "H100") {
      CHECK(run.plan.find("moe_dispatcher=flex,moe_ep_overlap=on") != std::string::npos);
      CHECK(std::abs(err) < 0.05);
    }
    groups[{run.model, run.gpu}].emplace_back(run.tokens_per_s_per_gpu, predicted);
    if (run.model == "qwen3-30b-a3b" && run.gpu == "B200" && run.label.find("mbs1") != std::string::npos)
      qwen_b200_mbs1[run.token_drop ? "drop" : run.label] = predicted;
  }
  CHECK(sum_abs / 32 < 0.23);
  CHECK(blackwell_abs / blackwell < 0.18);
  CHECK(gb200_abs / gb200 < 0.14);   // the target: 15%
  // Published: 18,066 tokens/s/GPU token-dropping against 9,691 and 9,299 dropless (1.9x).
  REQUIRE(qwen_b200_mbs1.size() == 3);
  for (const auto& [label, v] : qwen_b200_mbs1)
    if (label != "drop") CHECK(qwen_b200_mbs1["drop"] > 1.5 * v);
  int pairs = 0, right = 0;
  for (const auto& [key, rows] : groups)
    for (std::size_t i = 0; i < rows.size(); ++i)
      for (std::size_t j = i + 1; j < rows.size(); ++j) {
        if (rows[i].first == rows[j].first) continue;
        ++pairs;
        right += (rows[i].first > rows[j].first) == (rows[i].second > rows[j].second);
      }
  REQUIRE(pairs == 30);
  CHECK(right >= 20);   // two in three; the target is 85%
}

TEST_CASE("The shipped Blackwell host launch time is the fit to the generation's dropless MoE rows, stable when a model "
          "is left out",
          "[validation]") {
  const megascope::bench::HostFit f = megascope::bench::fit_host_launch(MEGASCOPE_REFERENCE_DIR, "blackwell");
  REQUIRE(f.error == "");
  REQUIRE(f.rows >= 10);
  for (const char* cluster : {"dgx-b200", "gb200-nvl72"}) {
    const auto c = megascope::resolve_cluster(cluster);
    REQUIRE(c);
    const auto cost = megascope::sim::CostModel::for_device(c->device);
    REQUIRE(cost);
    CHECK(cost->profile().host_launch_s * 1e6 == Approx(f.host_us).margin(0.5));
  }
  for (const auto& [model, us] : f.lomo_by_model) {
    INFO("without " << model);
    CHECK(std::abs(us - f.host_us) <= 10.0);
  }
  CHECK(f.lomo_mean_abs < f.mean_abs + 0.03);
}
