// The ops at the ends of the model, per micro-batch: the embedding on the
// first virtual stage; the output layer, the loss and the multi-token
// prediction depths on the last (edge_ops.cpp). Internal to the builder
// (builder.cpp), as the layers' ops are (layer_ops.cpp, stage_writer.hpp).
#pragma once

#include <cstdint>
#include <map>
#include <optional>

#include "core/program/stage_writer.hpp"

namespace megascope::detail {

// The parameters of the local slice of the word embedding (or output layer).
double word_params(const Setup& s);
// Tokens of one micro-batch on one rank (its CP share of the sequence).
double tokens_of(const Setup& s);

// The embedding lookup, its TP reduction and its dropout.
std::uint32_t embedding_forward(StageWriter& w, const Setup& s, const OpContext& ctx, Deps deps);
// The final norm, output layer and loss, forward and input gradient.
std::uint32_t output_forward(StageWriter& w, const Setup& s, const OpContext& ctx, std::optional<std::uint32_t> dep);
std::uint32_t output_backward(StageWriter& w, const Setup& s, const OpContext& ctx, std::optional<std::uint32_t> dep);
// The output layer's and the embedding's weight gradients.
std::uint32_t output_weight(StageWriter& w, const Setup& s, const OpContext& ctx, Deps deps = {});
std::uint32_t embedding_weight(StageWriter& w, const Setup& s, const OpContext& ctx, Deps deps = {});

// Multi-token prediction depth k (from 0): its layer is numbered num_layers + k.
int mtp_layer(const Setup& s, int k);
std::uint32_t mtp_projection_backward(StageWriter& w, const Setup& s, const OpContext& ctx, std::uint32_t dep);
std::uint32_t mtp_weight(StageWriter& w, LayerEmitter& layers, const Setup& s, const OpContext& ctx, int k,
                         std::optional<std::uint32_t> deps);

// After the decoder on the last virtual stage: the MTP depths, then every
// head. `gates`: the parameter gathers the first forward through a bucket
// waits for, by first layer.
std::uint32_t last_stage_forward(StageWriter& w, LayerEmitter& layers, const Setup& s, const OpContext& ctx,
                                 std::optional<std::uint32_t> dep, const std::map<int, std::uint32_t>* gates = nullptr);

// The backward of last_stage_forward up to the decoder's output gradient,
// with each depth's weight gradients handed to `weights` (the builder's
// pieces) right after its layer's input gradients.
template <class Weights>
std::uint32_t last_stage_backward(StageWriter& w, LayerEmitter& layers, const Setup& s, const OpContext& ctx,
                                  std::optional<std::uint32_t> dep, Weights&& weights) {
  std::uint32_t x = output_backward(w, s, ctx, dep);
  for (int head = 0; head < s.model.mtp_num_layers; ++head) x = output_backward(w, s, ctx, x);
  x = weights(-1, x);   // the output layer's
  for (int k = s.model.mtp_num_layers - 1; k >= 0; --k) {
    x = layers.backward_input(mtp_layer(s, k), ctx, x, false);
    x = weights(k, x);
    x = mtp_projection_backward(w, s, ctx, x);
  }
  return x;
}

// Standalone MTP (Megatron-Core's MTP in a stage before the loss's): that
// stage runs the depths after its decoder layers and returns the op the
// send of the main and the MTP hidden states together waits for; the loss's
// stage runs every head on what it receives (the MTP depths' heads, then
// the main one, as last_stage_forward). Their backwards split
// last_stage_backward the same way.
std::uint32_t mtp_stage_forward(StageWriter& w, LayerEmitter& layers, const Setup& s, const OpContext& ctx,
                                std::optional<std::uint32_t> dep, const std::map<int, std::uint32_t>* gates = nullptr);
std::uint32_t heads_forward(StageWriter& w, const Setup& s, const OpContext& ctx, std::optional<std::uint32_t> dep);

template <class Weights>
std::uint32_t heads_backward(StageWriter& w, const Setup& s, const OpContext& ctx, std::optional<std::uint32_t> dep,
                             Weights&& weights) {
  std::uint32_t x = output_backward(w, s, ctx, dep);
  for (int head = 0; head < s.model.mtp_num_layers; ++head) x = output_backward(w, s, ctx, x);
  return weights(-1, x);   // the output layer's
}

template <class Weights>
std::uint32_t mtp_stage_backward(StageWriter& w, LayerEmitter& layers, const Setup& s, const OpContext& ctx,
                                 std::optional<std::uint32_t> dep, Weights&& weights) {
  std::optional<std::uint32_t> x = dep;
  for (int k = s.model.mtp_num_layers - 1; k >= 0; --k) {
    x = layers.backward_input(mtp_layer(s, k), ctx, x, false);
    x = weights(k, *x);
    x = mtp_projection_backward(w, s, ctx, *x);
  }
  return *x;
}

}  // namespace megascope::detail
