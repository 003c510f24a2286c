#include "core/model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

namespace megascope {

bool ModelSpec::is_window_layer(int layer) const {
  if (window_size <= 0) return false;
  if (layer >= num_layers) layer = num_layers - 1;   // MTP layers are shaped like the last one
  return window_skip_freq <= 0 || (layer + 1) % window_skip_freq != 0;
}

bool ModelSpec::is_moe_layer(int layer) const {
  // MTP layers (numbered num_layers + depth) are shaped like the last layer.
  if (layer >= num_layers && layer < num_layers + mtp_num_layers) layer = num_layers - 1;
  return moe && layer >= 0 && layer < static_cast<int>(moe->moe_layers.size()) &&
         moe->moe_layers[static_cast<std::size_t>(layer)];
}

int ModelSpec::num_moe_layers() const {
  if (!moe) return 0;
  int n = 0;
  for (bool b : moe->moe_layers) n += b ? 1 : 0;
  return n;
}

std::int64_t ModelSpec::padded_vocab(int tp) const {
  // Megatron: _vocab_size_with_padding, multiple = make_vocab_size_divisible_by * tp.
  const std::int64_t multiple = static_cast<std::int64_t>(make_vocab_size_divisible_by) * tp;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

namespace {
Result<void> positive(const std::string& field, std::int64_t v) {
  if (v <= 0) return fail("model." + field, fmt::format("must be a positive integer, found {}", v));
  return {};
}
Result<void> probability(const std::string& field, double v) {
  if (!(v >= 0.0 && v < 1.0))
    return fail("model." + field, fmt::format("must be a probability in [0, 1), found {}", v));
  return {};
}
}  // namespace

Result<ModelSpec> validate_model(ModelSpec m) {
  for (auto [field, v] : {std::pair<const char*, std::int64_t>{"num_layers", m.num_layers},
                          {"hidden_size", m.hidden_size},
                          {"ffn_hidden_size", m.ffn_hidden_size},
                          {"num_attention_heads", m.num_attention_heads},
                          {"num_query_groups", m.num_query_groups},
                          {"kv_channels", m.kv_channels},
                          {"vocab_size", m.vocab_size},
                          {"make_vocab_size_divisible_by", m.make_vocab_size_divisible_by},
                          {"seq_length", m.seq_length}}) {
    if (auto r = positive(field, v); !r) return tl::unexpected(r.error());
  }
  // Upper bounds, far above any model trained, that keep every derived
  // count, FLOP and byte figure exact and finite (docs/validation-rules.md).
  for (auto [field, v, most] : {std::tuple<const char*, std::int64_t, std::int64_t>{"num_layers", m.num_layers, kMaxModelCount},
                                {"num_attention_heads", m.num_attention_heads, kMaxModelCount},
                                {"num_query_groups", m.num_query_groups, kMaxModelCount},
                                {"make_vocab_size_divisible_by", m.make_vocab_size_divisible_by, kMaxModelCount},
                                {"mtp_num_layers", m.mtp_num_layers, kMaxModelCount},
                                {"hidden_size", m.hidden_size, kMaxModelWidth},
                                {"ffn_hidden_size", m.ffn_hidden_size, kMaxModelWidth},
                                {"kv_channels", m.kv_channels, kMaxModelWidth},
                                {"vocab_size", m.vocab_size, kMaxModelLength},
                                {"seq_length", m.seq_length, kMaxModelLength},
                                {"window_size", m.window_size, kMaxModelLength}}) {
    if (v > most)
      return fail(std::string("model.") + field,
                  fmt::format("must be at most {} (the bound on a model dimension), found {}", most, v));
  }
  if (auto r = probability("hidden_dropout", m.hidden_dropout); !r) return tl::unexpected(r.error());
  if (auto r = probability("attention_dropout", m.attention_dropout); !r) return tl::unexpected(r.error());
  if (m.num_query_groups > m.num_attention_heads || m.num_attention_heads % m.num_query_groups != 0)
    return fail("model.num_query_groups",
                fmt::format("num_attention_heads ({}) must be a multiple of num_query_groups ({}): "
                            "each KV head serves a whole number of query heads",
                            m.num_attention_heads, m.num_query_groups));
  if (m.window_size < 0)
    return fail("model.window_size", fmt::format("must be >= 0 (0: no sliding window), found {}", m.window_size));
  if (m.window_skip_freq < 0)
    return fail("model.window_skip_freq", fmt::format("must be >= 0 (0: every layer windowed), found {}", m.window_skip_freq));
  if (m.mtp_num_layers < 0)
    return fail("model.mtp_num_layers", fmt::format("must be >= 0, found {}", m.mtp_num_layers));
  if (m.add_bias_linear) m.add_qkv_bias = true;

  if (m.moe) {
    MoeSpec& e = *m.moe;
    if (e.num_experts < 1)
      return fail("model.moe.num_experts", fmt::format("must be >= 1, found {}", e.num_experts));
    if (e.top_k < 1 || e.top_k > e.num_experts)
      return fail("model.moe.top_k", fmt::format("must be in [1, num_experts = {}], found {}",
                                                 e.num_experts, e.top_k));
    if (e.expert_ffn_hidden <= 0)
      return fail("model.moe.expert_ffn_hidden_size",
                  fmt::format("must be a positive integer, found {}", e.expert_ffn_hidden));
    if (e.shared_expert_ffn_hidden < 0)
      return fail("model.moe.shared_expert_ffn_hidden_size",
                  fmt::format("must be >= 0, found {}", e.shared_expert_ffn_hidden));
    for (auto [field, v, most] :
         {std::tuple<const char*, std::int64_t, std::int64_t>{"num_experts", e.num_experts, kMaxModelCount},
          {"expert_ffn_hidden_size", e.expert_ffn_hidden, kMaxModelWidth},
          {"shared_expert_ffn_hidden_size", e.shared_expert_ffn_hidden, kMaxModelWidth}})
      if (v > most)
        return fail(std::string("model.moe.") + field,
                    fmt::format("must be at most {} (the bound on a model dimension), found {}", most, v));
    if (static_cast<int>(e.moe_layers.size()) != m.num_layers)
      return fail("model.moe.layers",
                  fmt::format("the MoE layer pattern has {} entries but the model has {} layers",
                              e.moe_layers.size(), m.num_layers));
    if (!std::isfinite(e.load_imbalance) || e.load_imbalance < 1.0)
      return fail("model.moe.load_imbalance",
                  fmt::format("must be a finite number >= 1 (the busiest EP rank's tokens over the mean), found {}",
                              e.load_imbalance));
    for (std::size_t l = 0; l < e.token_histogram.size(); ++l) {
      const std::vector<double>& row = e.token_histogram[l];
      if (row.size() != static_cast<std::size_t>(e.num_experts))
        return fail("model.moe.token_histogram",
                    fmt::format("layer row {} has {} experts' counts; the model has {} experts", l + 1, row.size(),
                                e.num_experts));
      double total = 0;
      for (double c : row) {
        if (!std::isfinite(c) || c < 0)
          return fail("model.moe.token_histogram",
                      fmt::format("layer row {}: token counts must be finite and >= 0, found {}", l + 1, c));
        total += c;
      }
      if (!(total > 0)) return fail("model.moe.token_histogram", fmt::format("layer row {} routes no tokens", l + 1));
      if (!std::isfinite(total))
        return fail("model.moe.token_histogram",
                    fmt::format("layer row {}: its counts sum past the largest number (1.8e308); scale them down", l + 1));
    }
    if (e.capacity_factor && (!std::isfinite(*e.capacity_factor) || *e.capacity_factor <= 0))
      return fail("model.moe.capacity_factor", fmt::format("must be a finite number > 0, found {}", *e.capacity_factor));
    if (e.pad_to_capacity && !e.capacity_factor)
      return fail("model.moe.pad_to_capacity", "padding experts to capacity needs a capacity_factor");
    if ((e.num_groups > 0) != (e.group_topk > 0))
      return fail(e.num_groups > 0 ? "model.moe.group_topk" : "model.moe.num_groups",
                  "group-limited routing needs both num_groups and group_topk (>= 1)");
    if (e.num_groups < 0 || e.group_topk < 0)
      return fail(e.num_groups < 0 ? "model.moe.num_groups" : "model.moe.group_topk", "must be >= 1 when set");
    if (e.num_groups > 0) {
      if (e.num_experts % e.num_groups != 0)
        return fail("model.moe.num_groups", fmt::format("must divide num_experts ({}), found {}", e.num_experts,
                                                        e.num_groups));
      if (e.group_topk > e.num_groups)
        return fail("model.moe.group_topk", fmt::format("must be at most num_groups ({}), found {}", e.num_groups,
                                                        e.group_topk));
      if (e.top_k > e.group_topk * (e.num_experts / e.num_groups))
        return fail("model.moe.group_topk",
                    fmt::format("{} groups of {} experts hold fewer than top_k = {}", e.group_topk,
                                e.num_experts / e.num_groups, e.top_k));
    }
    bool any = false;
    for (bool b : e.moe_layers) any = any || b;
    if (!any) return fail("model.moe.layers", "no layer is an MoE layer; drop the [moe] table for a dense model");
  }
  if (m.mla) {
    const MlaSpec& a = *m.mla;
    if (a.q_lora_rank && (*a.q_lora_rank <= 0 || *a.q_lora_rank > kMaxModelWidth))
      return fail("model.mla.q_lora_rank", fmt::format("must be positive and at most {} when set, found {}", kMaxModelWidth,
                                                       *a.q_lora_rank));
    for (auto [field, v] : {std::pair<const char*, std::int64_t>{"kv_lora_rank", a.kv_lora_rank},
                            {"qk_head_dim", a.qk_head_dim},
                            {"qk_rope_head_dim", a.qk_rope_head_dim},
                            {"v_head_dim", a.v_head_dim}}) {
      if (v <= 0) return fail(std::string("model.mla.") + field,
                              fmt::format("must be a positive integer, found {}", v));
      if (v > kMaxModelWidth)
        return fail(std::string("model.mla.") + field,
                    fmt::format("must be at most {} (the bound on a model dimension), found {}", kMaxModelWidth, v));
    }
    if (m.num_query_groups != m.num_attention_heads)
      return fail("model.num_query_groups",
                  "MLA models have one latent KV per head: num_query_groups must equal num_attention_heads");
  }
  return m;
}

double expert_load_factor(const MoeSpec& e, int ep) {
  if (e.pad_to_capacity && e.capacity_factor) return *e.capacity_factor;
  ep = std::max(ep, 1);
  if (!e.token_histogram.empty()) {
    // Per layer: experts over their capacity drop what is beyond it; the
    // busiest rank's block of num_experts / ep experts over the mean rank's.
    double sum = 0;
    for (const std::vector<double>& layer : e.token_histogram) {
      double total = 0;
      for (double c : layer) total += c;
      const double cap = e.capacity_factor ? *e.capacity_factor * total / static_cast<double>(layer.size())
                                           : std::numeric_limits<double>::infinity();
      const std::size_t block = layer.size() / static_cast<std::size_t>(ep);
      double busiest = 0;
      for (std::size_t r = 0; r < static_cast<std::size_t>(ep); ++r) {
        double load = 0;
        for (std::size_t x = r * block; x < (r + 1) * block; ++x) load += std::min(layer[x], cap);
        busiest = std::max(busiest, load);
      }
      sum += busiest / (total / static_cast<double>(ep));
    }
    return sum / static_cast<double>(e.token_histogram.size());
  }
  double f = std::min(e.load_imbalance, static_cast<double>(ep));
  if (e.capacity_factor) f = std::min(f, *e.capacity_factor);
  return f;
}

namespace {

// C(a, k) / C(c, k) for a <= c: the chance that k draws without replacement
// from c items all miss c - a given ones.
double miss_all(std::int64_t a, std::int64_t c, int k) {
  double p = 1.0;
  for (int i = 0; i < k; ++i) {
    if (a - i <= 0) return 0.0;
    p *= static_cast<double>(a - i) / static_cast<double>(c - i);
  }
  return p;
}

double choose(int n, int r) {
  if (r < 0 || r > n) return 0.0;
  double v = 1.0;
  for (int i = 1; i <= r; ++i) v = v * (n - r + i) / i;
  return v;
}

}  // namespace

std::optional<double> routing_hit_probability(const MoeSpec& e, int blocks) {
  const std::int64_t E = e.num_experts;
  if (blocks < 1 || E % blocks != 0) return std::nullopt;
  const std::int64_t b = E / blocks;
  if (e.num_groups <= 0) return 1.0 - miss_all(E - b, E, e.top_k);
  const int G = e.num_groups, g = e.group_topk;
  const std::int64_t size = E / G, pool = size * g;
  if (b <= size && size % b == 0)   // inside one group: missed if the group is not picked, or by the draws
    return 1.0 - ((1.0 - static_cast<double>(g) / G) + static_cast<double>(g) / G * miss_all(pool - b, pool, e.top_k));
  if (b % size != 0) return std::nullopt;
  const int whole = static_cast<int>(b / size);   // groups the block holds; j of them picked
  double miss = 0;
  for (int j = 0; j <= std::min(whole, g); ++j)
    miss += choose(whole, j) * choose(G - whole, g - j) / choose(G, g) * miss_all(pool - j * size, pool, e.top_k);
  return 1.0 - miss;
}

const char* to_string(Activation a) {
  switch (a) {
    case Activation::gelu: return "gelu";
    case Activation::swiglu: return "swiglu";
    case Activation::squared_relu: return "squared_relu";
  }
  return "gelu";
}
const char* to_string(Norm n) { return n == Norm::layernorm ? "layernorm" : "rmsnorm"; }
const char* to_string(PositionEmbedding p) {
  switch (p) {
    case PositionEmbedding::learned: return "learned";
    case PositionEmbedding::rope: return "rope";
    case PositionEmbedding::none: return "none";
  }
  return "?";
}

}  // namespace megascope
