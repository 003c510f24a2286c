// Kernels of exec/cuda/device_kernels.hpp.
#include "exec/cuda/device_kernels.hpp"

#include "kernels/check.hpp"
#include "kernels/cuda/check.hpp"

namespace megascope::exec::cuda {

namespace {

__device__ __forceinline__ float as_float(float x) { return x; }
__device__ __forceinline__ float as_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T of_float(float x);
template <>
__device__ __forceinline__ float of_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 of_float<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}
template <>
__device__ __forceinline__ __nv_fp8_e4m3 of_float<__nv_fp8_e4m3>(float x) {
  return __nv_fp8_e4m3(x);
}

template <typename T>
__global__ void bias_grad_kernel(float* dbias, const T* dout, std::int64_t N, std::int64_t OC) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= OC) return;
  float s = 0.0f;
  for (std::int64_t r = 0; r < N; ++r) s += as_float(dout[r * OC + c]);   // coalesced over c
  dbias[c] += s;
}

template <typename T>
__global__ void broadcast_rows_kernel(T* out, const T* bias, std::int64_t N, std::int64_t OC) {
  const std::int64_t n = N * OC, stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = bias ? bias[i % OC] : of_float<T>(0.0f);
}

__device__ __forceinline__ std::uint64_t mix(std::uint64_t x) {   // splitmix64 finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

template <typename T>
__global__ void fill_kernel(T* x, std::int64_t n, std::uint64_t seed, float lo, float hi) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float u = static_cast<float>(mix(seed * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(i)) >> 40) *
                    (1.0f / 16777216.0f);
    x[i] = of_float<T>(lo + (hi - lo) * u);
  }
}

template <typename To, typename From>
__global__ void convert_kernel(To* out, const From* in, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = of_float<To>(as_float(in[i]));
}

template <typename To, typename From>
void convert(To* out, const From* in, std::int64_t n, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(n >= 0 && ((out != nullptr && in != nullptr) || n == 0));
  if (n == 0) return;
  constexpr int kBlock = 256;
  const std::int64_t blocks = (n + kBlock - 1) / kBlock;
  convert_kernel<To, From><<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), kBlock, 0, stream>>>(out, in, n);
  MEGASCOPE_CUDA_CHECK(cudaGetLastError());
}

__global__ void empty_kernel() {}

}  // namespace

template <typename T>
void bias_grad_accumulate(float* dbias, const T* dout, std::int64_t N, std::int64_t OC, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && OC >= 0);
  MEGASCOPE_KERNEL_REQUIRE(dbias != nullptr && (dout != nullptr || N * OC == 0));
  if (N == 0 || OC == 0) return;
  constexpr int kBlock = 256;
  const auto blocks = static_cast<unsigned>((OC + kBlock - 1) / kBlock);
  bias_grad_kernel<T><<<blocks, kBlock, 0, stream>>>(dbias, dout, N, OC);
  MEGASCOPE_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void broadcast_rows(T* out, const T* bias, std::int64_t N, std::int64_t OC, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && OC >= 0 && (out != nullptr || N * OC == 0));
  if (N == 0 || OC == 0) return;
  constexpr int kBlock = 256;
  const std::int64_t blocks = (N * OC + kBlock - 1) / kBlock;
  broadcast_rows_kernel<T><<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), kBlock, 0, stream>>>(out, bias, N, OC);
  MEGASCOPE_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void fill_uniform(T* x, std::int64_t n, std::uint64_t seed, float lo, float hi, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(n >= 0 && (x != nullptr || n == 0));
  if (n == 0) return;
  constexpr int kBlock = 256;
  const std::int64_t blocks = (n + kBlock - 1) / kBlock;
  fill_kernel<T><<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), kBlock, 0, stream>>>(x, n, seed, lo, hi);
  MEGASCOPE_CUDA_CHECK(cudaGetLastError());
}

void to_bf16(__nv_bfloat16* out, const float* in, std::int64_t n, cudaStream_t stream) { convert(out, in, n, stream); }
void from_bf16(float* out, const __nv_bfloat16* in, std::int64_t n, cudaStream_t stream) { convert(out, in, n, stream); }

void launch_empty(cudaStream_t stream) {
  empty_kernel<<<1, 1, 0, stream>>>();
  MEGASCOPE_CUDA_CHECK(cudaGetLastError());
}

template void bias_grad_accumulate<float>(float*, const float*, std::int64_t, std::int64_t, cudaStream_t);
template void bias_grad_accumulate<__nv_bfloat16>(float*, const __nv_bfloat16*, std::int64_t, std::int64_t,
                                                  cudaStream_t);
template void broadcast_rows<float>(float*, const float*, std::int64_t, std::int64_t, cudaStream_t);
template void broadcast_rows<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, std::int64_t, std::int64_t,
                                            cudaStream_t);
template void fill_uniform<float>(float*, std::int64_t, std::uint64_t, float, float, cudaStream_t);
template void fill_uniform<__nv_bfloat16>(__nv_bfloat16*, std::int64_t, std::uint64_t, float, float, cudaStream_t);
template void fill_uniform<__nv_fp8_e4m3>(__nv_fp8_e4m3*, std::int64_t, std::uint64_t, float, float, cudaStream_t);

}  // namespace megascope::exec::cuda
