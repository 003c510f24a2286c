// Vocab-parallel cross-entropy (Megatron's _VocabParallelCrossEntropy), split
// into the local pieces around the tensor-parallel reductions. Each rank holds
// logits (N, V) for vocabulary ids [vocab_start, vocab_start + V).
//
//   1. cross_entropy_local_max(row_max, logits)           -> all-reduce MAX row_max
//   2. cross_entropy_local_sumexp(sumexp, logits, row_max) -> all-reduce SUM sumexp
//      cross_entropy_local_target(target_logit, logits, targets, vocab_start)
//                                                          -> all-reduce SUM target_logit
//      (the two sums can travel in one (2, N) buffer)
//   3. cross_entropy_loss(loss, row_max, sumexp, target_logit)  (no reduction)
//   4. cross_entropy_backward(dlogits, logits, row_max, sumexp, targets, dloss, ...)
//      (local: no reduction; dlogits of the shard only)
// With TP = 1 call the same pieces without reductions.
// Does not: label smoothing, ignore-index (mask tokens through dloss = 0 and
// by ignoring their loss), z-loss.
#pragma once

#include <cstdint>

namespace megascope::kernels {

// row_max (N) = max over the shard's V logits of each row; logits (N, V).
template <typename T>
void cross_entropy_local_max(T* row_max, const T* logits, std::int64_t N, std::int64_t V);

// sumexp (N) = sum_v exp(logits[n, v] - row_max[n]) with the GLOBAL row_max.
template <typename T>
void cross_entropy_local_sumexp(T* sumexp, const T* logits, const T* row_max, std::int64_t N, std::int64_t V);

// target_logit (N) = logits[n, targets[n] - vocab_start] if the target is in
// this shard, else 0. targets (N) are global vocabulary ids.
template <typename T>
void cross_entropy_local_target(T* target_logit, const T* logits, const std::int32_t* targets, std::int64_t N,
                                std::int64_t V, std::int64_t vocab_start);

// loss (N) = log(sumexp) + row_max - target_logit, all three global.
template <typename T>
void cross_entropy_loss(T* loss, const T* row_max, const T* sumexp, const T* target_logit, std::int64_t N);

// dlogits (N, V) = (exp(logits - row_max) / sumexp - onehot(target)) * dloss[n],
// overwritten (dlogits may alias logits). dloss (N) is dL/dloss per row
// (e.g. loss_mask / number of tokens).
template <typename T>
void cross_entropy_backward(T* dlogits, const T* logits, const T* row_max, const T* sumexp, const std::int32_t* targets,
                            const T* dloss, std::int64_t N, std::int64_t V, std::int64_t vocab_start);

}  // namespace megascope::kernels
