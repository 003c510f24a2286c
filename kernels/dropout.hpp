// Residual add, dropout, and Megatron's fused bias + dropout + residual add.
// The keep mask is never stored: element i of a call uses Philox4x32-10 keyed
// by `seed` at counter `offset + i` (kernels/philox.hpp), so the backward
// regenerates it. Give every dropout site of a step its own (seed, offset)
// range. Under tensor/sequence parallelism, pass offset = base + (index of
// this shard's first element in the unsharded tensor) to get the same mask as
// an unsharded run. Kept values are scaled by 1/(1-p); p >= 1 zeroes all.
// Element-wise kernels allow out to alias any input of the same shape.
#pragma once

#include <cstdint>

#include "kernels/nullable.hpp"

namespace megascope::kernels {

// out (n) = a (n) + b (n).
template <typename T>
void residual_forward(T* out, const T* a, const T* b, std::int64_t n);

// out (n) = keep(i) ? inp / (1 - p) : 0.
template <typename T>
void dropout_forward(T* out, const T* inp, std::int64_t n, float p, std::uint64_t seed, std::uint64_t offset);

// dinp (n) = keep(i) ? dout / (1 - p) : 0, the same mask as the forward. Overwrites.
template <typename T>
void dropout_backward(T* dinp, const T* dout, std::int64_t n, float p, std::uint64_t seed, std::uint64_t offset);

// out (N, C) = residual (N, C) + dropout(inp (N, C) + bias (C)).
template <typename T>
void bias_dropout_add_forward(T* out, const T* inp, nullable<const T> bias, const T* residual, std::int64_t N,
                              std::int64_t C, float p, std::uint64_t seed, std::uint64_t offset);

// dinp (N, C) = dropout_backward(dout) (overwritten); dbias (C) += column sums
// of dinp (accumulated). The residual's gradient is dout itself: the caller
// passes dout on, no copy is made.
template <typename T>
void bias_dropout_add_backward(T* dinp, nullable<T> dbias, const T* dout, std::int64_t N, std::int64_t C, float p,
                               std::uint64_t seed, std::uint64_t offset);

}  // namespace megascope::kernels
