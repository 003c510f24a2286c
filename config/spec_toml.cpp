#include "config/spec_toml.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "config/plan_settings.hpp"
#include "config/toml_reader.hpp"

namespace megascope {

namespace {

using Err = tl::unexpected<Error>;

std::optional<Activation> parse_activation(std::string_view s) {
  if (s == "gelu") return Activation::gelu;
  if (s == "swiglu") return Activation::swiglu;
  if (s == "squared_relu") return Activation::squared_relu;
  return std::nullopt;
}
std::optional<Norm> parse_norm(std::string_view s) {
  if (s == "layernorm") return Norm::layernorm;
  if (s == "rmsnorm") return Norm::rmsnorm;
  return std::nullopt;
}
std::optional<PositionEmbedding> parse_position(std::string_view s) {
  if (s == "learned") return PositionEmbedding::learned;
  if (s == "rope") return PositionEmbedding::rope;
  if (s == "none") return PositionEmbedding::none;
  return std::nullopt;
}
std::optional<DeviceKind> parse_device_kind(std::string_view s) {
  if (s == "gpu") return DeviceKind::gpu;
  if (s == "cpu") return DeviceKind::cpu;
  return std::nullopt;
}
std::optional<ScaleUpKind> parse_scale_up(std::string_view s) {
  for (auto k : {ScaleUpKind::nvswitch, ScaleUpKind::nvlink_mesh, ScaleUpKind::pcie, ScaleUpKind::none})
    if (s == to_string(k)) return k;
  return std::nullopt;
}
std::optional<Fabric> parse_fabric(std::string_view s) {
  for (auto f : {Fabric::infiniband, Fabric::roce, Fabric::ethernet})
    if (s == to_string(f)) return f;
  return std::nullopt;
}
std::optional<Routing> parse_routing(std::string_view s) {
  for (auto r : {Routing::adaptive, Routing::ecmp})
    if (s == to_string(r)) return r;
  return std::nullopt;
}
std::optional<Precision> parse_precision(std::string_view s) {
  if (s == "bf16") return Precision::bf16;
  if (s == "fp8") return Precision::fp8;
  return std::nullopt;
}
std::optional<Dtype> parse_dtype(std::string_view s) {   // weights and gradients: no fp8
  const auto d = parse_dtype_name(s);
  return d == Dtype::fp8 ? std::nullopt : d;
}
std::optional<Dtype> parse_state_dtype(std::string_view s) { return parse_dtype_name(s); }   // Adam's moments
std::optional<int> parse_adam(std::string_view s) {
  if (s == "adam" || s == "adamw") return 0;
  return std::nullopt;
}

// Narrowing with a range check, recorded as an error on the reader.
int to_int(TomlReader& r, std::string_view key, std::int64_t v) {
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
    r.fail_at(key, fmt::format("{} is out of range", v));
    return 0;
  }
  return static_cast<int>(v);
}

const toml::table* top_table(const toml::table& root, std::string_view name) {
  const toml::node* n = root.get(name);
  return n ? n->as_table() : nullptr;
}

Error missing_table(const toml::table& root, std::string_view name, const std::string& file) {
  return Error{fmt::format("the file has no [{}] table", name), std::string(name), location_of(root, file)};
}

template <class T>
Result<T> finish(TomlReader& r, T value) {
  if (auto e = r.finish()) return Err(*e);
  return value;
}

}  // namespace

Result<void> check_top_level(const toml::table& root, const std::string& file) {
  for (auto&& [k, node] : root) {
    const std::string key(k.str());
    if (key != "model" && key != "cluster" && key != "training" && key != "plan" && key != "example")
      return Err(Error{"unknown top-level entry; expected the tables [model], [cluster], [training], [plan] or "
                       "[example]",
                       key, location_of(node, file)});
    if (!node.is_table())
      return Err(Error{fmt::format("[{}] must be a table", key), key, location_of(node, file)});
  }
  return {};
}

