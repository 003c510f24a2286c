// Predicting the published runs (published.hpp) and the published ablations
// with the simulator, as docs/validation.md reports them: shared by
// validation_report and the accuracy tests (tests/apps/validation_test.cpp),
// so that the tests hold the numbers the report prints.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "apps/expected_error.hpp"
#include "apps/scenario.hpp"
#include "apps/simulate.hpp"
#include "config/library.hpp"
#include "config/plan_settings.hpp"
#include "core/program/builder.hpp"
#include "planner/planner.hpp"
#include "sim/cost_model.hpp"
#include "sim/engine.hpp"
#include "published.hpp"

namespace megascope::bench {

struct Prediction {
  bool ok = false;
  std::string error;
  cli::SimulateOutcome out;
  bool fits = false;
  double peak_gib = 0;
};

// A file under the temporary directory holding `text`, removed with the object.
class TempFile {
 public:
  TempFile(const std::string& name, const std::string& text)
      : path_((std::filesystem::temp_directory_path() / name).string()) {
    std::ofstream(path_) << text;
  }
  ~TempFile() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A published run's scenario: its model, cluster, GPUs, plan and batch, in
// the run's number formats (the command line has no option for them).
inline Result<cli::Scenario> scenario_of(const PublishedRun& run) {
  cli::ScenarioOptions o;
  o.model = run.model;
  o.cluster = run.cluster;
  o.gpus = run.gpus;
  // FP8 parameter gathers need the run's FP8, set below: the plan is loaded
  // without them and they are put back with it.
  auto parsed = parse_inline_plan(run.plan);
  if (!parsed) return tl::unexpected(parsed.error());
  const bool fp8_gather = parsed->fp8_param_gather;
  parsed->fp8_param_gather = false;
  o.plan = format_inline_plan(*parsed);
  o.global_batch = run.batch;
  if (run.seq_len > 0) o.seq_len = run.seq_len;
  if (run.mtp_layers >= 0) o.mtp_layers = run.mtp_layers;
  auto sc = cli::load_scenario(o);
  if (!sc) return sc;
  sc->setup.plan.fp8_param_gather = fp8_gather;
  TrainingSpec t = sc->setup.training;
  t.params_dtype = run.params_dtype;
  t.grad_dtype = run.grad_dtype;
  t.precision = run.precision;
  t.fp8_recipe = run.fp8_recipe;
  ModelSpec model = sc->setup.model;
  if (run.token_drop && model.moe) {
    model.moe->capacity_factor = 1.0;
    model.moe->pad_to_capacity = true;
  }
  auto s = validate_setup(model, sc->setup.cluster, t, sc->setup.plan, run.gpus);
  if (!s) return tl::unexpected(s.error());
  sc->setup = std::move(*s);
  return sc;
}

// A published run whose table leaves the micro-batch size and the pipeline
// schedule unsaid (the Megatron-LM README H100 table): the plan the planner
// picks with everything the table and its text state held fixed (tp, pp,
// dp, no CP, the distributed optimizer, the overlaps, sequence parallelism
// with tp > 1, no recomputation, even stages) and the rest searched (micro-
// batch size, 1F1B or interleaved with any virtual stages), as whoever ran
// the benchmark tuned them. The pick is made once, with the shipped cost
// profile; on failure the run keeps its stated plan and `error` says why.
inline PublishedRun tuned(PublishedRun run, std::string* error = nullptr) {
  auto sc = scenario_of(run);
  auto fail = [&](const std::string& why) {
    if (error) *error = run.label + ": " + why;
    return run;
  };
  if (!sc) return fail(sc.error().str());
  const PlanSpec& stated = sc->setup.plan;
  planner::SearchInputs in;
  in.model = sc->setup.model;
  in.cluster = sc->setup.cluster;
  in.training = sc->setup.training;
  in.gpu_counts = {run.gpus};
  planner::Constraints& c = in.constraints;
  c.tp.values = {stated.tp};
  c.pp.values = {stated.pp};
  c.dp.values = {run.gpus / (stated.tp * stated.pp * stated.cp)};
  c.cp.values = {stated.cp};
  c.ep.values = {1};
  c.recompute = {RecomputeGranularity::none};
  c.zero = {1};
  c.hsdp = false;
  c.sp = stated.sequence_parallel;
  c.distopt = stated.distributed_optimizer;
  c.overlap_grad_reduce = stated.overlap_grad_reduce;
  c.overlap_param_gather = stated.overlap_param_gather;
  c.tp_comm_overlap = stated.tp_comm_overlap;
  c.uneven = planner::UnevenStages::off;
  auto checked = planner::check_inputs(std::move(in));
  if (!checked) return fail(checked.error().str());
  planner::SearchOptions o;
  o.threads = 1;
  auto r = planner::search(*checked, o);
  if (!r) return fail(r.error().str());
  if (r->ranked.empty()) return fail("the planner found no plan that fits");
  run.plan = format_inline_plan(r->ranked.front().plan);
  return run;
}

// The Megatron-LM README H100 rows with their plans tuned (tuned()), picked
// once per reference directory.
inline const std::vector<PublishedRun>& megatron_h100_tuned(const std::string& ref_dir) {
  static std::map<std::string, std::vector<PublishedRun>> cache;
  auto it = cache.find(ref_dir);
  if (it == cache.end()) {
    std::vector<PublishedRun> runs;
    for (const PublishedRun& run : megatron_h100(ref_dir)) runs.push_back(tuned(run));
    it = cache.emplace(ref_dir, std::move(runs)).first;
  }
  return it->second;
}

// One published run simulated with the shipped model, cluster and cost
// profile, in the run's number formats; with `calibration`, that cost-model
// profile laid over the shipped one (simulate --calibration).
inline Prediction predict(const PublishedRun& run, const std::optional<std::string>& calibration = std::nullopt) {
  Prediction p;
  auto sc = scenario_of(run);
  if (!sc) {
    p.error = sc.error().str();
    return p;
  }
  cli::SimulateOptions so;
  so.calibration = calibration;
  auto out = cli::run_simulation(*sc, so);
  if (!out) {
    p.error = out.error().str();
    return p;
  }
  const nlohmann::json j = cli::simulate_json(*sc, *out, so);
  p.fits = j["memory"]["fits"].get<bool>();
  p.peak_gib = j["memory"]["peak_bytes"].get<double>() / (1024.0 * 1024 * 1024);
  p.out = std::move(*out);
  p.ok = true;
  return p;
}

// A published run's throughput as published (tokens/s per GPU where the row
// gives it, else TFLOP/s per GPU) and as predicted in the same unit: the
// model FLOPs of Megatron-LM's 2024 counter for the README H100 table, the
// hardware FLOPs (recomputation counted) for Narayanan et al.'s tables.
inline double published_throughput(const PublishedRun& run) {
  return run.tokens_per_s_per_gpu > 0 ? run.tokens_per_s_per_gpu : run.tflops_per_gpu;
}
inline double predicted_throughput(const PublishedRun& run, const sim::SimReport& r) {
  if (run.tokens_per_s_per_gpu > 0) return r.tokens_per_s / run.gpus;
  return run.table == "megatron-h100" ? r.tflops_per_gpu_no_causal : r.hardware_tflops_per_gpu_no_causal;
}
inline double throughput_error(const PublishedRun& run, const sim::SimReport& r) {
  return predicted_throughput(run, r) / published_throughput(run) - 1;
}

// A run of `model` on `gpus` GPUs of `cluster` with `plan` and `batch`, in today's number formats.
inline PublishedRun run_of(const std::string& model, const std::string& cluster, int gpus, const std::string& plan,
                           std::int64_t batch) {
  return PublishedRun{"", "", model, cluster, plan, gpus, batch};
}

inline Prediction predict(const std::string& model, const std::string& cluster, int gpus, const std::string& plan,
                          std::int64_t batch) {
  return predict(run_of(model, cluster, gpus, plan, batch));
}

// The same as Megatron-LM of 2021 ran it (the Narayanan et al. ablations):
// no asynchronous TP all-reduce, no gradient accumulation fusion, pipeline
// tensors scattered and gathered over TP, every pipeline exchange waited for,
// fp16 weights and main gradients. `scatter_gather` false sends pipeline
// tensors whole (Fig. 18's baseline).
inline Prediction predict_2021(const std::string& model, const std::string& cluster, int gpus, const std::string& plan,
                               std::int64_t batch, bool scatter_gather = true) {
  PublishedRun run = run_of(model, cluster, gpus,
                            plan + fmt::format(",tp_grad_overlap=off,grad_accum_fusion=off,pp_scatter_gather={},overlap_p2p_comm=off",
                                               scatter_gather ? "on" : "off"),
                            batch);
  run.params_dtype = Dtype::fp16;
  run.grad_dtype = Dtype::fp16;
  return predict(run);
}

// --- The published ablations, as numbers (nullopt: a simulation failed) ---

// A GPT of the Narayanan et al. experiments (GeLU, LayerNorm, learned
// positions, biases, tied embeddings, dropout 0.1, vocabulary 51200, 2048
// tokens), written to `file` as a model TOML.
inline void write_gpt_model(const std::string& file, const std::string& name, int layers, int hidden, int heads,
                            int seq_length, int vocab) {
  std::ofstream(file) << fmt::format(
      "[model]\nname = \"{}\"\nnum_layers = {}\nhidden_size = {}\nffn_hidden_size = {}\n"
      "num_attention_heads = {}\nvocab_size = {}\nseq_length = {}\nactivation = \"gelu\"\n"
      "norm = \"layernorm\"\nposition_embedding = \"learned\"\nadd_bias_linear = true\n"
      "tied_embeddings = true\nhidden_dropout = 0.1\nattention_dropout = 0.1\n",
      name, layers, hidden, 4 * hidden, heads, vocab, seq_length);
}

inline void write_sc21_model(const std::string& file, const std::string& name, int layers, int hidden, int heads) {
  write_gpt_model(file, name, layers, hidden, heads, 2048, 51200);
}

// A sweep of one ablation: each value of the swept setting with its
// simulated tokens/s (nullopt: the simulation failed).
using Sweep = std::vector<std::pair<int, std::optional<double>>>;

inline std::optional<double> tokens_per_s(const Prediction& p) {
  return p.ok ? std::optional<double>(p.out.report.tokens_per_s) : std::nullopt;
}

// The swept value with the most tokens/s, 0 when any simulation failed.
inline int best_of(const Sweep& sweep) {
  int best = 0;
  double most = 0;
  for (const auto& [value, thr] : sweep) {
    if (!thr) return 0;
    if (*thr > most) {
      most = *thr;
      best = value;
    }
  }
  return best;
}

// Whether tokens/s fall strictly as the swept value grows (false when any
// simulation failed).
inline bool falling(const Sweep& sweep) {
  for (std::size_t i = 0; i < sweep.size(); ++i) {
    if (!sweep[i].second) return false;
    if (i > 0 && !(*sweep[i].second < *sweep[i - 1].second)) return false;
  }
  return true;
}

// The sc21 scripts' common settings: full recomputation of every layer
// (`--activations-checkpoint-method uniform`), 2021 attention.
inline const char* sc21_common() { return "recompute=full,recompute_method=uniform,recompute_layers=1,attention=unfused"; }

// Narayanan Fig. 12: GPT-3 175B on 96 GPUs, tp 8 pp 12: the interleaved
// schedule (2 layers per virtual stage, v 4) over 1F1B, as a step-time gain.
// With `scatter_gather` false both send pipeline tensors whole, where the
// paper finds 1F1B ahead at large batch (its text on Fig. 12).
// `cluster`: dgx-a100 or a variant of it.
inline std::optional<double> interleaving_gain(int batch, std::string* error = nullptr, bool scatter_gather = true,
                                               const std::string& cluster = "dgx-a100") {
  const std::string common = fmt::format("tp=8,pp=12,mbs=1,{}", sc21_common());
  const Prediction a = predict_2021("gpt3-175b", cluster, 96, common, batch, scatter_gather);
  const Prediction b = predict_2021("gpt3-175b", cluster, 96, common + ",vpp=4,schedule=interleaved", batch, scatter_gather);
  if (!a.ok || !b.ok) {
    if (error) *error = a.ok ? b.error : a.error;
    return std::nullopt;
  }
  return a.out.report.step_time_s / b.out.report.step_time_s - 1;
}

// Tokens/s of the model in `model_file` on 64 A100s at `batch`, for each
// value v of a setting, with the plan `plan(v)` and the sc21 settings.
template <class Plan>
Sweep sweep_64(const std::string& model_file, std::initializer_list<int> values, Plan plan, int batch) {
  Sweep out;
  for (int v : values)
    out.emplace_back(v, tokens_per_s(predict_2021(model_file, "dgx-a100", 64, fmt::format("{},{}", plan(v), sc21_common()), batch)));
  return out;
}

// Narayanan Fig. 13: the 162B model (32 layers, h 20480) on 64 GPUs, batch
// 128, tokens/s of each tp x pp = 64 split (the model is written to
// `model_file`).
inline Sweep tp_split_throughputs(const std::string& model_file) {
  write_sc21_model(model_file, "gpt-162b", 32, 20480, 128);
  return sweep_64(model_file, {2, 4, 8, 16, 32}, [](int tp) { return fmt::format("tp={},pp={},mbs=1", tp, 64 / tp); }, 128);
}

// Narayanan Figs. 14 and 15 (`run_figure_14.sh`, `run_figure_15.sh`): the
// 5.9B model (32 layers, h 3840, 32 heads) on 64 GPUs, micro-batch 1,
// Megatron's local (non-overlapped) DDP. Fig. 14: tp 1, pp 2-32 and dp the
// rest; Fig. 15: pp 1, tp 2-32 and dp the rest. Tokens/s by pp or tp.
inline Sweep pp_dp_throughputs(const std::string& model_file, int batch) {
  write_sc21_model(model_file, "gpt-5.9b", 32, 3840, 32);
  return sweep_64(model_file, {2, 4, 8, 16, 32}, [](int pp) { return fmt::format("pp={},mbs=1", pp); }, batch);
}

inline Sweep tp_dp_throughputs(const std::string& model_file, int batch) {
  write_sc21_model(model_file, "gpt-5.9b", 32, 3840, 32);
  return sweep_64(model_file, {2, 4, 8, 16, 32}, [](int tp) { return fmt::format("tp={},mbs=1", tp); }, batch);
}

// Narayanan Fig. 16: the 91B model (32 layers, h 15360, 128 heads) on 64
// GPUs, tp 8 pp 8 (1F1B), tokens/s by micro-batch size 1-8.
inline Sweep microbatch_throughputs(const std::string& model_file, int batch) {
  write_sc21_model(model_file, "gpt-91b", 32, 15360, 128);
  return sweep_64(model_file, {1, 2, 4, 8}, [](int mbs) { return fmt::format("tp=8,pp=8,mbs={}", mbs); }, batch);
}

// Narayanan Fig. 18 (`run_figure_18.sh`): GPT-3 175B on 96 GPUs, tp 8 pp 12,
// interleaved (v 4): pipeline tensors scattered over TP and gathered after
// the receive, against sent whole, as a step-time gain. With `interleaved`
// false, the same for 1F1B. `cluster`: dgx-a100 or a variant of it.
inline std::optional<double> scatter_gather_gain(int batch, bool interleaved = true, std::string* error = nullptr,
                                                 const std::string& cluster = "dgx-a100") {
  const std::string plan =
      fmt::format("tp=8,pp=12,mbs=1,{}{}", sc21_common(), interleaved ? ",vpp=4,schedule=interleaved" : "");
  const Prediction on = predict_2021("gpt3-175b", cluster, 96, plan, batch);
  const Prediction off = predict_2021("gpt3-175b", cluster, 96, plan, batch, false);
  if (!on.ok || !off.ok) {
    if (error) *error = on.ok ? off.error : on.error;
    return std::nullopt;
  }
  return off.out.report.step_time_s / on.out.report.step_time_s - 1;
}

// dgx-a100 with `[cluster.scale_out] p2p_efficiency` set, written to `file`
// (the shipped file ends in that table).
inline std::string a100_with_p2p_efficiency(const std::string& file, double efficiency) {
  std::ifstream in(data_dir() + "/clusters/dgx-a100.toml");
  std::ofstream(file) << in.rdbuf() << fmt::format("p2p_efficiency = {}\n", efficiency);
  return file;
}

// Korthikanti et al. 2022 Table 4: GPT-3 175B on 64 GPUs, tp 8 pp 8 with SP:
// selective recomputation over full, as a step-time gain.
inline std::optional<double> selective_recompute_gain(std::string* error = nullptr) {
  const std::string base = "tp=8,pp=8,mbs=1,sp=on,vpp=3,schedule=interleaved,attention=unfused";
  const Prediction sel = predict("gpt3-175b", "dgx-a100", 64, base + ",recompute=selective", 64);
  const Prediction full = predict("gpt3-175b", "dgx-a100", 64, base + ",recompute=full,recompute_method=uniform,recompute_layers=1", 64);
  if (!sel.ok || !full.ok) {
    if (error) *error = sel.ok ? full.error : sel.error;
    return std::nullopt;
  }
  return full.out.report.step_time_s / sel.out.report.step_time_s - 1;
}

// --- Megatron-LM README strong scaling (H100) ---
//
// The README's GPT-3 (177B with its 131,072-token vocabulary; the table's
// 177B row) at a global batch of 1,152 from 96 to 4,608 H100s: "a reduction
// in MFU from 47% to 42%" (README text); the plot's other points are the
// table's 2,304-GPU row (432.8 TFLOP/s) and points read off a log-log plot
// only. The split is the table's (tp 8, pp 6), dp the rest; the README's
// flags as in megatron_h100(). MFU counts model FLOPs without causal halving
// against the H100's dense BF16 peak, as the README does.
struct ScalingPoint {
  int gpus = 0, dp = 0, microbatches = 0;   // micro-batches per pipeline
  std::optional<double> published_mfu;      // where the README states it
  double mfu_1f1b = 0, mfu_interleaved = 0;
};
struct StrongScaling {
  std::string error;              // a simulation's error; empty when every point ran
  int pp = 6, layers_per_stage = 16;
  int vpp = 0;                    // the fewest virtual stages the published loss allows (see readme_strong_scaling)
  double bubble_bound = 0;        // the largest bubble fraction at 4,608 GPUs the published MFUs allow
  std::vector<ScalingPoint> points;
  double published_loss = 0;      // 1 - MFU(4608) / MFU(96)
  double loss_1f1b = 0, loss_interleaved = 0;
};

// The points simulated with the table's split, both as 1F1B and interleaved
// with `vpp` virtual stages: the fewest (dividing the 16 layers a stage
// holds) whose interleaved bubble, (p - 1) / (v m + p - 1) of the step, is
// within what the published MFUs leave for it at 4,608 GPUs (m = 12
// micro-batches per pipeline): MFU(4608) / MFU(96) times 96 GPUs' busy share.
// That is a bound from the published figures alone, as long as the rest of
// the step's overheads take no smaller a share of it at 4,608 GPUs than at
// 96; the README does not say which schedule ran. With
// `calibration`, that cost-model profile laid over the shipped one.
inline StrongScaling readme_strong_scaling(const std::optional<std::string>& calibration = std::nullopt) {
  constexpr int kBatch = 1152, kTp = 8, kLayers = 96;
  constexpr double kMfu96 = 0.47, kMfu4608 = 0.42;   // README text
  constexpr double kPeak = 989.4;                    // H100 SXM dense BF16, TFLOP/s (dgx-h100)
  StrongScaling s;
  s.layers_per_stage = kLayers / s.pp;
  const auto bubble = [&](int v, int m) { return (s.pp - 1.0) / (v * m + s.pp - 1.0); };
  const int m96 = kBatch / (96 / (kTp * s.pp)), m4608 = kBatch / (4608 / (kTp * s.pp));
  s.bubble_bound = 1 - kMfu4608 / kMfu96 * (1 - bubble(1, m96));
  for (int v = 2; v <= s.layers_per_stage && s.vpp == 0; ++v)
    if (s.layers_per_stage % v == 0 && bubble(v, m4608) <= s.bubble_bound) s.vpp = v;
  const std::string flags = "mbs=1,distopt=on,overlap_grad_reduce=on,overlap_param_gather=on,sp=on,tp_comm_overlap=on";
  const std::string base = fmt::format("tp={},pp={},{}", kTp, s.pp, flags);
  const std::string interleaved = fmt::format("{},vpp={},schedule=interleaved", base, s.vpp);
  // The plot's points: dp 2 to 96.
  for (const int gpus : {96, 144, 288, 576, 1152, 2304, 3072, 4608}) {
    ScalingPoint pt;
    pt.gpus = gpus;
    pt.dp = gpus / (kTp * s.pp);
    pt.microbatches = kBatch / pt.dp;
    if (gpus == 96) pt.published_mfu = kMfu96;
    if (gpus == 2304) pt.published_mfu = 432.8 / kPeak;   // the table's 177B row
    if (gpus == 4608) pt.published_mfu = kMfu4608;
    for (const bool inter : {false, true}) {
      const Prediction p = predict(run_of("mcore-gpt-177b", "dgx-h100", gpus, inter ? interleaved : base, kBatch), calibration);
      if (!p.ok) {
        s.error = fmt::format("{} GPUs{}: {}", gpus, inter ? " interleaved" : "", p.error);
        return s;
      }
      (inter ? pt.mfu_interleaved : pt.mfu_1f1b) = p.out.report.mfu_no_causal;
    }
    s.points.push_back(pt);
  }
  s.published_loss = 1 - kMfu4608 / kMfu96;
  s.loss_1f1b = 1 - s.points.back().mfu_1f1b / s.points.front().mfu_1f1b;
  s.loss_interleaved = 1 - s.points.back().mfu_interleaved / s.points.front().mfu_interleaved;
  return s;
}

// --- Per-stage compute times (Qi et al. 2024, Table 9) ---

struct StageTimes {
  bool ok = false;
  std::string error;
  double f_s = 0, b_s = 0, w_s = 0;
};

// One row's pipeline as the zero-bubble paper ran it, on `dgx-a100`: one GPU
// per stage, ZB-H1 (B and W apart), one fewer layer on the first and last
// stages, fp16 weights and gradients (its fork's --fp16), Megatron-LM's
// unfused attention (the fork's default without --use-flash-attn; which
// kernel the runs used is not stated), GPT-2's vocabulary padded to 50304.
// Returns the summed compute of micro-batch 0's F, B and W ops on stage 1, a
// middle stage. The model is written to `model_file`; `calibration`, a
// cost-model profile laid over the shipped one; `attention`, the plan's
// attention kernel ("unfused" or "flash").
inline StageTimes zero_bubble_stage(const StageTimeRow& row, const std::string& model_file,
                                    const std::optional<std::string>& calibration = std::nullopt,
                                    const std::string& attention = "unfused") {
  StageTimes out;
  if (row.layers <= 0) {
    out.error = fmt::format("no Table 3 dimensions for model {}", row.model);
    return out;
  }
  if (row.pp < 3 || (row.layers + 2) % row.pp != 0) {
    out.error = fmt::format("{} layers do not make {} stages of k layers with one fewer on the first and last", row.layers,
                            row.pp);
    return out;
  }
  write_gpt_model(model_file, "gpt-" + row.model + "-zb", row.layers, row.hidden, row.heads, 1024, 50304);
  const int k = (row.layers + 2) / row.pp;   // layers of a middle stage
  PublishedRun run = run_of(model_file, "dgx-a100", row.pp,
                            fmt::format("pp={},mbs={},schedule=zb-h1,first_stage_layers={},last_stage_layers={},attention={}",
                                        row.pp, row.mbs, k - 1, k - 1, attention),
                            static_cast<std::int64_t>(row.mbs) * row.microbatches);
  run.params_dtype = Dtype::fp16;
  run.grad_dtype = Dtype::fp16;
  auto sc = scenario_of(run);
  if (!sc) {
    out.error = sc.error().str();
    return out;
  }
  auto program = build_program(sc->setup);
  if (!program) {
    out.error = program.error().str();
    return out;
  }
  auto cost = cli::cost_model_for(sc->setup, calibration);
  if (!cost) {
    out.error = cost.error().str();
    return out;
  }
  if (program->stages.size() < 2) {
    out.error = "the pipeline has no second stage";
    return out;
  }
  const StageProgram& stage = program->stages[1];
  const std::vector<double> dur = sim::compute_durations(stage, *cost);
  for (std::size_t i = 0; i < stage.ops.size(); ++i) {
    const Op& op = stage.ops[i];
    if (op.kind != OpKind::compute || !(op.microbatch == 0)) continue;
    if (op.phase == Phase::forward) out.f_s += dur[i];
    if (op.phase == Phase::backward_input) out.b_s += dur[i];
    if (op.phase == Phase::backward_weight) out.w_s += dur[i];
  }
  out.ok = true;
  return out;
}

// The forward-pass efficiency (CostProfile::forward_efficiency) that fits
// Table 9's forward times, from the rows' F predicted at 1 (`unit`): the
// value minimising the squared relative errors of F over the rows. nullopt
// when a row failed.
inline std::optional<double> fitted_forward_efficiency(const std::vector<StageTimeRow>& rows,
                                                       const std::vector<StageTimes>& unit) {
  if (rows.empty() || rows.size() != unit.size()) return std::nullopt;
  // F(e) = F(1) / e; the e minimising sum (F(1)/(e P) - 1)^2 over rows is
  // sum (F(1)/P)^2 / sum (F(1)/P).
  double num = 0, den = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (!unit[i].ok) return std::nullopt;
    const double x = unit[i].f_s / rows[i].f_s;
    num += x * x;
    den += x;
  }
  return num / den;
}

}  // namespace megascope::bench

