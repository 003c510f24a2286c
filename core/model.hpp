// ModelSpec: the shape of a GPT/Llama-family decoder-only transformer, dense
// or mixture-of-experts, with standard, grouped-query or multi-latent (MLA)
// attention. A plain value type; validate_model() checks the rules that do
// not depend on the parallel plan (those live in validate.hpp).
//
// Not covered: encoder-decoder models, hybrid Mamba/linear-attention layers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/result.hpp"

namespace megascope {

// The MLP's activation: GeLU and squared ReLU (Nemotron: relu(x)^2) are
// elementwise on fc1's output; SwiGLU is gated (fc1 twice as wide).
enum class Activation { gelu, swiglu, squared_relu };
enum class Norm { layernorm, rmsnorm };
enum class PositionEmbedding { learned, rope, none };

// Mixture of experts (Megatron's --num-experts and friends).
struct MoeSpec {
  int num_experts = 0;                   // routed experts E
  int top_k = 0;                         // routed experts per token k
  std::int64_t expert_ffn_hidden = 0;    // f_e, FFN width of one routed expert
  std::int64_t shared_expert_ffn_hidden = 0;  // f_sh, total width of the shared experts (0: none)
  std::vector<bool> moe_layers;          // one entry per layer: true where the layer is MoE
  // Routing load. Balanced by default: every EP rank's experts take top_k x
  // their share of the tokens. load_imbalance is the busiest EP rank's
  // tokens over the mean (>= 1; what a router without perfect balancing
  // leaves). Megatron's --moe-expert-capacity-factor caps each expert at
  // that multiple of its balanced share (tokens beyond it are dropped) and
  // --moe-pad-expert-input-to-capacity pads every expert to the cap.
  double load_imbalance = 1.0;
  // Measured routing instead (--moe-histogram): tokens routed to each
  // expert, one row of num_experts counts per MoE layer measured (any
  // number of layers). When given it replaces load_imbalance: each
  // layer's busiest EP rank (its contiguous block of experts) over the
  // mean, averaged over the layers (each layer adds its own time).
  std::vector<std::vector<double>> token_histogram;
  std::optional<double> capacity_factor;
  bool pad_to_capacity = false;
  // Group-limited routing (DeepSeek-V3's node-limited routing; Megatron's
  // --moe-router-num-groups / --moe-router-group-topk): the experts split
  // into num_groups equal groups, a token picks group_topk of them and its
  // top_k experts among theirs. 0: not grouped.
  int num_groups = 0;
  int group_topk = 0;
};

// The tokens the busiest EP rank's experts process, over the balanced share:
// the capacity when experts are padded to it, else the imbalance, capped by
// the capacity factor and by ep (one rank can at most take every token; at
// ep = 1 the one rank takes exactly the balanced share).
double expert_load_factor(const MoeSpec& e, int ep);

// The chance that one of `blocks` equal, contiguous blocks of the experts (an
// EP rank's, a scale-up domain's) holds at least one of a token's top_k
// experts, routing uniform over the experts (or, with group-limited routing,
// over the experts of group_topk groups picked uniformly). With groups, a
// block must lie inside one group or be whole groups; nullopt otherwise.
std::optional<double> routing_hit_probability(const MoeSpec& e, int blocks);

// Multi-head latent attention (DeepSeek-V2/V3).
struct MlaSpec {
  std::optional<std::int64_t> q_lora_rank;  // r_q; absent: queries are a plain projection
  std::int64_t kv_lora_rank = 0;            // r_kv
  std::int64_t qk_head_dim = 0;             // d_qk, the non-rotary part of a query/key head
  std::int64_t qk_rope_head_dim = 0;        // d_rope
  std::int64_t v_head_dim = 0;              // d_v
};

struct ModelSpec {
  std::string name;                       // for reports
  int num_layers = 0;                     // L, transformer layers (without MTP)
  std::int64_t hidden_size = 0;           // h
  std::int64_t ffn_hidden_size = 0;       // f, dense MLP width (SwiGLU: width of one of the two halves)
  int num_attention_heads = 0;            // a
  int num_query_groups = 0;               // g, KV heads (g == a: MHA; g == 1: MQA)
  std::int64_t kv_channels = 0;           // d, head dimension (q = d*a)
  std::int64_t vocab_size = 0;            // tokenizer vocabulary, before Megatron's padding
  int make_vocab_size_divisible_by = 128; // Megatron pads the vocab to a multiple of this x TP
  std::int64_t seq_length = 0;            // default training sequence length (max positions for learned)
  Activation activation = Activation::gelu;
  Norm norm = Norm::layernorm;
  PositionEmbedding position_embedding = PositionEmbedding::learned;
  bool add_bias_linear = true;            // biases on all linear layers (GPT); false for Llama
  bool add_qkv_bias = false;              // biases on QKV only (Qwen2); implied by add_bias_linear
  bool tied_embeddings = true;            // output layer shares the input embedding
  bool qk_layernorm = false;              // norms on queries and keys per head (Qwen3, OLMo2)
  double hidden_dropout = 0.0;            // dropout after attention/MLP and on the embedding
  double attention_dropout = 0.0;         // dropout on attention probabilities
  int mtp_num_layers = 0;                 // DeepSeek-V3 multi-token-prediction layers
  // Sliding-window attention (Megatron's --window-size W,0 and
  // --window-attn-skip-freq N; GPT-OSS: 128 and 2): a query attends to the
  // W keys up to itself, on every layer but each N-th (1-based layer
  // numbers divisible by N attend to the whole sequence; 0: every layer
  // windowed). window_size 0: no windows.
  std::int64_t window_size = 0;
  int window_skip_freq = 0;
  std::optional<MoeSpec> moe;
  std::optional<MlaSpec> mla;

  // Derived shapes (valid after validate_model).
  [[nodiscard]] std::int64_t q_width() const { return kv_channels * num_attention_heads; }
  [[nodiscard]] std::int64_t kv_width() const { return kv_channels * num_query_groups; }
  // Layers num_layers .. num_layers + mtp_num_layers - 1 are the MTP layers
  // (shaped like the last one).
  [[nodiscard]] bool is_moe_layer(int layer) const;
  [[nodiscard]] bool is_window_layer(int layer) const;   // sliding-window attention (0-based layer)
  [[nodiscard]] int num_moe_layers() const;
  // Megatron's padded vocabulary for a tensor-parallel size.
  [[nodiscard]] std::int64_t padded_vocab(int tp) const;
};

// Upper bounds of a model's dimensions, far above any model trained, which
// keep every count, FLOP and byte figure derived from them exact and finite:
// counts (layers, heads, experts), widths (hidden, FFN, head and MLA
// dimensions) and lengths (vocabulary, sequence, window).
inline constexpr std::int64_t kMaxModelCount = std::int64_t{1} << 16;
inline constexpr std::int64_t kMaxModelWidth = std::int64_t{1} << 24;
inline constexpr std::int64_t kMaxModelLength = std::int64_t{1} << 28;

// Checks the model on its own: positive sizes within the bounds above, heads
// vs query groups, MoE and MLA consistency. Errors name the field
// ("model.num_query_groups").
Result<ModelSpec> validate_model(ModelSpec m);

const char* to_string(Activation a);
const char* to_string(Norm n);
const char* to_string(PositionEmbedding p);

}  // namespace megascope
