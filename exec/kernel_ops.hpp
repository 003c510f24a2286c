// The kernels a training rank calls (exec/cpu_rank.hpp), as one interface
// with two implementations: CpuKernelOps, the CPU reference kernels
// (kernels/*.hpp), and the CUDA backend's (exec/cuda/kernel_ops_cuda.hpp:
// the CUDA twins and cuBLASLt on memory the host can also read). The
// signatures are the fp32 instances of kernels/*.hpp, in the same argument
// order; the conventions (overwrite or accumulate, nullable pointers,
// shapes) are theirs (kernels/README.md). A null `bias`, `dbias`, `mean`,
// `wpe`, `dwpe` or position pointer means "absent", as there.
//
// bf16 GEMMs (a constructor flag of both implementations): the three
// matmul_* calls take their operands rounded to bf16 (round to nearest
// even), multiply and accumulate in fp32, and round the forward and
// input-gradient outputs to bf16, as cuBLASLt's bf16 GEMMs with fp32
// compute do; the weight gradient accumulates in fp32 (Megatron-LM's fp32
// main_grad). Everything else stays fp32: norms, softmax and attention, the
// loss, and the fp32 master weights of the optimizer. This is the numerics of
// Megatron-LM's --bf16 for the linear layers; activations between kernels
// are held in fp32.
//
// The attention is causal with the default scale 1/sqrt(D). sum_squares
// returns the sum of x^2 in double. When a call returns, its outputs are
// complete and readable by the host (a device backend synchronises).
#pragma once

#include <cstdint>
#include <vector>