namespace megascope::bench {

// The errors of the published tables (Narayanan Tables 1 and 2, the
// Megatron-LM README H100 table, the Megatron-Bridge / NeMo dense and MoE rows) by
// class of run (cli::Regime), as topologies/validation/regimes.toml ships
// them: throughput errors (published TFLOP/s and tokens/s are both
// throughput at a fixed FLOP count) and the highest published MFU of each
// class (the predicted MFU scaled by published over predicted).
inline std::vector<cli::RegimeStats> regime_stats(const std::string& ref_dir) {
  struct Table {
    std::vector<PublishedRun> runs;
    const char* name;
  };
  const Table tables[] = {{narayanan_table1(ref_dir), "Narayanan et al. 2021 Tables 1 and 2"},
                          {narayanan_table2_ptdp(ref_dir), "Narayanan et al. 2021 Tables 1 and 2"},
                          {shoeybi_2019(), "Shoeybi et al. 2019"},
                          {megatron_h100_tuned(ref_dir), "Megatron-LM README H100 table"},
                          {bridge_nemo_dense(ref_dir), "Megatron-Bridge and NeMo performance summaries"},
                          {bridge_nemo_moe(ref_dir), "Megatron-Bridge MoE rows"},
                          {bridge_fsdp(ref_dir), "Megatron-Bridge rows with Megatron-FSDP"},
                          {narayanan_table2_zero3(ref_dir), "Narayanan et al. 2021 Table 2, ZeRO-3 rows"}};
  std::vector<cli::RegimeStats> out;
  for (const Table& t : tables)
    for (const PublishedRun& run : t.runs) {
      const auto sc = scenario_of(run);
      const Prediction p = predict(run);
      if (!sc || !p.ok) continue;
      const sim::SimReport& r = p.out.report;
      const double err = throughput_error(run, r);
      const cli::Regime regime = cli::regime_of(sc->setup);
      auto it = std::find_if(out.begin(), out.end(), [&](const cli::RegimeStats& s) { return s.regime == regime; });
      if (it == out.end()) {
        out.push_back({regime, 0, 0, 0, 0, 0, t.name});
        it = out.end() - 1;
      } else if (it->tables.find(t.name) == std::string::npos) {
        it->tables += std::string("; ") + t.name;
      }
      it->mean_abs_error += std::abs(err);
      it->signed_mean_error += err;
      it->worst_abs_error = std::max(it->worst_abs_error, std::abs(err));
      it->max_published_mfu = std::max(it->max_published_mfu, r.mfu / (1 + err));
      ++it->rows;
    }
  for (cli::RegimeStats& s : out) {
    s.mean_abs_error /= s.rows;
    s.signed_mean_error /= s.rows;
  }
  return out;
}

}  // namespace megascope::bench