Result<ModelSpec> model_from_toml(const toml::table& root, const std::string& file) {
  const toml::table* t = top_table(root, "model");
  if (!t) return Err(missing_table(root, "model", file));
  TomlReader r(*t, "model", file);
  ModelSpec m;
  m.name = r.string("name");
  m.num_layers = to_int(r, "num_layers", r.integer("num_layers"));
  m.hidden_size = r.integer("hidden_size");
  m.ffn_hidden_size = r.integer("ffn_hidden_size");
  m.num_attention_heads = to_int(r, "num_attention_heads", r.integer("num_attention_heads"));
  m.num_query_groups = to_int(r, "num_query_groups", r.opt_integer("num_query_groups").value_or(m.num_attention_heads));
  if (auto d = r.opt_integer("kv_channels")) {
    m.kv_channels = *d;
  } else if (r.ok() && m.num_attention_heads > 0) {
    if (m.hidden_size % m.num_attention_heads != 0)
      r.fail_at("num_attention_heads",
                fmt::format("hidden_size ({}) is not divisible by num_attention_heads ({}); set kv_channels",
                            m.hidden_size, m.num_attention_heads));
    else
      m.kv_channels = m.hidden_size / m.num_attention_heads;
  }
  m.vocab_size = r.integer("vocab_size");
  m.make_vocab_size_divisible_by =
      to_int(r, "make_vocab_size_divisible_by", r.opt_integer("make_vocab_size_divisible_by").value_or(128));
  m.seq_length = r.integer("seq_length");
  m.activation = r.choice("activation", parse_activation, "gelu, swiglu, squared_relu", Activation::gelu);
  m.norm = r.choice("norm", parse_norm, "layernorm, rmsnorm", Norm::layernorm);
  m.position_embedding = r.choice("position_embedding", parse_position, "learned, rope, none",
                                  PositionEmbedding::learned);
  m.add_bias_linear = r.boolean("add_bias_linear");
  m.add_qkv_bias = r.opt_boolean("add_qkv_bias").value_or(false);
  m.tied_embeddings = r.boolean("tied_embeddings");
  m.qk_layernorm = r.opt_boolean("qk_layernorm").value_or(false);
  if (auto w = r.opt_integer("window_size")) m.window_size = *w;
  if (auto f = r.opt_integer("window_skip_freq")) m.window_skip_freq = to_int(r, "window_skip_freq", *f);
  m.hidden_dropout = r.number("hidden_dropout");
  m.attention_dropout = r.number("attention_dropout");
  m.mtp_num_layers = to_int(r, "mtp_num_layers", r.opt_integer("mtp_num_layers").value_or(0));

  if (auto moe = r.table("moe", false)) {
    MoeSpec e;
    e.num_experts = to_int(*moe, "num_experts", moe->integer("num_experts"));
    e.top_k = to_int(*moe, "top_k", moe->integer("top_k"));
    e.expert_ffn_hidden = moe->integer("expert_ffn_hidden_size");
    e.shared_expert_ffn_hidden = moe->opt_integer("shared_expert_ffn_hidden_size").value_or(0);
    e.load_imbalance = moe->opt_number("load_imbalance").value_or(1.0);
    e.capacity_factor = moe->opt_number("capacity_factor");
    e.pad_to_capacity = moe->opt_boolean("pad_to_capacity").value_or(false);
    e.num_groups = to_int(*moe, "num_groups", moe->opt_integer("num_groups").value_or(0));
    e.group_topk = to_int(*moe, "group_topk", moe->opt_integer("group_topk").value_or(0));
    const auto first_dense = moe->opt_integer("first_dense_layers");
    const auto freq = moe->opt_integer("layer_freq");
    if (const toml::array* layers = moe->opt_array("layers")) {
      if (first_dense || freq)
        moe->fail_at("layers", "give either layers or first_dense_layers/layer_freq, not both");
      for (const toml::node& n : *layers) {
        auto v = n.value_exact<std::int64_t>();
        if (!v || (*v != 0 && *v != 1)) {
          moe->fail_at_node(n, "layers", "entries must be 0 (dense) or 1 (MoE)");
          break;
        }
        e.moe_layers.push_back(*v == 1);
      }
    } else {
      const std::int64_t k = first_dense.value_or(0), n = freq.value_or(1);
      if (k < 0) moe->fail_at("first_dense_layers", fmt::format("must be >= 0, found {}", k));
      if (n < 1) moe->fail_at("layer_freq", fmt::format("must be >= 1, found {}", n));
      if (moe->ok())
        for (int l = 0; l < m.num_layers; ++l) e.moe_layers.push_back(l >= k && (l - k) % n == 0);
    }
    if (auto err = moe->finish()) return Err(*err);
    m.moe = e;
  }
  if (auto mla = r.table("mla", false)) {
    MlaSpec a;
    a.q_lora_rank = mla->opt_integer("q_lora_rank");
    a.kv_lora_rank = mla->integer("kv_lora_rank");
    a.qk_head_dim = mla->integer("qk_head_dim");
    a.qk_rope_head_dim = mla->integer("qk_rope_head_dim");
    a.v_head_dim = mla->integer("v_head_dim");
    if (auto err = mla->finish()) return Err(*err);
    m.mla = a;
  }
  if (auto e = r.finish()) return Err(*e);
  auto v = validate_model(m);
  if (!v) {
    Error e = v.error();
    const std::string key = e.field.rfind("model.", 0) == 0 ? e.field.substr(6) : e.field;
    const toml::node* n = t->at_path(key).node();
    e.where = location_of(n ? *n : *t, file);
    return Err(e);
  }
  return v;
}

