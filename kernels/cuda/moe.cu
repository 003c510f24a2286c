// CUDA MoE routing: router (one thread per token: softmax, k passes of
// argmax, ties to the lower expert, as the CPU twin), the permutation indices
// (one block per expert: a stable compaction in slot order, so rows come out
// exactly as the CPU twin orders them, with no atomics), and the gathers that
// permute and unpermute rows (one block per row; no scatter, no atomics).
// Does not: capacity/token dropping, aux losses, fused permute + all-to-all.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.hpp"

namespace megascope::kernels::cuda {

namespace {

using detail::from_float;
using detail::kFullMask;
using detail::to_float;

constexpr int kBlock = 256;

__device__ __forceinline__ std::int64_t thread_id() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

template <typename T>
__global__ void router_forward_kernel(float* probs, std::int32_t* experts, float* scores, const T* logits,
                                      std::int64_t N, std::int64_t E, std::int64_t k, bool renormalize) {
  const std::int64_t n = thread_id();
  if (n >= N) return;
  const T* l = logits + n * E;  // (E)
  float* s = scores + n * E;    // (E)
  std::int32_t* ex = experts + n * k;
  float mx = -INFINITY;
  for (std::int64_t e = 0; e < E; ++e) mx = fmaxf(mx, to_float(l[e]));
  float sum = 0.0f;
  for (std::int64_t e = 0; e < E; ++e) sum += (s[e] = expf(to_float(l[e]) - mx));
  for (std::int64_t e = 0; e < E; ++e) s[e] /= sum;
  float total = 0.0f;
  for (std::int64_t j = 0; j < k; ++j) {
    std::int64_t best = -1;
    for (std::int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (std::int64_t jj = 0; jj < j; ++jj) taken |= ex[jj] == e;
      if (!taken && (best < 0 || s[e] > s[best])) best = e;
    }
    ex[j] = static_cast<std::int32_t>(best);
    probs[n * k + j] = s[best];
    total += s[best];
  }
  if (renormalize)
    for (std::int64_t j = 0; j < k; ++j) probs[n * k + j] /= total;
}

// dL/dscore of the j-th choice (see the CPU twin): dp_j, or (dp_j - c) / Z
// when renormalised.
__device__ __forceinline__ float dscore(float dp_j, bool renormalize, float Z, float c) {
  return renormalize ? (dp_j - c) / Z : dp_j;
}

template <typename T>
__global__ void router_backward_kernel(T* dlogits, const float* dprobs, const std::int32_t* experts,
                                       const float* scores, std::int64_t N, std::int64_t E, std::int64_t k,
                                       bool renormalize) {
  const std::int64_t n = thread_id();
  if (n >= N) return;
  const float* s = scores + n * E;
  const float* dp = dprobs + n * k;
  const std::int32_t* ex = experts + n * k;
  float Z = 0.0f, c = 0.0f;
  if (renormalize) {
    for (std::int64_t j = 0; j < k; ++j) Z += s[ex[j]];
    for (std::int64_t j = 0; j < k; ++j) c += dp[j] * s[ex[j]] / Z;
  }
  float dot = 0.0f;  // sum_e ds_e s_e
  for (std::int64_t j = 0; j < k; ++j) dot += dscore(dp[j], renormalize, Z, c) * s[ex[j]];
  for (std::int64_t e = 0; e < E; ++e) {
    float ds = 0.0f;
    for (std::int64_t j = 0; j < k; ++j)
      if (ex[j] == e) ds = dscore(dp[j], renormalize, Z, c);
    dlogits[n * E + e] = from_float<T>(s[e] * (ds - dot));
  }
}

// Block e: counts[e], and rows [offset_e, offset_e + counts[e]) in slot order.
__global__ void permute_indices_kernel(std::int32_t* row_to_slot, std::int32_t* slot_to_row, std::int64_t* counts,
                                       const std::int32_t* experts, std::int64_t slots) {
  __shared__ long long scratch[32];
  __shared__ int warp_hits[32];
  const int e = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  long long before = 0, mine = 0;
  for (std::int64_t s = threadIdx.x; s < slots; s += blockDim.x) {
    before += experts[s] < e;
    mine += experts[s] == e;
  }
  long long base = detail::block_sum(before, scratch);
  mine = detail::block_sum(mine, scratch);
  if (threadIdx.x == 0) counts[e] = mine;
  for (std::int64_t s0 = 0; s0 < slots; s0 += blockDim.x) {
    const std::int64_t s = s0 + threadIdx.x;
    const bool hit = s < slots && experts[s] == e;
    const unsigned ballot = __ballot_sync(kFullMask, hit);
    __syncthreads();  // warp_hits of the previous chunk are read
    if (lane == 0) warp_hits[warp] = __popc(ballot);
    __syncthreads();
    int before_warp = 0, chunk = 0;
    for (int w = 0; w < warps; ++w) {
      before_warp += w < warp ? warp_hits[w] : 0;
      chunk += warp_hits[w];
    }
    if (hit) {
      const long long r = base + before_warp + __popc(ballot & ((1u << lane) - 1u));
      row_to_slot[r] = static_cast<std::int32_t>(s);
      slot_to_row[s] = static_cast<std::int32_t>(r);
    }
    base += chunk;
  }
}

// permuted row r = inp row row_to_slot[r] / k.
template <typename T>
__global__ void permute_forward_kernel(T* permuted, const T* inp, const std::int32_t* row_to_slot, std::int64_t C,
                                       std::int64_t k) {
  const std::int64_t r = blockIdx.x;
  const std::int64_t n = row_to_slot[r] / k;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) permuted[r * C + c] = inp[n * C + c];
}

// out row n = sum over j of probs[n, j] (1 if probs is null) * rows row slot_to_row[n * k + j]:
// the permute backward and the unpermute forward.
template <typename T>
__global__ void gather_sum_kernel(T* out, const T* rows, const float* probs, const std::int32_t* slot_to_row,
                                  std::int64_t C, std::int64_t k) {
  const std::int64_t n = blockIdx.x;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float y = 0.0f;
    for (std::int64_t j = 0; j < k; ++j) {
      const float w = probs != nullptr ? probs[n * k + j] : 1.0f;
      y += w * to_float(rows[static_cast<std::int64_t>(slot_to_row[n * k + j]) * C + c]);
    }
    out[n * C + c] = from_float<T>(y);
  }
}

