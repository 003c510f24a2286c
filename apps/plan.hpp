// `megascope plan`: search every legal plan for a model, a cluster and a
// batch, rank the best by simulation, explain the winner (or a given plan)
// and print the Megatron-LM arguments.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>

#include "planner/planner.hpp"

namespace megascope::cli {

struct PlanCommandOptions {
  std::optional<std::string> model, cluster, gpus, max_gpus, explain, calibration;
  std::optional<std::string> training;   // a TOML file with a [training] table
  std::optional<int> nodes;
  std::optional<std::int64_t> global_batch, seq_len;
  std::optional<double> moe_imbalance;   // overrides the MoE models' load_imbalance
  std::optional<std::string> moe_histogram;   // a measured per-expert token distribution
  int top = 32;
  int threads = 0;
  bool json = false, csv = false, no_progress = false;
  // Constraints as given (parsed in run_plan so that errors name the option).
  std::optional<std::string> tp, pp, vpp, dp, cp, ep, etp, mbs, schedules, recompute, sp, distopt, zero, overlap_grad_reduce,
      overlap_param_gather, tp_comm_overlap, block_recompute, recompute_modules, uneven_stages, hsdp;
  int uneven_depth = 4;
  double headroom_gib = 2.0;
  int min_dp = 1;
  bool tp_across_domains = false;
};

// Adds plan's --model, --cluster, --gpus and --max-gpus, then add_search_options.
void add_plan_options(CLI::App& cmd, PlanCommandOptions& o);
// Adds the batch, constraint and search options shared by plan and sweep
// (everything but the model, the cluster and the GPU counts).
void add_search_options(CLI::App& cmd, PlanCommandOptions& o);

// Resolves the options into search inputs (GPU counts from --gpus N | A-B or --max-gpus N);
// what it assumed or the user should know (a Hugging Face config's default
// length, a part-used node) goes to `notes` when given.
Result<planner::SearchInputs> plan_inputs(const PlanCommandOptions& o, std::vector<std::string>* notes = nullptr);

// A check_inputs error about the training, naming the --training file it came from.
Result<planner::SearchInputs> with_training_file(Result<planner::SearchInputs> r, const PlanCommandOptions& o);

// Sets the training spec and the constraints of `in` from the options of
// add_search_options; errors name the option.
Result<void> apply_search_options(const PlanCommandOptions& o, planner::SearchInputs& in);
// Adds whole nodes to `cluster` until it holds `gpus` devices (no change if it does).
Result<void> grow_cluster(ClusterSpec& cluster, int gpus);

// The inline form of a candidate's plan, e.g. "tp=8,pp=8,vpp=3,...".
std::string plan_text(const PlanSpec& p);
// What a training spec sets beyond the defaults ("fp8 GEMMs, precision-aware
// optimizer (...)"; empty for bf16 weights, fp32 gradients and fp32 state), and all of it as JSON.
std::string training_text(const TrainingSpec& t);
nlohmann::json training_json(const TrainingSpec& t);

int run_plan(const PlanCommandOptions& o, std::ostream& out, std::ostream& err);

}  // namespace megascope::cli
