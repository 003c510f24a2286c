// Hugging Face config.json -> ModelSpec.
//
// Each supported "model_type" names the keys its shape depends on; those are
// read strictly (type and range checked, errors name the file and the key as
// "hf.<key>"), everything else in the file is ignored. The layer patterns of
// the MoE families follow the Hugging Face modeling code:
//   qwen2_moe, qwen3_moe: layer i is MoE iff i is not in mlp_only_layers and
//                         (i + 1) % decoder_sparse_step == 0;
//   deepseek_v2/v3:       layer i is MoE iff i >= first_k_dense_replace and
//                         i % moe_layer_freq == 0.
#include "config/hf_config.hpp"
#include "config/json_file.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace megascope {
namespace {

using nlohmann::json;

constexpr std::int64_t kMaxInt64 = std::numeric_limits<std::int64_t>::max();

// Assigns the value of a Result-returning expression to `lhs`, or returns
// its error from the enclosing function.
#define MEGASCOPE_HF_ASSIGN(lhs, expr)                        \
  do {                                                        \
    auto hf_result_ = (expr);                                 \
    if (!hf_result_) return tl::unexpected(hf_result_.error()); \
    lhs = std::move(*hf_result_);                             \
  } while (0)

enum class Family { llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, deepseek, nemotron };

struct FamilyName {
  const char* model_type;
  Family family;
};

constexpr FamilyName kFamilies[] = {
    {"llama", Family::llama},         {"mistral", Family::mistral},
    {"mixtral", Family::mixtral},     {"qwen2", Family::qwen2},
    {"qwen2_moe", Family::qwen2_moe}, {"qwen3", Family::qwen3},
    {"qwen3_moe", Family::qwen3_moe}, {"deepseek_v2", Family::deepseek},
    {"deepseek_v3", Family::deepseek},  {"nemotron", Family::nemotron},
};

std::string supported_model_types() {
  std::string out;
  for (const auto& f : kFamilies) {
    if (!out.empty()) out += ", ";
    out += f.model_type;
  }
  return out;
}

// The JSON type of a value as a reader would name it.
std::string type_of(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "integer";
    case json::value_t::number_float: return "float";
    case json::value_t::string: return "string";
    case json::value_t::array: return "array";
    case json::value_t::object: return "object";
    case json::value_t::binary: return "binary";
    case json::value_t::discarded: return "discarded";
  }
  return "unknown";
}

// A short rendering of a value for messages ("found string \"4096\"").
std::string describe(const json& v) {
  if (v.is_primitive() && !v.is_null()) {
    std::string text = v.dump();
    if (text.size() > 40) text = text.substr(0, 37) + "...";
    return type_of(v) + " " + text;
  }
  return type_of(v);
}

// Typed, range-checked access to the top-level keys of one config.json.
class Reader {
 public:
  Reader(const json& root, std::string source, std::string model_type)
      : root_(root), source_(std::move(source)), model_type_(std::move(model_type)) {}

  [[nodiscard]] const std::string& source() const { return source_; }

  // Whether `key` is present (possibly null).
  [[nodiscard]] bool has(const char* key) const { return root_.contains(key); }

