// Model shapes built in code for exact formula comparisons.
#pragma once

#include "core/model.hpp"

namespace megascope::test {

// A GPT of Narayanan/Korthikanti: GeLU, f = 4h, MHA, LayerNorm, biases,
// learned positions, tied embeddings, dropout 0.1, V = 51200, s = 2048.
inline ModelSpec gpt(int layers, std::int64_t hidden, int heads, std::int64_t vocab = 51200,
                     std::int64_t seq = 2048) {
  ModelSpec m;
  m.name = "gpt-test";
  m.num_layers = layers;
  m.hidden_size = hidden;
  m.ffn_hidden_size = 4 * hidden;
  m.num_attention_heads = heads;
  m.num_query_groups = heads;
  m.kv_channels = hidden / heads;
  m.vocab_size = vocab;
  m.seq_length = seq;
  m.activation = Activation::gelu;
  m.norm = Norm::layernorm;
  m.position_embedding = PositionEmbedding::learned;
  m.add_bias_linear = true;
  m.tied_embeddings = true;
  m.hidden_dropout = 0.1;
  m.attention_dropout = 0.1;
  auto v = validate_model(m);
  return *v;
}

// The same GPT in the form Megatron's estimator models exactly: no biases,
// rotary positions (no position table).
inline ModelSpec gpt_no_bias(int layers, std::int64_t hidden, int heads) {
  ModelSpec m = gpt(layers, hidden, heads);
  m.add_bias_linear = false;
  m.add_qkv_bias = false;
  m.position_embedding = PositionEmbedding::rope;
  return m;
}

}  // namespace megascope::test
