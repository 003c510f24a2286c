// CpuKernelOps: the CPU reference kernels behind exec/kernel_ops.hpp.
#include "exec/kernel_ops.hpp"

#include "kernels/activation.hpp"
#include "kernels/adamw.hpp"
#include "kernels/attention.hpp"
#include "kernels/bf16.hpp"
#include "kernels/cross_entropy.hpp"
#include "kernels/dropout.hpp"
#include "kernels/embedding.hpp"
#include "kernels/matmul.hpp"
#include "kernels/moe.hpp"
#include "kernels/norm.hpp"
#include "kernels/rope.hpp"

namespace megascope::exec {

namespace k = megascope::kernels;

void KernelOps::attention_forward_packed(float* out, float* lse, const float* q, const float* k, const float* v,
                                         const std::int32_t* q_pos, const std::int32_t* kv_pos,
                                         const std::int32_t* q_doc, const std::int32_t* kv_doc, std::int64_t B,
                                         std::int64_t Tq, std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv,
                                         std::int64_t D) {
  k::attention_forward_packed<float>(out, lse, q, k, v, q_pos, kv_pos, q_doc, kv_doc, B, Tq, Tk, Hq, Hkv, D);
}
void KernelOps::attention_backward_packed(float* dq, float* dk, float* dv, const float* dout, const float* q,
                                          const float* k, const float* v, const float* out, const float* lse,
                                          const std::int32_t* q_pos, const std::int32_t* kv_pos,
                                          const std::int32_t* q_doc, const std::int32_t* kv_doc, std::int64_t B,
                                          std::int64_t Tq, std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv,
                                          std::int64_t D) {
  k::attention_backward_packed<float>(dq, dk, dv, dout, q, k, v, out, lse, q_pos, kv_pos, q_doc, kv_doc, B, Tq, Tk, Hq,
                                      Hkv, D);
}

const float* CpuKernelOps::rounded(int slot, const float* x, std::int64_t n) {
  if (x == nullptr) return nullptr;
  std::vector<float>& v = scratch_[slot];
  v.assign(x, x + n);
  k::round_to_bf16(v.data(), n);
  return v.data();
}

void CpuKernelOps::matmul_forward(float* out, const float* inp, const float* weight, const float* bias, std::int64_t N,
                                  std::int64_t C, std::int64_t OC) {
  if (!bf16_) return k::matmul_forward<float>(out, inp, weight, bias, N, C, OC);
  k::matmul_forward<float>(out, rounded(0, inp, N * C), rounded(1, weight, OC * C), rounded(2, bias, OC), N, C, OC);
  k::round_to_bf16(out, N * OC);
}
void CpuKernelOps::matmul_backward_input(float* dinp, const float* dout, const float* weight, std::int64_t N,
                                         std::int64_t C, std::int64_t OC) {
  if (!bf16_) return k::matmul_backward_input<float>(dinp, dout, weight, N, C, OC);
  k::matmul_backward_input<float>(dinp, rounded(0, dout, N * OC), rounded(1, weight, OC * C), N, C, OC);
  k::round_to_bf16(dinp, N * C);
}
void CpuKernelOps::matmul_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp,
                                          std::int64_t N, std::int64_t C, std::int64_t OC) {
  if (!bf16_) return k::matmul_backward_weight<float>(dweight, dbias, dout, inp, N, C, OC);
  k::matmul_backward_weight<float>(dweight, dbias, rounded(0, dout, N * OC), rounded(1, inp, N * C), N, C, OC);
}
void CpuKernelOps::layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                     const float* bias, std::int64_t N, std::int64_t C, float eps) {
  k::layernorm_forward<float>(out, mean, rstd, inp, weight, bias, N, C, eps);
}
void CpuKernelOps::layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                      const float* weight, const float* mean, const float* rstd, std::int64_t N,
                                      std::int64_t C) {
  k::layernorm_backward<float>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}
