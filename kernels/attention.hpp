// Softmax attention with a flash-style interface: O = softmax(scale Q K^T + mask) V
// per (batch, query head), the log-sum-exp of each row saved for the backward.
//
// GQA: Hq is a multiple of Hkv; query head h reads key/value head
// h / (Hq / Hkv) (consecutive query heads share a KV head, as in Megatron and
// Llama). MHA is Hkv == Hq, MQA Hkv == 1.
//
// Causal mask by positions: key j is visible to query i iff kv_pos[j] <= q_pos[i]
// (nullptr positions mean 0..T-1). This lets context parallelism call the same
// kernel on its load-balanced query chunks against all-gathered KV (pass the
// chunks' global positions), or blockwise for ring attention.
// A query row with no visible key gets out = 0 and lse = -inf.
//
// Ring attention: run the forward per KV block, combine the (out, lse) pairs
// with attention_merge; in the backward pass the FINAL merged out and lse with
// each KV block: dq from each block adds up, and each block's dk, dv are that
// block's exact gradients (the caller accumulates and sends them around).
//
// Does not: dropout on the attention probabilities, sliding windows, ALiBi,
// padding masks other than through positions, variable-length packing.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>

namespace megascope::kernels {

inline float attention_default_scale(std::int64_t D) { return 1.0f / std::sqrt(static_cast<float>(D)); }

// out (B, Tq, Hq, D), lse (B, Hq, Tq) natural log of sum_j exp(scale q.k_j)
// over the visible keys; q (B, Tq, Hq, D), k and v (B, Tk, Hkv, D);
// q_pos (Tq), kv_pos (Tk). causal = false ignores the positions.
// scale defaults to 1/sqrt(D), computed in T.
template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const std::int32_t* q_pos /*nullable*/,
                       const std::int32_t* kv_pos /*nullable*/, std::int64_t B, std::int64_t Tq, std::int64_t Tk,
                       std::int64_t Hq, std::int64_t Hkv, std::int64_t D, bool causal = true,
                       std::optional<float> scale = std::nullopt);

// dq (B, Tq, Hq, D), dk and dv (B, Tk, Hkv, D), all overwritten (dk, dv sum
// over the query heads of a group), from dout (B, Tq, Hq, D) and the
// forward's q, k, v, out, lse. Same positions, causal and scale as the forward.
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const T* lse, const std::int32_t* q_pos /*nullable*/, const std::int32_t* kv_pos /*nullable*/,
                        std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv,
                        std::int64_t D, bool causal = true, std::optional<float> scale = std::nullopt);

// Merges a partial result (out2, lse2) over another set of keys into
// (out, lse), in place: lse' = log(exp(lse) + exp(lse2)),
// out' = out exp(lse - lse') + out2 exp(lse2 - lse'). Rows where both are
// -inf stay (0, -inf). out, out2 (B, Tq, H, D); lse, lse2 (B, H, Tq).
template <typename T>
void attention_merge(T* out, T* lse, const T* out2, const T* lse2, std::int64_t B, std::int64_t Tq, std::int64_t H,
                     std::int64_t D);

}  // namespace megascope::kernels
