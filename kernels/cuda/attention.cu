// CUDA softmax attention, FlashAttention-style: K/V are streamed through
// shared memory in tiles of 32 keys, scores never go to global memory, the
// forward keeps an online softmax (running max and sum) per query row, and
// the backward recomputes P from the saved lse (FlashAttention-2's split:
// one kernel for dq over query rows, one for dk/dv over key tiles, no atomics
// in global memory; delta = rowsum(dO * O) is recomputed where needed).
//
// Mapping: one warp per query row, lane j owns key j of the tile for the
// scores, lane d owns head-dim entries d, d+32, ... of the accumulators.
// CUDA cores, fp32 math; head dim D <= 256; GQA and positions as the CPU twin.
// Does not: tensor cores (mma/wgmma), TMA, skip fully masked tiles by index
// (positions may be arbitrary; a tile nobody sees costs its load only).
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.hpp"

namespace megascope::kernels::cuda {

namespace {

using detail::from_float;
using detail::kFullMask;
using detail::to_float;
using detail::warp_max;
using detail::warp_sum;

constexpr int kWarps = 8;  // query rows per block (forward, dq); warps per block (dk/dv)
constexpr int kTile = 32;  // keys per tile = warp size
constexpr int kMaxD = 256;
constexpr int kMaxR = kMaxD / 32;  // head-dim entries per lane

struct Args {
  std::int64_t B, Tq, Tk, Hq, Hkv, D;
  float scale;
  bool causal;
  const std::int32_t* q_pos;
  const std::int32_t* kv_pos;
};

__device__ __forceinline__ std::int64_t q_position(const Args& a, std::int64_t i) {
  return a.q_pos != nullptr ? a.q_pos[i] : i;
}
__device__ __forceinline__ std::int64_t kv_position(const Args& a, std::int64_t j) {
  return a.kv_pos != nullptr ? a.kv_pos[j] : j;
}

// Index of (b, t, h, d) in a (B, T, H, D) tensor.
__device__ __forceinline__ std::int64_t at(std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d,
                                           std::int64_t T, std::int64_t H, std::int64_t D) {
  return ((b * T + t) * H + h) * D + d;
}

// Loads keys [j0, j0 + kTile) of KV head hk into Ks, Vs (kTile, D + 1), zeros past Tk.
template <typename T>
__device__ void load_tile(float* Ks, float* Vs, const T* k, const T* v, std::int64_t b, std::int64_t hk,
                          std::int64_t j0, const Args& a) {
  const int D = static_cast<int>(a.D), ld = D + 1;
  for (int e = threadIdx.x; e < kTile * D; e += blockDim.x) {
    const int jj = e / D, d = e % D;
    const std::int64_t j = j0 + jj;
    float kv = 0.0f, vv = 0.0f;
    if (j < a.Tk) {
      const std::int64_t idx = at(b, j, hk, d, a.Tk, a.Hkv, a.D);
      kv = to_float(k[idx]);
      vv = to_float(v[idx]);
    }
    Ks[jj * ld + d] = kv;
    Vs[jj * ld + d] = vv;
  }
}

__device__ __forceinline__ float dot_row(const float* x, const float* row, int D) {
  float s = 0.0f;
  for (int d = 0; d < D; ++d) s += x[d] * row[d];
  return s;
}

template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    attention_forward_kernel(T* out, float* lse, const T* q, const T* k, const T* v, Args a) {
  extern __shared__ float smem[];
  const int D = static_cast<int>(a.D), ld = D + 1;
  float* Ks = smem;             // (kTile, D + 1)
  float* Vs = Ks + kTile * ld;  // (kTile, D + 1)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* qs = Vs + kTile * ld + warp * D;  // (D): this warp's query row, pre-scaled
  const std::int64_t b = blockIdx.z, h = blockIdx.y, hk = h / (a.Hq / a.Hkv);
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kWarps + warp;
  const bool row = i < a.Tq;
  const std::int64_t qp = row ? q_position(a, i) : 0;
  if (row)
    for (int d = lane; d < D; d += 32) qs[d] = to_float(q[at(b, i, h, d, a.Tq, a.Hq, a.D)]) * a.scale;
  float m = -INFINITY, l = 0.0f, acc[kMaxR];
#pragma unroll
  for (int r = 0; r < kMaxR; ++r) acc[r] = 0.0f;

  for (std::int64_t j0 = 0; j0 < a.Tk; j0 += kTile) {
    __syncthreads();  // the previous tile is consumed (and qs written)
    load_tile(Ks, Vs, k, v, b, hk, j0, a);
    __syncthreads();
    if (!row) continue;
    const std::int64_t j = j0 + lane;
    const bool vis = j < a.Tk && (!a.causal || kv_position(a, j) <= qp);
    if (!__any_sync(kFullMask, vis)) continue;
    const float s = vis ? dot_row(qs, Ks + lane * ld, D) : -INFINITY;
    const float m_new = fmaxf(m, warp_max(s));  // finite: some lane is visible
    const float p = vis ? expf(s - m_new) : 0.0f;
    const float corr = expf(m - m_new);  // 0 on the first visible tile
    l = l * corr + warp_sum(p);
#pragma unroll
    for (int r = 0; r < kMaxR; ++r) acc[r] *= corr;
    for (int jj = 0; jj < kTile; ++jj) {
      const float pj = __shfl_sync(kFullMask, p, jj);
      const float* vrow = Vs + jj * ld;
#pragma unroll
      for (int r = 0; r < kMaxR; ++r) {
        const int d = lane + 32 * r;
        if (d < D) acc[r] += pj * vrow[d];
      }
    }
    m = m_new;
  }
  if (!row) return;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int r = 0; r < kMaxR; ++r) {
    const int d = lane + 32 * r;
    if (d < D) out[at(b, i, h, d, a.Tq, a.Hq, a.D)] = from_float<T>(acc[r] * inv);
  }
  if (lane == 0) lse[(b * a.Hq + h) * a.Tq + i] = l > 0.0f ? m + logf(l) : -INFINITY;
}

// dq_i = scale sum_j P_ij (dP_ij - delta_i) k_j, one warp per query row.
template <typename T>
__global__ void __launch_bounds__(kWarps * 32) attention_dq_kernel(T* dq, const T* dout, const T* q, const T* k,
                                                                   const T* v, const T* out, const float* lse, Args a) {
  extern __shared__ float smem[];
  const int D = static_cast<int>(a.D), ld = D + 1;
  float* Ks = smem;
  float* Vs = Ks + kTile * ld;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* qs = Vs + kTile * ld + warp * D;  // (D) scaled query row
  float* dos = qs + kWarps * D;            // (D) dout row
  const std::int64_t b = blockIdx.z, h = blockIdx.y, hk = h / (a.Hq / a.Hkv);
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kWarps + warp;
  const bool row = i < a.Tq;
  float L = -INFINITY, delta = 0.0f;
  std::int64_t qp = 0;
  if (row) {
    L = lse[(b * a.Hq + h) * a.Tq + i];
    qp = q_position(a, i);
    float dd = 0.0f;
    for (int d = lane; d < D; d += 32) {
      const std::int64_t idx = at(b, i, h, d, a.Tq, a.Hq, a.D);
      qs[d] = to_float(q[idx]) * a.scale;
      dos[d] = to_float(dout[idx]);
      dd += dos[d] * to_float(out[idx]);
    }
    delta = warp_sum(dd);
  }
  const bool live = row && L != -INFINITY;  // a row with no visible key has zero gradient
  float acc[kMaxR];
#pragma unroll
  for (int r = 0; r < kMaxR; ++r) acc[r] = 0.0f;

  for (std::int64_t j0 = 0; j0 < a.Tk; j0 += kTile) {
    __syncthreads();
    load_tile(Ks, Vs, k, v, b, hk, j0, a);
    __syncthreads();
    if (!live) continue;
    const std::int64_t j = j0 + lane;
    const bool vis = j < a.Tk && (!a.causal || kv_position(a, j) <= qp);
    if (!__any_sync(kFullMask, vis)) continue;
    float ds = 0.0f;
    if (vis) {
      const float p = expf(dot_row(qs, Ks + lane * ld, D) - L);
      ds = p * (dot_row(dos, Vs + lane * ld, D) - delta);
    }
    for (int jj = 0; jj < kTile; ++jj) {
      const float dsj = __shfl_sync(kFullMask, ds, jj);
      const float* krow = Ks + jj * ld;
#pragma unroll
      for (int r = 0; r < kMaxR; ++r) {
        const int d = lane + 32 * r;
        if (d < D) acc[r] += dsj * krow[d];
      }
    }
  }
  if (!row) return;
#pragma unroll
  for (int r = 0; r < kMaxR; ++r) {
    const int d = lane + 32 * r;
    if (d < D) dq[at(b, i, h, d, a.Tq, a.Hq, a.D)] = from_float<T>(acc[r] * a.scale);
  }
}

// dv_j = sum_i P_ij dO_i and dk_j = scale sum_i dS_ij q_i over every query
// row of every query head of KV head hk; one block per tile of 32 keys, its
// warps taking query rows in turn and adding into shared accumulators.
template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    attention_dkdv_kernel(T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                          const float* lse, Args a) {
  extern __shared__ float smem[];
  const int D = static_cast<int>(a.D), ld = D + 1;
  float* Ks = smem;              // (kTile, D + 1)
  float* Vs = Ks + kTile * ld;   // (kTile, D + 1)
  float* dKs = Vs + kTile * ld;  // (kTile, D)
  float* dVs = dKs + kTile * D;  // (kTile, D)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* qs = dVs + kTile * D + warp * D;  // (D)
  float* dos = qs + kWarps * D;            // (D)
  const std::int64_t b = blockIdx.z, hk = blockIdx.y, j0 = static_cast<std::int64_t>(blockIdx.x) * kTile;
  load_tile(Ks, Vs, k, v, b, hk, j0, a);
  for (int e = threadIdx.x; e < 2 * kTile * D; e += blockDim.x) dKs[e] = 0.0f;  // dKs and dVs
  __syncthreads();
  const std::int64_t j = j0 + lane;
  const bool key = j < a.Tk;
  const std::int64_t kp = key ? kv_position(a, j) : 0;
  const std::int64_t group = a.Hq / a.Hkv, rows = group * a.Tq;
  for (std::int64_t r = warp; r < rows; r += kWarps) {
    const std::int64_t h = hk * group + r / a.Tq, i = r % a.Tq;
    const float L = lse[(b * a.Hq + h) * a.Tq + i];
    if (L == -INFINITY) continue;
    const bool vis = key && (!a.causal || kp <= q_position(a, i));
    if (!__any_sync(kFullMask, vis)) continue;
    __syncwarp();  // the previous row's qs, dos are consumed
    float dd = 0.0f;
    for (int d = lane; d < D; d += 32) {
      const std::int64_t idx = at(b, i, h, d, a.Tq, a.Hq, a.D);
      qs[d] = to_float(q[idx]) * a.scale;
      dos[d] = to_float(dout[idx]);
      dd += dos[d] * to_float(out[idx]);
    }
    __syncwarp();  // qs, dos visible to the whole warp
    const float delta = warp_sum(dd);
    float p = 0.0f, ds = 0.0f;
    if (vis) {
      p = expf(dot_row(qs, Ks + lane * ld, D) - L);
      ds = p * (dot_row(dos, Vs + lane * ld, D) - delta);
    }
    for (int jj = 0; jj < kTile; ++jj) {
      const float pj = __shfl_sync(kFullMask, p, jj), dsj = __shfl_sync(kFullMask, ds, jj);
      if (pj == 0.0f && dsj == 0.0f) continue;  // the same for the whole warp
#pragma unroll
      for (int rr = 0; rr < kMaxR; ++rr) {
        const int d = lane + 32 * rr;
        if (d < D) {
          atomicAdd(&dVs[jj * D + d], pj * dos[d]);
          atomicAdd(&dKs[jj * D + d], dsj * qs[d]);  // qs carries the scale
        }
      }
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kTile * D; e += blockDim.x) {
    const int jj = e / D, d = e % D;
    if (j0 + jj >= a.Tk) continue;
    const std::int64_t idx = at(b, j0 + jj, hk, d, a.Tk, a.Hkv, a.D);
    dk[idx] = from_float<T>(dKs[e]);
    dv[idx] = from_float<T>(dVs[e]);
  }
}

template <typename T>
__global__ void attention_merge_kernel(T* out, float* lse, const T* out2, const float* lse2, std::int64_t B,
                                       std::int64_t Tq, std::int64_t H, std::int64_t D) {
  const std::int64_t rows = B * H * Tq;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < rows;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t t = e % Tq, h = (e / Tq) % H, b = e / (Tq * H);  // e = (b * H + h) * Tq + t
    const float l1 = lse[e], l2 = lse2[e], mx = fmaxf(l1, l2);
    if (mx == -INFINITY) continue;
    const float merged = mx + logf(expf(l1 - mx) + expf(l2 - mx));
    const float w1 = expf(l1 - merged), w2 = expf(l2 - merged);
    for (std::int64_t d = 0; d < D; ++d) {
      const std::int64_t idx = at(b, t, h, d, Tq, H, D);
      out[idx] = from_float<T>(w1 * to_float(out[idx]) + w2 * to_float(out2[idx]));
    }
    lse[e] = merged;
  }
}

Args make_args(std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv, std::int64_t D,
               bool causal, std::optional<float> scale, const std::int32_t* q_pos, const std::int32_t* kv_pos) {
  MEGASCOPE_KERNEL_REQUIRE(B >= 0 && Tq >= 0 && Tk >= 0 && D > 0 && D <= kMaxD);
  MEGASCOPE_KERNEL_REQUIRE(Hkv > 0 && Hq > 0 && Hq % Hkv == 0 && B <= 65535 && Hq <= 65535);
  const float sc = scale ? *scale : 1.0f / std::sqrt(static_cast<float>(D));
  return Args{B, Tq, Tk, Hq, Hkv, D, sc, causal, q_pos, kv_pos};
}

}  // namespace

