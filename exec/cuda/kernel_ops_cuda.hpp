// The cuda backend's training kernels: exec/kernel_ops.hpp on the CUDA
// twins (kernels/cuda/kernels.hpp) and cuBLASLt (exec/cuda/gemm.hpp), in
// fp32 (no TF32), one stream, each call waited for before it returns, so
// that the training rank (exec/cpu_rank.hpp), its host-side bookkeeping and
// its MPI communicators run unchanged over buffers the host and the device
// share: ManagedMemory, a memory resource of CUDA managed memory, made the
// default polymorphic-allocator resource for the run (ManagedDefault).
//
// This is the numerics path of the GPU backend (the losses of a plan on the
// GPU kernels, to compare with the cpu backend), not its speed path: every
// kernel synchronises, collectives and pipeline transfers go through host
// copies and MPI (exec/comm.hpp, StagedGroups). Timing runs are the replay's
// (exec/cuda/replay_cuda.hpp). Without a device the constructors throw
// NoCudaDevice.
#pragma once

#include <cuda_runtime_api.h>

#include <memory_resource>

#include "exec/cuda/gemm.hpp"
#include "exec/kernel_ops.hpp"
#include "exec/runner.hpp"

namespace megascope::exec::cuda {

class CudaKernelOps final : public KernelOps {
 public:
  CudaKernelOps();
  ~CudaKernelOps() override;
  CudaKernelOps(const CudaKernelOps&) = delete;
  CudaKernelOps& operator=(const CudaKernelOps&) = delete;
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, std::int64_t N,
                      std::int64_t C, std::int64_t OC) override;
  void matmul_backward_input(float* dinp, const float* dout, const float* weight, std::int64_t N, std::int64_t C,
                             std::int64_t OC) override;
  void matmul_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp, std::int64_t N,
                              std::int64_t C, std::int64_t OC) override;
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                         std::int64_t N, std::int64_t C, float eps) override;
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* mean, const float* rstd, std::int64_t N,
                          std::int64_t C) override;
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, std::int64_t N, std::int64_t C,
                       float eps) override;
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                        const float* rstd, std::int64_t N, std::int64_t C) override;
  void gelu_forward(float* out, const float* inp, std::int64_t n) override;
  void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n) override;
  void swiglu_forward(float* out, const float* inp, std::int64_t N, std::int64_t F) override;
  void swiglu_backward(float* dinp, const float* inp, const float* dout, std::int64_t N, std::int64_t F) override;
  void dropout_forward(float* out, const float* inp, std::int64_t n, float p, std::uint64_t seed,
                       std::uint64_t offset) override;
  void dropout_backward(float* dinp, const float* dout, std::int64_t n, float p, std::uint64_t seed,
                        std::uint64_t offset) override;
  void bias_dropout_add_forward(float* out, const float* inp, const float* bias, const float* residual, std::int64_t N,
                                std::int64_t C, float p, std::uint64_t seed, std::uint64_t offset) override;
  void bias_dropout_add_backward(float* dinp, float* dbias, const float* dout, std::int64_t N, std::int64_t C, float p,
                                 std::uint64_t seed, std::uint64_t offset) override;
  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         const std::int32_t* q_pos, const std::int32_t* kv_pos, std::int64_t B, std::int64_t Tq,
                         std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv, std::int64_t D) override;
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                          const float* v, const float* out, const float* lse, const std::int32_t* q_pos,
                          const std::int32_t* kv_pos, std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t Hq,
                          std::int64_t Hkv, std::int64_t D) override;
  void rope_forward(float* out, const float* inp, const std::int32_t* pos, std::int64_t B, std::int64_t S,
                    std::int64_t H, std::int64_t D, float theta) override;
  void rope_backward(float* dinp, const float* dout, const std::int32_t* pos, std::int64_t B, std::int64_t S,
                     std::int64_t H, std::int64_t D, float theta) override;
  void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                         const std::int32_t* pos, std::int64_t N, std::int64_t C, std::int64_t vocab_start,
                         std::int64_t vocab_end) override;
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                          const std::int32_t* pos, std::int64_t N, std::int64_t C, std::int64_t vocab_start,
                          std::int64_t vocab_end) override;
  void cross_entropy_local_max(float* row_max, const float* logits, std::int64_t N, std::int64_t V) override;
  void cross_entropy_local_sumexp(float* sumexp, const float* logits, const float* row_max, std::int64_t N,
                                  std::int64_t V) override;
  void cross_entropy_local_target(float* target_logit, const float* logits, const std::int32_t* targets, std::int64_t N,
                                  std::int64_t V, std::int64_t vocab_start) override;
  void cross_entropy_loss(float* loss, const float* row_max, const float* sumexp, const float* target_logit,
                          std::int64_t N) override;
  void cross_entropy_backward(float* dlogits, const float* logits, const float* row_max, const float* sumexp,
                              const std::int32_t* targets, const float* dloss, std::int64_t N, std::int64_t V,
                              std::int64_t vocab_start) override;
  void adamw_update(float* params, const float* grads, float* m, float* v, std::int64_t n, float lr, float beta1,
                    float beta2, float eps, float weight_decay, std::int64_t step, float grad_scale) override;
  void moe_router_forward(float* probs, std::int32_t* experts, float* scores, const float* logits, std::int64_t N,
                          std::int64_t E, std::int64_t k, bool renormalize) override;
  void moe_router_backward(float* dlogits, const float* dprobs, const std::int32_t* experts, const float* scores,
                           std::int64_t N, std::int64_t E, std::int64_t k, bool renormalize) override;
  void moe_permute_indices(std::int32_t* row_to_slot, std::int32_t* slot_to_row, std::int64_t* counts,
                           const std::int32_t* experts, std::int64_t N, std::int64_t E, std::int64_t k) override;
  void moe_permute_forward(float* permuted, const float* inp, const std::int32_t* row_to_slot, std::int64_t N,
                           std::int64_t C, std::int64_t k) override;
  void moe_permute_backward(float* dinp, const float* dpermuted, const std::int32_t* slot_to_row, std::int64_t N,
                            std::int64_t C, std::int64_t k) override;
  void moe_unpermute_forward(float* out, const float* expert_out, const float* probs, const std::int32_t* slot_to_row,
                             std::int64_t N, std::int64_t C, std::int64_t k) override;
  void moe_unpermute_backward(float* dexpert_out, float* dprobs, const float* dout, const float* expert_out,
                              const float* probs, const std::int32_t* slot_to_row, std::int64_t N, std::int64_t C,
                              std::int64_t k) override;
  double sum_squares(const float* x, std::int64_t n) override;
  [[nodiscard]] const char* name() const override { return name_.c_str(); }

 private:
  void done();  // waits for the stream (and surfaces an asynchronous error)
  cudaStream_t stream_ = nullptr;
  Gemm gemm_;
  double* acc_ = nullptr;  // sum_squares's accumulator (managed)
  std::string name_;
};

