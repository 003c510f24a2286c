// CUDA twins of the CPU reference kernels (kernels/*.hpp), host-side
// launchers. Each takes the CPU twin's arguments in the same order, then the
// cudaStream_t it is queued on; pointers are device pointers.
//
// Element types: T is float, __nv_bfloat16 or __half (activations, weights,
// logits), with fp32 arithmetic inside. What is float whatever T is:
//   - per-row statistics: mean, rstd, lse, row_max, sumexp, target_logit, loss, dloss;
//   - accumulated parameter gradients: dweight, dbias, dwte, dwpe (Megatron's
//     fp32 main_grad; accumulated with fp32 atomics, so not bit-reproducible);
//   - AdamW's master params, m and v; router probs, scores, dprobs.
// Conventions (overwrite vs accumulate, nullable, shapes) are the CPU twin's:
// see kernels/README.md. Launchers never synchronise. Errors: bad arguments
// throw std::invalid_argument, CUDA errors std::runtime_error (cuda/check.hpp).
// Not here: GEMMs (exec/ uses cuBLASLt). Header kept C++17 for nvcc.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>

#include "kernels/nullable.hpp"

namespace megascope::kernels::cuda {

using bf16 = __nv_bfloat16;
using fp16 = __half;

// ---- activation.hpp -------------------------------------------------------
template <typename T>
void gelu_forward(T* out, const T* inp, std::int64_t n, cudaStream_t stream);
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, std::int64_t n, cudaStream_t stream);
template <typename T>
void swiglu_forward(T* out, const T* inp, std::int64_t N, std::int64_t F, cudaStream_t stream);
template <typename T>
void swiglu_backward(T* dinp, const T* inp, const T* dout, std::int64_t N, std::int64_t F, cudaStream_t stream);

// ---- dropout.hpp ----------------------------------------------------------
template <typename T>
void residual_forward(T* out, const T* a, const T* b, std::int64_t n, cudaStream_t stream);
template <typename T>
void dropout_forward(T* out, const T* inp, std::int64_t n, float p, std::uint64_t seed, std::uint64_t offset,
                     cudaStream_t stream);
template <typename T>
void dropout_backward(T* dinp, const T* dout, std::int64_t n, float p, std::uint64_t seed, std::uint64_t offset,
                      cudaStream_t stream);
template <typename T>
void bias_dropout_add_forward(T* out, const T* inp, nullable<const T> bias, const T* residual, std::int64_t N,
                              std::int64_t C, float p, std::uint64_t seed, std::uint64_t offset, cudaStream_t stream);
// dbias (C) += column sums of the (unrounded, fp32) dinp.
template <typename T>
void bias_dropout_add_backward(T* dinp, nullable<float> dbias, const T* dout, std::int64_t N, std::int64_t C, float p,
                               std::uint64_t seed, std::uint64_t offset, cudaStream_t stream);

// ---- norm.hpp -------------------------------------------------------------
template <typename T>
void layernorm_forward(T* out, nullable<float> mean, nullable<float> rstd, const T* inp, const T* weight,
                       nullable<const T> bias, std::int64_t N, std::int64_t C, float eps, cudaStream_t stream);
template <typename T>
void layernorm_backward(T* dinp, float* dweight, nullable<float> dbias, const T* dout, const T* inp, const T* weight,
                        const float* mean, const float* rstd, std::int64_t N, std::int64_t C, cudaStream_t stream);
template <typename T>
void rmsnorm_forward(T* out, nullable<float> rstd, const T* inp, const T* weight, std::int64_t N, std::int64_t C,
                     float eps, cudaStream_t stream);
template <typename T>
void rmsnorm_backward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight, const float* rstd,
                      std::int64_t N, std::int64_t C, cudaStream_t stream);

// ---- attention.hpp (head dim D <= 256; B, Hq <= 65535) ---------------------
template <typename T>
void attention_forward(T* out, float* lse, const T* q, const T* k, const T* v, const std::int32_t* q_pos /*nullable*/,
                       const std::int32_t* kv_pos /*nullable*/, std::int64_t B, std::int64_t Tq, std::int64_t Tk,
                       std::int64_t Hq, std::int64_t Hkv, std::int64_t D, bool causal, std::optional<float> scale,
                       cudaStream_t stream);
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const float* lse, const std::int32_t* q_pos /*nullable*/,
                        const std::int32_t* kv_pos /*nullable*/, std::int64_t B, std::int64_t Tq, std::int64_t Tk,
                        std::int64_t Hq, std::int64_t Hkv, std::int64_t D, bool causal, std::optional<float> scale,
                        cudaStream_t stream);
