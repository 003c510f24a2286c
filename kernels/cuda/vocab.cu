// CUDA vocab-parallel embedding and cross-entropy pieces (the two kernels
// that touch the vocabulary dimension). Embedding: one block per token row;
// the backward adds into the fp32 dwte/dwpe with atomics (repeated tokens
// collide; the order of the additions varies). Cross-entropy: one block per
// row for the reductions over V, fp32 statistics whatever the logits' type.
// Does not: sort tokens for a deterministic embedding backward, fuse the
// pieces (the TP all-reduces sit between them).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.hpp"

namespace megascope::kernels::cuda {

namespace {

using detail::from_float;
using detail::to_float;

constexpr int kBlock = 256;

template <typename T>
__global__ void embedding_forward_kernel(T* out, const std::int32_t* tokens, const T* wte, const T* wpe,
                                         const std::int32_t* pos, std::int64_t C, std::int64_t vocab_start,
                                         std::int64_t vocab_end) {
  const std::int64_t n = blockIdx.x;
  const std::int64_t tok = tokens[n];
  const bool local = tok >= vocab_start && tok < vocab_end;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float y = local ? to_float(wte[(tok - vocab_start) * C + c]) : 0.0f;
    if (wpe != nullptr) y += to_float(wpe[static_cast<std::int64_t>(pos[n]) * C + c]);
    out[n * C + c] = from_float<T>(y);
  }
}

template <typename T>
__global__ void embedding_backward_kernel(float* dwte, float* dwpe, const T* dout, const std::int32_t* tokens,
                                          const std::int32_t* pos, std::int64_t C, std::int64_t vocab_start,
                                          std::int64_t vocab_end) {
  const std::int64_t n = blockIdx.x;
  const std::int64_t tok = tokens[n];
  const bool local = tok >= vocab_start && tok < vocab_end;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float g = to_float(dout[n * C + c]);
    if (local) atomicAdd(&dwte[(tok - vocab_start) * C + c], g);
    if (dwpe != nullptr) atomicAdd(&dwpe[static_cast<std::int64_t>(pos[n]) * C + c], g);
  }
}

template <typename T>
__global__ void row_max_kernel(float* row_max, const T* logits, std::int64_t V) {
  __shared__ float scratch[32];
  const T* l = logits + static_cast<std::int64_t>(blockIdx.x) * V;
  float m = -INFINITY;
  for (std::int64_t v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, to_float(l[v]));
  m = detail::block_max(m, scratch);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

template <typename T>
__global__ void sumexp_kernel(float* sumexp, const T* logits, const float* row_max, std::int64_t V) {
  __shared__ float scratch[32];
  const T* l = logits + static_cast<std::int64_t>(blockIdx.x) * V;
  const float m = row_max[blockIdx.x];
  float s = 0.0f;
  for (std::int64_t v = threadIdx.x; v < V; v += blockDim.x) s += expf(to_float(l[v]) - m);
  s = detail::block_sum(s, scratch);
  if (threadIdx.x == 0) sumexp[blockIdx.x] = s;
}

template <typename T>
__global__ void target_kernel(float* target_logit, const T* logits, const std::int32_t* targets, std::int64_t N,
                              std::int64_t V, std::int64_t vocab_start) {
  const std::int64_t n = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const std::int64_t local = static_cast<std::int64_t>(targets[n]) - vocab_start;
  target_logit[n] = (local >= 0 && local < V) ? to_float(logits[n * V + local]) : 0.0f;
}

__global__ void loss_kernel(float* loss, const float* row_max, const float* sumexp, const float* target_logit,
                            std::int64_t N) {
  const std::int64_t n = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n < N) loss[n] = logf(sumexp[n]) + row_max[n] - target_logit[n];
}

template <typename T>
__global__ void xent_backward_kernel(T* dlogits, const T* logits, const float* row_max, const float* sumexp,
                                     const std::int32_t* targets, const float* dloss, std::int64_t V,
                                     std::int64_t vocab_start) {
  const std::int64_t n = blockIdx.x;
  const float m = row_max[n], inv = 1.0f / sumexp[n], g = dloss[n];
  const std::int64_t local = static_cast<std::int64_t>(targets[n]) - vocab_start;
  for (std::int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float p = expf(to_float(logits[n * V + v]) - m) * inv;
    dlogits[n * V + v] = from_float<T>((p - (v == local ? 1.0f : 0.0f)) * g);
  }
}

void check_rows(std::int64_t N) { MEGASCOPE_KERNEL_REQUIRE(N >= 0 && N <= 2147483647); }

}  // namespace

