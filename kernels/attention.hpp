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
// Packed sequences (THD: documents concatenated into one sequence, Megatron-LM's
// cu_seqlens): attention_forward_packed / _backward_packed also take a
// document id per row, and a key is visible to a query only when both lie in
// the same document (causal within it by the positions). Ids come from the
// documents' boundaries through document_ids.
//
// Does not: dropout on the attention probabilities, sliding windows, ALiBi,
// padding masks other than through positions or document ids.
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

// Packed sequences: as attention_forward / attention_backward, and key j of
// sequence b visible to query i of b only when q_doc[b Tq + i] ==
// kv_doc[b Tk + j] (with causal, also kv_pos[j] <= q_pos[i]; without it, every
// key of the query's document). q_doc (B, Tq), kv_doc (B, Tk): one id per
// row, both given or both null (null: attention_forward's mask). Padding
// rows are a document of their own, so that real rows never see them.
// Positions stay the rows' positions in the packed sequence (the causal
// order within a document is theirs), so context parallelism passes its
// chunks' global positions and the documents of those positions, as above.
template <typename T>
void attention_forward_packed(T* out, T* lse, const T* q, const T* k, const T* v,
                              const std::int32_t* q_pos /*nullable*/, const std::int32_t* kv_pos /*nullable*/,
                              const std::int32_t* q_doc /*nullable*/, const std::int32_t* kv_doc /*nullable*/,
                              std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv,
                              std::int64_t D, bool causal = true, std::optional<float> scale = std::nullopt);
template <typename T>
void attention_backward_packed(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                               const T* lse, const std::int32_t* q_pos /*nullable*/,
                               const std::int32_t* kv_pos /*nullable*/, const std::int32_t* q_doc /*nullable*/,
                               const std::int32_t* kv_doc /*nullable*/, std::int64_t B, std::int64_t Tq,
                               std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv, std::int64_t D, bool causal = true,
                               std::optional<float> scale = std::nullopt);

// The rows of one packed sequence of S positions from its documents'
// boundaries, Megatron-LM's cu_seqlens of that sequence: cu_seqlens (docs + 1),
// cu_seqlens[0] = 0, non-decreasing, cu_seqlens[docs] <= S. Position p of
// document i (cu_seqlens[i] <= p < cu_seqlens[i + 1]) gets doc[p] = i and
// doc_pos[p] = p - cu_seqlens[i], its position within the document (RoPE's
// and learned position embeddings' index, restarting at each document); the
// positions from cu_seqlens[docs] on are padding, a document of their own:
// doc[p] = docs, doc_pos[p] = p - cu_seqlens[docs]. doc_pos may be null.
void document_ids(std::int32_t* doc, std::int32_t* doc_pos /*nullable*/, const std::int32_t* cu_seqlens,
                  std::int64_t docs, std::int64_t S);

// Merges a partial result (out2, lse2) over another set of keys into
// (out, lse), in place: lse' = log(exp(lse) + exp(lse2)),
// out' = out exp(lse - lse') + out2 exp(lse2 - lse'). Rows where both are
// -inf stay (0, -inf). out, out2 (B, Tq, H, D); lse, lse2 (B, H, Tq).
template <typename T>
void attention_merge(T* out, T* lse, const T* out2, const T* lse2, std::int64_t B, std::int64_t Tq, std::int64_t H,
                     std::int64_t D);

}  // namespace megascope::kernels
