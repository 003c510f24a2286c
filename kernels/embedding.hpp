// Vocab-parallel token embedding (Megatron's VocabParallelEmbedding) with an
// optional learned position embedding (GPT-2's wpe).
// This rank holds rows [vocab_start, vocab_end) of the table; a token outside
// that range gives a zero row, and the caller all-reduces (sums) out over the
// tensor-parallel group (reduce-scatters it with sequence parallelism).
// wpe is replicated, so with TP > 1 pass it on one TP rank only (or add it
// after the reduction) or it is counted TP times.
// Does not: check token ids against the full vocabulary, embedding dropout.
#pragma once

#include <cstdint>

#include "kernels/nullable.hpp"

namespace megascope::kernels {

// out (N, C) = wte[tokens[n] - vocab_start] (0 if outside the shard)
//            + wpe[pos[n]] (if wpe is given; pos (N) is then required).
// wte (vocab_end - vocab_start, C), wpe (max positions, C), tokens (N).
template <typename T>
void embedding_forward(T* out, const std::int32_t* tokens, const T* wte, nullable<const T> wpe,
                       const std::int32_t* pos /*nullable*/, std::int64_t N, std::int64_t C, std::int64_t vocab_start,
                       std::int64_t vocab_end);

// dwte[tokens[n] - vocab_start] += dout[n] for tokens in the shard;
// dwpe[pos[n]] += dout[n] if dwpe is given. Accumulates.
template <typename T>
void embedding_backward(T* dwte, nullable<T> dwpe, const T* dout, const std::int32_t* tokens,
                        const std::int32_t* pos /*nullable*/, std::int64_t N, std::int64_t C, std::int64_t vocab_start,
                        std::int64_t vocab_end);

}  // namespace megascope::kernels