Result<ClusterSpec> cluster_from_toml(const toml::table& root, const std::string& file) {
  const toml::table* t = top_table(root, "cluster");
  if (!t) return Err(missing_table(root, "cluster", file));
  TomlReader r(*t, "cluster", file);
  ClusterSpec c;
  c.name = r.string("name");
  c.num_nodes = to_int(r, "num_nodes", r.integer("num_nodes"));
  c.scale_up_domain = to_int(r, "scale_up_domain", r.opt_integer("scale_up_domain").value_or(0));
  c.scale_up_domain_used = to_int(r, "scale_up_domain_used", r.opt_integer("scale_up_domain_used").value_or(0));
  if (auto d = r.table("device", true)) {
    DeviceSpec& dev = c.device;
    dev.name = d->string("name");
    dev.kind = d->choice("kind", parse_device_kind, "gpu, cpu", DeviceKind::gpu, false);
    dev.peak_bf16_flops = d->number("peak_bf16_tflops") * 1e12;
    if (auto f8 = d->opt_number("peak_fp8_tflops")) dev.peak_fp8_flops = *f8 * 1e12;
    dev.peak_fp32_flops = d->number("peak_fp32_tflops") * 1e12;
    dev.memory_bytes = d->number("memory_GiB") * 1024.0 * 1024.0 * 1024.0;
    dev.memory_bandwidth_Bps = d->number("memory_bandwidth_TBps") * 1e12;
    if (auto sms = d->opt_integer("sms")) dev.sms = to_int(*d, "sms", *sms);
    if (auto mx = d->opt_boolean("mx_formats")) dev.mx_formats = *mx;
    if (auto e = d->finish()) return Err(*e);
  }
  if (auto n = r.table("node", true)) {
    NodeSpec& node = c.node;
    node.devices_per_node = to_int(*n, "devices", n->integer("devices"));
    node.scale_up = n->choice("scale_up", parse_scale_up, "nvswitch, nvlink-mesh, pcie, none", ScaleUpKind::none);
    const bool linked = node.devices_per_node > 1 && node.scale_up != ScaleUpKind::none;
    if (auto bw = linked ? std::optional<double>(n->number("scale_up_bandwidth_GBps"))
                         : n->opt_number("scale_up_bandwidth_GBps"))
      node.scale_up_bandwidth_Bps = *bw * 1e9;
    node.scale_up_latency_s = n->number("scale_up_latency_us") * 1e-6;
    node.nvls = n->opt_boolean("nvls").value_or(false);
    node.pcie_bandwidth_Bps = n->number("pcie_bandwidth_GBps") * 1e9;
    node.nics_per_node = to_int(*n, "nics", n->integer("nics"));
    if (auto nic = node.nics_per_node > 0 ? std::optional<double>(n->number("nic_bandwidth_Gbps"))
                                          : n->opt_number("nic_bandwidth_Gbps"))
      node.nic_bandwidth_Bps = *nic * 1e9 / 8.0;
    if (auto e = n->finish()) return Err(*e);
  }
  if (auto so = r.table("scale_out", c.node.nics_per_node > 0)) {
    ScaleOutSpec& o = c.scale_out;
    o.fabric = so->choice("fabric", parse_fabric, "infiniband, roce, ethernet", Fabric::infiniband);
    o.latency_s = so->number("latency_us") * 1e-6;
    o.tiers = to_int(*so, "tiers", so->integer("tiers"));
    o.rail_optimized = so->boolean("rail_optimized");
    o.oversubscription = so->number("oversubscription");
    o.switch_radix = to_int(*so, "switch_radix", so->integer("switch_radix"));
    o.p2p_efficiency = so->opt_number("p2p_efficiency").value_or(1.0);
    const Routing by_fabric = o.fabric == Fabric::infiniband ? Routing::adaptive : Routing::ecmp;
    o.routing = so->choice("routing", parse_routing, "adaptive, ecmp", by_fabric, /*required=*/false);
    if (auto e = so->finish()) return Err(*e);
  } else if (c.node.nics_per_node == 0) {
    c.scale_out.fabric = Fabric::none;
  }
  if (auto e = r.finish()) return Err(*e);
  auto v = validate_cluster(c);
  if (!v) {
    Error e = v.error();
    e.where = location_of(*t, file);
    return Err(e);
  }
  return v;
}

