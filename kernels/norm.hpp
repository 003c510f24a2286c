// LayerNorm and RMSNorm over the last dimension of (N, C) rows, with the
// per-row statistics saved for the backward. With sequence parallelism each
// rank normalises its own rows; the caller all-reduces dweight/dbias over TP.
// Does not: "1p" weights (weight + 1), fused residual add, zero-centred gamma.
#pragma once

#include <cstdint>

#include "kernels/nullable.hpp"

namespace megascope::kernels {

// out (N, C) = (inp - mean) * rstd * weight (C) + bias (C), rstd = 1/sqrt(var + eps),
// var the biased (population) variance. mean, rstd (N) are written when not null.
template <typename T>
void layernorm_forward(T* out, nullable<T> mean, nullable<T> rstd, const T* inp, const T* weight,
                       nullable<const T> bias, std::int64_t N, std::int64_t C, float eps);

// dinp (N, C) overwritten; dweight (C) and dbias (C, nullable) accumulated.
// mean, rstd (N) from the forward.
template <typename T>
void layernorm_backward(T* dinp, T* dweight, nullable<T> dbias, const T* dout, const T* inp, const T* weight,
                        const T* mean, const T* rstd, std::int64_t N, std::int64_t C);

// out (N, C) = inp * rstd * weight (C), rstd = 1/sqrt(mean(inp^2) + eps).
// rstd (N) is written when not null.
template <typename T>
void rmsnorm_forward(T* out, nullable<T> rstd, const T* inp, const T* weight, std::int64_t N, std::int64_t C,
                     float eps);

// dinp (N, C) overwritten; dweight (C) accumulated; rstd (N) from the forward.
template <typename T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const T* rstd, std::int64_t N,
                      std::int64_t C);

}  // namespace megascope::kernels
