// Mixture-of-experts routing: a top-k softmax router and the permutation of
// tokens into per-expert contiguous rows (what the expert-parallel all-to-all
// sends, split by `counts`) and back, weighted by the router probabilities.
//
// Router: scores = softmax(logits) over the E experts, then the top k
// (descending, ties to the lower expert index). With renormalize = true the
// k probabilities are divided by their sum, which equals Megatron-Core's
// default (top-k on the logits, then a softmax over the k: Mixtral, Qwen-MoE);
// renormalize = false is Megatron's --moe-router-pre-softmax (DeepSeek-V2).
// Does not: auxiliary load-balancing loss, z-loss, capacity factor and token
// dropping, group-limited routing, sigmoid scores, expert bias.
//
// Slots: token n's j-th choice is slot s = n*k + j. The permuted buffer has
// N*k rows grouped by expert 0..E-1, and within an expert ordered by slot.
#pragma once

#include <cstdint>

namespace megascope::kernels {

// scores (N, E) = softmax(logits (N, E)) (saved for the backward);
// experts (N, k) the chosen experts; probs (N, k) their weights.
template <typename T>
void moe_router_forward(T* probs, std::int32_t* experts, T* scores, const T* logits, std::int64_t N, std::int64_t E,
                        std::int64_t k, bool renormalize);

// dlogits (N, E) overwritten from dprobs (N, k) and the forward's experts,
// scores. The same renormalize as the forward.
template <typename T>
void moe_router_backward(T* dlogits, const T* dprobs, const std::int32_t* experts, const T* scores, std::int64_t N,
                         std::int64_t E, std::int64_t k, bool renormalize);

// row_to_slot (N*k): the slot each permuted row comes from; slot_to_row
// (N*k): its inverse; counts (E): rows per expert. experts (N, k) in [0, E).
// N*k must fit in int32.
void moe_permute_indices(std::int32_t* row_to_slot, std::int32_t* slot_to_row, std::int64_t* counts,
                         const std::int32_t* experts, std::int64_t N, std::int64_t E, std::int64_t k);

// permuted (N*k, C): row r = inp (N, C) row row_to_slot[r] / k.
template <typename T>
void moe_permute_forward(T* permuted, const T* inp, const std::int32_t* row_to_slot, std::int64_t N, std::int64_t C,
                         std::int64_t k);

// dinp (N, C) row n = sum over j of dpermuted (N*k, C) row slot_to_row[n*k + j]. Overwrites.
template <typename T>
void moe_permute_backward(T* dinp, const T* dpermuted, const std::int32_t* slot_to_row, std::int64_t N, std::int64_t C,
                          std::int64_t k);

// out (N, C) row n = sum over j of probs[n, j] * expert_out (N*k, C) row slot_to_row[n*k + j].
template <typename T>
void moe_unpermute_forward(T* out, const T* expert_out, const T* probs, const std::int32_t* slot_to_row, std::int64_t N,
                           std::int64_t C, std::int64_t k);

// dexpert_out (N*k, C) row slot_to_row[s] = probs[s] * dout row s / k;
// dprobs (N, k)[s] = dout row s / k . expert_out row slot_to_row[s]. Both overwritten.
template <typename T>
void moe_unpermute_backward(T* dexpert_out, T* dprobs, const T* dout, const T* expert_out, const T* probs,
                            const std::int32_t* slot_to_row, std::int64_t N, std::int64_t C, std::int64_t k);

}  // namespace megascope::kernels