template <typename T>
void attention_merge(T* out, float* lse, const T* out2, const float* lse2, std::int64_t B, std::int64_t Tq,
                     std::int64_t H, std::int64_t D, cudaStream_t stream);

// ---- rope.hpp (angles in fp32: pos * theta^(-2i/D), sincosf) ---------------
template <typename T>
void rope_forward(T* out, const T* inp, const std::int32_t* pos /*nullable*/, std::int64_t B, std::int64_t S,
                  std::int64_t H, std::int64_t D, float theta, cudaStream_t stream);
template <typename T>
void rope_backward(T* dinp, const T* dout, const std::int32_t* pos /*nullable*/, std::int64_t B, std::int64_t S,
                   std::int64_t H, std::int64_t D, float theta, cudaStream_t stream);

// ---- embedding.hpp --------------------------------------------------------
template <typename T>
void embedding_forward(T* out, const std::int32_t* tokens, const T* wte, nullable<const T> wpe,
                       const std::int32_t* pos /*nullable*/, std::int64_t N, std::int64_t C, std::int64_t vocab_start,
                       std::int64_t vocab_end, cudaStream_t stream);
template <typename T>
void embedding_backward(float* dwte, nullable<float> dwpe, const T* dout, const std::int32_t* tokens,
                        const std::int32_t* pos /*nullable*/, std::int64_t N, std::int64_t C, std::int64_t vocab_start,
                        std::int64_t vocab_end, cudaStream_t stream);

// ---- cross_entropy.hpp ----------------------------------------------------
template <typename T>
void cross_entropy_local_max(float* row_max, const T* logits, std::int64_t N, std::int64_t V, cudaStream_t stream);
template <typename T>
void cross_entropy_local_sumexp(float* sumexp, const T* logits, const float* row_max, std::int64_t N, std::int64_t V,
                                cudaStream_t stream);
template <typename T>
void cross_entropy_local_target(float* target_logit, const T* logits, const std::int32_t* targets, std::int64_t N,
                                std::int64_t V, std::int64_t vocab_start, cudaStream_t stream);
void cross_entropy_loss(float* loss, const float* row_max, const float* sumexp, const float* target_logit,
                        std::int64_t N, cudaStream_t stream);
template <typename T>
void cross_entropy_backward(T* dlogits, const T* logits, const float* row_max, const float* sumexp,
                            const std::int32_t* targets, const float* dloss, std::int64_t N, std::int64_t V,
                            std::int64_t vocab_start, cudaStream_t stream);

// ---- adamw.hpp (params, m, v fp32; grads T) -------------------------------
template <typename T>
void adamw_update(float* params, const T* grads, float* m, float* v, std::int64_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, std::int64_t step, float grad_scale, cudaStream_t stream);
// *acc (one double in device memory) += sum of x^2.
template <typename T>
void sum_squares(double* acc, const T* x, std::int64_t n, cudaStream_t stream);
template <typename T>
void scale_inplace(T* x, std::int64_t n, float s, cudaStream_t stream);

// ---- moe.hpp (one thread per token: fine for E up to a few hundred) ---------
template <typename T>
void moe_router_forward(float* probs, std::int32_t* experts, float* scores, const T* logits, std::int64_t N,
                        std::int64_t E, std::int64_t k, bool renormalize, cudaStream_t stream);
template <typename T>
void moe_router_backward(T* dlogits, const float* dprobs, const std::int32_t* experts, const float* scores,
                         std::int64_t N, std::int64_t E, std::int64_t k, bool renormalize, cudaStream_t stream);
// Same order as the CPU twin (by expert, then slot): deterministic.
void moe_permute_indices(std::int32_t* row_to_slot, std::int32_t* slot_to_row, std::int64_t* counts,
                         const std::int32_t* experts, std::int64_t N, std::int64_t E, std::int64_t k,
                         cudaStream_t stream);
template <typename T>
void moe_permute_forward(T* permuted, const T* inp, const std::int32_t* row_to_slot, std::int64_t N, std::int64_t C,
                         std::int64_t k, cudaStream_t stream);
template <typename T>
void moe_permute_backward(T* dinp, const T* dpermuted, const std::int32_t* slot_to_row, std::int64_t N, std::int64_t C,
                          std::int64_t k, cudaStream_t stream);
template <typename T>
void moe_unpermute_forward(T* out, const T* expert_out, const float* probs, const std::int32_t* slot_to_row,
                           std::int64_t N, std::int64_t C, std::int64_t k, cudaStream_t stream);
template <typename T>
void moe_unpermute_backward(T* dexpert_out, float* dprobs, const T* dout, const T* expert_out, const float* probs,
                            const std::int32_t* slot_to_row, std::int64_t N, std::int64_t C, std::int64_t k,
                            cudaStream_t stream);

}  // namespace megascope::kernels::cuda
