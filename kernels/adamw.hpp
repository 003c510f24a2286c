// AdamW (decoupled weight decay, bias-corrected moments), as
// torch.optim.AdamW and Megatron's (Apex/TE) FusedAdam in adam_w_mode:
//   g = grad * grad_scale
//   p = p - lr * weight_decay * p
//   m = beta1 m + (1 - beta1) g,   v = beta2 v + (1 - beta2) g^2
//   p = p - lr * (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps)
// plus the pieces of global-norm gradient clipping (Megatron's
// clip_grad_norm_fp32): sum_squares per tensor, a reduction by the caller,
// clip_coefficient, then scale_inplace or grad_scale in adamw_update.
// Does not: decide which parameters get weight decay, loss scaling for fp16,
// the distributed optimizer's sharding (the caller passes its shard).
#pragma once

#include <cstdint>

namespace megascope::kernels {

// params, m, v (n) updated in place from grads (n); step counts from 1.
template <typename T>
void adamw_update(T* params, const T* grads, T* m, T* v, std::int64_t n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, std::int64_t step, float grad_scale = 1.0f);

// *acc += sum of x[i]^2 over x (n), summed in double. Accumulates so that
// several tensors add into one total; the caller all-reduces the total over
// the data-parallel (and model-parallel) ranks and takes the square root.
template <typename T>
void sum_squares(double* acc, const T* x, std::int64_t n);

// x (n) *= s.
template <typename T>
void scale_inplace(T* x, std::int64_t n, float s);

// Megatron's clip factor: max_norm / (total_norm + 1e-6) when that is below
// 1, else 1 (no clipping).
inline float clip_coefficient(double total_norm, double max_norm) {
  const double c = max_norm / (total_norm + 1.0e-6);
  return c < 1.0 ? static_cast<float>(c) : 1.0f;
}

}  // namespace megascope::kernels
