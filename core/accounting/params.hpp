// Parameter accounting: per layer, per pipeline rank and in total, split by
// how each weight is sharded (tensor-parallel, replicated across TP, expert).
//
// Derivation (docs/accounting.md section 1): QKV and the MLP's first GEMM are
// column-parallel (weights and biases divided by tp); the attention output
// projection and the MLP's second GEMM are row-parallel (weights divided by
// tp, biases replicated); norms, the router and position embeddings are
// replicated; routed experts are divided by etp x ep. With fewer KV heads than
// tp (num_query_groups < tp), each rank keeps one whole KV head.
#pragma once

#include <cstdint>

#include "core/model.hpp"
#include "core/setup.hpp"

namespace megascope {

// Parameters of one piece of the model as seen by one rank (or in total when
// tp = etp = ep = 1).
struct ParamSplit {
  double dense = 0;   // non-expert parameters (optimizer sharded over dp x cp)
  double expert = 0;  // routed-expert parameters (optimizer sharded over expert-dp)
  [[nodiscard]] double total() const { return dense + expert; }
  ParamSplit& operator+=(const ParamSplit& o) {
    dense += o.dense;
    expert += o.expert;
    return *this;
  }
};

struct Sharding {
  int tp = 1;
  int etp = 1;
  int ep = 1;
};

// One transformer layer (layer index in [0, num_layers)), on one rank.
ParamSplit layer_params(const ModelSpec& m, int layer, Sharding sh = {});
// One MTP layer: a transformer layer shaped like the last one, plus its
// embedding/hidden norms, the 2h -> h projection and its final norm.
ParamSplit mtp_layer_params(const ModelSpec& m, Sharding sh = {});

struct ModelParams {
  double embedding = 0;       // word (+ learned position) embedding
  double output = 0;          // untied output layer (0 when tied)
  double final_norm = 0;
  ParamSplit layers;          // all transformer layers
  ParamSplit mtp;             // all MTP layers
  [[nodiscard]] double total() const {
    return embedding + output + final_norm + layers.total() + mtp.total();
  }
};

// Whole model, unsharded, with the given vocabulary (the tokenizer's by default).
ModelParams model_params(const ModelSpec& m, std::optional<std::int64_t> vocab = std::nullopt);

// Parameters active for one token: routed experts counted k of E.
double active_params(const ModelSpec& m);

// What one rank of pipeline stage `pp_rank` holds (any tp/dp/cp/ep rank of
// that stage: they hold the same amount). Includes the duplicated word
// embedding Megatron keeps on the last stage for tied or MTP models.
ParamSplit rank_params(const Setup& s, int pp_rank);

// Per pipeline rank, the same split into named parts for reports.
struct RankParamParts {
  ParamSplit layers;
  double embedding = 0;
  double output = 0;          // output layer or the duplicated embedding used by it
  double final_norm = 0;
  ParamSplit mtp;
  [[nodiscard]] ParamSplit total() const;
};
RankParamParts rank_param_parts(const Setup& s, int pp_rank);

}  // namespace megascope
