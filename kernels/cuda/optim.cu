// CUDA AdamW (fp32 master params and moments; fp32, bf16 or fp16 gradients, unscaled by grad_scale) and the
// gradient-clipping helpers. The bias corrections are computed once on the
// host in double, as the CPU twin does.
// Does not: multi-tensor launches (one launch per tensor), fp16 loss scaling.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.hpp"

namespace megascope::kernels::cuda {

namespace {

using detail::from_float;
using detail::to_float;

constexpr int kBlock = 256;

template <typename T>
__global__ void adamw_kernel(float* params, const T* grads, float* m, float* v, std::int64_t n, float lr, float beta1,
                             float beta2, float eps, float decay, float bc1, float bc2, float grad_scale) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float g = to_float(grads[i]) * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    params[i] = params[i] * decay - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
  }
}

template <typename T>
__global__ void sum_squares_kernel(double* acc, const T* x, std::int64_t n) {
  __shared__ double scratch[32];
  double s = 0.0;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const double xi = static_cast<double>(to_float(x[i]));
    s += xi * xi;
  }
  s = detail::block_sum(s, scratch);
  if (threadIdx.x == 0) atomicAdd(acc, s);
}

template <typename T>
__global__ void scale_kernel(T* x, std::int64_t n, float s) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    x[i] = from_float<T>(to_float(x[i]) * s);
}

}  // namespace

template <typename T>
void adamw_update(float* params, const T* grads, float* m, float* v, std::int64_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, std::int64_t step, float grad_scale, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(n >= 0 && step >= 1);
  MEGASCOPE_KERNEL_REQUIRE(beta1 >= 0.0f && beta1 < 1.0f && beta2 >= 0.0f && beta2 < 1.0f);
  if (n == 0) return;
  const double t = static_cast<double>(step);
  const auto bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), t));
  const auto bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), t));
  const float decay = 1.0f - lr * weight_decay;
  adamw_kernel<T><<<detail::grid_size(n, kBlock), kBlock, 0, stream>>>(params, grads, m, v, n, lr, beta1, beta2, eps,
                                                                       decay, bc1, bc2, grad_scale);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T>
void sum_squares(double* acc, const T* x, std::int64_t n, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(acc != nullptr && n >= 0);
  if (n == 0) return;
  sum_squares_kernel<T><<<detail::grid_size(n, kBlock, 1024), kBlock, 0, stream>>>(acc, x, n);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T>
void scale_inplace(T* x, std::int64_t n, float s, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(n >= 0);
  if (n == 0) return;
  scale_kernel<T><<<detail::grid_size(n, kBlock), kBlock, 0, stream>>>(x, n, s);
  MEGASCOPE_CUDA_LAUNCHED();
}

#define MEGASCOPE_INSTANTIATE(T)                                                                                   \
  template void adamw_update<T>(float*, const T*, float*, float*, std::int64_t, float, float, float, float, float, \
                                std::int64_t, float, cudaStream_t);                                                \
  template void sum_squares<T>(double*, const T*, std::int64_t, cudaStream_t);                                     \
  template void scale_inplace<T>(T*, std::int64_t, float, cudaStream_t);
MEGASCOPE_INSTANTIATE(float)
MEGASCOPE_INSTANTIATE(bf16)
MEGASCOPE_INSTANTIATE(fp16)
#undef MEGASCOPE_INSTANTIATE

}  // namespace megascope::kernels::cuda
