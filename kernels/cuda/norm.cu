// CUDA LayerNorm and RMSNorm. Forward: one warp per row (the row is read
// three times, through L1/L2), 128-bit loads and stores (detail::Pack) when
// C is a multiple of the pack and the pointers are 16-byte aligned.
// Backward, packed (same condition): a block takes a run of rows; its warps
// first compute each row's two means, then every thread owns a pack of
// columns, runs down the block's rows writing dinp and summing the
// parameter gradients in registers, and adds them to the fp32
// dweight/dbias with one atomic per column per block. Otherwise one warp
// per row, parameter gradients summed per block in shared memory (2C
// floats, one shared atomic per element) or straight into global for rows
// too wide for it. Does not: keep the row in registers, fuse the residual add.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.hpp"

namespace megascope::kernels::cuda {

namespace {

using detail::aligned16;
using detail::from_float;
using detail::load_pack;
using detail::Pack;
using detail::store_pack;
using detail::to_float;
using detail::warp_sum;

constexpr int kWarps = 8;  // rows per block in flight

// A row's columns in steps of 32 lanes x V (V = 1, or a pack).
template <typename T, bool kPack>
struct RowStep {
  static constexpr int V = kPack ? Pack<T>::n : 1;
  __device__ static Pack<T> load(const T* p) {
    if constexpr (kPack) {
      return load_pack(p);
    } else {
      Pack<T> r;
      r.v[0] = *p;
      return r;
    }
  }
  __device__ static void store(T* p, const Pack<T>& r) {
    if constexpr (kPack)
      store_pack(p, r);
    else
      *p = r.v[0];
  }
};

template <typename T, bool kRms, bool kPack>
__global__ void norm_forward_kernel(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias,
                                    std::int64_t N, std::int64_t C, float eps) {
  using S = RowStep<T, kPack>;
  constexpr int V = S::V;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int64_t n = static_cast<std::int64_t>(blockIdx.x) * kWarps + warp;
  if (n >= N) return;
  const T* x = inp + n * C;  // (C)
  const float c = static_cast<float>(C);
  float m = 0.0f;
  if (!kRms) {
    float s = 0.0f;
    for (std::int64_t i = lane * V; i < C; i += 32 * V) {
      const Pack<T> xv = S::load(x + i);
#pragma unroll
      for (int j = 0; j < V; ++j) s += to_float(xv.v[j]);
    }
    m = warp_sum(s) / c;
  }
  float var = 0.0f;  // mean of squares for RMSNorm (m = 0)
  for (std::int64_t i = lane * V; i < C; i += 32 * V) {
    const Pack<T> xv = S::load(x + i);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float d = to_float(xv.v[j]) - m;
      var += d * d;
    }
  }
  const float r = 1.0f / sqrtf(warp_sum(var) / c + eps);
  for (std::int64_t i = lane * V; i < C; i += 32 * V) {
    const Pack<T> xv = S::load(x + i), wv = S::load(weight + i);
    Pack<T> bv{};
    if (bias != nullptr) bv = S::load(bias + i);
    Pack<T> y;
#pragma unroll
    for (int j = 0; j < V; ++j)
      y.v[j] = from_float<T>((to_float(xv.v[j]) - m) * r * to_float(wv.v[j]) +
                             (bias != nullptr ? to_float(bv.v[j]) : 0.0f));
    S::store(out + n * C + i, y);
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

// The packed backward: rows [r0, r0 + rows) of block blockIdx.x. Shared:
// the rows' mean(dnorm) and mean(dnorm * norm), 2 x rows floats.
template <typename T, bool kRms>
__global__ void __launch_bounds__(kWarps * 32)
    norm_backward_packed_kernel(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp, const T* weight,
                                const float* mean, const float* rstd, std::int64_t N, std::int64_t C,
                                std::int64_t rows) {
  extern __shared__ float srow[];  // (2, rows)
  constexpr int V = Pack<T>::n;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.x) * rows;
  const std::int64_t r1 = r0 + rows < N ? r0 + rows : N;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float c = static_cast<float>(C);
  for (std::int64_t n = r0 + warp; n < r1; n += kWarps) {
    const float m = kRms ? 0.0f : mean[n], r = rstd[n];
    float a = 0.0f, b = 0.0f;  // mean(dnorm), mean(dnorm * norm)
    for (std::int64_t i = lane * V; i < C; i += 32 * V) {
      const Pack<T> dy = load_pack(dout + n * C + i), x = load_pack(inp + n * C + i), w = load_pack(weight + i);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float dn = to_float(dy.v[j]) * to_float(w.v[j]);
        a += dn;
        b += dn * (to_float(x.v[j]) - m) * r;
      }
    }
    a = kRms ? 0.0f : warp_sum(a) / c;
    b = warp_sum(b) / c;
    if (lane == 0) {
      srow[n - r0] = a;
      srow[rows + n - r0] = b;
    }
  }
  __syncthreads();
  const bool want_b = !kRms && dbias != nullptr;
  for (std::int64_t i = static_cast<std::int64_t>(threadIdx.x) * V; i < C; i += static_cast<std::int64_t>(blockDim.x) * V) {
    const Pack<T> w = load_pack(weight + i);
    float acc_w[V], acc_b[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc_w[j] = acc_b[j] = 0.0f;
    for (std::int64_t n = r0; n < r1; ++n) {
      const float m = kRms ? 0.0f : mean[n], r = rstd[n], a = srow[n - r0], b = srow[rows + n - r0];
      const Pack<T> dy = load_pack(dout + n * C + i), x = load_pack(inp + n * C + i);
      Pack<T> dx;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float g = to_float(dy.v[j]), norm = (to_float(x.v[j]) - m) * r;
        dx.v[j] = from_float<T>((g * to_float(w.v[j]) - a - norm * b) * r);
        acc_w[j] += norm * g;
        acc_b[j] += g;
      }
      store_pack(dinp + n * C + i, dx);
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
      atomicAdd(&dweight[i + j], acc_w[j]);
      if (want_b) atomicAdd(&dbias[i + j], acc_b[j]);
    }
  }
}

template <typename T, bool kRms>
void norm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, std::int64_t N,
                  std::int64_t C, float eps, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && C > 0);
  if (N == 0) return;
  const auto blocks = static_cast<unsigned>((N + kWarps - 1) / kWarps);
  if (C % Pack<T>::n == 0 && aligned16(out) && aligned16(inp) && aligned16(weight) && aligned16(bias))
    norm_forward_kernel<T, kRms, true><<<blocks, kWarps * 32, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C, eps);
  else
    norm_forward_kernel<T, kRms, false><<<blocks, kWarps * 32, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C, eps);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T, bool kRms>
void norm_backward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp, const T* weight,
                   const float* mean, const float* rstd, std::int64_t N, std::int64_t C, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && C > 0 && dweight != nullptr);
  if (N == 0) return;
  if (C % Pack<T>::n == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(weight)) {
    // Two blocks per SM, each with at least a warp's worth of rows and at most
    // 4096 (32 KiB of shared means).
    const std::int64_t blocks = std::max<std::int64_t>(
        std::min<std::int64_t>((N + kWarps - 1) / kWarps, 2 * detail::sm_count()), (N + 4095) / 4096);
    const std::int64_t rows = (N + blocks - 1) / blocks;
    const std::size_t smem = 2 * static_cast<std::size_t>(rows) * sizeof(float);
    auto kernel = norm_backward_packed_kernel<T, kRms>;
    detail::allow_smem(kernel, smem);
    kernel<<<static_cast<unsigned>((N + rows - 1) / rows), kWarps * 32, smem, stream>>>(
        dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, rows);
    MEGASCOPE_CUDA_LAUNCHED();
    return;
  }
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