template <typename T>
void embedding_forward(T* out, const std::int32_t* tokens, const T* wte, nullable<const T> wpe, const std::int32_t* pos,
                       std::int64_t N, std::int64_t C, std::int64_t vocab_start, std::int64_t vocab_end,
                       cudaStream_t stream) {
  check_rows(N);
  MEGASCOPE_KERNEL_REQUIRE(C >= 0 && vocab_start >= 0 && vocab_end >= vocab_start &&
                           (wpe == nullptr || pos != nullptr));
  if (N == 0 || C == 0) return;
  embedding_forward_kernel<T>
      <<<static_cast<unsigned>(N), kBlock, 0, stream>>>(out, tokens, wte, wpe, pos, C, vocab_start, vocab_end);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T>
void embedding_backward(float* dwte, nullable<float> dwpe, const T* dout, const std::int32_t* tokens,
                        const std::int32_t* pos, std::int64_t N, std::int64_t C, std::int64_t vocab_start,
                        std::int64_t vocab_end, cudaStream_t stream) {
  check_rows(N);
  MEGASCOPE_KERNEL_REQUIRE(C >= 0 && vocab_start >= 0 && vocab_end >= vocab_start &&
                           (dwpe == nullptr || pos != nullptr));
  if (N == 0 || C == 0) return;
  embedding_backward_kernel<T>
      <<<static_cast<unsigned>(N), kBlock, 0, stream>>>(dwte, dwpe, dout, tokens, pos, C, vocab_start, vocab_end);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T>
void cross_entropy_local_max(float* row_max, const T* logits, std::int64_t N, std::int64_t V, cudaStream_t stream) {
  check_rows(N);
  MEGASCOPE_KERNEL_REQUIRE(V >= 0);
  if (N == 0) return;
  row_max_kernel<T><<<static_cast<unsigned>(N), kBlock, 0, stream>>>(row_max, logits, V);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T>
void cross_entropy_local_sumexp(float* sumexp, const T* logits, const float* row_max, std::int64_t N, std::int64_t V,
                                cudaStream_t stream) {
  check_rows(N);
  MEGASCOPE_KERNEL_REQUIRE(V >= 0);
  if (N == 0) return;
  sumexp_kernel<T><<<static_cast<unsigned>(N), kBlock, 0, stream>>>(sumexp, logits, row_max, V);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T>
void cross_entropy_local_target(float* target_logit, const T* logits, const std::int32_t* targets, std::int64_t N,
                                std::int64_t V, std::int64_t vocab_start, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && V >= 0 && vocab_start >= 0);
  if (N == 0) return;
  target_kernel<T><<<detail::grid_size(N, kBlock, 1LL << 31), kBlock, 0, stream>>>(target_logit, logits, targets, N, V,
                                                                                   vocab_start);
  MEGASCOPE_CUDA_LAUNCHED();
}

void cross_entropy_loss(float* loss, const float* row_max, const float* sumexp, const float* target_logit,
                        std::int64_t N, cudaStream_t stream) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0);
  if (N == 0) return;
  loss_kernel<<<detail::grid_size(N, kBlock, 1LL << 31), kBlock, 0, stream>>>(loss, row_max, sumexp, target_logit, N);
  MEGASCOPE_CUDA_LAUNCHED();
}

template <typename T>
void cross_entropy_backward(T* dlogits, const T* logits, const float* row_max, const float* sumexp,
                            const std::int32_t* targets, const float* dloss, std::int64_t N, std::int64_t V,
                            std::int64_t vocab_start, cudaStream_t stream) {
  check_rows(N);
  MEGASCOPE_KERNEL_REQUIRE(V >= 0 && vocab_start >= 0);
  if (N == 0 || V == 0) return;
  xent_backward_kernel<T><<<static_cast<unsigned>(N), kBlock, 0, stream>>>(dlogits, logits, row_max, sumexp, targets,
                                                                           dloss, V, vocab_start);
  MEGASCOPE_CUDA_LAUNCHED();
}

#define MEGASCOPE_INSTANTIATE(T)                                                                                       \
  template void embedding_forward<T>(T*, const std::int32_t*, const T*, nullable<const T>, const std::int32_t*,        \
                                     std::int64_t, std::int64_t, std::int64_t, std::int64_t, cudaStream_t);            \
  template void embedding_backward<T>(float*, nullable<float>, const T*, const std::int32_t*, const std::int32_t*,     \
                                      std::int64_t, std::int64_t, std::int64_t, std::int64_t, cudaStream_t);           \
  template void cross_entropy_local_max<T>(float*, const T*, std::int64_t, std::int64_t, cudaStream_t);                \
  template void cross_entropy_local_sumexp<T>(float*, const T*, const float*, std::int64_t, std::int64_t,              \
                                              cudaStream_t);                                                           \
  template void cross_entropy_local_target<T>(float*, const T*, const std::int32_t*, std::int64_t, std::int64_t,       \
                                              std::int64_t, cudaStream_t);                                             \
  template void cross_entropy_backward<T>(T*, const T*, const float*, const float*, const std::int32_t*, const float*, \
                                          std::int64_t, std::int64_t, std::int64_t, cudaStream_t);
MEGASCOPE_INSTANTIATE(float)
MEGASCOPE_INSTANTIATE(bf16)
MEGASCOPE_INSTANTIATE(fp16)
#undef MEGASCOPE_INSTANTIATE

}  // namespace megascope::kernels::cuda
