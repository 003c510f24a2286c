// Predicting the published runs (published.hpp) and the published ablations
// with the simulator, as docs/validation.md reports them: shared by
// validation_report and the accuracy tests (tests/apps/validation_test.cpp),
// so that the tests hold the numbers the report prints.
#pragma once

#include <fmt/format.h>

#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "apps/scenario.hpp"
#include "apps/simulate.hpp"
#include "published.hpp"

namespace megascope::bench {

struct Prediction {
  bool ok = false;
  std::string error;
  cli::SimulateOutcome out;
  bool fits = false;
  double peak_gib = 0;
};

// One published run simulated with the shipped model, cluster and cost
// profile, in the run's number formats; with `calibration`, that cost-model
// profile laid over the shipped one (simulate --calibration).
inline Prediction predict(const PublishedRun& run, const std::optional<std::string>& calibration = std::nullopt) {
  Prediction p;
  cli::ScenarioOptions o;
  o.model = run.model;
  o.cluster = run.cluster;
  o.gpus = run.gpus;
  o.plan = run.plan;
  o.global_batch = run.batch;
  auto sc = cli::load_scenario(o);
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
// fp16 weights and main gradients.
inline Prediction predict_2021(const std::string& model, const std::string& cluster, int gpus, const std::string& plan,
                               std::int64_t batch) {
  PublishedRun run = run_of(model, cluster, gpus, plan + ",tp_grad_overlap=off,grad_accum_fusion=off,pp_scatter_gather=on,overlap_p2p_comm=off", batch);
  run.params_dtype = Dtype::fp16;
  run.grad_dtype = Dtype::fp16;
  return predict(run);
}

// --- The published ablations, as numbers (nullopt: a simulation failed) ---

// Narayanan Fig. 12: GPT-3 175B on 96 GPUs, tp 8 pp 12: the interleaved
// schedule (2 layers per virtual stage, v 4) over 1F1B, as a step-time gain.
inline std::optional<double> interleaving_gain(int batch, std::string* error = nullptr) {
  const std::string common = "mbs=1,recompute=full,recompute_method=uniform,recompute_layers=1,attention=unfused";
  const Prediction a = predict_2021("gpt3-175b", "dgx-a100", 96, "tp=8,pp=12," + common, batch);
  const Prediction b = predict_2021("gpt3-175b", "dgx-a100", 96, "tp=8,pp=12,vpp=4,schedule=interleaved," + common, batch);
  if (!a.ok || !b.ok) {
    if (error) *error = a.ok ? b.error : a.error;
    return std::nullopt;
  }
  return a.out.report.step_time_s / b.out.report.step_time_s - 1;
}

// Narayanan Fig. 13: the 162B model (32 layers, h 20480) on 64 GPUs, batch
// 128, tokens/s of each tp x pp = 64 split (the model is written to
// `model_file`).
inline std::vector<std::pair<int, std::optional<double>>> tp_split_throughputs(const std::string& model_file) {
  std::ofstream(model_file) << "[model]\nname = \"gpt-162b\"\nnum_layers = 32\nhidden_size = 20480\nffn_hidden_size = 81920\n"
                               "num_attention_heads = 128\nvocab_size = 51200\nseq_length = 2048\nactivation = \"gelu\"\n"
                               "norm = \"layernorm\"\nposition_embedding = \"learned\"\nadd_bias_linear = true\n"
                               "tied_embeddings = true\nhidden_dropout = 0.1\nattention_dropout = 0.1\n";
  std::vector<std::pair<int, std::optional<double>>> out;
  for (int tp : {2, 4, 8, 16, 32}) {
    const Prediction p = predict_2021(
        model_file, "dgx-a100", 64,
        fmt::format("tp={},pp={},mbs=1,recompute=full,recompute_method=uniform,recompute_layers=1,attention=unfused", tp, 64 / tp), 128);
    out.emplace_back(tp, p.ok ? std::optional<double>(p.out.report.tokens_per_s) : std::nullopt);
  }
  return out;
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

}  // namespace megascope::bench