namespace megascope::bench {

// The sustained clock of a GPU generation ([profile] sustained_clock),
// fitted on the dense published runs of that generation (the Megatron-LM
// README H100 table and the Megatron-Bridge / NeMo dense rows): the value
// that minimises the squared log error of their throughput, with
// leave-one-model-out cross-validation (each model's rows predicted at the
// value fitted without them). Each row is simulated at three clocks and its
// log throughput interpolated by the parabola through them.
// A fit's errors over its rows: in sample and leave-one-model-out, summed
// row by row, then averaged.
struct FitErrors {
  int rows = 0;
  double mean_abs = 0, signed_mean = 0;          // in sample
  double lomo_mean_abs = 0, lomo_signed_mean = 0;
  void average() {
    const double n = static_cast<double>(rows);
    mean_abs /= n;
    signed_mean /= n;
    lomo_mean_abs /= n;
    lomo_signed_mean /= n;
  }
};

struct ClockFit : FitErrors {
  std::string generation;
  double clock = 1;                  // fitted on every row
  std::vector<std::pair<std::string, double>> lomo_clock_by_model;   // the clock fitted without each model
  std::string error;                 // a simulation failed
};

inline ClockFit fit_sustained_clock(const std::string& ref_dir, const std::string& generation) {
  ClockFit fit;
  fit.generation = generation;
  struct Row {
    std::string model;
    double published;                // throughput, in the row's unit
    double a, b, c;                  // log(predicted) = a + b x + c x^2
  };
  std::vector<Row> rows;
  constexpr double kAt[3] = {0.7, 0.85, 1.0};
  std::vector<PublishedRun> runs = megatron_h100_tuned(ref_dir);
  for (PublishedRun& r : bridge_nemo_dense(ref_dir)) runs.push_back(std::move(r));
  std::vector<std::unique_ptr<TempFile>> files;
  for (double at : kAt)
    files.push_back(std::make_unique<TempFile>(fmt::format("megascope-clock-{:.2f}.toml", at),
                                               fmt::format("[profile]\nsustained_clock = {}\n", at)));
  for (const PublishedRun& run : runs) {
    const auto sc = scenario_of(run);
    if (!sc || cli::regime_of(sc->setup).generation != generation) continue;
    double y[3];
    for (int i = 0; i < 3; ++i) {
      const Prediction p = predict(run, files[static_cast<std::size_t>(i)]->path());
      if (!p.ok) {
        fit.error = run.label + ": " + p.error;
        return fit;
      }
      y[i] = std::log(predicted_throughput(run, p.out.report));
    }
    // The parabola through (x_i, y_i), equally spaced by h.
    const double h = kAt[1] - kAt[0], x1 = kAt[1];
    const double c = (y[2] - 2 * y[1] + y[0]) / (2 * h * h), b1 = (y[2] - y[0]) / (2 * h);
    const double b = b1 - 2 * c * x1, a = y[1] - b1 * x1 + c * x1 * x1;
    rows.push_back({run.model, published_throughput(run), a, b, c});
  }
  fit.rows = static_cast<int>(rows.size());
  if (rows.empty()) return fit;
  const auto err = [](const Row& r, double x) { return std::exp(r.a + r.b * x + r.c * x * x) / r.published - 1; };
  // The clock in [0.5, 1] (1e-4 steps) with the least squared log error over the rows `use` keeps.
  const auto best = [&](auto use) {
    double best_x = 1, best_s = 1e300;
    for (int i = 5000; i <= 10000; ++i) {
      const double x = i * 1e-4;
      double s = 0;
      for (const Row& r : rows)
        if (use(r)) s += std::pow(std::log1p(err(r, x)), 2);
      if (s < best_s) {
        best_s = s;
        best_x = x;
      }
    }
    return best_x;
  };
  fit.clock = best([](const Row&) { return true; });
  std::vector<std::string> models;
  for (const Row& r : rows)
    if (std::find(models.begin(), models.end(), r.model) == models.end()) models.push_back(r.model);
  for (const std::string& m : models) {
    const double x = best([&](const Row& r) { return r.model != m; });
    fit.lomo_clock_by_model.emplace_back(m, x);
    for (const Row& r : rows)
      if (r.model == m) {
        fit.lomo_mean_abs += std::abs(err(r, x));
        fit.lomo_signed_mean += err(r, x);
      }
  }
  for (const Row& r : rows) {
    fit.mean_abs += std::abs(err(r, fit.clock));
    fit.signed_mean += err(r, fit.clock);
  }
  fit.average();
  return fit;
}

}  // namespace megascope::bench