// Block per slot s: dexpert_out row slot_to_row[s] = probs[s] dout[s / k], dprobs[s] = dout[s / k] . expert_out row.
template <typename T>
__global__ void unpermute_backward_kernel(T* dexpert_out, float* dprobs, const T* dout, const T* expert_out,
                                          const float* probs, const std::int32_t* slot_to_row, std::int64_t C,
                                          std::int64_t k) {
  __shared__ float scratch[32];
  const std::int64_t s = blockIdx.x, n = s / k, r = slot_to_row[s];
  float dot = 0.0f;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float g = to_float(dout[n * C + c]);
    dexpert_out[r * C + c] = from_float<T>(probs[s] * g);
    dot += g * to_float(expert_out[r * C + c]);
  }
  dot = detail::block_sum(dot, scratch);
  if (threadIdx.x == 0) dprobs[s] = dot;
}

void check_moe(std::int64_t N, std::int64_t C, std::int64_t k) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && C >= 0 && k > 0 && N * k <= 2147483647);
}

}  // namespace

template <typename T>
void moe_router_forward(float* probs, std::int32_t* experts, float* scores, const T* logits, std::int64_t N,
                        std::int64_t E, std::int64_t k, bool renormalize, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && E > 0 && k > 0 && k <= E);
  if (N == 0) return;
  router_forward_kernel<T><<<detail::grid_size(N, kBlock, 1LL << 31), kBlock, 0, stream>>>(
      probs, experts, scores, logits, N, E, k, renormalize);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T>
void moe_router_backward(T* dlogits, const float* dprobs, const std::int32_t* experts, const float* scores,
                         std::int64_t N, std::int64_t E, std::int64_t k, bool renormalize, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && E > 0 && k > 0 && k <= E);
  if (N == 0) return;
  router_backward_kernel<T><<<detail::grid_size(N, kBlock, 1LL << 31), kBlock, 0, stream>>>(
      dlogits, dprobs, experts, scores, N, E, k, renormalize);
  MEGASCOPE_CUDA_LAUNCHED();
}