  // The value of `key`, or nullptr when it is absent or null.
  [[nodiscard]] const json* find(const char* key) const {
    auto it = root_.find(key);
    if (it == root_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  [[nodiscard]] tl::unexpected<Error> error(const char* key, const std::string& message) const {
    return fail(std::string("hf.") + key, fmt::format("{} (in {})", message, source_));
  }

  [[nodiscard]] tl::unexpected<Error> missing(const char* key) const {
    auto it = root_.find(key);
    if (it != root_.end())  // present but null
      return error(key, fmt::format("\"{}\" is null, but model_type \"{}\" needs an integer here",
                                    key, model_type_));
    return error(key, fmt::format("missing required key \"{}\" for model_type \"{}\"", key, model_type_));
  }

  // An integer in [min, max]; absent or null gives nullopt.
  Result<std::optional<std::int64_t>> opt_int(const char* key, std::int64_t min,
                                              std::int64_t max = kMaxInt64) const {
    const json* v = find(key);
    if (!v) return std::optional<std::int64_t>{};
    return checked_int(key, *v, min, max);
  }

  Result<std::int64_t> req_int(const char* key, std::int64_t min = 1, std::int64_t max = kMaxInt64) const {
    const json* v = find(key);
    if (!v) return missing(key);
    return checked_int(key, *v, min, max);
  }

  // A required integer that must fit an `int` (layer and head counts).
  Result<int> req_count(const char* key, int min = 1) const {
    auto r = req_int(key, min, INT_MAX);
    if (!r) return tl::unexpected(r.error());
    return static_cast<int>(*r);
  }

  Result<std::optional<bool>> opt_bool(const char* key) const {
    const json* v = find(key);
    if (!v) return std::optional<bool>{};
    if (!v->is_boolean())
      return error(key, fmt::format("\"{}\": expected a boolean, found {}", key, describe(*v)));
    return std::optional<bool>{v->get<bool>()};
  }

  Result<std::optional<double>> opt_number(const char* key) const {
    const json* v = find(key);
    if (!v) return std::optional<double>{};
    if (!v->is_number())
      return error(key, fmt::format("\"{}\": expected a number, found {}", key, describe(*v)));
    return std::optional<double>{v->get<double>()};
  }

  Result<std::optional<std::string>> opt_string(const char* key) const {
    const json* v = find(key);
    if (!v) return std::optional<std::string>{};
    if (!v->is_string())
      return error(key, fmt::format("\"{}\": expected a string, found {}", key, describe(*v)));
    return std::optional<std::string>{v->get<std::string>()};
  }

  // A list of integers in [min, max]; absent or null gives an empty list.
  Result<std::vector<std::int64_t>> opt_int_list(const char* key, std::int64_t min, std::int64_t max) const {
    std::vector<std::int64_t> out;
    const json* v = find(key);
    if (!v) return out;
    if (!v->is_array())
      return error(key, fmt::format("\"{}\": expected an array of integers, found {}", key, describe(*v)));
    for (const json& item : *v) {
      if (!item.is_number_integer())
        return error(key, fmt::format("\"{}\": expected an array of integers, found an element of type {}",
                                      key, describe(item)));
      auto r = checked_int(key, item, min, max);
      if (!r) return tl::unexpected(r.error());
      out.push_back(*r);
    }
    return out;
  }

 private:
  Result<std::int64_t> checked_int(const char* key, const json& v, std::int64_t min, std::int64_t max) const {
    if (!v.is_number_integer())
      return error(key, fmt::format("\"{}\": expected an integer, found {}", key, describe(v)));
    std::int64_t value = 0;
    if (v.is_number_unsigned()) {
      const auto u = v.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        return error(key, fmt::format("\"{}\" = {} is too large", key, u));
      value = static_cast<std::int64_t>(u);
    } else {
      value = v.get<std::int64_t>();
    }
    if (value < min || value > max) {
      if (max == kMaxInt64)
        return error(key, fmt::format("\"{}\" must be >= {}, found {}", key, min, value));
      return error(key, fmt::format("\"{}\" must be in [{}, {}], found {}", key, min, max, value));
    }
    return value;
  }

  const json& root_;
  std::string source_;
  std::string model_type_;
};


// The name used in reports: "_name_or_path", else the file's stem (or its
// folder for a plain "config.json"), else "hf-model".
std::string default_name(const std::string& source) {
  if (source.empty() || source.front() == '<') return "hf-model";
  const std::filesystem::path p(source);
  std::string stem = p.stem().string();
  if (stem == "config") {
    const std::string folder = p.parent_path().filename().string();
    if (!folder.empty() && folder != "." && folder != "..") return folder;
  }
  return stem.empty() ? std::string("hf-model") : stem;
}

// The MLP's activation. Every family but Nemotron has a gated MLP (gate,
// up and down projections) whatever its hidden_act: priced as SwiGLU (the
// gate's activation is elementwise either way). Nemotron's MLP is not gated
// (up and down): relu2 (its default) or a GeLU.
Result<Activation> activation_of(const Reader& rd, bool gated) {
  std::optional<std::string> act;
  MEGASCOPE_HF_ASSIGN(act, rd.opt_string("hidden_act"));
  const std::string name = act.value_or(gated ? "silu" : "relu2");   // the family's default
  const bool gelu = name.rfind("gelu", 0) == 0;
  if (gated) {
    if (name == "silu" || name == "swiglu" || gelu || name == "relu2") return Activation::swiglu;
    return rd.error("hidden_act", fmt::format("unsupported hidden_act \"{}\"; supported: silu, swiglu, gelu*, relu2 "
                                              "(a gated MLP, priced as SwiGLU)",
                                              name));
  }
  if (name == "relu2") return Activation::squared_relu;
  if (gelu) return Activation::gelu;
  return rd.error("hidden_act", fmt::format("unsupported hidden_act \"{}\" for a Nemotron MLP (not gated); supported: "
                                            "relu2, gelu*",
                                            name));
}

// The per-layer MoE pattern of Qwen2-MoE / Qwen3-MoE.
Result<std::vector<bool>> qwen_moe_layers(const Reader& rd, int num_layers) {
  std::optional<std::int64_t> step;
  MEGASCOPE_HF_ASSIGN(step, rd.opt_int("decoder_sparse_step", 1));
  std::vector<std::int64_t> mlp_only;
  MEGASCOPE_HF_ASSIGN(mlp_only, rd.opt_int_list("mlp_only_layers", 0, num_layers - 1));
  const std::int64_t every = step.value_or(1);
  std::vector<bool> layers(static_cast<std::size_t>(num_layers), false);
  for (int i = 0; i < num_layers; ++i) {
    const bool dense_only = std::find(mlp_only.begin(), mlp_only.end(), i) != mlp_only.end();
    layers[static_cast<std::size_t>(i)] = !dense_only && (i + 1) % every == 0;
  }
  return layers;
}

// Attention, MLA and MoE of DeepSeek-V2/V3.
Result<void> read_deepseek(const Reader& rd, ModelSpec& m) {
  MlaSpec mla;
  // q_lora_rank must be stated; null means queries are not compressed
  // (DeepSeek-V2-Lite).
  if (!rd.has("q_lora_rank"))
    return rd.error("q_lora_rank",
                    "missing required key \"q_lora_rank\" (write null for no query compression)");
  MEGASCOPE_HF_ASSIGN(mla.q_lora_rank, rd.opt_int("q_lora_rank", 1));
  MEGASCOPE_HF_ASSIGN(mla.kv_lora_rank, rd.req_int("kv_lora_rank"));
  MEGASCOPE_HF_ASSIGN(mla.qk_head_dim, rd.req_int("qk_nope_head_dim"));
  MEGASCOPE_HF_ASSIGN(mla.qk_rope_head_dim, rd.req_int("qk_rope_head_dim"));
  MEGASCOPE_HF_ASSIGN(mla.v_head_dim, rd.req_int("v_head_dim"));
  m.kv_channels = mla.qk_head_dim + mla.qk_rope_head_dim;
  m.num_query_groups = m.num_attention_heads;  // one latent KV serves every head
  m.mla = mla;

  std::optional<std::int64_t> mtp;
  MEGASCOPE_HF_ASSIGN(mtp, rd.opt_int("num_nextn_predict_layers", 0, INT_MAX));
  m.mtp_num_layers = static_cast<int>(mtp.value_or(0));

  // n_routed_experts absent or null: a dense model (the HF modeling code
  // builds MoE layers only when it is set).
  std::optional<std::int64_t> routed;
  MEGASCOPE_HF_ASSIGN(routed, rd.opt_int("n_routed_experts", 1, INT_MAX));
  if (!routed) return {};
  MoeSpec moe;
  moe.num_experts = static_cast<int>(*routed);
  MEGASCOPE_HF_ASSIGN(moe.top_k, rd.req_count("num_experts_per_tok"));
  MEGASCOPE_HF_ASSIGN(moe.expert_ffn_hidden, rd.req_int("moe_intermediate_size"));
  std::optional<std::int64_t> shared;
  MEGASCOPE_HF_ASSIGN(shared, rd.opt_int("n_shared_experts", 0));
  moe.shared_expert_ffn_hidden = shared.value_or(0) * moe.expert_ffn_hidden;
  // Group-limited routing (V2's group_limited_greedy, V3's noaux_tc): n_group
  // groups, topk_group of them per token; "greedy" (V2-Lite) routes over all.
  std::optional<std::int64_t> n_group, topk_group;
  std::optional<std::string> topk_method;
  MEGASCOPE_HF_ASSIGN(n_group, rd.opt_int("n_group", 1));
  MEGASCOPE_HF_ASSIGN(topk_group, rd.opt_int("topk_group", 1));
  MEGASCOPE_HF_ASSIGN(topk_method, rd.opt_string("topk_method"));
  if (n_group && *n_group > 1 && topk_group && topk_method.value_or("") != "greedy") {
    moe.num_groups = static_cast<int>(*n_group);
    moe.group_topk = static_cast<int>(*topk_group);
  }
  std::optional<std::int64_t> first_dense;
  MEGASCOPE_HF_ASSIGN(first_dense, rd.opt_int("first_k_dense_replace", 0));
  std::optional<std::int64_t> freq;
  MEGASCOPE_HF_ASSIGN(freq, rd.opt_int("moe_layer_freq", 1));
  moe.moe_layers.assign(static_cast<std::size_t>(m.num_layers), false);
  for (int i = 0; i < m.num_layers; ++i)
    moe.moe_layers[static_cast<std::size_t>(i)] = i >= first_dense.value_or(0) && i % freq.value_or(1) == 0;
  m.moe = std::move(moe);
  return {};
}

Result<ModelSpec> convert(const json& root, const std::string& source) {
  if (!root.is_object())
    return fail("hf", fmt::format("expected a JSON object at the top level, found {} (in {})",
                                  type_of(root), source));

  // Dispatch on model_type.
  auto type_it = root.find("model_type");
  if (type_it == root.end() || type_it->is_null())
    return fail("hf.model_type",
                fmt::format("missing \"model_type\"; supported: {} (in {})", supported_model_types(), source));
  if (!type_it->is_string())
    return fail("hf.model_type", fmt::format("\"model_type\": expected a string, found {} (in {})",
                                             describe(*type_it), source));
  const std::string model_type = type_it->get<std::string>();
  const auto* entry = std::find_if(std::begin(kFamilies), std::end(kFamilies),
                                   [&](const FamilyName& f) { return model_type == f.model_type; });
  if (entry == std::end(kFamilies))
    return fail("hf.model_type", fmt::format("unsupported model_type \"{}\"; supported: {} (in {})",
                                             model_type, supported_model_types(), source));
  const Family family = entry->family;
  const Reader rd(root, source, model_type);

  ModelSpec m;
  std::optional<std::string> name;
  MEGASCOPE_HF_ASSIGN(name, rd.opt_string("_name_or_path"));
  m.name = name && !name->empty() ? *name : default_name(source);

  // Keys every family needs.
  MEGASCOPE_HF_ASSIGN(m.hidden_size, rd.req_int("hidden_size"));
  MEGASCOPE_HF_ASSIGN(m.ffn_hidden_size, rd.req_int("intermediate_size"));
  MEGASCOPE_HF_ASSIGN(m.num_layers, rd.req_count("num_hidden_layers"));
  MEGASCOPE_HF_ASSIGN(m.num_attention_heads, rd.req_count("num_attention_heads"));
  MEGASCOPE_HF_ASSIGN(m.vocab_size, rd.req_int("vocab_size"));
  MEGASCOPE_HF_ASSIGN(m.seq_length, rd.req_int("max_position_embeddings"));
  // Nemotron (NemotronConfig): squared ReLU by default, LayerNorm1p (a LayerNorm's cost).
  MEGASCOPE_HF_ASSIGN(m.activation, activation_of(rd, family != Family::nemotron));
  m.norm = family == Family::nemotron ? Norm::layernorm : Norm::rmsnorm;
  m.position_embedding = PositionEmbedding::rope;

  std::optional<bool> tied;
  MEGASCOPE_HF_ASSIGN(tied, rd.opt_bool("tie_word_embeddings"));
  m.tied_embeddings = tied.value_or(false);
  std::optional<double> attn_dropout;
  MEGASCOPE_HF_ASSIGN(attn_dropout, rd.opt_number("attention_dropout"));
  m.hidden_dropout = 0.0;
  m.attention_dropout = attn_dropout.value_or(0.0);
  std::optional<bool> attention_bias;
  MEGASCOPE_HF_ASSIGN(attention_bias, rd.opt_bool("attention_bias"));

  if (family == Family::deepseek) {
    m.add_bias_linear = false;
    m.add_qkv_bias = attention_bias.value_or(false);
    if (auto r = read_deepseek(rd, m); !r) return tl::unexpected(r.error());
  } else {
    // Grouped-query attention and the head dimension.
    std::optional<std::int64_t> kv_heads;
    MEGASCOPE_HF_ASSIGN(kv_heads, rd.opt_int("num_key_value_heads", 1, INT_MAX));
    m.num_query_groups = kv_heads ? static_cast<int>(*kv_heads) : m.num_attention_heads;

    // Qwen3's own default head_dim (128) differs from hidden_size / heads,
    // so it is required there rather than guessed.
    const bool head_dim_required = family == Family::qwen3 || family == Family::qwen3_moe;
    std::optional<std::int64_t> head_dim;
    if (head_dim_required) {
      MEGASCOPE_HF_ASSIGN(head_dim, rd.req_int("head_dim"));
    } else {
      MEGASCOPE_HF_ASSIGN(head_dim, rd.opt_int("head_dim", 1));
    }
    if (head_dim) {
      m.kv_channels = *head_dim;
    } else if (m.hidden_size % m.num_attention_heads != 0) {
      return rd.error("head_dim", fmt::format("\"head_dim\" is absent and hidden_size ({}) is not divisible by "
                                              "num_attention_heads ({})",
                                              m.hidden_size, m.num_attention_heads));
    } else {
      m.kv_channels = m.hidden_size / m.num_attention_heads;
    }

    // Biases.
    switch (family) {
      case Family::qwen2:
      case Family::qwen2_moe:
        m.add_bias_linear = false;
        m.add_qkv_bias = true;  // Qwen2 always has q/k/v biases
        break;
      case Family::qwen3:
      case Family::qwen3_moe:
        m.add_bias_linear = false;
        m.add_qkv_bias = attention_bias.value_or(false);
        m.qk_layernorm = true;
        break;
      default: {  // llama, mistral, mixtral, nemotron
        std::optional<bool> mlp_bias;
        MEGASCOPE_HF_ASSIGN(mlp_bias, rd.opt_bool("mlp_bias"));
        m.add_qkv_bias = attention_bias.value_or(false);
        m.add_bias_linear = m.add_qkv_bias && mlp_bias.value_or(false);
        break;
      }
    }

    // Mixture of experts.
    if (family == Family::mixtral) {
      MoeSpec moe;
      MEGASCOPE_HF_ASSIGN(moe.num_experts, rd.req_count("num_local_experts"));
      MEGASCOPE_HF_ASSIGN(moe.top_k, rd.req_count("num_experts_per_tok"));
      moe.expert_ffn_hidden = m.ffn_hidden_size;
      moe.moe_layers.assign(static_cast<std::size_t>(m.num_layers), true);
      m.moe = std::move(moe);
    } else if (family == Family::qwen2_moe || family == Family::qwen3_moe) {
      MoeSpec moe;
      MEGASCOPE_HF_ASSIGN(moe.num_experts, rd.req_count("num_experts"));
      MEGASCOPE_HF_ASSIGN(moe.top_k, rd.req_count("num_experts_per_tok"));
      MEGASCOPE_HF_ASSIGN(moe.expert_ffn_hidden, rd.req_int("moe_intermediate_size"));
      if (family == Family::qwen2_moe)
        MEGASCOPE_HF_ASSIGN(moe.shared_expert_ffn_hidden, rd.req_int("shared_expert_intermediate_size", 0));
      MEGASCOPE_HF_ASSIGN(moe.moe_layers, qwen_moe_layers(rd, m.num_layers));
      m.moe = std::move(moe);
    }
  }

  auto validated = validate_model(std::move(m));
  if (!validated) {
    Error e = validated.error();
    e.message += fmt::format(" (converted from {})", source);
    return tl::unexpected(std::move(e));
  }
  return validated;
}

#undef MEGASCOPE_HF_ASSIGN

}  // namespace

Result<ModelSpec> parse_hf_config(std::string_view json_text, const std::string& source) {
  auto root = json_detail::parse_json(json_text, source, "");
  if (!root) return tl::unexpected(root.error());
  return convert(*root, source);
}

Result<ModelSpec> load_hf_config(const std::string& path) {
  auto text = json_detail::read_text_file(path, "Hugging Face config", "");
  if (!text) return tl::unexpected(text.error());
  return parse_hf_config(*text, path);
}

}  // namespace megascope
