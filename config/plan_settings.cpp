#include "config/plan_settings.hpp"

#include "core/pipeline_layout.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <optional>
#include <set>
#include <string>

namespace megascope {

namespace {

std::string field_of(std::string_view key) { return "plan." + std::string(key); }

std::string_view trim(std::string_view s) {
  const auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string known_keys_list() {
  std::string out;
  for (const auto& k : plan_keys()) {
    if (!out.empty()) out += ", ";
    out += k;
  }
  return out;
}

// A plain positive decimal integer that fits in an int: digits only, no sign,
// no spaces, no exponent, not zero.
Result<int> positive_int(std::string_view key, std::string_view value) {
  bool digits = !value.empty() &&
                std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (digits) {
    long long v = 0;
    for (char c : value) {
      v = v * 10 + (c - '0');
      if (v > INT_MAX) {
        return fail(field_of(key), fmt::format("{} must be a positive integer no larger than {}, found '{}'",
                                               key, INT_MAX, value));
      }
    }
    if (v > 0) return static_cast<int>(v);
  }
  return fail(field_of(key), fmt::format("{} must be a positive integer, found '{}'", key, value));
}

Result<bool> boolean(std::string_view key, std::string_view value) {
  if (value == "on" || value == "true" || value == "1") return true;
  if (value == "off" || value == "false" || value == "0") return false;
  return fail(field_of(key),
              fmt::format("{} must be a boolean (on, off, true, false, 1, 0), found '{}'", key, value));
}

template <class Enum, class Parse>
Result<Enum> enumeration(std::string_view key, std::string_view value, Parse parse, const char* accepted) {
  if (auto v = parse(value)) return *v;
  return fail(field_of(key), fmt::format("{} must be one of {}, found '{}'", key, accepted, value));
}

std::optional<CpCommType> parse_cp_comm_lenient(std::string_view s) {
  if (s == "all_gather") return CpCommType::all_gather;  // Megatron's spelling
  return parse_cp_comm(s);
}

const char* on_off(bool b) { return b ? "on" : "off"; }

}  // namespace

const std::vector<std::string>& plan_keys() {
  static const std::vector<std::string> keys = {
      "tp", "pp", "vpp", "microbatch_group", "dp", "cp", "ep", "etp", "mbs", "sp", "recompute", "recompute_method",
      "recompute_layers", "recompute_modules", "distopt", "zero", "reshard_after_forward", "fsdp_prefetch",
      "fp8_param_gather", "grad_bucket", "dp_replicas", "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap",
      "tp_grad_overlap", "grad_accum_fusion", "pp_scatter_gather", "overlap_p2p_comm", "overlap_p2p_warmup_flush",
      "moe_shared_expert_overlap", "moe_ep_overlap",
      "schedule", "attention", "cp_comm", "moe_dispatcher", "first_stage_layers", "last_stage_layers",
      "embedding_in_split", "loss_in_split", "layout", "post_validation", "dynamic_cp"};
  return keys;
}

Result<void> apply_plan_setting(PlanSpec& plan, std::string_view key, std::string_view value) {
  // Integers.
  auto set_int = [&](int& target) -> Result<void> {
    auto v = positive_int(key, value);
    if (!v) return tl::unexpected(v.error());
    target = *v;
    return {};
  };
  auto set_opt_int = [&](std::optional<int>& target) -> Result<void> {
    auto v = positive_int(key, value);
    if (!v) return tl::unexpected(v.error());
    target = *v;
    return {};
  };
  auto set_bool = [&](bool& target) -> Result<void> {
    auto v = boolean(key, value);
    if (!v) return tl::unexpected(v.error());
    target = *v;
    return {};
  };

  if (key == "tp") return set_int(plan.tp);
  if (key == "pp") return set_int(plan.pp);
  if (key == "vpp") return set_opt_int(plan.vpp);
  if (key == "microbatch_group") return set_opt_int(plan.microbatch_group);
  if (key == "dp") return set_opt_int(plan.dp);
  if (key == "cp") return set_int(plan.cp);
  if (key == "ep") return set_int(plan.ep);
  if (key == "etp") return set_opt_int(plan.etp);
  if (key == "mbs") return set_int(plan.micro_batch_size);
  if (key == "recompute_layers") return set_opt_int(plan.recompute.num_layers);
  if (key == "first_stage_layers") return set_opt_int(plan.first_stage_layers);
  if (key == "last_stage_layers") return set_opt_int(plan.last_stage_layers);

  if (key == "embedding_in_split") return set_bool(plan.embedding_in_split);
  if (key == "loss_in_split") return set_bool(plan.loss_in_split);
  if (key == "post_validation") return set_bool(plan.post_validation);
  if (key == "dynamic_cp") return set_bool(plan.dynamic_cp);
  if (key == "layout") {   // checked here for its syntax; validate_setup checks it against the model
    auto parsed = parse_pipeline_layout(value, field_of(key));
    if (!parsed) return tl::unexpected(parsed.error());
    plan.layout = std::string(trim(value));
    return {};
  }
  if (key == "sp") return set_bool(plan.sequence_parallel);
  if (key == "distopt") return set_bool(plan.distributed_optimizer);
  if (key == "zero" || key == "fsdp_prefetch") {
    const bool digits = !value.empty() && value.size() <= 2 &&
                        std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; });
    const int v = digits ? std::stoi(std::string(value)) : -1;
    if (key == "zero") {
      if (v < 0 || v > 3)
        return fail(field_of(key), fmt::format("zero must be the ZeRO stage 0, 1, 2 or 3, found '{}'", value));
      plan.zero = v;
      if (v >= 1) plan.distributed_optimizer = true;   // stages 1-3 shard the optimizer state
      return {};
    }
    if (v < 0) return fail(field_of(key), fmt::format("fsdp_prefetch must be a number of units, 0 to 64, found '{}'", value));
    plan.fsdp_prefetch = v;
    return {};
  }
  if (key == "grad_bucket") return set_opt_int(plan.grad_bucket);
  if (key == "dp_replicas") return set_int(plan.dp_replicas);
  if (key == "reshard_after_forward") return set_bool(plan.reshard_after_forward);
  if (key == "fp8_param_gather") return set_bool(plan.fp8_param_gather);
  if (key == "overlap_grad_reduce") return set_bool(plan.overlap_grad_reduce);
  if (key == "overlap_param_gather") return set_bool(plan.overlap_param_gather);
  if (key == "tp_comm_overlap") return set_bool(plan.tp_comm_overlap);
  if (key == "tp_grad_overlap") return set_bool(plan.tp_grad_overlap);
  if (key == "grad_accum_fusion") return set_bool(plan.grad_accum_fusion);
  if (key == "pp_scatter_gather") return set_bool(plan.pp_scatter_gather);
  if (key == "moe_shared_expert_overlap") return set_bool(plan.moe_shared_expert_overlap);
  if (key == "moe_ep_overlap") return set_bool(plan.moe_ep_overlap);
  if (key == "overlap_p2p_warmup_flush") return set_bool(plan.overlap_p2p_warmup_flush);
  if (key == "overlap_p2p_comm") {
    auto v = boolean(key, value);
    if (!v) return tl::unexpected(v.error());
    plan.overlap_p2p_comm = *v;
    return {};
  }