template <typename T>
void attention_forward(T* out, float* lse, const T* q, const T* k, const T* v, const std::int32_t* q_pos,
                       const std::int32_t* kv_pos, std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t Hq,
                       std::int64_t Hkv, std::int64_t D, bool causal, std::optional<float> scale, cudaStream_t stream) {
  const Args a = make_args(B, Tq, Tk, Hq, Hkv, D, causal, scale, q_pos, kv_pos);
  if (B * Tq * Hq == 0) return;
  const std::size_t smem = (2 * kTile * (D + 1) + kWarps * D) * sizeof(float);
  detail::allow_smem(attention_forward_kernel<T>, smem);
  const dim3 grid(static_cast<unsigned>((Tq + kWarps - 1) / kWarps), static_cast<unsigned>(Hq),
                  static_cast<unsigned>(B));
  attention_forward_kernel<T><<<grid, kWarps * 32, smem, stream>>>(out, lse, q, k, v, a);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const float* lse, const std::int32_t* q_pos, const std::int32_t* kv_pos, std::int64_t B,
                        std::int64_t Tq, std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv, std::int64_t D,
                        bool causal, std::optional<float> scale, cudaStream_t stream) {
  const Args a = make_args(B, Tq, Tk, Hq, Hkv, D, causal, scale, q_pos, kv_pos);
  if (B * Tq * Hq > 0) {
    const std::size_t smem = (2 * kTile * (D + 1) + 2 * kWarps * D) * sizeof(float);
    detail::allow_smem(attention_dq_kernel<T>, smem);
    const dim3 grid(static_cast<unsigned>((Tq + kWarps - 1) / kWarps), static_cast<unsigned>(Hq),
                    static_cast<unsigned>(B));
    attention_dq_kernel<T><<<grid, kWarps * 32, smem, stream>>>(dq, dout, q, k, v, out, lse, a);
    MEGASCOPE_CUDA_LAUNCHED();
  }
  if (B * Tk * Hkv > 0) {  // with Tq == 0 this writes zeros
    const std::size_t smem = (2 * kTile * (D + 1) + 2 * kTile * D + 2 * kWarps * D) * sizeof(float);
    detail::allow_smem(attention_dkdv_kernel<T>, smem);
    const dim3 grid(static_cast<unsigned>((Tk + kTile - 1) / kTile), static_cast<unsigned>(Hkv),
                    static_cast<unsigned>(B));
    attention_dkdv_kernel<T><<<grid, kWarps * 32, smem, stream>>>(dk, dv, dout, q, k, v, out, lse, a);
    MEGASCOPE_CUDA_LAUNCHED();
  }
}

