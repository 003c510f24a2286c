#include "apps/scenario.hpp"

#include <fmt/format.h>

#include "config/library.hpp"
#include "config/spec_toml.hpp"
#include "config/deepspeed_config.hpp"
#include "config/megatron_args.hpp"
#include "config/token_histogram.hpp"

namespace megascope::cli {

namespace {
using Err = tl::unexpected<Error>;
Error usage(const std::string& option, const std::string& message) { return Error{message, option, std::nullopt}; }
}  // namespace

Result<void> override_moe_imbalance(ModelSpec& m, std::optional<double> imbalance) {
  if (!imbalance) return {};
  if (!m.moe) return Err(usage("--moe-imbalance", fmt::format("'{}' has no experts to route to", m.name)));
  ModelSpec with = m;
  with.moe->load_imbalance = *imbalance;
  auto valid = validate_model(std::move(with));   // the model's own rule for the value
  if (!valid) return Err(usage("--moe-imbalance", valid.error().message));
  m = std::move(*valid);
  return {};
}

std::optional<std::string> default_hf_seq_length(const std::string& model_arg, const ModelSpec& m, TrainingSpec& t) {
  if (!model_arg.ends_with(".json") || t.seq_length || m.seq_length <= kHfSeqLen) return std::nullopt;
  t.seq_length = kHfSeqLen;
  return fmt::format("sequence length {} assumed: {}'s max_position_embeddings ({}) is the longest the model takes, not "
                     "a training length; give --seq-len", kHfSeqLen, model_arg, m.seq_length);
}

Result<Scenario> load_scenario(const ScenarioOptions& o) {
  Scenario sc;
  ModelSpec model;
  std::optional<ClusterSpec> cluster;
  TrainingSpec training;
  PlanSpec plan;
  std::optional<int> gpus = o.gpus;
  bool have_model = false, have_plan = false, have_training = false;

  const bool nothing = !o.model && !o.cluster && !o.plan && !o.megatron_args;
  if (o.example || nothing) {
    const std::string path = o.example.value_or(default_example_path());
    auto ex = load_example_toml(path);
    if (!ex) return Err(ex.error());
    auto m = resolve_model(ex->model);
    if (!m) return Err(m.error());
    auto c = resolve_cluster(ex->cluster);
    if (!c) return Err(c.error());
    model = *m;
    cluster = *c;
    training = ex->training;
    plan = ex->plan;
    if (!gpus) gpus = ex->gpus;
    have_model = have_plan = have_training = true;
    sc.source = o.example ? "example " + path : "the default example (" + path + ")";
  }

  if (o.megatron_args) {
    if (o.model) return Err(usage("--model", "--megatron-args carries the model; do not give --model as well"));
    if (o.plan) return Err(usage("--plan", "--megatron-args carries the plan; do not give --plan as well"));
    auto launch = import_megatron_args(*o.megatron_args);
    if (!launch) return Err(launch.error());
    model = launch->model;
    training = launch->training;
    plan = launch->plan;
    have_model = have_plan = have_training = true;
    if (!launch->ignored.empty())
      sc.notes.push_back(fmt::format("Megatron flags accepted but not modelled: {}",
                                     fmt::join(launch->ignored, " ")));
    for (const auto& w : launch->warnings) sc.notes.push_back(w);
  }
  if (o.model) {
    auto m = resolve_model(*o.model);
    if (!m) return Err(m.error());
    model = *m;
    have_model = true;
  }
  if (o.cluster) {
    auto c = resolve_cluster(*o.cluster);
    if (!c) return Err(c.error());
    cluster = *c;
  }
  if (o.plan) {
    auto p = resolve_plan(*o.plan);
    if (!p) return Err(p.error());
    plan = *p;
    have_plan = true;
  }
  if (o.deepspeed_config) {
    if (!have_plan) return Err(usage("--deepspeed-config", "needs a plan to apply to: --plan, --megatron-args or --example"));
    if (!have_model) return Err(usage("--deepspeed-config", "needs a model: --model, --megatron-args or --example"));
    auto ds = load_deepspeed_config(*o.deepspeed_config);
    if (!ds) return Err(ds.error());
    std::optional<int> dp;
    if (gpus && *gpus % (plan.tp * plan.pp * plan.cp) == 0) dp = *gpus / (plan.tp * plan.pp * plan.cp);
    if (plan.dp) dp = plan.dp;
    if (auto ok = apply_deepspeed_config(*ds, model, plan, training, dp); !ok) return Err(ok.error());
    // The batch it gives, or micro-batch x accumulation x DP.
    have_training = have_training || training.global_batch_size > 0;
    if (!ds->ignored.empty())
      sc.notes.push_back(fmt::format("DeepSpeed keys read but not priced: {}", fmt::join(ds->ignored, " ")));
  }
  if (!cluster && o.cluster_spec) cluster = *o.cluster_spec;
  if (!have_model) return Err(usage("--model", "a model is required: --model NAME|FILE or --megatron-args \"...\""));
  if (auto ok = override_moe_imbalance(model, o.moe_imbalance); !ok) return Err(ok.error());
  if (o.moe_histogram)
    if (auto ok = apply_token_histogram(model, *o.moe_histogram); !ok) return Err(ok.error());
  if (o.mtp_layers) {
    if (*o.mtp_layers < 0) return Err(usage("--mtp-layers", fmt::format("must be >= 0, found {}", *o.mtp_layers)));
    model.mtp_num_layers = *o.mtp_layers;
  }
  if (!cluster) return Err(usage("--cluster", "a cluster is required: --cluster NAME|FILE"));
  if (!have_plan) return Err(usage("--plan", "a plan is required: --plan \"tp=8,pp=2,...\"|FILE"));
  if (o.global_batch && *o.global_batch < 1)
    return Err(usage("--global-batch", fmt::format("must be >= 1, found {}", *o.global_batch)));
  if (o.training) {
    if (o.megatron_args) return Err(usage("--training", "--megatron-args carries the training setup; do not give both"));
    auto t = o.global_batch ? load_training_toml(*o.training, *o.global_batch) : load_training_toml(*o.training);
    if (!t) return Err(t.error());
    training = std::move(*t);
    have_training = true;
  }
  if (o.global_batch) training.global_batch_size = *o.global_batch;
  if (o.seq_len) training.seq_length = *o.seq_len;
  if (o.model)
    if (auto note = default_hf_seq_length(*o.model, model, training)) sc.notes.push_back(*note);
  if (!have_training && !o.global_batch)
    return Err(usage("--global-batch", "the global batch size is required: --global-batch B"));
  if (training.global_batch_size < 1)
    return Err(usage("--global-batch", "the launch line has no --global-batch-size; give --global-batch B"));

  if (!gpus && !o.nodes && plan.dp.value_or(1) >= 1 && plan.tp >= 1 && plan.pp >= 1 && plan.cp >= 1) {
    // No GPU count from --gpus, --nodes or an example: not the whole cluster
    // (thousands of GPUs, and a data-parallel size no batch divides) but the
    // fewest the plan runs on: tp x pp x cp x dp with the plan's dp, or the
    // smallest dp (a power of two, for expert parallelism and the batch) that
    // makes a legal setup.
    const int dp_from = plan.dp.value_or(1), dp_to = plan.dp.value_or(1 << 20);
    const std::int64_t per_dp = static_cast<std::int64_t>(plan.tp) * plan.pp * plan.cp;
    for (int dp = dp_from; dp <= dp_to && per_dp * dp <= cluster->total_devices(); dp *= 2) {
      const int n = static_cast<int>(per_dp * dp);
      auto c = with_device_count(*cluster, n);
      if (!c || !validate_setup(model, *c, training, plan, n)) continue;
      gpus = n;
      sc.notes.push_back(fmt::format("--gpus {} assumed: the fewest GPUs the plan runs on (tp {} x pp {} x cp {} x dp {}); "
                                     "give --gpus or --nodes for the job's size",
                                     n, plan.tp, plan.pp, plan.cp, dp));
      break;
    }
  }
  if (o.nodes) {
    if (*o.nodes < 1) return Err(usage("--nodes", fmt::format("must be >= 1, found {}", *o.nodes)));
    cluster->num_nodes = *o.nodes;
    if (gpus && *gpus > cluster->total_devices() && o.gpus)
      return Err(usage("--gpus", fmt::format("{} GPUs do not fit in {} nodes of {}", *gpus, *o.nodes,
                                             cluster->node.devices_per_node)));
    if (!o.gpus) gpus = cluster->total_devices();
  } else if (gpus) {
    auto c = with_device_count(*cluster, *gpus);
    if (!c) return Err(c.error());
    cluster = *c;
  }
  auto setup = validate_setup(model, *cluster, training, plan, gpus.value_or(0));
  if (!setup) return Err(setup.error());
  sc.setup = *setup;
  if (sc.source.empty()) sc.source = "command line";
  return sc;
}

}  // namespace megascope::cli