  if (key == "recompute") {
    auto v = enumeration<RecomputeGranularity>(key, value, parse_recompute_granularity, "none, selective, full");
    if (!v) return tl::unexpected(v.error());
    plan.recompute.granularity = *v;
    return {};
  }
  if (key == "recompute_method") {
    auto v = enumeration<RecomputeMethod>(key, value, parse_recompute_method, "uniform, block");
    if (!v) return tl::unexpected(v.error());
    plan.recompute.method = *v;
    return {};
  }
  if (key == "recompute_modules") {
    const auto v = parse_recompute_modules(value);
    if (!v)
      return fail("plan.recompute_modules",
                  fmt::format("'{}' is not a '+'-separated list of {} (a TOML plan may give an array)", value,
                              recompute_module_names()));
    plan.recompute.modules = *v;
    return {};
  }
  if (key == "schedule") {
    auto v = enumeration<Schedule>(key, value, parse_schedule, schedule_names());
    if (!v) return tl::unexpected(v.error());
    plan.schedule = *v;
    return {};
  }
  if (key == "attention") {
    auto v = enumeration<AttentionKernel>(key, value, parse_attention_kernel, "flash, unfused");
    if (!v) return tl::unexpected(v.error());
    plan.attention = *v;
    return {};
  }
  if (key == "cp_comm") {
    auto v = enumeration<CpCommType>(key, value, parse_cp_comm_lenient, "p2p, all-gather, a2a");
    if (!v) return tl::unexpected(v.error());
    plan.cp_comm = *v;
    return {};
  }
  if (key == "moe_dispatcher") {
    auto v = enumeration<MoeDispatcher>(key, value, parse_moe_dispatcher, "alltoall, allgather, flex");
    if (!v) return tl::unexpected(v.error());
    plan.moe_dispatcher = *v;
    return {};
  }
  return fail(field_of(key), fmt::format("unknown plan key '{}'; known keys: {}", key, known_keys_list()));
}

