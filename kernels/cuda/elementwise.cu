// CUDA element-wise kernels: GeLU (tanh form), SwiGLU, residual add,
// dropout and bias + dropout + residual (Philox masks from kernels/philox.hpp,
// identical to the CPU's), rotary embedding. Grid-stride loops, fp32 math;
// 128-bit loads and stores (detail::Pack) where the pointers are 16-byte
// aligned (SwiGLU: and F a multiple of the pack), element by element
// otherwise and for the tail. Does not: vectorise RoPE or the dropout
// column sums.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/philox.hpp"

namespace megascope::kernels::cuda {

namespace {

using detail::aligned16;
using detail::from_float;
using detail::load_pack;
using detail::Pack;
using detail::store_pack;
using detail::to_float;

constexpr int kBlock = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

__device__ __forceinline__ std::int64_t global_index() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t grid_stride() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x; }

__device__ __forceinline__ float gelu(float x) {
  return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kGeluCubic * x * x * x)));
}
__device__ __forceinline__ float gelu_grad(float x) {
  const float th = tanhf(kSqrt2OverPi * (x + kGeluCubic * x * x * x));
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
}

// out[i] = f(a[i], b[i], i) over n elements (b may be null: f gets 0 for
// it); kPack: a pack per step, then the tail element by element.
template <typename T, bool kPack, typename F>
__device__ __forceinline__ void map2(T* out, const T* a, const T* b, std::int64_t n, F f) {
  std::int64_t done = 0;
  if constexpr (kPack) {
    constexpr int V = Pack<T>::n;
    const std::int64_t packs = n / V;
    for (std::int64_t p = global_index(); p < packs; p += grid_stride()) {
      const Pack<T> x = load_pack(a + p * V);
      Pack<T> y;
      if (b != nullptr) {
        const Pack<T> z = load_pack(b + p * V);
#pragma unroll
        for (int j = 0; j < V; ++j) y.v[j] = from_float<T>(f(to_float(x.v[j]), to_float(z.v[j]), p * V + j));
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) y.v[j] = from_float<T>(f(to_float(x.v[j]), 0.0f, p * V + j));
      }
      store_pack(out + p * V, y);
    }
    done = packs * V;
  }
  for (std::int64_t i = done + global_index(); i < n; i += grid_stride())
    out[i] = from_float<T>(f(to_float(a[i]), b != nullptr ? to_float(b[i]) : 0.0f, i));
}

template <typename T, bool kPack>
__global__ void gelu_forward_kernel(T* out, const T* inp, std::int64_t n) {
  map2<T, kPack>(out, inp, static_cast<const T*>(nullptr), n, [](float x, float, std::int64_t) { return gelu(x); });
}

template <typename T, bool kPack>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, std::int64_t n) {
  map2<T, kPack>(dinp, inp, dout, n, [](float x, float dy, std::int64_t) { return gelu_grad(x) * dy; });
}

// SwiGLU over (N, 2F) inputs [gate | up]: kPack (F a multiple of the pack,
// pointers aligned) takes a pack of F per step, which never crosses a row.
template <typename T, bool kPack>
__global__ void swiglu_forward_kernel(T* out, const T* inp, std::int64_t N, std::int64_t F) {
  constexpr int V = kPack ? Pack<T>::n : 1;
  for (std::int64_t p = global_index(); p < N * F / V; p += grid_stride()) {
    const std::int64_t i = p * V, n = i / F, f = i % F;
    const T* gate = inp + n * 2 * F + f;
    if constexpr (kPack) {
      const Pack<T> g = load_pack(gate), u = load_pack(gate + F);
      Pack<T> y;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float gj = to_float(g.v[j]);
        y.v[j] = from_float<T>(gj / (1.0f + expf(-gj)) * to_float(u.v[j]));
      }
      store_pack(out + i, y);
    } else {
      const float g = to_float(gate[0]), u = to_float(gate[F]);
      out[i] = from_float<T>(g / (1.0f + expf(-g)) * u);
    }
  }
}

template <typename T, bool kPack>
__global__ void swiglu_backward_kernel(T* dinp, const T* inp, const T* dout, std::int64_t N, std::int64_t F) {
  constexpr int V = kPack ? Pack<T>::n : 1;
  for (std::int64_t p = global_index(); p < N * F / V; p += grid_stride()) {
    const std::int64_t i = p * V, n = i / F, f = i % F;
    const T* gate = inp + n * 2 * F + f;
    T* dgate = dinp + n * 2 * F + f;
    if constexpr (kPack) {
      const Pack<T> g = load_pack(gate), u = load_pack(gate + F), dy = load_pack(dout + i);
      Pack<T> dg, du;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float gj = to_float(g.v[j]), uj = to_float(u.v[j]), dyj = to_float(dy.v[j]);
        const float sg = 1.0f / (1.0f + expf(-gj));
        dg.v[j] = from_float<T>(dyj * uj * sg * (1.0f + gj * (1.0f - sg)));
        du.v[j] = from_float<T>(dyj * gj * sg);
      }
      store_pack(dgate, dg);
      store_pack(dgate + F, du);
    } else {
      const float g = to_float(gate[0]), u = to_float(gate[F]);
      const float dy = to_float(dout[i]), sg = 1.0f / (1.0f + expf(-g));
      dgate[0] = from_float<T>(dy * u * sg * (1.0f + g * (1.0f - sg)));
      dgate[F] = from_float<T>(dy * g * sg);
    }
  }
}