namespace {
std::optional<LengthDistribution::Kind> parse_length_kind(std::string_view s) {
  if (s == "fixed") return LengthDistribution::Kind::fixed;
  if (s == "lognormal") return LengthDistribution::Kind::lognormal;
  if (s == "histogram") return LengthDistribution::Kind::histogram;
  return std::nullopt;
}
}  // namespace

Result<TrainingSpec> training_from_toml(const toml::table& root, const std::string& file) {
  const toml::table* t = top_table(root, "training");
  if (!t) return Err(missing_table(root, "training", file));
  TomlReader r(*t, "training", file);
  TrainingSpec tr;
  tr.global_batch_size = r.integer("global_batch_size");
  tr.seq_length = r.opt_integer("seq_length");
  tr.precision = r.choice("precision", parse_precision, "bf16, fp8", Precision::bf16, false);
  tr.fp8_recipe = r.choice("fp8_recipe", parse_fp8_recipe, "delayed, tensorwise, blockwise, mxfp8", Fp8Recipe::delayed, false);
  tr.params_dtype = r.choice("params_dtype", parse_dtype, "bf16, fp16, fp32", Dtype::bf16, false);
  tr.grad_dtype = r.choice("grad_dtype", parse_dtype, "fp32, bf16, fp16", Dtype::fp32, false);
  (void)r.choice("optimizer", parse_adam, "adam", 0, false);
  OptimizerPrecision& op = tr.optimizer_precision;
  op.enabled = r.opt_boolean("precision_aware_optimizer").value_or(false);
  op.main_params = r.choice("main_params_dtype", parse_dtype, "fp32, fp16", Dtype::fp32, false);
  op.exp_avg = r.choice("exp_avg_dtype", parse_state_dtype, "fp32, bf16, fp16, fp8", Dtype::fp32, false);
  op.exp_avg_sq = r.choice("exp_avg_sq_dtype", parse_state_dtype, "fp32, bf16, fp16, fp8", Dtype::fp32, false);
  op.store_param_remainders = r.opt_boolean("store_param_remainders").value_or(true);
  if (auto o = r.table("overheads", false)) {
    constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
    if (auto v = o->opt_number("cuda_context_GiB")) tr.overheads.cuda_context_bytes = *v * GiB;
    if (auto v = o->opt_number("nccl_per_group_GiB")) tr.overheads.nccl_bytes_per_group = *v * GiB;
    if (auto v = o->opt_number("fragmentation")) tr.overheads.fragmentation_fraction = *v;
    if (auto e = o->finish()) return Err(*e);
  }
  if (auto l = r.table("lengths", false)) {
    // [training.lengths]: variable-length training (core/varlen.hpp).
    auto v = std::make_shared<VarlenSpec>();
    LengthDistribution& d = v->lengths;
    d.kind = l->choice("distribution", parse_length_kind, "fixed, lognormal, histogram", LengthDistribution::Kind::fixed, true);
    if (auto x = l->opt_number("mean")) d.mean = *x;
    if (auto x = l->opt_number("sigma")) d.sigma = *x;
    if (auto x = l->opt_integer("min")) d.min = *x;
    if (auto x = l->opt_integer("max")) d.max = *x;
    const std::optional<std::string> hist = l->opt_string("file");
    v->packing = l->choice("packing", parse_packing, "pad, pack", Packing::pack, false);
    if (auto x = l->opt_integer("seed")) {
      if (*x < 0) l->fail_at("seed", fmt::format("must be >= 0, found {}", *x));
      v->seed = static_cast<std::uint64_t>(*x);
    }
    if (auto x = l->opt_integer("steps")) v->steps = static_cast<int>(std::clamp<std::int64_t>(*x, -1, 1 << 30));
    if (auto e = l->finish()) return Err(*e);
    if (d.kind == LengthDistribution::Kind::histogram) {
      if (!hist) return Err(Error{"a histogram distribution needs file = \"lengths.txt\" (one \"length count\" per line)",
                                  "training.lengths.file", location_of(*t, file)});
      std::filesystem::path path(*hist);
      if (path.is_relative()) path = std::filesystem::path(file).parent_path() / path;
      auto rows = read_length_histogram(path.string());
      if (!rows) return Err(rows.error());
      d.histogram = std::move(rows->histogram);
    } else if (hist) {
      return Err(Error{"file is read only with distribution = \"histogram\"", "training.lengths.file",
                       location_of(*t, file)});
    }
    tr.varlen = std::move(v);
  }
  if (auto e = r.finish()) return Err(*e);
  auto v = validate_training(tr);
  if (!v) {
    Error e = v.error();
    e.where = location_of(*t, file);
    return Err(e);
  }
  return v;
}

