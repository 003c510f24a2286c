#include "apps/plan.hpp"

#include "apps/cli.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "apps/expected_error.hpp"
#include "config/library.hpp"
#include "config/token_histogram.hpp"
#include "config/megatron_args.hpp"
#include "apps/scenario.hpp"
#include "config/plan_settings.hpp"
#include "config/spec_toml.hpp"

namespace megascope::cli {

namespace {

using Err = tl::unexpected<Error>;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

Error usage(const std::string& option, const std::string& message) { return Error{message, option, std::nullopt}; }

Result<std::optional<bool>> on_off(const std::optional<std::string>& v, const std::string& option) {
  if (!v) return std::optional<bool>{};
  if (*v == "on") return std::optional<bool>{true};
  if (*v == "off") return std::optional<bool>{false};
  return Err(usage(option, fmt::format("must be on or off, found '{}'", *v)));
}

template <class T, class Parse>
Result<std::vector<T>> parse_list(const std::string& text, const std::string& option, Parse parse, const char* names) {
  std::vector<T> out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    auto v = parse(item);
    if (!v) return Err(usage(option, fmt::format("unknown value '{}'; expected one of: {}", item, names)));
    if (std::find(out.begin(), out.end(), *v) == out.end()) out.push_back(*v);
    pos = comma + 1;
  }
  return out;
}

std::string si(double x) {
  if (x >= 1e6) return fmt::format("{:.2f} M", x / 1e6);
  if (x >= 1e3) return fmt::format("{:.1f} k", x / 1e3);
  return fmt::format("{:.0f}", x);
}

class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled && isatty(fileno(stderr))) {}
  ~ProgressBar() { finish(); }
  void update(const planner::Progress& p) {
    if (!enabled_) return;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    if (elapsed < 1.0 || p.total == 0) return;   // only for searches longer than a second
    const double f = std::min(1.0, static_cast<double>(p.done) / static_cast<double>(p.total));
    const int width = 30;
    const int filled = static_cast<int>(f * width);
    std::fprintf(stderr, "\r%s [%s%s] %3.0f%% %.1f s", p.stage, std::string(static_cast<std::size_t>(filled), '#').c_str(),
                 std::string(static_cast<std::size_t>(width - filled), '.').c_str(), 100 * f, elapsed);
    std::fflush(stderr);
    drawn_ = true;
  }
  void finish() {
    if (drawn_) std::fprintf(stderr, "\r%60s\r", "");
    drawn_ = false;
  }

 private:
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

std::string plan_with_gpus(const planner::SimulatedPlan& p) { return plan_text(p.plan); }

nlohmann::json plan_json(const planner::SimulatedPlan& p, int rank) {
  const sim::SimReport& r = p.report;
  nlohmann::json exposed = nlohmann::json::object();
  for (int k = 0; k < sim::kCommKinds; ++k)
    exposed[sim::to_string(static_cast<sim::CommKind>(k))] = r.exposed_comm_s[static_cast<std::size_t>(k)];
  return {{"rank", rank},
          {"plan", plan_text(p.plan)},
          {"gpus", p.gpus},
          {"tokens_per_s", r.tokens_per_s},
          {"tflops_per_gpu", r.tflops_per_gpu},
          {"mfu", r.mfu},
          {"step_time_s", r.step_time_s},
          {"peak_memory_bytes", p.memory.peak_bytes},
          {"headroom_bytes", p.headroom_bytes()},
          {"bubble_fraction", r.bubble_fraction},
          {"busiest_bubble_fraction", r.busiest_bubble_fraction},
          {"exposed_comm_fraction", p.exposed_comm_s() / r.step_time_s},
          {"exposed_comm_s", exposed},
          {"stage1_step_time_s", p.stage1.step_s},
          {"stage1_rank", p.stage1_rank},
          {"full_length_step_time_s", p.varlen ? p.varlen->fixed_step_s : r.step_time_s},
          {"balance", p.varlen ? p.varlen->run.balance : 1.0}};
}

}  // namespace

std::string plan_text(const PlanSpec& p) { return format_inline_plan(p); }