namespace megascope::bench {

// The host's time per kernel launch of a GPU generation ([launch] host_us),
// fitted on the dropless MoE rows of the Megatron-Bridge summaries
// (bridge_nemo_moe: the runs whose host paces the GPU; token-dropping rows
// do not depend on it): the value on a 10 us grid from 0 to 150 us with the
// least squared log error of their throughput, with leave-one-model-out
// cross-validation (each model's rows predicted at the value fitted without
// them).
struct HostFit : FitErrors {
  std::string generation;
  double host_us = 0;                                // fitted on every row
  std::vector<std::pair<std::string, double>> lomo_by_model;   // the value fitted without each model
  std::string error;
};

inline HostFit fit_host_launch(const std::string& ref_dir, const std::string& generation) {
  HostFit fit;
  fit.generation = generation;
  constexpr int kSteps = 16;
  constexpr double kStepUs = 10.0;
  std::vector<std::unique_ptr<TempFile>> files;
  for (int i = 0; i < kSteps; ++i)
    files.push_back(std::make_unique<TempFile>(fmt::format("megascope-host-{}.toml", i),
                                               fmt::format("[launch]\nhost_us = {}\n", i * kStepUs)));
  struct Row {
    std::string model;
    std::vector<double> err;   // at each grid value
  };
  std::vector<Row> rows;
  for (const PublishedRun& run : bridge_nemo_moe(ref_dir)) {
    if (run.token_drop) continue;
    const auto sc = scenario_of(run);
    if (!sc || cli::regime_of(sc->setup).generation != generation) continue;
    Row r{run.model, {}};
    for (int i = 0; i < kSteps; ++i) {
      const Prediction p = predict(run, files[static_cast<std::size_t>(i)]->path());
      if (!p.ok) {
        fit.error = run.label + ": " + p.error;
        return fit;
      }
      r.err.push_back(throughput_error(run, p.out.report));
    }
    rows.push_back(std::move(r));
  }
  fit.rows = static_cast<int>(rows.size());
  if (rows.empty()) return fit;
  const auto best = [&](auto use) {
    int bi = 0;
    double bs = 1e300;
    for (int i = 0; i < kSteps; ++i) {
      double s = 0;
      for (const Row& r : rows)
        if (use(r)) s += std::pow(std::log1p(r.err[static_cast<std::size_t>(i)]), 2);
      if (s < bs - 1e-12) {
        bs = s;
        bi = i;
      }
    }
    return bi;
  };
  const int all = best([](const Row&) { return true; });
  fit.host_us = all * kStepUs;
  std::vector<std::string> models;
  for (const Row& r : rows)
    if (std::find(models.begin(), models.end(), r.model) == models.end()) models.push_back(r.model);
  for (const std::string& m : models) {
    const int i = best([&](const Row& r) { return r.model != m; });
    fit.lomo_by_model.emplace_back(m, i * kStepUs);
    for (const Row& r : rows)
      if (r.model == m) {
        fit.lomo_mean_abs += std::abs(r.err[static_cast<std::size_t>(i)]);
        fit.lomo_signed_mean += r.err[static_cast<std::size_t>(i)];
      }
  }
  for (const Row& r : rows) {
    fit.mean_abs += std::abs(r.err[static_cast<std::size_t>(all)]);
    fit.signed_mean += r.err[static_cast<std::size_t>(all)];
  }
  fit.average();
  return fit;
}

}  // namespace megascope::bench
