// Scenario: the model, cluster, training setup and plan a command works on,
// resolved from command-line options (shipped names, files, inline plans,
// Megatron-LM launch lines or an [example] file) and validated into a Setup.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/cluster.hpp"
#include "core/result.hpp"
#include "core/setup.hpp"

namespace megascope::cli {

struct ScenarioOptions {
  std::optional<std::string> example;         // [example] file; default when nothing else is given
  std::optional<std::string> model;
  std::optional<std::string> cluster;
  std::optional<std::string> plan;
  std::optional<std::string> megatron_args;   // replaces model, plan and batch
  std::optional<std::string> deepspeed_config;   // a ds_config.json applied to the plan and batch
  std::optional<int> nodes;
  std::optional<int> gpus;
  std::optional<std::int64_t> global_batch;
  std::optional<std::int64_t> seq_len;
  std::optional<std::string> training;        // a [training] TOML file: precision, dtypes, optimizer, batch, length
  std::optional<double> moe_imbalance;        // overrides the model's [model.moe] load_imbalance
  std::optional<std::string> moe_histogram;   // a measured per-expert token distribution (config/token_histogram.hpp)
  std::optional<int> mtp_layers;              // overrides the model's mtp_num_layers (0: trained without MTP)
  std::optional<ClusterSpec> cluster_spec;    // used when no cluster is named (run: the CPU host sized to the job)
};

struct Scenario {
  Setup setup;
  std::string source;                          // "default example (...)", "--model ...", ...
  std::vector<std::string> notes;              // e.g. Megatron flags accepted but not modelled
};

Result<Scenario> load_scenario(const ScenarioOptions& o);

// A Hugging Face config.json states the longest sequence the model takes
// (max_position_embeddings, 131,072 for Llama 3.1), not a training length.
// A model loaded from one (`model_arg` ends in .json) with no training
// length given trains at kHfSeqLen tokens, or its maximum where that is
// shorter: sets training.seq_length and returns the note that says so.
inline constexpr std::int64_t kHfSeqLen = 4096;
std::optional<std::string> default_hf_seq_length(const std::string& model_arg, const ModelSpec& m, TrainingSpec& t);

// --moe-imbalance: sets the model's [model.moe] load_imbalance (the busiest EP
// rank's tokens over the mean). An error for a dense model or a value that is
// not a finite number >= 1, naming the option.
Result<void> override_moe_imbalance(ModelSpec& m, std::optional<double> imbalance);

}  // namespace megascope::cli
