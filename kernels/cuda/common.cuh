// Device helpers shared by the .cu files (internal, not installed): element
// conversions, warp and block reductions, launch-size arithmetic.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/check.hpp"
#include "kernels/cuda/check.hpp"

namespace megascope::kernels::cuda::detail {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);  // round to nearest even
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);  // round to nearest even; beyond 65504 it is inf, as fp16 training expects
}

// 16 bytes of T (8 bf16 or fp16, 4 float): what one 128-bit load or store
// moves. Kernels take the packed path when every pointer is 16-byte aligned
// (aligned16) and the row or element count allows it, else the scalar one.
template <typename T>
struct alignas(16) Pack {
  static constexpr int n = 16 / static_cast<int>(sizeof(T));
  T v[n];
};
template <typename T>
__device__ __forceinline__ Pack<T> load_pack(const T* p) {
  Pack<T> r;
  *reinterpret_cast<uint4*>(&r) = *reinterpret_cast<const uint4*>(p);   // plain load: in-place kernels read what they write
  return r;
}
template <typename T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T>& r) {
  *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(&r);
}
inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

template <typename V>
__device__ __forceinline__ V warp_sum(V v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024), returned to
// every thread. `scratch` holds 32 values in shared memory; the call begins
// and ends with a barrier, so it can be called repeatedly.
template <typename V>
__device__ V block_sum(V v, V* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  V total = 0;
  for (int w = 0; w < warps; ++w) total += scratch[w];
  return total;
}

__device__ inline float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < warps; ++w) m = fmaxf(m, scratch[w]);
  return m;
}

// Blocks for a grid-stride loop over n items: enough to fill the device,
// never more than needed, never zero (callers return early when n == 0).
inline unsigned grid_size(std::int64_t n, int block, std::int64_t cap = 65536) {
  const std::int64_t blocks = (n + block - 1) / block;
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min(blocks, cap)));
}

// The largest dynamic shared memory a block of the current device may opt in to.
inline std::size_t max_dynamic_smem() {
  int device = 0, bytes = 0;
  MEGASCOPE_CUDA_CHECK(cudaGetDevice(&device));
  MEGASCOPE_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return static_cast<std::size_t>(bytes);
}

inline int sm_count() {
  int device = 0, n = 0;
  MEGASCOPE_CUDA_CHECK(cudaGetDevice(&device));
  MEGASCOPE_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  return n;
}

// Raises a kernel's dynamic shared memory limit when it needs more than the
// default 48 KiB.
template <typename Kernel>
void allow_smem(Kernel kernel, std::size_t bytes) {
  if (bytes > 48 * 1024)
    MEGASCOPE_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

}  // namespace megascope::kernels::cuda::detail

// After every launch.
#define MEGASCOPE_CUDA_LAUNCHED() MEGASCOPE_CUDA_CHECK(cudaGetLastError())
