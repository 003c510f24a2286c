#include "config/deepspeed_config.hpp"
#include "config/json_file.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>
#include <tuple>

#include "core/accounting/params.hpp"

namespace megascope {

namespace {

using nlohmann::json;

// Where a key is written: the line of the first "key" after `from` (the
// parent object's own key, when nested), for messages. nlohmann does not
// keep positions; a key name written once per object level is found.
class Locator {
 public:
  Locator(std::string_view text, std::string source) : text_(text), source_(std::move(source)) {}

  [[nodiscard]] SourceLocation at(const std::string& path) const {
    std::size_t from = 0, pos = std::string_view::npos;
    std::size_t start = 0;
    while (start <= path.size()) {
      const std::size_t dot = std::min(path.find('.', start), path.size());
      const std::string quoted = "\"" + path.substr(start, dot - start) + "\"";
      const std::size_t found = text_.find(quoted, from);
      if (found == std::string_view::npos) break;
      pos = found;
      from = found + quoted.size();
      start = dot + 1;
    }
    SourceLocation loc{source_, std::nullopt, std::nullopt};
    if (pos != std::string_view::npos) std::tie(loc.line, loc.column) = json_detail::line_column(text_, pos);
    return loc;
  }

  [[nodiscard]] tl::unexpected<Error> error(const std::string& path, std::string message) const {
    return tl::unexpected(Error{std::move(message), "deepspeed." + path, at(path)});
  }

 private:
  std::string_view text_;
  std::string source_;
};

std::string type_of(const json& v) {
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

// What the reader does with each key it knows.
enum class Role { read, ignored };

// Keys of one object: modelled ones are read by the caller, ignored ones
// listed in the config's notes; anything else is an error.
Result<void> check_keys(const json& obj, const std::string& prefix, const Locator& loc,
                        const std::set<std::string, std::less<>>& read, const std::set<std::string, std::less<>>& ignored,
                        std::vector<std::string>& notes) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const std::string path = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (read.count(it.key())) continue;
    if (ignored.count(it.key())) {
      notes.push_back(path);
      continue;
    }
    std::string known;
    for (const auto* set : {&read, &ignored})
      for (const std::string& k : *set) known += (known.empty() ? "" : ", ") + k;
    return loc.error(path, fmt::format("unknown DeepSpeed key \"{}\"{}; known here: {}", path,
                                       prefix.empty() ? "" : fmt::format(" in \"{}\"", prefix), known));
  }
  return {};
}

}  // namespace