// cudaMallocManaged / cudaFree: memory the host and the device both address.
class ManagedMemory final : public std::pmr::memory_resource {
 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment) override;
  [[nodiscard]] bool do_is_equal(const std::pmr::memory_resource& o) const noexcept override { return this == &o; }
};

// Makes `resource` the default polymorphic-allocator resource for its
// lifetime (the previous one is restored after).
class ManagedDefault {
 public:
  explicit ManagedDefault(std::pmr::memory_resource* resource) : previous_(std::pmr::set_default_resource(resource)) {}
  ~ManagedDefault() { std::pmr::set_default_resource(previous_); }
  ManagedDefault(const ManagedDefault&) = delete;
  ManagedDefault& operator=(const ManagedDefault&) = delete;

 private:
  std::pmr::memory_resource* previous_;
};

// run_cpu's training (exec/runner.hpp) on this process's GPU (selected by its
// rank on the node): managed memory as the default resource, CudaKernelOps,
// communicators on host copies. Throws NoCudaDevice without a device; an
// error on one rank of a multi-rank job aborts the job with a line naming
// the rank (the others may be waiting for it in a collective).
Result<std::vector<StepLog>> run_cuda_training(const Setup& s, const Program& p, const RunOptions& o,
                                               std::ostream& out);

}  // namespace megascope::exec::cuda
