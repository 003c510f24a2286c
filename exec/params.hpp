// The parameters one rank holds for a Setup: per model chunk a flat buffer
// of weights and one of gradients, laid out in the order the backward
// finishes them (output layer, layers last to first, embedding), as
// Megatron's gradient buckets are.
//
// Initialisation does not depend on the plan: each logical (unsharded)
// tensor, e.g. "layer.3.wq" of shape (a*d, h), draws element (r, c) from a
// counter-based normal keyed by (seed, tensor, r*cols+c), and a rank fills
// its shard by global indices. So every plan starts from the same weights
// (Megatron's init: N(0, 0.02), output projections N(0, 0.02/sqrt(2L)),
// norms 1, biases 0).
//
// Does not: MoE experts, MLA, QK-norm, learned-position shards (replicated).
#pragma once

#include <cstdint>
#include <memory_resource>
#include <optional>
#include <string>
#include <vector>

#include "core/result.hpp"
#include "core/setup.hpp"

namespace megascope::exec {

// How a parameter's gradient relates across the tensor-parallel group.
enum class TpSync : std::uint8_t {
  sharded,       // each TP rank holds a different shard
  replicated,    // every TP rank holds the same values and computes the same gradient
  partial        // replicated, but each TP rank sees part of the tokens (sequence parallelism):
                 // gradients are summed over TP before the optimizer
};

// A block of a logical tensor: rows [row0, row0+rows) x cols [col0, col0+cols)
// of a (full_rows, full_cols) tensor.
struct ParamPart {
  std::string tensor;
  std::int64_t full_rows = 0, full_cols = 0;
  std::int64_t row0 = 0, rows = 0, col0 = 0, cols = 0;
};

enum class Init : std::uint8_t { normal, zeros, ones };

// Parameters start at multiples of 4 floats in their chunk's buffers (16
// bytes, what cuBLASLt's bias epilogue and vector loads need on a GPU); the
// gaps stay zero and belong to no parameter.
inline constexpr std::int64_t kParamAlign = 4;

struct Param {
  std::string name;                   // e.g. "layer.3.qkv.weight"
  std::int64_t rows = 0, cols = 0;    // local shape (vectors: cols = 1)
  std::int64_t offset = 0;            // in the chunk's buffers
  std::vector<ParamPart> parts;       // stacked by rows
  TpSync sync = TpSync::sharded;
  bool decay = false;                 // weight decay applies (matrices; not norms or biases)
  bool tied_copy = false;             // the last stage's copy of the word embedding
  bool expert = false;                // a routed expert's (reduced over expert-DP, in Chunk::experts)
  Init init = Init::normal;
  float init_std = 0.02f;
  [[nodiscard]] std::int64_t size() const { return rows * cols; }
};

struct LayerShapes {
  std::int64_t T = 0;        // tokens of a micro-batch on this rank (b s / cp)
  std::int64_t Ts = 0;       // tokens a rank normalises: T / tp with sequence parallelism
  std::int64_t h = 0, d = 0;
  std::int64_t hq = 0, hkv = 0;      // local heads
  std::int64_t q = 0, kv = 0;        // local widths hq*d, hkv*d
  std::int64_t f = 0, up = 1;        // local FFN width; 2 for SwiGLU
  std::int64_t vocab = 0, vocab_start = 0;   // local vocabulary shard
  bool sp = false;
  int tp = 1, tp_rank = 0;
};
LayerShapes layer_shapes(const Setup& s, int tp_rank);

struct Chunk {
  int index = 0;                      // chunk index on the rank
  ChunkLayers layers;
  bool embedding = false, output = false;
  bool expert = false;                // the routed experts' parameters of a chunk (see make_chunks)
  std::vector<Param> params;
  std::int64_t size = 0;              // elements, alignment gaps included (before padding)
  std::pmr::vector<float> w, g;       // padded to a multiple of dp x cp (exec/cpu_rank.hpp: Vec)
  [[nodiscard]] const Param* find(const std::string& name) const;
  [[nodiscard]] float* weight(const std::string& name);
  [[nodiscard]] float* grad(const std::string& name);
};

// Checks that the executor can run this Setup (dense GPT/Llama; the options
// it supports) and says which rule it breaks otherwise.
Result<void> check_supported(const Setup& s);

// The chunks of a rank, initialised from `seed`: first one per model chunk
// (dense parameters, gradients reduced over DP x CP), then, for an MoE model,
// one per model chunk with its routed experts (expert = true, same index;
// gradients reduced over expert-DP).
std::vector<Chunk> make_chunks(const Setup& s, int rank, std::uint64_t seed);
// Local experts of a rank: [first, first + count) of the model's experts.
struct LocalExperts {
  int first = 0, count = 0;
};
LocalExperts local_experts(const Setup& s, int rank);

// A standard normal draw for element `index` of tensor `tensor` (plan-independent).
float init_normal(std::uint64_t seed, const std::string& tensor, std::uint64_t index);

}  // namespace megascope::exec
