// CUDA LayerNorm and RMSNorm, one warp per row (C any size; the row is read
// from global memory twice in the forward, three times in the backward).
// Backward: parameter gradients are summed per block in shared memory
// (2C floats) and added to the fp32 dweight/dbias with one atomic per column
// per block; rows too wide for shared memory add straight into global.
// Does not: keep the row in registers, fuse the residual add.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.hpp"

namespace megascope::kernels::cuda {

namespace {

using detail::from_float;
using detail::to_float;
using detail::warp_sum;

constexpr int kWarps = 8;  // rows per block in flight

template <typename T, bool kRms>
__global__ void norm_forward_kernel(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias,
                                    std::int64_t N, std::int64_t C, float eps) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int64_t n = static_cast<std::int64_t>(blockIdx.x) * kWarps + warp;
  if (n >= N) return;
  const T* x = inp + n * C;  // (C)
  const float c = static_cast<float>(C);
  float m = 0.0f;
  if (!kRms) {
    float s = 0.0f;
    for (std::int64_t i = lane; i < C; i += 32) s += to_float(x[i]);
    m = warp_sum(s) / c;
  }
  float var = 0.0f;  // mean of squares for RMSNorm (m = 0)
  for (std::int64_t i = lane; i < C; i += 32) {
    const float d = to_float(x[i]) - m;
    var += d * d;
  }
  const float r = 1.0f / sqrtf(warp_sum(var) / c + eps);
  for (std::int64_t i = lane; i < C; i += 32) {
    const float y = (to_float(x[i]) - m) * r * to_float(weight[i]) + (bias != nullptr ? to_float(bias[i]) : 0.0f);
    out[n * C + i] = from_float<T>(y);
  }
  if (lane == 0) {
    if (mean != nullptr) mean[n] = m;
    if (rstd != nullptr) rstd[n] = r;
  }
}

template <typename T, bool kRms>
__global__ void norm_backward_kernel(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                                     const T* weight, const float* mean, const float* rstd, std::int64_t N,
                                     std::int64_t C, bool use_smem) {
  extern __shared__ float sacc[];  // (2, C) when use_smem
  float* acc_w = use_smem ? sacc : dweight;
  float* acc_b = use_smem ? sacc + C : dbias;
  const bool want_b = !kRms && dbias != nullptr;
  if (use_smem) {
    for (std::int64_t i = threadIdx.x; i < 2 * C; i += blockDim.x) sacc[i] = 0.0f;
    __syncthreads();
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float c = static_cast<float>(C);
  for (std::int64_t n = static_cast<std::int64_t>(blockIdx.x) * kWarps + warp; n < N;
       n += static_cast<std::int64_t>(gridDim.x) * kWarps) {
    const T* x = inp + n * C;    // (C)
    const T* dy = dout + n * C;  // (C)
    const float m = kRms ? 0.0f : mean[n], r = rstd[n];
    float a = 0.0f, b = 0.0f;  // mean(dnorm), mean(dnorm * norm)
    for (std::int64_t i = lane; i < C; i += 32) {
      const float dn = to_float(dy[i]) * to_float(weight[i]);
      a += dn;
      b += dn * (to_float(x[i]) - m) * r;
    }
    a = kRms ? 0.0f : warp_sum(a) / c;
    b = warp_sum(b) / c;
    for (std::int64_t i = lane; i < C; i += 32) {
      const float g = to_float(dy[i]), norm = (to_float(x[i]) - m) * r;
      dinp[n * C + i] = from_float<T>((g * to_float(weight[i]) - a - norm * b) * r);
      atomicAdd(&acc_w[i], norm * g);
      if (want_b) atomicAdd(&acc_b[i], g);
    }
  }
  if (use_smem) {
    __syncthreads();
    for (std::int64_t i = threadIdx.x; i < C; i += blockDim.x) {
      atomicAdd(&dweight[i], sacc[i]);
      if (want_b) atomicAdd(&dbias[i], sacc[C + i]);
    }
  }
}

template <typename T, bool kRms>
void norm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, std::int64_t N,
                  std::int64_t C, float eps, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && C > 0);
  if (N == 0) return;
  const auto blocks = static_cast<unsigned>((N + kWarps - 1) / kWarps);
  norm_forward_kernel<T, kRms><<<blocks, kWarps * 32, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C, eps);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T, bool kRms>
void norm_backward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp, const T* weight,
                   const float* mean, const float* rstd, std::int64_t N, std::int64_t C, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && C > 0 && dweight != nullptr);
  if (N == 0) return;
  const std::size_t smem = 2 * static_cast<std::size_t>(C) * sizeof(float);
  const bool use_smem = smem <= detail::max_dynamic_smem();
  const std::int64_t blocks = std::min<std::int64_t>((N + kWarps - 1) / kWarps, 2 * detail::sm_count());
  auto kernel = norm_backward_kernel<T, kRms>;
  if (use_smem) detail::allow_smem(kernel, smem);
  kernel<<<static_cast<unsigned>(blocks), kWarps * 32, use_smem ? smem : 0, stream>>>(
      dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, use_smem);
  MEGASCOPE_CUDA_LAUNCHED();
}

}  // namespace

template <typename T>
void layernorm_forward(T* out, nullable<float> mean, nullable<float> rstd, const T* inp, const T* weight,
                       nullable<const T> bias, std::int64_t N, std::int64_t C, float eps, cudaStream_t stream) {
  norm_forward<T, false>(out, mean, rstd, inp, weight, bias, N, C, eps, stream);
}

template <typename T>
void layernorm_backward(T* dinp, float* dweight, nullable<float> dbias, const T* dout, const T* inp, const T* weight,
                        const float* mean, const float* rstd, std::int64_t N, std::int64_t C, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(mean != nullptr && rstd != nullptr);
  norm_backward<T, false>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, stream);
}

template <typename T>
void rmsnorm_forward(T* out, nullable<float> rstd, const T* inp, const T* weight, std::int64_t N, std::int64_t C,
                     float eps, cudaStream_t stream) {
  norm_forward<T, true>(out, nullptr, rstd, inp, weight, nullptr, N, C, eps, stream);
}

template <typename T>
void rmsnorm_backward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight, const float* rstd,
                      std::int64_t N, std::int64_t C, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(rstd != nullptr);
  norm_backward<T, true>(dinp, dweight, nullptr, dout, inp, weight, nullptr, rstd, N, C, stream);
}

#define MEGASCOPE_INSTANTIATE(T)                                                                                  \
  template void layernorm_forward<T>(T*, nullable<float>, nullable<float>, const T*, const T*, nullable<const T>, \
                                     std::int64_t, std::int64_t, float, cudaStream_t);                            \
  template void layernorm_backward<T>(T*, float*, nullable<float>, const T*, const T*, const T*, const float*,    \
                                      const float*, std::int64_t, std::int64_t, cudaStream_t);                    \
  template void rmsnorm_forward<T>(T*, nullable<float>, const T*, const T*, std::int64_t, std::int64_t, float,    \
                                   cudaStream_t);                                                                 \
  template void rmsnorm_backward<T>(T*, float*, const T*, const T*, const T*, const float*, std::int64_t,         \
                                    std::int64_t, cudaStream_t);
MEGASCOPE_INSTANTIATE(float)
MEGASCOPE_INSTANTIATE(bf16)
MEGASCOPE_INSTANTIATE(fp16)
#undef MEGASCOPE_INSTANTIATE

}  // namespace megascope::kernels::cuda
