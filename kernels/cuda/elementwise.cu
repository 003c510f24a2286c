// CUDA element-wise kernels: GeLU (tanh form), SwiGLU, residual add,
// dropout and bias + dropout + residual (Philox masks from kernels/philox.hpp,
// identical to the CPU's), rotary embedding. Grid-stride loops, fp32 math.
// Does not: vectorised (128-bit) loads; the bench says how far that leaves
// these kernels from the copy bandwidth.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/philox.hpp"

namespace megascope::kernels::cuda {

namespace {

using detail::from_float;
using detail::to_float;

constexpr int kBlock = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

__device__ __forceinline__ std::int64_t global_index() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t grid_stride() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x; }

template <typename T>
__global__ void gelu_forward_kernel(T* out, const T* inp, std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += grid_stride()) {
    const float x = to_float(inp[i]);
    out[i] = from_float<T>(0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kGeluCubic * x * x * x))));
  }
}

template <typename T>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += grid_stride()) {
    const float x = to_float(inp[i]);
    const float th = tanhf(kSqrt2OverPi * (x + kGeluCubic * x * x * x));
    const float grad =
        0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
    dinp[i] = from_float<T>(grad * to_float(dout[i]));
  }
}

template <typename T>
__global__ void swiglu_forward_kernel(T* out, const T* inp, std::int64_t N, std::int64_t F) {
  for (std::int64_t i = global_index(); i < N * F; i += grid_stride()) {
    const std::int64_t n = i / F, f = i % F;
    const float g = to_float(inp[n * 2 * F + f]), u = to_float(inp[n * 2 * F + F + f]);
    out[i] = from_float<T>(g / (1.0f + expf(-g)) * u);
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(T* dinp, const T* inp, const T* dout, std::int64_t N, std::int64_t F) {
  for (std::int64_t i = global_index(); i < N * F; i += grid_stride()) {
    const std::int64_t n = i / F, f = i % F;
    const float g = to_float(inp[n * 2 * F + f]), u = to_float(inp[n * 2 * F + F + f]);
    const float dy = to_float(dout[i]), sg = 1.0f / (1.0f + expf(-g));
    dinp[n * 2 * F + f] = from_float<T>(dy * u * sg * (1.0f + g * (1.0f - sg)));
    dinp[n * 2 * F + F + f] = from_float<T>(dy * g * sg);
  }
}

template <typename T>
__global__ void residual_kernel(T* out, const T* a, const T* b, std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += grid_stride())
    out[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
}

// out = residual + keep(offset + i) * (inp + bias[i % C]) * scale; residual
// and bias may be null (plain dropout: C is then unused).
template <typename T>
__global__ void dropout_kernel(T* out, const T* inp, const T* bias, const T* residual, std::int64_t n, std::int64_t C,
                               float scale, std::uint64_t threshold, std::uint64_t seed, std::uint64_t offset) {
  for (std::int64_t i = global_index(); i < n; i += grid_stride()) {
    float x = to_float(inp[i]);
    if (bias != nullptr) x += to_float(bias[i % C]);
    const bool keep = dropout_keep(seed, offset + static_cast<std::uint64_t>(i), threshold);
    float y = keep ? x * scale : 0.0f;
    if (residual != nullptr) y += to_float(residual[i]);
    out[i] = from_float<T>(y);
  }
}

// dbias[c] += sum over rows of keep * dout * scale. Block (32, 8): x runs
// over 32 columns, y over rows; one atomic per column per block.
template <typename T>
__global__ void dropout_colsum_kernel(float* dbias, const T* dout, std::int64_t N, std::int64_t C, float scale,
                                      std::uint64_t threshold, std::uint64_t seed, std::uint64_t offset) {
  __shared__ float partial[8][33];
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float s = 0.0f;
  if (c < C) {
    for (std::int64_t n = static_cast<std::int64_t>(blockIdx.y) * 8 + threadIdx.y; n < N;
         n += static_cast<std::int64_t>(gridDim.y) * 8) {
      const std::int64_t i = n * C + c;
      if (dropout_keep(seed, offset + static_cast<std::uint64_t>(i), threshold)) s += to_float(dout[i]) * scale;
    }
  }
  partial[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float total = 0.0f;
    for (int y = 0; y < 8; ++y) total += partial[y][threadIdx.x];
    atomicAdd(&dbias[c], total);
  }
}

// One thread per rotation pair (b, s, h, i < D/2); sign -1 is the backward.
template <typename T>
__global__ void rope_kernel(T* out, const T* inp, const std::int32_t* pos, std::int64_t B, std::int64_t S,
                            std::int64_t H, std::int64_t D, float theta, float sign) {
  const std::int64_t half = D / 2, pairs = B * S * H * half;
  for (std::int64_t p = global_index(); p < pairs; p += grid_stride()) {
    const std::int64_t i = p % half, row = p / half;  // row = (b * S + s) * H + h
    const std::int64_t s = (row / H) % S;
    const float position = static_cast<float>(pos != nullptr ? pos[s] : s);
    const float inv_freq = 1.0f / powf(theta, static_cast<float>(2 * i) / static_cast<float>(D));
    float sn, cs;
    sincosf(position * inv_freq, &sn, &cs);
    sn *= sign;
    const std::int64_t base = row * D;
    const float x1 = to_float(inp[base + i]), x2 = to_float(inp[base + half + i]);
    out[base + i] = from_float<T>(x1 * cs - x2 * sn);
    out[base + half + i] = from_float<T>(x2 * cs + x1 * sn);
  }
}

float keep_scale(float p) { return p >= 1.0f ? 0.0f : static_cast<float>(1.0 / (1.0 - static_cast<double>(p))); }

}  // namespace

template <typename T>
void gelu_forward(T* out, const T* inp, std::int64_t n, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(n >= 0);
  if (n == 0) return;
  gelu_forward_kernel<<<detail::grid_size(n, kBlock), kBlock, 0, stream>>>(out, inp, n);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, std::int64_t n, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(n >= 0);
  if (n == 0) return;
  gelu_backward_kernel<<<detail::grid_size(n, kBlock), kBlock, 0, stream>>>(dinp, inp, dout, n);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T>
void swiglu_forward(T* out, const T* inp, std::int64_t N, std::int64_t F, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && F >= 0);
  if (N * F == 0) return;
  swiglu_forward_kernel<<<detail::grid_size(N * F, kBlock), kBlock, 0, stream>>>(out, inp, N, F);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T>
void swiglu_backward(T* dinp, const T* inp, const T* dout, std::int64_t N, std::int64_t F, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && F >= 0);
  if (N * F == 0) return;
  swiglu_backward_kernel<<<detail::grid_size(N * F, kBlock), kBlock, 0, stream>>>(dinp, inp, dout, N, F);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T>
void residual_forward(T* out, const T* a, const T* b, std::int64_t n, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(n >= 0);
  if (n == 0) return;
  residual_kernel<<<detail::grid_size(n, kBlock), kBlock, 0, stream>>>(out, a, b, n);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T>
void dropout_forward(T* out, const T* inp, std::int64_t n, float p, std::uint64_t seed, std::uint64_t offset,
                     cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(n >= 0 && p >= 0.0f && p <= 1.0f);
  if (n == 0) return;
  dropout_kernel<<<detail::grid_size(n, kBlock), kBlock, 0, stream>>>(
      out, inp, static_cast<const T*>(nullptr), static_cast<const T*>(nullptr), n, 1, keep_scale(p),
      dropout_threshold(p), seed, offset);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T>
void dropout_backward(T* dinp, const T* dout, std::int64_t n, float p, std::uint64_t seed, std::uint64_t offset,
                      cudaStream_t stream) {
  dropout_forward(dinp, dout, n, p, seed, offset, stream);  // the same linear map
}

template <typename T>
void bias_dropout_add_forward(T* out, const T* inp, nullable<const T> bias, const T* residual, std::int64_t N,
                              std::int64_t C, float p, std::uint64_t seed, std::uint64_t offset, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && C >= 0 && p >= 0.0f && p <= 1.0f && residual != nullptr);
  if (N * C == 0) return;
  dropout_kernel<<<detail::grid_size(N * C, kBlock), kBlock, 0, stream>>>(
      out, inp, bias, residual, N * C, C, keep_scale(p), dropout_threshold(p), seed, offset);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T>
void bias_dropout_add_backward(T* dinp, nullable<float> dbias, const T* dout, std::int64_t N, std::int64_t C, float p,
                               std::uint64_t seed, std::uint64_t offset, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && C >= 0 && p >= 0.0f && p <= 1.0f);
  // dbias first: it reads dout, which dinp may alias (as the CPU twin allows).
  if (dbias != nullptr && N * C != 0) {
    const dim3 block(32, 8);
    const dim3 grid(static_cast<unsigned>((C + 31) / 32),
                    static_cast<unsigned>(std::min<std::int64_t>((N + 7) / 8, 256)));
    dropout_colsum_kernel<<<grid, block, 0, stream>>>(dbias, dout, N, C, keep_scale(p), dropout_threshold(p), seed,
                                                      offset);
    MEGASCOPE_CUDA_LAUNCHED();
  }
  dropout_forward(dinp, dout, N * C, p, seed, offset, stream);
}

template <typename T>
void rope_forward(T* out, const T* inp, const std::int32_t* pos, std::int64_t B, std::int64_t S, std::int64_t H,
                  std::int64_t D, float theta, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(B >= 0 && S >= 0 && H >= 0 && D > 0 && D % 2 == 0 && theta > 0.0f);
  const std::int64_t pairs = B * S * H * (D / 2);
  if (pairs == 0) return;
  rope_kernel<<<detail::grid_size(pairs, kBlock), kBlock, 0, stream>>>(out, inp, pos, B, S, H, D, theta, 1.0f);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T>
void rope_backward(T* dinp, const T* dout, const std::int32_t* pos, std::int64_t B, std::int64_t S, std::int64_t H,
                   std::int64_t D, float theta, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(B >= 0 && S >= 0 && H >= 0 && D > 0 && D % 2 == 0 && theta > 0.0f);
  const std::int64_t pairs = B * S * H * (D / 2);
  if (pairs == 0) return;
  rope_kernel<<<detail::grid_size(pairs, kBlock), kBlock, 0, stream>>>(dinp, dout, pos, B, S, H, D, theta, -1.0f);
  MEGASCOPE_CUDA_LAUNCHED();
}

#define MEGASCOPE_INSTANTIATE(T)                                                                                    \
  template void gelu_forward<T>(T*, const T*, std::int64_t, cudaStream_t);                                          \
  template void gelu_backward<T>(T*, const T*, const T*, std::int64_t, cudaStream_t);                               \
  template void swiglu_forward<T>(T*, const T*, std::int64_t, std::int64_t, cudaStream_t);                          \
  template void swiglu_backward<T>(T*, const T*, const T*, std::int64_t, std::int64_t, cudaStream_t);               \
  template void residual_forward<T>(T*, const T*, const T*, std::int64_t, cudaStream_t);                            \
  template void dropout_forward<T>(T*, const T*, std::int64_t, float, std::uint64_t, std::uint64_t, cudaStream_t);  \
  template void dropout_backward<T>(T*, const T*, std::int64_t, float, std::uint64_t, std::uint64_t, cudaStream_t); \
  template void bias_dropout_add_forward<T>(T*, const T*, nullable<const T>, const T*, std::int64_t, std::int64_t,  \
                                            float, std::uint64_t, std::uint64_t, cudaStream_t);                     \
  template void bias_dropout_add_backward<T>(T*, nullable<float>, const T*, std::int64_t, std::int64_t, float,      \
                                             std::uint64_t, std::uint64_t, cudaStream_t);                           \
  template void rope_forward<T>(T*, const T*, const std::int32_t*, std::int64_t, std::int64_t, std::int64_t,        \
                                std::int64_t, float, cudaStream_t);                                                 \
  template void rope_backward<T>(T*, const T*, const std::int32_t*, std::int64_t, std::int64_t, std::int64_t,       \
                                 std::int64_t, float, cudaStream_t);
MEGASCOPE_INSTANTIATE(float)
MEGASCOPE_INSTANTIATE(bf16)
MEGASCOPE_INSTANTIATE(fp16)
#undef MEGASCOPE_INSTANTIATE

}  // namespace megascope::kernels::cuda
