// Dense layer (Megatron's ColumnParallel/RowParallel linear, per shard):
// out = inp . weight^T + bias, with the backward split in two so that
// zero-bubble schedules can run the input gradient (B) and the weight
// gradient (W) at different times. CPU only: on GPUs the executor calls
// cuBLASLt. Does not: transpose flags, strided batches, fp8.
// Conventions (all kernels): kernels/README.md.
#pragma once

#include <cstdint>

#include "kernels/nullable.hpp"

namespace megascope::kernels {

// out (N, OC) = inp (N, C) . weight (OC, C)^T + bias (OC). Overwrites out.
template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, nullable<const T> bias, std::int64_t N, std::int64_t C,
                    std::int64_t OC);

// dinp (N, C) = dout (N, OC) . weight (OC, C). Overwrites dinp.
template <typename T>
void matmul_backward_input(T* dinp, const T* dout, const T* weight, std::int64_t N, std::int64_t C, std::int64_t OC);

// dweight (OC, C) += dout (N, OC)^T . inp (N, C); dbias (OC) += column sums of
// dout. Accumulates.
template <typename T>
void matmul_backward_weight(T* dweight, nullable<T> dbias, const T* dout, const T* inp, std::int64_t N, std::int64_t C,
                            std::int64_t OC);

}  // namespace megascope::kernels