Result<DeepSpeedConfig> parse_deepspeed_config(std::string_view json_text, const std::string& source) {
  auto parsed = json_detail::parse_json(json_text, source, "deepspeed");
  if (!parsed) return tl::unexpected(parsed.error());
  const json root = std::move(*parsed);
  const Locator loc(json_text, source);
  if (!root.is_object()) return loc.error("", fmt::format("a DeepSpeed config is a JSON object, found {}", type_of(root)));
  DeepSpeedConfig ds;
  ds.source = source;

  // Typed reads of one object's keys.
  const auto integer = [&](const json& obj, const std::string& prefix, const char* key, std::int64_t lo,
                           std::int64_t hi) -> Result<std::optional<std::int64_t>> {
    const auto it = obj.find(key);
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (it == obj.end() || it->is_null()) return std::optional<std::int64_t>{};
    // DeepSpeed writes sizes as 5e8 as often as 500000000: a whole number either way.
    if (!it->is_number() || std::floor(it->get<double>()) != it->get<double>())
      return loc.error(path, fmt::format("\"{}\" must be a whole number, found {}", path, it->dump()));
    const double v = it->get<double>();
    if (v < static_cast<double>(lo) || v > static_cast<double>(hi))
      return loc.error(path, fmt::format("\"{}\" must be in [{}, {}], found {}", path, lo, hi, it->dump()));
    return std::optional<std::int64_t>{static_cast<std::int64_t>(v)};
  };
  const auto boolean = [&](const json& obj, const std::string& prefix, const char* key) -> Result<std::optional<bool>> {
    const auto it = obj.find(key);
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (it == obj.end() || it->is_null()) return std::optional<bool>{};
    if (!it->is_boolean()) return loc.error(path, fmt::format("\"{}\" must be true or false, found {}", path, type_of(*it)));
    return std::optional<bool>{it->get<bool>()};
  };
  const auto object = [&](const char* key) -> Result<const json*> {
    const auto it = root.find(key);
    if (it == root.end() || it->is_null()) return static_cast<const json*>(nullptr);
    if (!it->is_object()) return loc.error(key, fmt::format("\"{}\" must be an object, found {}", key, type_of(*it)));
    return &*it;
  };
#define MEGASCOPE_DS_TRY(var, expr)                 \
  auto var = (expr);                                \
  if (!var) return tl::unexpected(var.error());

  // Top level.
  if (auto ok = check_keys(root, "", loc,
                           {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "bf16",
                            "fp16", "zero_optimization", "optimizer", "data_types", "activation_checkpointing",
                            "communication_data_type", "amp", "compression_training", "sparse_attention",
                            "curriculum_learning", "data_efficiency", "elasticity", "zero_force_ds_cpu_optimizer"},
                           {"scheduler", "gradient_clipping", "steps_per_print", "wall_clock_breakdown", "prescale_gradients",
                            "gradient_predivide_factor", "zero_allow_untested_optimizer", "flops_profiler", "tensorboard",
                            "wandb", "csv_monitor", "comms_logger", "dump_state", "memory_breakdown", "pipeline",
                            "checkpoint", "aio", "disable_allgather", "seq_parallel_communication_data_type",
                            "load_universal_checkpoint", "use_node_local_storage", "timers", "monitor_config"},
                           ds.ignored);
      !ok)
    return tl::unexpected(ok.error());
  for (const char* key : {"amp", "compression_training", "sparse_attention", "curriculum_learning", "data_efficiency",
                          "elasticity"})
    if (root.contains(key) && !(root[key].is_object() && root[key].contains("enabled") && root[key]["enabled"] == false))
      return loc.error(key, fmt::format("\"{}\" changes the work of a step and is not modelled; remove it", key));
  if (root.contains("communication_data_type"))
    return loc.error("communication_data_type",
                     "\"communication_data_type\" is not modelled: gradients are reduced in their own dtype");
  if (root.contains("zero_force_ds_cpu_optimizer") && root["zero_force_ds_cpu_optimizer"] == true)
    return loc.error("zero_force_ds_cpu_optimizer", "the CPU optimizer (offload) is not modelled");
  MEGASCOPE_DS_TRY(gbs, integer(root, "", "train_batch_size", 1, std::int64_t{1} << 40));
  MEGASCOPE_DS_TRY(mbs, integer(root, "", "train_micro_batch_size_per_gpu", 1, 1 << 20));
  MEGASCOPE_DS_TRY(ga, integer(root, "", "gradient_accumulation_steps", 1, 1 << 30));
  ds.train_batch_size = *gbs;
  ds.micro_batch = *mbs;
  ds.grad_accum = *ga;

  for (const char* key : {"bf16", "fp16"}) {
    MEGASCOPE_DS_TRY(obj, object(key));
    if (!*obj) continue;
    MEGASCOPE_DS_TRY(enabled, boolean(**obj, key, "enabled"));
    if (auto ok = check_keys(**obj, key, loc, {"enabled"},
                             {"loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                              "consecutive_hysteresis", "min_loss_scale", "auto_cast", "fp16_master_weights_and_grads",
                              "immediate_grad_update", "check_grad_overflow", "bf16_master_weights_and_grads",
                              "bf16_optimizer_states"},
                             ds.ignored);
        !ok)
      return tl::unexpected(ok.error());
    (std::string(key) == "bf16" ? ds.bf16 : ds.fp16) = enabled->value_or(false);
  }
  if (ds.bf16.value_or(false) && ds.fp16.value_or(false))
    return loc.error("fp16.enabled", "bf16 and fp16 are both enabled; DeepSpeed takes one");

  {
    MEGASCOPE_DS_TRY(opt, object("optimizer"));
    if (*opt) {
      const auto type = (*opt)->find("type");
      std::string name = type != (*opt)->end() && type->is_string() ? type->get<std::string>() : "";
      std::string lower = name;
      std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      if (lower != "adam" && lower != "adamw" && lower != "fusedadam")
        return loc.error("optimizer.type", fmt::format("optimizer \"{}\" is not modelled; Adam and AdamW are", name));
      ds.ignored.push_back("optimizer.params");
    }
  }
  {
    MEGASCOPE_DS_TRY(dt, object("data_types"));
    if (*dt) {
      if (auto ok = check_keys(**dt, "data_types", loc, {"grad_accum_dtype"}, {}, ds.ignored); !ok) return tl::unexpected(ok.error());
      if ((*dt)->contains("grad_accum_dtype"))
        return loc.error("data_types.grad_accum_dtype",
                         "\"grad_accum_dtype\" is not modelled: the gradients are kept in fp32 with bf16, fp16 with fp16");
    }
  }
  {
    MEGASCOPE_DS_TRY(ac, object("activation_checkpointing"));
    if (*ac) {
      if (auto ok = check_keys(**ac, "activation_checkpointing", loc, {"partition_activations", "cpu_checkpointing"},
                               {"contiguous_memory_optimization", "number_checkpoints", "synchronize_checkpoint_boundary",
                                "profile"},
                               ds.ignored);
          !ok)
        return tl::unexpected(ok.error());
      for (const char* key : {"partition_activations", "cpu_checkpointing"}) {
        MEGASCOPE_DS_TRY(on, boolean(**ac, "activation_checkpointing", key));
        if (on->value_or(false))
          return loc.error(std::string("activation_checkpointing.") + key,
                           fmt::format("\"{}\" is not modelled; recomputation comes from the plan", key));
      }
    }
  }

  MEGASCOPE_DS_TRY(zero_obj, object("zero_optimization"));
  if (*zero_obj) {
    const json& z = **zero_obj;
    const std::string zp = "zero_optimization";
    if (auto ok = check_keys(z, zp, loc,
                             {"stage", "overlap_comm", "reduce_bucket_size", "reduce_scatter", "allgather_partitions",
                              "stage3_prefetch_bucket_size", "offload_optimizer", "offload_param", "cpu_offload",
                              "cpu_offload_params", "zero_quantized_weights", "zero_quantized_gradients",
                              "zero_hpz_partition_size", "mics_shard_size", "mics_hierarchical_params_gather",
                              "zero_quantized_nontrainable_weights"},
                             {"contiguous_gradients", "allgather_bucket_size", "round_robin_gradients",
                              "stage3_param_persistence_threshold", "stage3_max_live_parameters",
                              "stage3_max_reuse_distance", "stage3_gather_16bit_weights_on_model_save",
                              "stage3_gather_fp16_weights_on_model_save", "sub_group_size", "elastic_checkpoint",
                              "load_from_fp32_weights", "ignore_unused_parameters", "memory_efficient_linear",
                              "legacy_stage1", "round_robin_gradients", "use_multi_rank_bucket_allreduce",
                              "log_trace_cache_warnings", "zeropp_loco_param", "pipeline_loading_checkpoint",
                              "override_module_apply", "use_all_reduce_for_fetch_params"},
                             ds.ignored);
        !ok)
      return tl::unexpected(ok.error());
    MEGASCOPE_DS_TRY(stage, integer(z, zp, "stage", 0, 3));
    ds.stage = static_cast<int>(stage->value_or(0));
    MEGASCOPE_DS_TRY(overlap, boolean(z, zp, "overlap_comm"));
    ds.overlap_comm = *overlap;
    MEGASCOPE_DS_TRY(rbucket, integer(z, zp, "reduce_bucket_size", 1, std::int64_t{1} << 40));
    if (*rbucket) ds.reduce_bucket_size = static_cast<double>(**rbucket);
    MEGASCOPE_DS_TRY(pbucket, integer(z, zp, "stage3_prefetch_bucket_size", 0, std::int64_t{1} << 40));
    if (*pbucket) ds.prefetch_bucket_size = static_cast<double>(**pbucket);
    for (const char* key : {"reduce_scatter", "allgather_partitions"}) {
      MEGASCOPE_DS_TRY(on, boolean(z, zp, key));
      if (*on && !**on)
        return loc.error(zp + "." + key, fmt::format("\"{}\": false (reduce or all-reduce and broadcast instead of "
                                                     "reduce-scatter and all-gather) is not modelled",
                                                     key));
    }
    for (const char* key : {"offload_optimizer", "offload_param"}) {
      const auto it = z.find(key);
      if (it == z.end() || it->is_null()) continue;
      const std::string device = it->is_object() && it->contains("device") && (*it)["device"].is_string()
                                     ? (*it)["device"].get<std::string>()
                                     : "cpu";
      if (device != "none")
        return loc.error(zp + "." + key, fmt::format("\"{}\" to {} (ZeRO-Offload / ZeRO-Infinity) is not modelled; "
                                                     "remove it or set \"device\": \"none\"",
                                                     key, device));
    }
    for (const char* key : {"cpu_offload", "cpu_offload_params", "zero_quantized_weights", "zero_quantized_gradients",
                            "zero_quantized_nontrainable_weights", "mics_hierarchical_params_gather"}) {
      MEGASCOPE_DS_TRY(on, boolean(z, zp, key));
      if (on->value_or(false))
        return loc.error(zp + "." + key, fmt::format("\"{}\" is not modelled (offload, ZeRO++ quantisation and MiCS "
                                                     "change what each collective moves)",
                                                     key));
    }
    MEGASCOPE_DS_TRY(hpz, integer(z, zp, "zero_hpz_partition_size", -1, 1 << 30));
    if (hpz->value_or(1) > 1)
      return loc.error(zp + ".zero_hpz_partition_size", "\"zero_hpz_partition_size\" (ZeRO++'s secondary copy of the "
                                                        "parameters inside a group) is not modelled");
    // MiCS: the state sharded inside groups of this many ranks, replicated across.
    MEGASCOPE_DS_TRY(mics, integer(z, zp, "mics_shard_size", -1, 1 << 30));
    if (mics->value_or(-1) > 0) ds.mics_shard_size = static_cast<int>(**mics);
  }
#undef MEGASCOPE_DS_TRY
  return ds;
}