Result<PlanSpec> parse_inline_plan(std::string_view text) {
  if (trim(text).empty())
    return fail("plan", "the inline plan is empty; expected key=value items separated by commas, "
                        "e.g. tp=8,pp=2,mbs=1");
  PlanSpec plan;
  std::set<std::string, std::less<>> seen;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view item = trim(text.substr(start, comma - start));
    // A layout's own commas (cosmetic in Megatron-Core's syntax): the item runs
    // on up to the next comma that starts a key=value item.
    if (item.starts_with("layout=") || item.starts_with("layout =")) {
      while (comma < text.size()) {
        const std::size_t next = text.find(',', comma + 1);
        const std::string_view piece = text.substr(comma + 1, (next == std::string_view::npos ? text.size() : next) - comma - 1);
        if (piece.find('=') != std::string_view::npos || trim(piece).empty()) break;
        comma = next == std::string_view::npos ? text.size() : next;
      }
      item = trim(text.substr(start, comma - start));
    }
    start = comma + 1;

    if (item.empty())
      return fail("plan", fmt::format("empty item in the inline plan '{}'; expected key=value items "
                                      "separated by single commas",
                                      text));
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      return fail("plan", fmt::format("expected key=value in the inline plan, found '{}'", item));
    const std::string_view key = trim(item.substr(0, eq));
    const std::string_view value = trim(item.substr(eq + 1));
    if (key.empty())
      return fail("plan", fmt::format("missing key before '=' in the inline plan item '{}'", item));
    if (seen.count(key) != 0)
      return fail(field_of(key), fmt::format("key '{}' is given twice in the inline plan", key));
    seen.emplace(key);
    if (auto r = apply_plan_setting(plan, key, value); !r) return tl::unexpected(r.error());
  }
  return plan;
}

std::string format_inline_plan(const PlanSpec& plan) {
  const PlanSpec d;
  std::vector<std::string> items;
  auto add = [&](std::string_view key, const std::string& value) {
    items.push_back(fmt::format("{}={}", key, value));
  };
  auto add_int = [&](std::string_view key, int v, int dv) {
    if (v != dv) add(key, std::to_string(v));
  };
  auto add_opt = [&](std::string_view key, const std::optional<int>& v) {
    if (v) add(key, std::to_string(*v));
  };
  auto add_bool = [&](std::string_view key, bool v, bool dv) {
    if (v != dv) add(key, on_off(v));
  };

  for (const auto& key : plan_keys()) {
    if (key == "tp") add_int(key, plan.tp, d.tp);
    else if (key == "pp") add_int(key, plan.pp, d.pp);
    else if (key == "vpp") add_opt(key, plan.vpp);
    else if (key == "microbatch_group") add_opt(key, plan.microbatch_group);
    else if (key == "dp") add_opt(key, plan.dp);
    else if (key == "cp") add_int(key, plan.cp, d.cp);
    else if (key == "ep") add_int(key, plan.ep, d.ep);
    else if (key == "etp") add_opt(key, plan.etp);
    else if (key == "mbs") add_int(key, plan.micro_batch_size, d.micro_batch_size);
    else if (key == "sp") add_bool(key, plan.sequence_parallel, d.sequence_parallel);
    else if (key == "recompute") {
      if (plan.recompute.granularity != d.recompute.granularity)
        add(key, to_string(plan.recompute.granularity));
    } else if (key == "recompute_method") {
      if (plan.recompute.method) add(key, to_string(*plan.recompute.method));
    } else if (key == "recompute_layers") add_opt(key, plan.recompute.num_layers);
    else if (key == "recompute_modules") {
      if (plan.recompute.modules) add(key, format_recompute_modules(*plan.recompute.modules));
    }
    else if (key == "distopt") add_bool(key, plan.distributed_optimizer, d.distributed_optimizer);
    else if (key == "zero") add_int(key, plan.zero, d.zero);
    else if (key == "reshard_after_forward") add_bool(key, plan.reshard_after_forward, d.reshard_after_forward);
    else if (key == "fsdp_prefetch") add_int(key, plan.fsdp_prefetch, d.fsdp_prefetch);
    else if (key == "fp8_param_gather") add_bool(key, plan.fp8_param_gather, d.fp8_param_gather);
    else if (key == "grad_bucket") add_opt(key, plan.grad_bucket);
    else if (key == "dp_replicas") add_int(key, plan.dp_replicas, d.dp_replicas);
    else if (key == "overlap_grad_reduce") add_bool(key, plan.overlap_grad_reduce, d.overlap_grad_reduce);
    else if (key == "overlap_param_gather") add_bool(key, plan.overlap_param_gather, d.overlap_param_gather);
    else if (key == "tp_comm_overlap") add_bool(key, plan.tp_comm_overlap, d.tp_comm_overlap);
    else if (key == "tp_grad_overlap") add_bool(key, plan.tp_grad_overlap, d.tp_grad_overlap);
    else if (key == "grad_accum_fusion") add_bool(key, plan.grad_accum_fusion, d.grad_accum_fusion);
    else if (key == "pp_scatter_gather") add_bool(key, plan.pp_scatter_gather, d.pp_scatter_gather);
    else if (key == "moe_shared_expert_overlap")
      add_bool(key, plan.moe_shared_expert_overlap, d.moe_shared_expert_overlap);
    else if (key == "moe_ep_overlap")
      add_bool(key, plan.moe_ep_overlap, d.moe_ep_overlap);
    else if (key == "overlap_p2p_warmup_flush")
      add_bool(key, plan.overlap_p2p_warmup_flush, d.overlap_p2p_warmup_flush);
    else if (key == "overlap_p2p_comm") {
      if (plan.overlap_p2p_comm) add(key, on_off(*plan.overlap_p2p_comm));
    }
    else if (key == "schedule") {
      if (plan.schedule != d.schedule) add(key, to_string(plan.schedule));
    } else if (key == "attention") {
      if (plan.attention != d.attention) add(key, to_string(plan.attention));
    } else if (key == "cp_comm") {
      if (plan.cp_comm != d.cp_comm) add(key, to_string(plan.cp_comm));
    } else if (key == "moe_dispatcher") {
      if (plan.moe_dispatcher != d.moe_dispatcher) add(key, to_string(plan.moe_dispatcher));
    } else if (key == "first_stage_layers") add_opt(key, plan.first_stage_layers);
    else if (key == "last_stage_layers") add_opt(key, plan.last_stage_layers);
    else if (key == "embedding_in_split") add_bool(key, plan.embedding_in_split, d.embedding_in_split);
    else if (key == "loss_in_split") add_bool(key, plan.loss_in_split, d.loss_in_split);
    else if (key == "post_validation") add_bool(key, plan.post_validation, d.post_validation);
    else if (key == "dynamic_cp") add_bool(key, plan.dynamic_cp, d.dynamic_cp);
    else if (key == "layout") {
      if (plan.layout) add(key, *plan.layout);
    }
  }
  // The all-default plan would format as "", which parse_inline_plan rejects;
  // "tp=1" keeps parse(format(p)) == p true for every plan.
  if (items.empty()) return "tp=1";
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += ',';
    out += item;
  }
  return out;
}