template <typename T, bool kPack>
__global__ void residual_kernel(T* out, const T* a, const T* b, std::int64_t n) {
  map2<T, kPack>(out, a, b, n, [](float x, float y, std::int64_t) { return x + y; });
}

// out = residual + keep(offset + i) * (inp + bias[i % C]) * scale; residual
// and bias may be null (plain dropout: C is then unused).
template <typename T, bool kPack>
__global__ void dropout_kernel(T* out, const T* inp, const T* bias, const T* residual, std::int64_t n, std::int64_t C,
                               float scale, std::uint64_t threshold, std::uint64_t seed, std::uint64_t offset) {
  map2<T, kPack>(out, inp, residual, n, [=](float x, float r, std::int64_t i) {
    if (bias != nullptr) x += to_float(bias[i % C]);
    const bool keep = dropout_keep(seed, offset + static_cast<std::uint64_t>(i), threshold);
    return (keep ? x * scale : 0.0f) + r;
  });
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

// The bias is read element by element (i % C), so only out, inp and the
// residual need the alignment.
template <typename T>
void launch_dropout(T* out, const T* inp, const T* bias, const T* residual, std::int64_t n, std::int64_t C, float p,
                    std::uint64_t seed, std::uint64_t offset, cudaStream_t stream) {
  if (aligned16(out) && aligned16(inp) && aligned16(residual))
    dropout_kernel<T, true><<<detail::grid_size(n / Pack<T>::n + 1, kBlock), kBlock, 0, stream>>>(
        out, inp, bias, residual, n, C, keep_scale(p), dropout_threshold(p), seed, offset);
  else
    dropout_kernel<T, false><<<detail::grid_size(n, kBlock), kBlock, 0, stream>>>(
        out, inp, bias, residual, n, C, keep_scale(p), dropout_threshold(p), seed, offset);
  MEGASCOPE_CUDA_LAUNCHED();
}

}  // namespace

template <typename T>
void gelu_forward(T* out, const T* inp, std::int64_t n, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(n >= 0);
  if (n == 0) return;
  if (aligned16(out) && aligned16(inp))
    gelu_forward_kernel<T, true><<<detail::grid_size(n / Pack<T>::n + 1, kBlock), kBlock, 0, stream>>>(out, inp, n);
  else
    gelu_forward_kernel<T, false><<<detail::grid_size(n, kBlock), kBlock, 0, stream>>>(out, inp, n);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, std::int64_t n, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(n >= 0);
  if (n == 0) return;
  if (aligned16(dinp) && aligned16(inp) && aligned16(dout))
    gelu_backward_kernel<T, true>
        <<<detail::grid_size(n / Pack<T>::n + 1, kBlock), kBlock, 0, stream>>>(dinp, inp, dout, n);
  else
    gelu_backward_kernel<T, false><<<detail::grid_size(n, kBlock), kBlock, 0, stream>>>(dinp, inp, dout, n);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T>
void swiglu_forward(T* out, const T* inp, std::int64_t N, std::int64_t F, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && F >= 0);
  if (N * F == 0) return;
  if (F % Pack<T>::n == 0 && aligned16(out) && aligned16(inp))
    swiglu_forward_kernel<T, true><<<detail::grid_size(N * F / Pack<T>::n, kBlock), kBlock, 0, stream>>>(out, inp, N, F);
  else
    swiglu_forward_kernel<T, false><<<detail::grid_size(N * F, kBlock), kBlock, 0, stream>>>(out, inp, N, F);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T>
void swiglu_backward(T* dinp, const T* inp, const T* dout, std::int64_t N, std::int64_t F, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && F >= 0);
  if (N * F == 0) return;
  if (F % Pack<T>::n == 0 && aligned16(dinp) && aligned16(inp) && aligned16(dout))
    swiglu_backward_kernel<T, true>
        <<<detail::grid_size(N * F / Pack<T>::n, kBlock), kBlock, 0, stream>>>(dinp, inp, dout, N, F);
  else
    swiglu_backward_kernel<T, false><<<detail::grid_size(N * F, kBlock), kBlock, 0, stream>>>(dinp, inp, dout, N, F);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T>
void residual_forward(T* out, const T* a, const T* b, std::int64_t n, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(n >= 0);
  if (n == 0) return;
  if (aligned16(out) && aligned16(a) && aligned16(b))
    residual_kernel<T, true><<<detail::grid_size(n / Pack<T>::n + 1, kBlock), kBlock, 0, stream>>>(out, a, b, n);
  else
    residual_kernel<T, false><<<detail::grid_size(n, kBlock), kBlock, 0, stream>>>(out, a, b, n);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T>
void dropout_forward(T* out, const T* inp, std::int64_t n, float p, std::uint64_t seed, std::uint64_t offset,
                     cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(n >= 0 && p >= 0.0f && p <= 1.0f);
  if (n == 0) return;
  launch_dropout(out, inp, static_cast<const T*>(nullptr), static_cast<const T*>(nullptr), n, 1, p, seed, offset,
                 stream);
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
  launch_dropout(out, inp, static_cast<const T*>(bias), residual, N * C, C, p, seed, offset, stream);
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