Result<PlanSpec> plan_from_toml(const toml::table& root, const std::string& file) {
  const toml::table* t = top_table(root, "plan");
  if (!t) return Err(missing_table(root, "plan", file));
  PlanSpec p;
  for (auto&& [k, node] : *t) {
    std::string value;
    if (auto i = node.value_exact<std::int64_t>()) value = std::to_string(*i);
    else if (auto b = node.value_exact<bool>()) value = *b ? "true" : "false";
    else if (auto s = node.value_exact<std::string>()) value = *s;
    else if (const toml::array* a = node.as_array(); a && k.str() == "recompute_modules") {
      for (const toml::node& n : *a) {   // ["core_attn", "moe_act"] is core_attn+moe_act
        const auto name = n.value_exact<std::string>();
        if (!name) return Err(Error{"expected an array of strings", "plan.recompute_modules", location_of(n, file)});
        value += (value.empty() ? "" : "+") + *name;
      }
    } else
      return Err(Error{"expected an integer, a boolean or a string", "plan." + std::string(k.str()),
                       location_of(node, file)});
    if (auto ok = apply_plan_setting(p, k.str(), value); !ok) {
      Error e = ok.error();
      e.where = location_of(node, file);
      return Err(e);
    }
  }
  return p;
}

namespace {
template <class T>
Result<T> from_file(const std::string& path, Result<T> (*fn)(const toml::table&, const std::string&)) {
  auto root = parse_toml_file(path);
  if (!root) return Err(root.error());
  if (auto ok = check_top_level(*root, path); !ok) return Err(ok.error());
  return fn(*root, path);
}
}  // namespace

Result<ModelSpec> load_model_toml(const std::string& path) { return from_file(path, model_from_toml); }
Result<ClusterSpec> load_cluster_toml(const std::string& path) { return from_file(path, cluster_from_toml); }
Result<TrainingSpec> load_training_toml(const std::string& path) { return from_file(path, training_from_toml); }
Result<TrainingSpec> load_training_toml(const std::string& path, std::int64_t batch) {
  auto root = parse_toml_file(path);
  if (!root) return Err(root.error());
  if (auto ok = check_top_level(*root, path); !ok) return Err(ok.error());
  if (toml::table* t = (*root)["training"].as_table(); t && !t->contains("global_batch_size"))
    t->insert("global_batch_size", batch);
  return training_from_toml(*root, path);
}
Result<PlanSpec> load_plan_toml(const std::string& path) { return from_file(path, plan_from_toml); }

Result<ExampleSpec> load_example_toml(const std::string& path) {
  auto root = parse_toml_file(path);
  if (!root) return Err(root.error());
  if (auto ok = check_top_level(*root, path); !ok) return Err(ok.error());
  const toml::table* t = top_table(*root, "example");
  if (!t) return Err(missing_table(*root, "example", path));
  TomlReader r(*t, "example", path);
  ExampleSpec ex;
  ex.model = r.string("model");
  ex.cluster = r.string("cluster");
  if (auto g = r.opt_integer("gpus")) ex.gpus = to_int(r, "gpus", *g);
  if (auto e = r.finish()) return Err(*e);
  // Paths are relative to the example file.
  const auto dir = std::filesystem::path(path).parent_path();
  for (std::string* ref : {&ex.model, &ex.cluster})
    if (ref->find('/') != std::string::npos || ref->ends_with(".toml") || ref->ends_with(".json"))
      *ref = (dir / *ref).string();
  auto training = training_from_toml(*root, path);
  if (!training) return Err(training.error());
  ex.training = *training;
  auto plan = plan_from_toml(*root, path);
  if (!plan) return Err(plan.error());
  ex.plan = *plan;
  return ex;
}

}  // namespace megascope