bool operator==(const Recompute& a, const Recompute& b) {
  return a.granularity == b.granularity && a.method == b.method && a.num_layers == b.num_layers &&
         recompute_modules(a) == recompute_modules(b);
}

bool operator==(const PlanSpec& a, const PlanSpec& b) {
  return a.tp == b.tp && a.pp == b.pp && a.vpp == b.vpp && a.microbatch_group == b.microbatch_group && a.first_stage_layers == b.first_stage_layers &&
         a.last_stage_layers == b.last_stage_layers && a.dp == b.dp && a.cp == b.cp && a.ep == b.ep &&
         a.etp == b.etp && a.micro_batch_size == b.micro_batch_size &&
         a.sequence_parallel == b.sequence_parallel && a.recompute == b.recompute &&
         a.distributed_optimizer == b.distributed_optimizer && a.zero == b.zero &&
         a.reshard_after_forward == b.reshard_after_forward && a.fsdp_prefetch == b.fsdp_prefetch &&
         a.fp8_param_gather == b.fp8_param_gather && a.grad_bucket == b.grad_bucket && a.dp_replicas == b.dp_replicas && a.overlap_grad_reduce == b.overlap_grad_reduce &&
         a.overlap_param_gather == b.overlap_param_gather && a.tp_comm_overlap == b.tp_comm_overlap &&
         a.tp_grad_overlap == b.tp_grad_overlap && a.grad_accum_fusion == b.grad_accum_fusion &&
         a.pp_scatter_gather == b.pp_scatter_gather && a.overlap_p2p_comm == b.overlap_p2p_comm &&
         a.overlap_p2p_warmup_flush == b.overlap_p2p_warmup_flush &&
         a.moe_shared_expert_overlap == b.moe_shared_expert_overlap && a.moe_ep_overlap == b.moe_ep_overlap &&
         a.schedule == b.schedule && a.attention == b.attention &&
         a.cp_comm == b.cp_comm && a.moe_dispatcher == b.moe_dispatcher &&
         a.embedding_in_split == b.embedding_in_split && a.loss_in_split == b.loss_in_split && a.layout == b.layout &&
         a.post_validation == b.post_validation && a.dynamic_cp == b.dynamic_cp;
}

}  // namespace megascope