namespace megascope::exec {

// Every kernel of KernelOps as X(name, (parameters)): the interface and its
// implementations declare them from this one list.
#define MEGASCOPE_KERNEL_OPS(X)                                                                                        \
  X(matmul_forward, (float* out, const float* inp, const float* weight, const float* bias, std::int64_t N,             \
                     std::int64_t C, std::int64_t OC))                                                                 \
  X(matmul_backward_input,                                                                                             \
    (float* dinp, const float* dout, const float* weight, std::int64_t N, std::int64_t C, std::int64_t OC))            \
  X(matmul_backward_weight, (float* dweight, float* dbias, const float* dout, const float* inp, std::int64_t N,        \
                             std::int64_t C, std::int64_t OC))                                                         \
  X(layernorm_forward, (float* out, float* mean, float* rstd, const float* inp, const float* weight,                   \
                        const float* bias, std::int64_t N, std::int64_t C, float eps))                                 \
  X(layernorm_backward, (float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,               \
                         const float* weight, const float* mean, const float* rstd, std::int64_t N, std::int64_t C))   \
  X(rmsnorm_forward,                                                                                                   \
    (float* out, float* rstd, const float* inp, const float* weight, std::int64_t N, std::int64_t C, float eps))       \
  X(rmsnorm_backward, (float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,          \
                       const float* rstd, std::int64_t N, std::int64_t C))                                             \
  X(gelu_forward, (float* out, const float* inp, std::int64_t n))                                                      \
  X(gelu_backward, (float* dinp, const float* inp, const float* dout, std::int64_t n))                                 \
  X(swiglu_forward, (float* out, const float* inp, std::int64_t N, std::int64_t F))                                    \
  X(swiglu_backward, (float* dinp, const float* inp, const float* dout, std::int64_t N, std::int64_t F))               \
  X(dropout_forward,                                                                                                   \
    (float* out, const float* inp, std::int64_t n, float p, std::uint64_t seed, std::uint64_t offset))                 \
  X(dropout_backward,                                                                                                  \
    (float* dinp, const float* dout, std::int64_t n, float p, std::uint64_t seed, std::uint64_t offset))               \
  X(bias_dropout_add_forward, (float* out, const float* inp, const float* bias, const float* residual, std::int64_t N, \
                               std::int64_t C, float p, std::uint64_t seed, std::uint64_t offset))                     \
  X(bias_dropout_add_backward, (float* dinp, float* dbias, const float* dout, std::int64_t N, std::int64_t C, float p, \
                                std::uint64_t seed, std::uint64_t offset))                                             \
  X(attention_forward, (float* out, float* lse, const float* q, const float* k, const float* v,                        \
                        const std::int32_t* q_pos, const std::int32_t* kv_pos, std::int64_t B, std::int64_t Tq,        \
                        std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv, std::int64_t D))                           \
  X(attention_backward,                                                                                                \
    (float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,               \
     const float* out, const float* lse, const std::int32_t* q_pos, const std::int32_t* kv_pos, std::int64_t B,        \
     std::int64_t Tq, std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv, std::int64_t D))                             \
  X(rope_forward, (float* out, const float* inp, const std::int32_t* pos, std::int64_t B, std::int64_t S,              \
                   std::int64_t H, std::int64_t D, float theta))                                                       \
  X(rope_backward, (float* dinp, const float* dout, const std::int32_t* pos, std::int64_t B, std::int64_t S,           \
                    std::int64_t H, std::int64_t D, float theta))                                                      \
  X(embedding_forward,                                                                                                 \
    (float* out, const std::int32_t* tokens, const float* wte, const float* wpe, const std::int32_t* pos,              \
     std::int64_t N, std::int64_t C, std::int64_t vocab_start, std::int64_t vocab_end))                                \
  X(embedding_backward,                                                                                                \
    (float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, const std::int32_t* pos, std::int64_t N, \
     std::int64_t C, std::int64_t vocab_start, std::int64_t vocab_end))                                                \
  X(cross_entropy_local_max, (float* row_max, const float* logits, std::int64_t N, std::int64_t V))                    \
  X(cross_entropy_local_sumexp,                                                                                        \
    (float* sumexp, const float* logits, const float* row_max, std::int64_t N, std::int64_t V))                        \
  X(cross_entropy_local_target, (float* target_logit, const float* logits, const std::int32_t* targets,                \
                                 std::int64_t N, std::int64_t V, std::int64_t vocab_start))                            \
  X(cross_entropy_loss,                                                                                                \
    (float* loss, const float* row_max, const float* sumexp, const float* target_logit, std::int64_t N))               \
  X(cross_entropy_backward,                                                                                            \
    (float* dlogits, const float* logits, const float* row_max, const float* sumexp, const std::int32_t* targets,      \
     const float* dloss, std::int64_t N, std::int64_t V, std::int64_t vocab_start))                                    \
  X(adamw_update, (float* params, const float* grads, float* m, float* v, std::int64_t n, float lr, float beta1,       \
                   float beta2, float eps, float weight_decay, std::int64_t step, float grad_scale))                   \
  X(moe_router_forward, (float* probs, std::int32_t* experts, float* scores, const float* logits, std::int64_t N,      \
                         std::int64_t E, std::int64_t k, bool renormalize))                                            \
  X(moe_router_backward, (float* dlogits, const float* dprobs, const std::int32_t* experts, const float* scores,       \
                          std::int64_t N, std::int64_t E, std::int64_t k, bool renormalize))                           \
  X(moe_permute_indices, (std::int32_t * row_to_slot, std::int32_t * slot_to_row, std::int64_t * counts,               \
                          const std::int32_t* experts, std::int64_t N, std::int64_t E, std::int64_t k))                \
  X(moe_permute_forward, (float* permuted, const float* inp, const std::int32_t* row_to_slot, std::int64_t N,          \
                          std::int64_t C, std::int64_t k))                                                             \
  X(moe_permute_backward, (float* dinp, const float* dpermuted, const std::int32_t* slot_to_row, std::int64_t N,       \
                           std::int64_t C, std::int64_t k))                                                            \
  X(moe_unpermute_forward, (float* out, const float* expert_out, const float* probs, const std::int32_t* slot_to_row,  \
                            std::int64_t N, std::int64_t C, std::int64_t k))                                           \
  X(moe_unpermute_backward,                                                                                            \
    (float* dexpert_out, float* dprobs, const float* dout, const float* expert_out, const float* probs,                \
     const std::int32_t* slot_to_row, std::int64_t N, std::int64_t C, std::int64_t k))
#define MEGASCOPE_KERNEL_OP_PURE(name, params) virtual void name params = 0;
#define MEGASCOPE_KERNEL_OP_OVERRIDE(name, params) void name params override;

class KernelOps {
 public:
  virtual ~KernelOps() = default;
  MEGASCOPE_KERNEL_OPS(MEGASCOPE_KERNEL_OP_PURE)
  virtual double sum_squares(const float* x, std::int64_t n) = 0;
  // Packed sequences (variable-length training): attention_forward /
  // _backward masked by document as well, q_doc (B, Tq) and kv_doc (B, Tk)
  // one id per row (kernels/attention.hpp attention_forward_packed). Outside
  // the list above, with the CPU reference as the default: a backend that
  // has no twin of its own does not have to declare one. Only the cpu
  // backend trains packed sequences (exec/runner.cpp refuses the others).
  virtual void attention_forward_packed(float* out, float* lse, const float* q, const float* k, const float* v,
                                        const std::int32_t* q_pos, const std::int32_t* kv_pos,
                                        const std::int32_t* q_doc, const std::int32_t* kv_doc, std::int64_t B,
                                        std::int64_t Tq, std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv,
                                        std::int64_t D);
  virtual void attention_backward_packed(float* dq, float* dk, float* dv, const float* dout, const float* q,
                                         const float* k, const float* v, const float* out, const float* lse,
                                         const std::int32_t* q_pos, const std::int32_t* kv_pos,
                                         const std::int32_t* q_doc, const std::int32_t* kv_doc, std::int64_t B,
                                         std::int64_t Tq, std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv,
                                         std::int64_t D);
  // What runs the kernels, for messages ("cpu", "cuda: NVIDIA H100 ...").
  [[nodiscard]] virtual const char* name() const = 0;
};

// The CPU reference kernels (kernels/*.hpp).
class CpuKernelOps final : public KernelOps {
 public:
  explicit CpuKernelOps(bool bf16_gemms = false) : bf16_(bf16_gemms) {}
  MEGASCOPE_KERNEL_OPS(MEGASCOPE_KERNEL_OP_OVERRIDE)
  double sum_squares(const float* x, std::int64_t n) override;
  [[nodiscard]] const char* name() const override { return bf16_ ? "cpu (bf16 GEMMs)" : "cpu"; }

 private:
  // A bf16-rounded copy of x[0, n) in scratch slot `slot` (null stays null).
  const float* rounded(int slot, const float* x, std::int64_t n);
  bool bf16_ = false;
  std::vector<float> scratch_[3];
};

}  // namespace megascope::exec