template <typename T>
void attention_merge(T* out, float* lse, const T* out2, const float* lse2, std::int64_t B, std::int64_t Tq,
                     std::int64_t H, std::int64_t D, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(B >= 0 && Tq >= 0 && H >= 0 && D >= 0);
  const std::int64_t rows = B * H * Tq;
  if (rows == 0) return;
  attention_merge_kernel<T><<<detail::grid_size(rows, 256), 256, 0, stream>>>(out, lse, out2, lse2, B, Tq, H, D);
  MEGASCOPE_CUDA_LAUNCHED();
}

#define MEGASCOPE_INSTANTIATE(T)                                                                                  \
  template void attention_forward<T>(T*, float*, const T*, const T*, const T*, const std::int32_t*,               \
                                     const std::int32_t*, std::int64_t, std::int64_t, std::int64_t, std::int64_t, \
                                     std::int64_t, std::int64_t, bool, std::optional<float>, cudaStream_t);       \
  template void attention_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, const float*, \
                                      const std::int32_t*, const std::int32_t*, std::int64_t, std::int64_t,       \
                                      std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool,               \
                                      std::optional<float>, cudaStream_t);                                        \
  template void attention_merge<T>(T*, float*, const T*, const float*, std::int64_t, std::int64_t, std::int64_t,  \
                                   std::int64_t, cudaStream_t);
MEGASCOPE_INSTANTIATE(float)
MEGASCOPE_INSTANTIATE(bf16)
MEGASCOPE_INSTANTIATE(fp16)
#undef MEGASCOPE_INSTANTIATE

}  // namespace megascope::kernels::cuda
