// The work inside a compute op, as the kernels it launches: GEMMs by shape,
// fused attention by shape, and memory-bound kernels by bytes moved. The cost
// model (sim/cost_model.hpp) prices these; the executor launches them.
#pragma once

#include <cstdint>

#include "core/training.hpp"

namespace megascope {

struct GemmShape {
  std::int64_t m = 0, n = 0, k = 0;   // (m x k) @ (k x n)
  auto operator<=>(const GemmShape&) const = default;
};

struct AttentionShape {
  std::int64_t batch = 0, heads = 0, kv_heads = 0, seq_q = 0, seq_kv = 0, head_dim = 0;
  std::int64_t head_dim_v = 0;        // value head dim (MLA); 0 means head_dim
  bool causal = true;
  bool dropout = false;               // dropout on the attention probabilities, inside the fused kernel
  std::int64_t window = 0;            // causal sliding window: each query's keys up to itself, at most this many (0: none)
  // Packed variable-length sequences (THD, core/varlen.hpp): the call
  // computes `packed` times the query-key pairs of its shape (the documents'
  // causal pairs over a full-length sequence's), and its kernel's tiles
  // cover `packed_tiles` times the shape's (the documents' tiles over a
  // full-length sequence's; short documents waste part of their diagonal
  // tiles). 1 and 1: a full-length sequence.
  double packed = 1.0, packed_tiles = 1.0;
};

// Query-key pairs an attention call computes: all of them, or the causal
// (bottom-right aligned) part, s_q s_kv - s_q^2 / 2 when s_q <= s_kv (half
// when equal), s_kv^2 / 2 otherwise. The program's FLOPs and the cost
// model's attention times both count these.
// With a sliding window of w, the query at position p (bottom-right
// aligned) takes min(p, w) keys: F(kv) - F(kv - s_q) pairs, F(n) = n^2 / 2
// up to w and w^2 / 2 + (n - w) w beyond (the causal count when w >= s_kv).
inline double attention_shape_pairs(const AttentionShape& a) {
  const double q = static_cast<double>(a.seq_q), kv = static_cast<double>(a.seq_kv);
  if (!a.causal) return q * kv;
  if (a.window > 0 && a.window < a.seq_kv && q <= kv) {
    const double w = static_cast<double>(a.window);
    const auto F = [w](double n) { return n <= w ? n * n / 2 : w * w / 2 + (n - w) * w; };
    return F(kv) - F(kv - q);
  }
  return q <= kv ? q * kv - q * q / 2 : kv * kv / 2;
}
// The pairs the call computes (a packed call: its documents' share).
inline double attention_pairs(const AttentionShape& a) {
  const double p = attention_shape_pairs(a);
  return a.packed == 1.0 ? p : p * a.packed;
}

enum class MemoryOp : std::uint8_t { norm, activation, dropout_residual, embedding, cross_entropy, optimizer, other };

// Bytes per logit (the local V / tp slice of each token) that Megatron-LM's
// vocab-parallel cross entropy (megatron/core/tensor_parallel/cross_entropy.py,
// unfused, the default) moves. Forward: the 16-bit logits cast to fp32 (read
// 2, write 4), max (read 4), subtract the max in place (8), exp in place (8),
// sum (4), divide by the sum in place (8): 38. Backward: scale the saved fp32
// softmax by the loss gradient in place (8), then the cast's gradient back to
// 16 bits (read 4, write 2): 14. The target gathers and the scatter into the
// target column touch one value per token and are not counted.
inline constexpr double kCrossEntropyFwdBytesPerLogit = 38.0;
inline constexpr double kCrossEntropyBwdBytesPerLogit = 14.0;

// FP8 training (Transformer Engine's linear layers): quantising a 16-bit
// tensor for an FP8 GEMM writes it twice, row-wise for this GEMM and
// column-wise (transposed) for the weight-gradient GEMM: read 2 bytes, write
// 1 + 1, per element, with delayed scaling and with the block recipes (their
// scales come out of the same pass). Tensorwise current scaling first reads
// the tensor once more for its amax: 6.
inline constexpr double kFp8CastBytesPerElement = 4.0;
inline constexpr double kFp8CurrentScalingCastBytesPerElement = 6.0;

enum class KernelKind : std::uint8_t { gemm, attention_fwd, attention_bwd, memory };

struct Kernel {
  KernelKind kind = KernelKind::gemm;
  GemmShape gemm;                     // gemm
  AttentionShape attention;           // attention_fwd / attention_bwd
  MemoryOp memory = MemoryOp::other;  // memory
  // A GEMM or memory kernel of unfused attention, over the whole score
  // matrix (QK^T, softmax, dropout, PV and their backwards): the cost model
  // prices it at its own efficiency (docs/cost-model.md).
  bool unfused_attention = false;
  // A memory kernel of a backward op (input or weight gradient): priced at
  // the profile's backward bandwidth of its kind when it has one.
  bool backward = false;
  double bytes = 0;                   // memory: bytes read + written
  Precision precision = Precision::bf16;
  // A grouped GEMM (the routed experts' linear layers, Transformer Engine's
  // GroupedLinear): `groups` GEMMs of the one shape `gemm`, one per local
  // expert, launched one after another. Its FLOPs and time are groups x one's.
  std::uint32_t groups = 1;
};

}  // namespace megascope