void CpuKernelOps::rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, std::int64_t N,
                                   std::int64_t C, float eps) {
  k::rmsnorm_forward<float>(out, rstd, inp, weight, N, C, eps);
}
void CpuKernelOps::rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                                    const float* weight, const float* rstd, std::int64_t N, std::int64_t C) {
  k::rmsnorm_backward<float>(dinp, dweight, dout, inp, weight, rstd, N, C);
}
void CpuKernelOps::gelu_forward(float* out, const float* inp, std::int64_t n) { k::gelu_forward<float>(out, inp, n); }
void CpuKernelOps::gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n) {
  k::gelu_backward<float>(dinp, inp, dout, n);
}
void CpuKernelOps::swiglu_forward(float* out, const float* inp, std::int64_t N, std::int64_t F) {
  k::swiglu_forward<float>(out, inp, N, F);
}
void CpuKernelOps::swiglu_backward(float* dinp, const float* inp, const float* dout, std::int64_t N, std::int64_t F) {
  k::swiglu_backward<float>(dinp, inp, dout, N, F);
}
void CpuKernelOps::dropout_forward(float* out, const float* inp, std::int64_t n, float p, std::uint64_t seed,
                                   std::uint64_t offset) {
  k::dropout_forward<float>(out, inp, n, p, seed, offset);
}
void CpuKernelOps::dropout_backward(float* dinp, const float* dout, std::int64_t n, float p, std::uint64_t seed,
                                    std::uint64_t offset) {
  k::dropout_backward<float>(dinp, dout, n, p, seed, offset);
}
void CpuKernelOps::bias_dropout_add_forward(float* out, const float* inp, const float* bias, const float* residual,
                                            std::int64_t N, std::int64_t C, float p, std::uint64_t seed,
                                            std::uint64_t offset) {
  k::bias_dropout_add_forward<float>(out, inp, bias, residual, N, C, p, seed, offset);
}
void CpuKernelOps::bias_dropout_add_backward(float* dinp, float* dbias, const float* dout, std::int64_t N,
                                             std::int64_t C, float p, std::uint64_t seed, std::uint64_t offset) {
  k::bias_dropout_add_backward<float>(dinp, dbias, dout, N, C, p, seed, offset);
}
void CpuKernelOps::attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                                     const std::int32_t* q_pos, const std::int32_t* kv_pos, std::int64_t B,
                                     std::int64_t Tq, std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv,
                                     std::int64_t D) {
  k::attention_forward<float>(out, lse, q, k, v, q_pos, kv_pos, B, Tq, Tk, Hq, Hkv, D);
}
void CpuKernelOps::attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                                      const float* k, const float* v, const float* out, const float* lse,
                                      const std::int32_t* q_pos, const std::int32_t* kv_pos, std::int64_t B,
                                      std::int64_t Tq, std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv,
                                      std::int64_t D) {
  k::attention_backward<float>(dq, dk, dv, dout, q, k, v, out, lse, q_pos, kv_pos, B, Tq, Tk, Hq, Hkv, D);
}
void CpuKernelOps::rope_forward(float* out, const float* inp, const std::int32_t* pos, std::int64_t B, std::int64_t S,
                                std::int64_t H, std::int64_t D, float theta) {
  k::rope_forward<float>(out, inp, pos, B, S, H, D, theta);
}
void CpuKernelOps::rope_backward(float* dinp, const float* dout, const std::int32_t* pos, std::int64_t B,
                                 std::int64_t S, std::int64_t H, std::int64_t D, float theta) {
  k::rope_backward<float>(dinp, dout, pos, B, S, H, D, theta);
}
void CpuKernelOps::embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                                     const std::int32_t* pos, std::int64_t N, std::int64_t C, std::int64_t vocab_start,
                                     std::int64_t vocab_end) {
  k::embedding_forward<float>(out, tokens, wte, wpe, pos, N, C, vocab_start, vocab_end);
}
void CpuKernelOps::embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                                      const std::int32_t* pos, std::int64_t N, std::int64_t C, std::int64_t vocab_start,
                                      std::int64_t vocab_end) {
  k::embedding_backward<float>(dwte, dwpe, dout, tokens, pos, N, C, vocab_start, vocab_end);
}
void CpuKernelOps::cross_entropy_local_max(float* row_max, const float* logits, std::int64_t N, std::int64_t V) {
  k::cross_entropy_local_max<float>(row_max, logits, N, V);
}
void CpuKernelOps::cross_entropy_local_sumexp(float* sumexp, const float* logits, const float* row_max, std::int64_t N,
                                              std::int64_t V) {
  k::cross_entropy_local_sumexp<float>(sumexp, logits, row_max, N, V);
}
void CpuKernelOps::cross_entropy_local_target(float* target_logit, const float* logits, const std::int32_t* targets,
                                              std::int64_t N, std::int64_t V, std::int64_t vocab_start) {
  k::cross_entropy_local_target<float>(target_logit, logits, targets, N, V, vocab_start);
}
void CpuKernelOps::cross_entropy_loss(float* loss, const float* row_max, const float* sumexp, const float* target_logit,
                                      std::int64_t N) {
  k::cross_entropy_loss<float>(loss, row_max, sumexp, target_logit, N);
}
void CpuKernelOps::cross_entropy_backward(float* dlogits, const float* logits, const float* row_max,
                                          const float* sumexp, const std::int32_t* targets, const float* dloss,
                                          std::int64_t N, std::int64_t V, std::int64_t vocab_start) {
  k::cross_entropy_backward<float>(dlogits, logits, row_max, sumexp, targets, dloss, N, V, vocab_start);
}
void CpuKernelOps::adamw_update(float* params, const float* grads, float* m, float* v, std::int64_t n, float lr,
                                float beta1, float beta2, float eps, float weight_decay, std::int64_t step,
                                float grad_scale) {
  k::adamw_update<float>(params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, step, grad_scale);
}
void CpuKernelOps::moe_router_forward(float* probs, std::int32_t* experts, float* scores, const float* logits,
                                      std::int64_t N, std::int64_t E, std::int64_t k, bool renormalize) {
  k::moe_router_forward<float>(probs, experts, scores, logits, N, E, k, renormalize);
}
void CpuKernelOps::moe_router_backward(float* dlogits, const float* dprobs, const std::int32_t* experts,
                                       const float* scores, std::int64_t N, std::int64_t E, std::int64_t k,
                                       bool renormalize) {
  k::moe_router_backward<float>(dlogits, dprobs, experts, scores, N, E, k, renormalize);
}
void CpuKernelOps::moe_permute_indices(std::int32_t* row_to_slot, std::int32_t* slot_to_row, std::int64_t* counts,
                                       const std::int32_t* experts, std::int64_t N, std::int64_t E, std::int64_t k) {
  k::moe_permute_indices(row_to_slot, slot_to_row, counts, experts, N, E, k);
}
void CpuKernelOps::moe_permute_forward(float* permuted, const float* inp, const std::int32_t* row_to_slot,
                                       std::int64_t N, std::int64_t C, std::int64_t k) {
  k::moe_permute_forward<float>(permuted, inp, row_to_slot, N, C, k);
}
void CpuKernelOps::moe_permute_backward(float* dinp, const float* dpermuted, const std::int32_t* slot_to_row,
                                        std::int64_t N, std::int64_t C, std::int64_t k) {
  k::moe_permute_backward<float>(dinp, dpermuted, slot_to_row, N, C, k);
}
void CpuKernelOps::moe_unpermute_forward(float* out, const float* expert_out, const float* probs,
                                         const std::int32_t* slot_to_row, std::int64_t N, std::int64_t C,
                                         std::int64_t k) {
  k::moe_unpermute_forward<float>(out, expert_out, probs, slot_to_row, N, C, k);
}
void CpuKernelOps::moe_unpermute_backward(float* dexpert_out, float* dprobs, const float* dout, const float* expert_out,
                                          const float* probs, const std::int32_t* slot_to_row, std::int64_t N,
                                          std::int64_t C, std::int64_t k) {
  k::moe_unpermute_backward<float>(dexpert_out, dprobs, dout, expert_out, probs, slot_to_row, N, C, k);
}

double CpuKernelOps::sum_squares(const float* x, std::int64_t n) {
  double acc = 0;
  k::sum_squares<float>(&acc, x, n);
  return acc;
}

}  // namespace megascope::exec