Result<DeepSpeedConfig> load_deepspeed_config(const std::string& path) {
  auto text = json_detail::read_text_file(path, "DeepSpeed config", "deepspeed");
  if (!text) return tl::unexpected(text.error());
  return parse_deepspeed_config(*text, path);
}

Result<void> apply_deepspeed_config(const DeepSpeedConfig& ds, const ModelSpec& model, PlanSpec& plan,
                                    TrainingSpec& training, std::optional<int> data_parallel) {
  const auto error = [&](const std::string& field, std::string message) {
    return tl::unexpected(Error{std::move(message), "deepspeed." + field, SourceLocation{ds.source, std::nullopt, std::nullopt}});
  };
  if (ds.stage >= 2 && plan.pp > 1)
    return error("zero_optimization.stage", fmt::format("DeepSpeed runs ZeRO stage {} without pipeline parallelism; the "
                                                        "plan has pp={} (its pipeline engine takes stages 0 and 1)",
                                                        ds.stage, plan.pp));
  plan.zero = ds.stage;
  plan.distributed_optimizer = ds.stage >= 1;
  plan.dp_replicas = 1;
  if (ds.mics_shard_size) {
    if (!data_parallel)
      return error("zero_optimization.mics_shard_size", "mics_shard_size needs the data-parallel size: give --gpus");
    if (*data_parallel % *ds.mics_shard_size != 0)
      return error("zero_optimization.mics_shard_size",
                   fmt::format("mics_shard_size {} must divide the data-parallel size {}", *ds.mics_shard_size, *data_parallel));
    plan.dp_replicas = *data_parallel / *ds.mics_shard_size;
  }
  // DeepSpeed's overlap_comm default: on at stage 3, off below.
  const bool overlap = ds.overlap_comm.value_or(ds.stage == 3);
  plan.overlap_grad_reduce = overlap && ds.stage >= 1;
  plan.overlap_param_gather = false;   // DeepSpeed gathers the updated partitions after the step
  // Gradients reduced in buckets of reduce_bucket_size elements (DeepSpeed's 5e8 by default).
  const double bucket = ds.reduce_bucket_size.value_or(5e8);
  plan.grad_bucket = static_cast<int>(std::min(bucket, 2e9));
  if (ds.stage == 3) {
    // Parameters fetched ahead up to stage3_prefetch_bucket_size elements
    // (5e7 by default): as many whole layers as fit, none without overlap.
    const double layer = layer_params(model, 0, Sharding{plan.tp, plan.etp.value_or(plan.tp), plan.ep}).total();
    const double ahead = ds.prefetch_bucket_size.value_or(5e7);
    plan.fsdp_prefetch = overlap && layer > 0 ? static_cast<int>(std::min(64.0, std::floor(ahead / layer))) : 0;
    plan.reshard_after_forward = true;
  } else {
    plan.fsdp_prefetch = 1;
    plan.reshard_after_forward = true;
  }
  if (ds.micro_batch) plan.micro_batch_size = static_cast<int>(*ds.micro_batch);
  if (ds.bf16.value_or(false)) {
    training.params_dtype = Dtype::bf16;
    training.grad_dtype = Dtype::fp32;   // DeepSpeed's bf16 optimizer accumulates fp32 gradients
  } else if (ds.fp16.value_or(false)) {
    training.params_dtype = Dtype::fp16;
    training.grad_dtype = Dtype::fp16;   // fp16 ZeRO keeps and reduces fp16 gradients
  }
  if (ds.train_batch_size) {
    training.global_batch_size = *ds.train_batch_size;
    if (ds.micro_batch && ds.grad_accum && data_parallel &&
        *ds.micro_batch * *ds.grad_accum * *data_parallel != *ds.train_batch_size)
      return error("train_batch_size",
                   fmt::format("train_batch_size {} is not train_micro_batch_size_per_gpu {} x "
                               "gradient_accumulation_steps {} x data-parallel size {}, as DeepSpeed requires",
                               *ds.train_batch_size, *ds.micro_batch, *ds.grad_accum, *data_parallel));
  } else if (ds.micro_batch && ds.grad_accum && data_parallel) {
    training.global_batch_size = *ds.micro_batch * *ds.grad_accum * *data_parallel;
  }
  return {};
}

}  // namespace megascope
