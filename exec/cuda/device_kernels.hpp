// The few kernels of the GPU runtime itself (not twins of kernels/): the bias
// gradient of a linear layer, a deterministic fill for benchmark buffers, and
// an empty kernel for measuring launch overhead. Header kept C++17 for nvcc.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace megascope::exec::cuda {

// dbias (OC) += column sums of dout (N, OC), in fp32. T: float or __nv_bfloat16.
// Deterministic (one thread per column, rows summed in order).
template <typename T>
void bias_grad_accumulate(float* dbias, const T* dout, std::int64_t N, std::int64_t OC, cudaStream_t stream);

// out (N, OC) = bias (OC) on every row, or zeros when bias is null (a GEMM with an empty inner dimension).
template <typename T>
void broadcast_rows(T* out, const T* bias /*nullable*/, std::int64_t N, std::int64_t OC, cudaStream_t stream);

// x[i] = lo + (hi - lo) * u(seed, i), u a hash of (seed, i) in [0, 1).
// T: float, __nv_bfloat16 or __nv_fp8_e4m3.
template <typename T>
void fill_uniform(T* x, std::int64_t n, std::uint64_t seed, float lo, float hi, cudaStream_t stream);

// out[i] = in[i] rounded to bf16 (round to nearest even), and back to fp32.
void to_bf16(__nv_bfloat16* out, const float* in, std::int64_t n, cudaStream_t stream);
void from_bf16(float* out, const __nv_bfloat16* in, std::int64_t n, cudaStream_t stream);

// One empty kernel of one thread: the launch overhead.
void launch_empty(cudaStream_t stream);

}  // namespace megascope::exec::cuda