void moe_permute_indices(std::int32_t* row_to_slot, std::int32_t* slot_to_row, std::int64_t* counts,
                         const std::int32_t* experts, std::int64_t N, std::int64_t E, std::int64_t k,
                         cudaStream_t stream) {
  check_moe(N, 0, k);
  MEGASCOPE_KERNEL_REQUIRE(E > 0 && E <= 2147483647);
  // Expert ids are not range-checked on the device: ids outside [0, E) are
  // counted nowhere and leave their slots unassigned.
  permute_indices_kernel<<<static_cast<unsigned>(E), kBlock, 0, stream>>>(row_to_slot, slot_to_row, counts, experts,
                                                                          N * k);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T>
void moe_permute_forward(T* permuted, const T* inp, const std::int32_t* row_to_slot, std::int64_t N, std::int64_t C,
                         std::int64_t k, cudaStream_t stream) {
  check_moe(N, C, k);
  if (N * C == 0) return;
  permute_forward_kernel<T><<<static_cast<unsigned>(N * k), kBlock, 0, stream>>>(permuted, inp, row_to_slot, C, k);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T>
void moe_permute_backward(T* dinp, const T* dpermuted, const std::int32_t* slot_to_row, std::int64_t N, std::int64_t C,
                          std::int64_t k, cudaStream_t stream) {
  check_moe(N, C, k);
  if (N * C == 0) return;
  gather_sum_kernel<T><<<static_cast<unsigned>(N), kBlock, 0, stream>>>(dinp, dpermuted, nullptr, slot_to_row, C, k);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T>
void moe_unpermute_forward(T* out, const T* expert_out, const float* probs, const std::int32_t* slot_to_row,
                           std::int64_t N, std::int64_t C, std::int64_t k, cudaStream_t stream) {
  check_moe(N, C, k);
  MEGASCOPE_KERNEL_REQUIRE(probs != nullptr);
  if (N * C == 0) return;
  gather_sum_kernel<T><<<static_cast<unsigned>(N), kBlock, 0, stream>>>(out, expert_out, probs, slot_to_row, C, k);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T>
void moe_unpermute_backward(T* dexpert_out, float* dprobs, const T* dout, const T* expert_out, const float* probs,
                            const std::int32_t* slot_to_row, std::int64_t N, std::int64_t C, std::int64_t k,
                            cudaStream_t stream) {
  check_moe(N, C, k);
  if (N == 0) return;
  unpermute_backward_kernel<T><<<static_cast<unsigned>(N * k), kBlock, 0, stream>>>(
      dexpert_out, dprobs, dout, expert_out, probs, slot_to_row, C, k);
  MEGASCOPE_CUDA_LAUNCHED();
}

#define MEGASCOPE_INSTANTIATE(T)                                                                                      \
  template void moe_router_forward<T>(float*, std::int32_t*, float*, const T*, std::int64_t, std::int64_t,            \
                                      std::int64_t, bool, cudaStream_t);                                              \
  template void moe_router_backward<T>(T*, const float*, const std::int32_t*, const float*, std::int64_t,             \
                                       std::int64_t, std::int64_t, bool, cudaStream_t);                               \
  template void moe_permute_forward<T>(T*, const T*, const std::int32_t*, std::int64_t, std::int64_t, std::int64_t,   \
                                       cudaStream_t);                                                                 \
  template void moe_permute_backward<T>(T*, const T*, const std::int32_t*, std::int64_t, std::int64_t, std::int64_t,  \
                                        cudaStream_t);                                                                \
  template void moe_unpermute_forward<T>(T*, const T*, const float*, const std::int32_t*, std::int64_t, std::int64_t, \
                                         std::int64_t, cudaStream_t);                                                 \
  template void moe_unpermute_backward<T>(T*, float*, const T*, const T*, const float*, const std::int32_t*,          \
                                          std::int64_t, std::int64_t, std::int64_t, cudaStream_t);
MEGASCOPE_INSTANTIATE(float)
MEGASCOPE_INSTANTIATE(bf16)
MEGASCOPE_INSTANTIATE(fp16)
#undef MEGASCOPE_INSTANTIATE

}  // namespace megascope::kernels::cuda