std::string training_text(const TrainingSpec& t) {
  std::vector<std::string> parts;
  if (t.precision == Precision::fp8)
    parts.push_back(fmt::format("fp8 GEMMs ({} recipe)", to_string(t.fp8_recipe)));
  else if (t.precision != Precision::bf16)
    parts.push_back(fmt::format("{} GEMMs", to_string(t.precision)));
  if (t.params_dtype != Dtype::bf16) parts.push_back(fmt::format("{} weights", to_string(t.params_dtype)));
  if (t.grad_dtype != Dtype::fp32) parts.push_back(fmt::format("{} gradients", to_string(t.grad_dtype)));
  if (const OptimizerPrecision& op = t.optimizer_precision; op.enabled) {
    const std::string master =
        t.params_dtype == Dtype::fp32 ? "the fp32 weights"
        : master_as_remainders(t) ? "fp32 as remainders"
            : to_string(op.main_params);
    parts.push_back(fmt::format("precision-aware optimizer (moments {}/{}, master weights {})", to_string(op.exp_avg),
                                to_string(op.exp_avg_sq), master));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

nlohmann::json training_json(const TrainingSpec& t) {
  const OptimizerPrecision& op = t.optimizer_precision;
  return {{"precision", to_string(t.precision)},
          {"fp8_recipe", to_string(t.fp8_recipe)},
          {"params_dtype", to_string(t.params_dtype)},
          {"grad_dtype", to_string(t.grad_dtype)},
          {"precision_aware_optimizer", op.enabled},
          {"main_params_dtype", to_string(op.main_params)},
          {"exp_avg_dtype", to_string(op.exp_avg)},
          {"exp_avg_sq_dtype", to_string(op.exp_avg_sq)},
          {"store_param_remainders", op.store_param_remainders}};
}

void add_plan_options(CLI::App& cmd, PlanCommandOptions& o) {
  cmd.add_option("--model", o.model, "shipped model name, model TOML file or Hugging Face config.json")->required();
  cmd.add_option("--cluster", o.cluster, "shipped cluster name or cluster TOML file")->required();
  auto* gpus = cmd.add_option("--gpus", o.gpus, "GPU count N (any count: past one node, the last node may be part-used), or a range A-B searched at whole nodes and powers of two below one; this or --max-gpus is required");
  cmd.add_option("--max-gpus", o.max_gpus, "search every count up to N (whole nodes, and powers of two below one)")
      ->excludes(gpus);
  add_search_options(cmd, o);
}

void add_search_options(CLI::App& cmd, PlanCommandOptions& o) {
  cmd.add_option("--global-batch", o.global_batch, "sequences per iteration (required unless --training gives it)");
  cmd.add_option("--training", o.training,
                 "a TOML file with a [training] table: precision, dtypes, the precision-aware optimizer, overheads, and "
                 "its batch and length unless --global-batch or --seq-len are given");
  cmd.add_option("--seq-len", o.seq_len, "tokens per sequence (default: the model's)");
  cmd.add_option("--moe-imbalance", o.moe_imbalance,
                 "MoE: the busiest EP rank's tokens over the mean (default: the model's load_imbalance, 1 if unset)");
  cmd.add_option("--moe-histogram", o.moe_histogram,
                 "MoE: a measured per-expert token distribution, one line of counts per layer (replaces --moe-imbalance)");
  cmd.add_option("--calibration", o.calibration, "a cost-model profile (TOML) applied over the default");
  cmd.add_option("--threads", o.threads, "simulation threads for stage 2 (default: all cores)")->check(CLI::Range(1, 1024));
  for (auto [name, slot] : {std::pair<const char*, std::optional<std::string>*>{"--tp", &o.tp}, {"--pp", &o.pp},
                            {"--vpp", &o.vpp}, {"--dp", &o.dp}, {"--cp", &o.cp}, {"--ep", &o.ep}, {"--etp", &o.etp},
                            {"--mbs", &o.mbs}})
    cmd.add_option(name, *slot, "allowed values: N, A-B, <=N, >=N or A,B,C (default: any; mbs: 1-16)");
  cmd.add_option("--schedules", o.schedules,
                 "allowed schedules, comma-separated, or 'all' (default: 1f1b,interleaved, which Megatron-LM runs)");
  cmd.add_option("--recompute", o.recompute, "allowed recomputation: none,selective,full (default: all three)");
  cmd.add_option("--block-recompute", o.block_recompute,
                 "with full recomputation, also try the first k layers of each chunk only: on|off (default on)");
  cmd.add_option("--recompute-modules", o.recompute_modules,
                 "with selective recomputation, also try module sets beyond core_attn (layernorm; mla_up_proj, moe_act or moe "
                 "where the model has them): on|off (default on)");
  cmd.add_option("--sp", o.sp, "fix sequence parallelism: on|off (default: both)");
  cmd.add_option("--distopt", o.distopt, "fix the distributed optimizer: on|off (default: both)");
  cmd.add_option("--zero", o.zero,
                 "ZeRO stages to search, comma-separated from 0-3 (0: none, 1: the distributed optimizer, 2: gradients "
                 "too, 3: parameters too, FSDP; default all)");
  cmd.add_option("--hsdp", o.hsdp,
                 "with stages 1-3 on dense models, also shard inside each scale-up domain and replicate across "
                 "(hybrid sharding, --num-distributed-optimizer-instances): on|off (default on)");
  cmd.add_option("--overlap-grad-reduce", o.overlap_grad_reduce, "fix: on|off (default: both)");
  cmd.add_option("--overlap-param-gather", o.overlap_param_gather, "fix: on|off (default: both)");
  cmd.add_option("--tp-comm-overlap", o.tp_comm_overlap, "fix: on|off (default: both)");
  cmd.add_option("--uneven-stages", o.uneven_stages,
                 "uneven first/last pipeline stages: off, auto (only where pp does not divide the layers; default) "
                 "or on (every pp)");
  cmd.add_option("--uneven-depth", o.uneven_depth,
                 "how many layers fewer than the middle stages the first/last stage may hold (default 4)");
  cmd.add_option("--headroom", o.headroom_gib, "GiB kept free on every GPU (default 2)");
  cmd.add_option("--min-dp", o.min_dp, "smallest data-parallel size (default 1)");
  cmd.add_flag("--tp-across-domains", o.tp_across_domains,
               "let TP groups span NVLink domains (default: TP stays inside one)");
}

Result<planner::SearchInputs> plan_inputs(const PlanCommandOptions& o, std::vector<std::string>* notes) {
  planner::SearchInputs in;
  auto m = resolve_model(*o.model);
  if (!m) return Err(m.error());
  auto c = resolve_cluster(*o.cluster);
  if (!c) return Err(c.error());
  in.model = *m;
  in.cluster = *c;
  if (auto ok = override_moe_imbalance(in.model, o.moe_imbalance); !ok) return Err(ok.error());
  if (o.moe_histogram)
    if (auto ok = apply_token_histogram(in.model, *o.moe_histogram); !ok) return Err(ok.error());

  // GPU counts.
  int most = 0;
  if (o.max_gpus) {
    auto n = planner::parse_int_set(*o.max_gpus, "--max-gpus");
    if (!n || n->values.size() != 1) return Err(usage("--max-gpus", "must be one positive integer"));
    if (n->values[0] > kMaxDevices) return Err(usage("--max-gpus", fmt::format("must be at most {}", kMaxDevices)));
    in.gpu_counts = planner::counts_up_to(in.cluster, n->values[0]);
    most = n->values[0];
  } else if (o.gpus) {
    auto n = planner::parse_int_set(*o.gpus, "--gpus");
    if (!n) return Err(n.error());
    for (int v : n->values)
      if (v > kMaxDevices) return Err(usage("--gpus", fmt::format("at most {} GPUs, found {}", kMaxDevices, v)));
    if (n->hi && *n->hi > kMaxDevices)
      return Err(usage("--gpus", fmt::format("at most {} GPUs, found a range up to {}", kMaxDevices, *n->hi)));
    if (!n->values.empty()) {
      in.gpu_counts = n->values;
    } else if (n->lo && n->hi) {
      for (int k : planner::counts_up_to(in.cluster, *n->hi))
        if (k >= *n->lo) in.gpu_counts.push_back(k);
      if (in.gpu_counts.empty())
        return Err(usage("--gpus", fmt::format("no whole-node count in {}", *o.gpus)));
    } else {
      return Err(usage("--gpus", "use N, A-B or a list A,B,C"));
    }
  } else if (o.nodes && *o.nodes >= 1) {
    in.gpu_counts = {*o.nodes * in.cluster.node.devices_per_node};
  } else {
    return Err(usage("--gpus", fmt::format("say how many GPUs the job uses: --gpus N (or a range A-B, or a list), "
                                           "or --max-gpus N for every whole-node count up to N ({} holds {})",
                                           in.cluster.name, in.cluster.total_devices())));
  }
  for (int n : in.gpu_counts) most = std::max(most, n);
  if (auto ok = grow_cluster(in.cluster, most); !ok) return Err(ok.error());
  if (o.nodes) {
    if (*o.nodes < 1) return Err(usage("--nodes", "must be >= 1"));
    in.cluster.num_nodes = *o.nodes;
  }
  if (auto ok = apply_search_options(o, in); !ok) return Err(ok.error());
  std::vector<std::string> said;
  if (auto note = default_hf_seq_length(*o.model, in.model, in.training)) said.push_back(*note);
  if (const int per = in.cluster.node.devices_per_node; in.gpu_counts.size() == 1 && per > 0) {
    const int n = in.gpu_counts.front();
    if (n > per && n % per != 0)
      said.push_back(fmt::format("{} GPUs are {} whole node{} of {} and {} GPUs of one more node, whose other {} GPUs "
                                 "stay idle",
                                 n, n / per, n / per == 1 ? "" : "s", per, n % per, per - n % per));
  }
  if (notes) *notes = std::move(said);
  return with_training_file(planner::check_inputs(in), o);
}

Result<planner::SearchInputs> with_training_file(Result<planner::SearchInputs> r, const PlanCommandOptions& o) {
  if (r || !o.training || r.error().field.rfind("training.", 0) != 0) return r;
  Error e = r.error();
  e.message += fmt::format(" (training from {})", *o.training);
  return Err(e);
}

Result<void> grow_cluster(ClusterSpec& cluster, int gpus) {
  if (gpus <= cluster.total_devices()) return {};
  auto grown = with_device_count(cluster, gpus);
  if (!grown) return Err(grown.error());
  cluster = *grown;
  return {};
}

Result<void> apply_search_options(const PlanCommandOptions& o, planner::SearchInputs& in) {
  if (o.training) {
    auto t = o.global_batch ? load_training_toml(*o.training, *o.global_batch) : load_training_toml(*o.training);
    if (!t) return Err(t.error());
    in.training = std::move(*t);
  } else if (!o.global_batch) {
    return Err(usage("--global-batch", "is required (or a --training file that gives global_batch_size)"));
  }
  if (o.global_batch) {
    if (*o.global_batch < 1) return Err(usage("--global-batch", "must be >= 1"));
    in.training.global_batch_size = *o.global_batch;
  }
  if (o.seq_len) in.training.seq_length = *o.seq_len;
  planner::Constraints& k = in.constraints;
  for (auto [name, text, slot] :
       {std::tuple<const char*, const std::optional<std::string>*, planner::IntSet*>{"--tp", &o.tp, &k.tp},
        {"--pp", &o.pp, &k.pp}, {"--vpp", &o.vpp, &k.vpp}, {"--dp", &o.dp, &k.dp}, {"--cp", &o.cp, &k.cp},
        {"--ep", &o.ep, &k.ep}, {"--etp", &o.etp, &k.etp}, {"--mbs", &o.mbs, &k.mbs}}) {
    if (!*text) continue;
    auto s = planner::parse_int_set(**text, name);
    if (!s) return Err(s.error());
    *slot = *s;
  }
  if (o.schedules) {
    if (*o.schedules == "all") {
      k.schedules = all_schedules();
    } else {
      auto s = parse_list<Schedule>(*o.schedules, "--schedules", parse_schedule, schedule_names());
      if (!s) return Err(s.error());
      k.schedules = *s;
    }
  }
  if (o.recompute) {
    auto r = parse_list<RecomputeGranularity>(*o.recompute, "--recompute", parse_recompute_granularity,
                                              "none, selective, full");
    if (!r) return Err(r.error());
    k.recompute = *r;
  }
  for (auto [name, text, slot] :
       {std::tuple<const char*, const std::optional<std::string>*, std::optional<bool>*>{"--sp", &o.sp, &k.sp},
        {"--distopt", &o.distopt, &k.distopt},
        {"--overlap-grad-reduce", &o.overlap_grad_reduce, &k.overlap_grad_reduce},
        {"--overlap-param-gather", &o.overlap_param_gather, &k.overlap_param_gather},
        {"--tp-comm-overlap", &o.tp_comm_overlap, &k.tp_comm_overlap}}) {
    auto v = on_off(*text, name);
    if (!v) return Err(v.error());
    *slot = *v;
  }
  if (o.zero) {
    std::vector<int> stages;
    std::string_view rest = *o.zero;
    while (true) {
      const std::size_t comma = rest.find(',');
      const std::string_view item = rest.substr(0, comma);
      if (item.size() != 1 || item[0] < '0' || item[0] > '3')
        return Err(usage("--zero", fmt::format("'{}' is not a comma-separated list of ZeRO stages 0-3", *o.zero)));
      stages.push_back(item[0] - '0');
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
    k.zero = stages;
    const bool any_sharded = std::any_of(stages.begin(), stages.end(), [](int z) { return z >= 1; });
    if (k.distopt == false && std::count(stages.begin(), stages.end(), 0) == 0)
      return Err(usage("--zero", "--distopt off leaves none of these stages (1-3 shard the optimizer state)"));
    if (k.distopt == true && !any_sharded)
      return Err(usage("--zero", "--distopt on leaves none of these stages (0 does not shard the optimizer state)"));
  }
  if (k.distopt == false && in.training.optimizer_precision.enabled)
    return Err(usage("--distopt", fmt::format("off leaves no plan: the precision-aware optimizer of --training {} needs the "
                                              "distributed optimizer, as Megatron-LM asserts",
                                              o.training.value_or(""))));
  auto block = on_off(o.block_recompute, "--block-recompute");
  if (!block) return Err(block.error());
  k.block_recompute = block->value_or(true);
  auto hsdp = on_off(o.hsdp, "--hsdp");
  if (!hsdp) return Err(hsdp.error());
  k.hsdp = hsdp->value_or(true);
  auto modules = on_off(o.recompute_modules, "--recompute-modules");
  if (!modules) return Err(modules.error());
  k.recompute_modules = modules->value_or(true);
  if (o.uneven_stages) {
    auto u = planner::parse_uneven_stages(*o.uneven_stages);
    if (!u) return Err(usage("--uneven-stages", fmt::format("'{}' is not off, auto or on", *o.uneven_stages)));
    k.uneven = *u;
  }
  if (o.uneven_depth < 0 || o.uneven_depth > 1024) return Err(usage("--uneven-depth", "must be in [0, 1024]"));
  k.uneven_depth = o.uneven_depth;
  // No device has a PiB: a headroom past it is a typo, and 1e308 GiB in bytes is infinite.
  if (!(o.headroom_gib >= 0) || !(o.headroom_gib <= 1024.0 * 1024.0))
    return Err(usage("--headroom", "must be a number of GiB from 0 to 1048576"));
  k.headroom_bytes = o.headroom_gib * kGiB;
  if (o.min_dp < 1) return Err(usage("--min-dp", "must be >= 1"));
  k.min_dp = o.min_dp;
  k.tp_in_scale_up = !o.tp_across_domains;
  if (o.top < 1) return Err(usage("--top", "must be >= 1"));
  return {};
}

int run_plan(const PlanCommandOptions& o, std::ostream& out, std::ostream& err) {
  std::vector<std::string> notes;
  auto in = plan_inputs(o, &notes);
  if (!in) {
    err << "megascope plan: error: " << in.error().str() << "\n";
    return 1;
  }
  ProgressBar bar(!o.no_progress && !o.json && !o.csv);
  planner::SearchOptions so;
  so.top_k = o.top;
  so.threads = o.threads;
  so.calibration = o.calibration;
  so.progress = [&](const planner::Progress& p) { bar.update(p); };
  auto res = planner::search(*in, so);
  bar.finish();
  if (!res) {
    err << "megascope plan: error: " << res.error().str() << "\n";
    return 1;
  }
  // Nothing fits: the fewest GPUs that would hold a plan, searched by
  // doubling the largest count asked for (stage 1's exact memory only).
  std::optional<int> enough;
  if (res->ranked.empty() && res->evaluated > 0) {
    const int most = *std::max_element(in->gpu_counts.begin(), in->gpu_counts.end());
    planner::SearchOptions quick;
    quick.top_k = 1;
    quick.threads = o.threads;
    quick.calibration = o.calibration;
    quick.stage1_only = true;
    for (long n = 2L * most; n <= kMaxDevices && !enough; n *= 2) {
      planner::SearchInputs bigger = *in;
      bigger.gpu_counts = {static_cast<int>(n)};
      if (!grow_cluster(bigger.cluster, static_cast<int>(n))) break;
      auto checked = planner::check_inputs(bigger);
      if (!checked) break;
      auto r = planner::search(*checked, quick);
      if (r && r->fitting > 0) enough = static_cast<int>(n);
    }
  }
  std::optional<planner::Explanation> ex;
  if (o.explain) {
    auto plan = resolve_plan(*o.explain);
    if (!plan) {
      err << "megascope plan: error: --explain: " << plan.error().str() << "\n";
      return 1;
    }
    int gpus = in->gpu_counts.back();
    if (plan->dp) gpus = *plan->dp * plan->tp * plan->pp * plan->cp;
    auto e = planner::explain(*in, *res, *plan, gpus, so);
    if (!e) {
      err << "megascope plan: error: --explain: " << e.error().str() << "\n";
      return 1;
    }
    ex = std::move(*e);
  }

  // The winner's Megatron-LM arguments.
  std::string megatron;
  std::string megatron_error;
  if (!res->ranked.empty()) {
    const planner::SimulatedPlan& w = res->ranked.front();
    auto s = validate_setup(in->model, in->cluster, in->training, w.plan, w.gpus);
    if (s) {
      auto args = export_megatron_args(*s);
      if (args) megatron = *args;
      else megatron_error = args.error().message;
    }
  }

  const auto& rej = res->rejections;
  if (o.json) {
    nlohmann::json j;
    j["model"] = in->model.name;
    j["cluster"] = in->cluster.name;
    j["gpu_counts"] = in->gpu_counts;
    j["global_batch"] = in->training.global_batch_size;
    j["seq_length"] = in->training.seq_length.value_or(in->model.seq_length);
    j["training"] = training_json(in->training);
    j["notes"] = notes;
    nlohmann::json ranked = nlohmann::json::array();
    for (std::size_t i = 0; i < res->ranked.size(); ++i) ranked.push_back(plan_json(res->ranked[i], static_cast<int>(i) + 1));
    j["ranked"] = ranked;
    j["megatron_args"] = megatron;
    if (!megatron_error.empty()) j["megatron_args_error"] = megatron_error;
    if (!res->ranked.empty()) {
      const planner::SimulatedPlan& w = res->ranked.front();
      j["bounded_by"] = planner::bounding_factors(w);
      const Regime regime = regime_of(in->cluster.device, in->training, in->model, w.plan.cp, zero_stage(w.plan));
      j["expected_error"] = expected_error_json(expected_error(regime, w.report.mfu, shipped_regimes()));
    }
    j["considered"] = {{"structural", rej.structural},
                       {"rejected_divisibility", rej.divisibility},
                       {"rejected_constraint", rej.constraint},
                       {"evaluated", res->evaluated},
                       {"rejected_memory", rej.memory},
                       {"fitting", res->fitting},
                       {"simulated", res->ranked.size()}};
    if (res->best_rejected) {
      const PlanSpec bp = planner::to_plan(*res->best_rejected);
      j["best_rejected_for_memory"] = {
          {"plan", plan_text(bp)},
          {"gpus", res->best_rejected->gpus},
          {"peak_memory_bytes", res->best_rejected_estimate.peak_bytes},
          {"lacking_bytes", res->best_rejected_estimate.peak_bytes + res->headroom_bytes - res->capacity_bytes},
          {"stage1_step_time_s", res->best_rejected_estimate.step_s}};
    }
    if (enough) j["fewest_gpus_that_fit"] = *enough;
    j["timing"] = {{"stage1_s", res->stage1_s},
                   {"stage2_s", res->stage2_s},
                   {"stage1_plans_per_s", res->stage1_s > 0 ? static_cast<double>(res->evaluated) / res->stage1_s : 0.0}};
    if (ex) {
      nlohmann::json e = {{"plan", *o.explain}, {"legal", ex->legal}};
      if (!ex->legal) e["error"] = ex->illegal_reason;
      else {
        e["fits"] = ex->fits;
        e["simulated_rank"] = ex->simulated_rank;
        if (ex->stage1_rank) e["stage1_rank"] = *ex->stage1_rank;
        e["result"] = plan_json(ex->plan, ex->simulated_rank);
        e["reasons"] = ex->reasons;
        if (ex->split_best) e["split_best"] = plan_json(*ex->split_best, ex->split_rank);
      }
      j["explain"] = e;
    }
    out << j.dump(2) << "\n";
    return res->ranked.empty() ? kExitDoesNotFit : 0;
  }
  if (o.csv) {
    out << "rank,plan,gpus,tokens_per_s,tflops_per_gpu,mfu,step_time_s,peak_memory_gib,headroom_gib,bubble_fraction,"
           "exposed_comm_fraction,stage1_step_time_s\n";
    for (std::size_t i = 0; i < res->ranked.size(); ++i) {
      const planner::SimulatedPlan& p = res->ranked[i];
      const sim::SimReport& r = p.report;
      out << fmt::format("{},\"{}\",{},{:.1f},{:.2f},{:.4f},{:.4f},{:.2f},{:.2f},{:.4f},{:.4f},{:.4f}\n", i + 1,
                         plan_text(p.plan), p.gpus, r.tokens_per_s, r.tflops_per_gpu, r.mfu, r.step_time_s,
                         p.memory.peak_bytes / kGiB, p.headroom_bytes() / kGiB, r.bubble_fraction,
                         p.exposed_comm_s() / r.step_time_s, p.stage1.step_s);
    }
    return res->ranked.empty() ? kExitDoesNotFit : 0;
  }

  // Human report.
  const std::int64_t seq = in->training.seq_length.value_or(in->model.seq_length);
  std::string counts;
  if (in->gpu_counts.size() == 1) counts = fmt::format("{} GPUs", in->gpu_counts.front());
  else counts = fmt::format("{} GPU counts from {} to {}", in->gpu_counts.size(), in->gpu_counts.front(), in->gpu_counts.back());
  out << fmt::format("megascope plan: {} on {} of {} ({}), global batch {} x {} tokens\n", in->model.name, counts,
                     in->cluster.name, in->cluster.device.name, in->training.global_batch_size, seq);
  if (const std::string t = training_text(in->training); !t.empty()) out << "  training: " << t << "\n";
  if (const VarlenSpec* v = in->training.varlen.get())
    out << fmt::format("  lengths: {} ({}); stage 1 ranks plans by full-length sequences, stage 2 by the mean of {} "
                       "sampled steps (tokens/s of real tokens); bubble and exposed communication are the full-length "
                       "step's shares\n",
                       to_string(v->lengths.kind), v->packing == Packing::pack ? "packed" : "padded", v->steps);
  for (const std::string& note : notes) out << "  note: " << note << "\n";
  out << fmt::format("  stage 1: {} plans in {:.2f} s ({} plans/s); stage 2: the best {} simulated in {:.2f} s\n\n",
                     res->evaluated, res->stage1_s, si(res->stage1_s > 0 ? static_cast<double>(res->evaluated) / res->stage1_s : 0.0),
                     res->ranked.size(), res->stage2_s);
  if (res->ranked.empty() && res->evaluated == 0) {
    out << "no legal plan: every combination below breaks a divisibility or schedule rule or a constraint "
           "(the global batch must be a multiple of mbs x dp)\n";
  } else if (res->ranked.empty()) {
    out << "no plan fits in memory";
    if (enough) out << fmt::format("; {} GPUs would hold one (--gpus {})", *enough, *enough);
    out << "\n";
  } else {
    std::size_t width = 4;
    for (const planner::SimulatedPlan& p : res->ranked) width = std::max(width, plan_with_gpus(p).size());
    out << fmt::format("{:>4}  {:<{}} {:>5} {:>10} {:>7} {:>6} {:>8} {:>7} {:>7} {:>7} {:>7}\n", "rank", "plan", width, "gpus",
                       "tokens/s", "TFLOP/s", "MFU", "step s", "peak", "free", "bubble", "exposed");
    out << fmt::format("{:>4}  {:<{}} {:>5} {:>10} {:>7} {:>6} {:>8} {:>7} {:>7} {:>7} {:>7}\n", "", "", width, "", "", "/GPU",
                       "", "", "GiB", "GiB", "", "comm");
    for (std::size_t i = 0; i < res->ranked.size(); ++i) {
      const planner::SimulatedPlan& p = res->ranked[i];
      const sim::SimReport& r = p.report;
      out << fmt::format("{:>4}  {:<{}} {:>5} {:>10.0f} {:>7.1f} {:>5.1f}% {:>8.3f} {:>7.1f} {:>7.1f} {:>6.1f}% {:>6.1f}%\n",
                         i + 1, plan_with_gpus(p), width, p.gpus, r.tokens_per_s, r.tflops_per_gpu, 100 * r.mfu, r.step_time_s,
                         p.memory.peak_bytes / kGiB, p.headroom_bytes() / kGiB, 100 * r.bubble_fraction,
                         100 * p.exposed_comm_s() / r.step_time_s);
    }
    const planner::SimulatedPlan& w = res->ranked.front();
    out << fmt::format("\nbest plan: {} on {} GPUs\n", plan_text(w.plan), w.gpus);
    out << "  bounded by:\n";
    for (const std::string& b : planner::bounding_factors(w)) out << "    " << b << "\n";
    out << "  expected: "
        << expected_error_text(
               expected_error(regime_of(in->cluster.device, in->training, in->model, w.plan.cp, zero_stage(w.plan)),
                              w.report.mfu, shipped_regimes()))
        << "\n";
    if (!megatron.empty()) out << "  Megatron-LM arguments:\n    " << megatron << "\n";
    else out << "  Megatron-LM arguments: not available: " << megatron_error << "\n";
  }
  out << fmt::format("\nconsidered: {} combinations of (gpus, tp, cp, pp, layer split, ep, etp, mbs, schedule, vpp): {} break a "
                     "divisibility or schedule rule, {} are excluded by constraints\n",
                     rej.structural, rej.divisibility, rej.constraint);
  out << fmt::format("            {} plans with every sp/recompute/optimizer/overlap option: {} do not fit in {:.1f} GiB "
                     "with {:.1f} GiB headroom, {} fit; {} simulated\n",
                     res->evaluated, rej.memory, res->capacity_bytes / kGiB, res->headroom_bytes / kGiB, res->fitting,
                     res->ranked.size());
  if (res->best_rejected) {
    const planner::Estimate& e = res->best_rejected_estimate;
    out << fmt::format("best plan rejected for memory: {} on {} GPUs: {:.1f} GiB on stage {}, {:.1f} GiB short "
                       "(stage-1 step {:.3f} s)\n",
                       plan_text(planner::to_plan(*res->best_rejected)), res->best_rejected->gpus, e.peak_bytes / kGiB,
                       e.peak_stage, (e.peak_bytes + res->headroom_bytes - res->capacity_bytes) / kGiB, e.step_s);
  }
  out << "cost profile: " << res->profile_source << "\n";
  if (ex) {
    out << fmt::format("\nexplain {}:\n", *o.explain);
    if (!ex->legal) {
      out << "  not a legal plan: " << ex->illegal_reason << "\n";
    } else {
      const sim::SimReport& r = ex->plan.report;
      out << fmt::format("  simulated: {:.3f} s per step, {:.0f} tokens/s, MFU {:.1f}%, peak {:.1f} GiB\n", r.step_time_s,
                         r.tokens_per_s, 100 * r.mfu, ex->plan.memory.peak_bytes / kGiB);
      out << fmt::format("  rank {} among the {} simulated plans", ex->simulated_rank, res->ranked.size() + 1);
      if (ex->stage1_rank) out << fmt::format("; rank {} of {} fitting plans by the stage-1 estimate", *ex->stage1_rank, res->fitting);
      out << "\n";
      for (const std::string& s : ex->reasons) out << "  - " << s << "\n";
      if (ex->split_best) {
        const planner::SimulatedPlan& b = *ex->split_best;
        std::string split = fmt::format("tp {}", b.plan.tp);
        if (b.plan.cp > 1) split += fmt::format(", cp {}", b.plan.cp);
        split += fmt::format(", pp {}, dp {}", b.plan.pp, b.plan.dp.value_or(0));
        if (b.plan.ep > 1) split += fmt::format(", ep {}", b.plan.ep);
        out << fmt::format("  its split ({}) does better with other settings:\n", split);
        out << fmt::format("    {}: {:.3f} s per step ({:.1f}% less), rank {} among the simulated plans\n", plan_text(b.plan),
                           b.report.step_time_s, 100 * (1 - b.report.step_time_s / ex->plan.report.step_time_s),
                           ex->split_rank);
      }
    }
  }
  return res->ranked.empty() ? kExitDoesNotFit : 0;
}

}  // namespace megascope::cli
