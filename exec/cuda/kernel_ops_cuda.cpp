// CudaKernelOps and ManagedMemory (exec/cuda/kernel_ops_cuda.hpp).
#include "exec/cuda/kernel_ops_cuda.hpp"

#include <memory_resource>

#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <new>
#include <optional>

#include "exec/cuda/check.hpp"
#include "exec/cuda/device.hpp"
#include "exec/cuda/device_kernels.hpp"
#include "exec/cuda/nccl_comm.hpp"
#include "exec/mpi_env.hpp"
#include "kernels/cuda/kernels.hpp"

namespace megascope::exec::cuda {

namespace ku = megascope::kernels::cuda;

CudaKernelOps::CudaKernelOps(bool bf16_gemms) : bf16_(bf16_gemms) {
  require_device();
  MEGASCOPE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  MEGASCOPE_CUDA_CHECK(cudaMallocManaged(reinterpret_cast<void**>(&acc_), sizeof(double)));
  const DeviceInfo d = device_info();
  name_ = fmt::format("cuda: {} (cc {}.{}){}", d.name, d.cc_major, d.cc_minor, bf16_ ? ", bf16 GEMMs" : "");
}

CudaKernelOps::~CudaKernelOps() {
  if (acc_) (void)cudaFree(acc_);
  if (stream_) (void)cudaStreamDestroy(stream_);
}

void CudaKernelOps::done() {
  MEGASCOPE_CUDA_CHECK(cudaGetLastError());
  MEGASCOPE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

bf16* CudaKernelOps::staged(int slot, const float* x, std::int64_t n) {
  if (x == nullptr) return nullptr;
  DeviceBuffer<bf16>& b = scratch_[static_cast<std::size_t>(slot)];
  if (b.size() < static_cast<std::size_t>(n)) b = DeviceBuffer<bf16>(static_cast<std::size_t>(n));
  to_bf16(b.get(), x, n, stream_);
  return b.get();
}

bf16* CudaKernelOps::output(std::int64_t n) {
  DeviceBuffer<bf16>& b = scratch_[3];
  if (b.size() < static_cast<std::size_t>(n)) b = DeviceBuffer<bf16>(static_cast<std::size_t>(n));
  return b.get();
}

void CudaKernelOps::matmul_forward(float* out, const float* inp, const float* weight, const float* bias, std::int64_t N,
                                   std::int64_t C, std::int64_t OC) {
  if (!bf16_) {
    gemm_.forward<float>(out, inp, weight, bias, N, C, OC, stream_);
  } else {
    const bf16 *a = staged(0, inp, N * C), *w = staged(1, weight, OC * C), *b = staged(2, bias, OC);
    gemm_.forward<bf16>(output(N * OC), a, w, b, N, C, OC, stream_);
    from_bf16(out, scratch_[3].get(), N * OC, stream_);
  }
  done();
}

void CudaKernelOps::matmul_backward_input(float* dinp, const float* dout, const float* weight, std::int64_t N,
                                          std::int64_t C, std::int64_t OC) {
  if (!bf16_) {
    gemm_.backward_input<float>(dinp, dout, weight, N, C, OC, stream_);
  } else {
    const bf16 *g = staged(0, dout, N * OC), *w = staged(1, weight, OC * C);
    gemm_.backward_input<bf16>(output(N * C), g, w, N, C, OC, stream_);
    from_bf16(dinp, scratch_[3].get(), N * C, stream_);
  }
  done();
}

void CudaKernelOps::matmul_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp,
                                           std::int64_t N, std::int64_t C, std::int64_t OC) {
  if (!bf16_)
    gemm_.backward_weight<float>(dweight, dbias, dout, inp, N, C, OC, stream_);
  else   // bf16 operands, the fp32 gradient accumulates (Megatron-LM's main_grad)
    gemm_.backward_weight<bf16>(dweight, dbias, staged(0, dout, N * OC), staged(1, inp, N * C), N, C, OC, stream_);
  done();
}

void CudaKernelOps::layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                      const float* bias, std::int64_t N, std::int64_t C, float eps) {
  ku::layernorm_forward<float>(out, mean, rstd, inp, weight, bias, N, C, eps, stream_);
  done();
}

void CudaKernelOps::layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                       const float* weight, const float* mean, const float* rstd, std::int64_t N,
                                       std::int64_t C) {
  ku::layernorm_backward<float>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, stream_);
  done();
}

void CudaKernelOps::rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, std::int64_t N,
                                    std::int64_t C, float eps) {
  ku::rmsnorm_forward<float>(out, rstd, inp, weight, N, C, eps, stream_);
  done();
}

void CudaKernelOps::rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                                     const float* weight, const float* rstd, std::int64_t N, std::int64_t C) {
  ku::rmsnorm_backward<float>(dinp, dweight, dout, inp, weight, rstd, N, C, stream_);
  done();
}

void CudaKernelOps::gelu_forward(float* out, const float* inp, std::int64_t n) {
  ku::gelu_forward<float>(out, inp, n, stream_);
  done();
}

void CudaKernelOps::gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n) {
  ku::gelu_backward<float>(dinp, inp, dout, n, stream_);
  done();
}

void CudaKernelOps::swiglu_forward(float* out, const float* inp, std::int64_t N, std::int64_t F) {
  ku::swiglu_forward<float>(out, inp, N, F, stream_);
  done();
}

void CudaKernelOps::swiglu_backward(float* dinp, const float* inp, const float* dout, std::int64_t N, std::int64_t F) {
  ku::swiglu_backward<float>(dinp, inp, dout, N, F, stream_);
  done();
}

void CudaKernelOps::dropout_forward(float* out, const float* inp, std::int64_t n, float p, std::uint64_t seed,
                                    std::uint64_t offset) {
  ku::dropout_forward<float>(out, inp, n, p, seed, offset, stream_);
  done();
}

void CudaKernelOps::dropout_backward(float* dinp, const float* dout, std::int64_t n, float p, std::uint64_t seed,
                                     std::uint64_t offset) {
  ku::dropout_backward<float>(dinp, dout, n, p, seed, offset, stream_);
  done();
}

void CudaKernelOps::bias_dropout_add_forward(float* out, const float* inp, const float* bias, const float* residual,
                                             std::int64_t N, std::int64_t C, float p, std::uint64_t seed,
                                             std::uint64_t offset) {
  ku::bias_dropout_add_forward<float>(out, inp, bias, residual, N, C, p, seed, offset, stream_);
  done();
}

void CudaKernelOps::bias_dropout_add_backward(float* dinp, float* dbias, const float* dout, std::int64_t N,
                                              std::int64_t C, float p, std::uint64_t seed, std::uint64_t offset) {
  ku::bias_dropout_add_backward<float>(dinp, dbias, dout, N, C, p, seed, offset, stream_);
  done();
}

void CudaKernelOps::attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                                      const std::int32_t* q_pos, const std::int32_t* kv_pos, std::int64_t B,
                                      std::int64_t Tq, std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv,
                                      std::int64_t D) {
  ku::attention_forward<float>(out, lse, q, k, v, q_pos, kv_pos, B, Tq, Tk, Hq, Hkv, D, true, std::nullopt, stream_);
  done();
}

void CudaKernelOps::attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                                       const float* k, const float* v, const float* out, const float* lse,
                                       const std::int32_t* q_pos, const std::int32_t* kv_pos, std::int64_t B,
                                       std::int64_t Tq, std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv,
                                       std::int64_t D) {
  ku::attention_backward<float>(dq, dk, dv, dout, q, k, v, out, lse, q_pos, kv_pos, B, Tq, Tk, Hq, Hkv, D, true,
                                std::nullopt, stream_);
  done();
}

void CudaKernelOps::rope_forward(float* out, const float* inp, const std::int32_t* pos, std::int64_t B, std::int64_t S,
                                 std::int64_t H, std::int64_t D, float theta) {
  ku::rope_forward<float>(out, inp, pos, B, S, H, D, theta, stream_);
  done();
}

void CudaKernelOps::rope_backward(float* dinp, const float* dout, const std::int32_t* pos, std::int64_t B,
                                  std::int64_t S, std::int64_t H, std::int64_t D, float theta) {
  ku::rope_backward<float>(dinp, dout, pos, B, S, H, D, theta, stream_);
  done();
}

void CudaKernelOps::embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                                      const std::int32_t* pos, std::int64_t N, std::int64_t C, std::int64_t vocab_start,
                                      std::int64_t vocab_end) {
  ku::embedding_forward<float>(out, tokens, wte, wpe, pos, N, C, vocab_start, vocab_end, stream_);
  done();
}

void CudaKernelOps::embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                                       const std::int32_t* pos, std::int64_t N, std::int64_t C,
                                       std::int64_t vocab_start, std::int64_t vocab_end) {
  ku::embedding_backward<float>(dwte, dwpe, dout, tokens, pos, N, C, vocab_start, vocab_end, stream_);
  done();
}

void CudaKernelOps::cross_entropy_local_max(float* row_max, const float* logits, std::int64_t N, std::int64_t V) {
  ku::cross_entropy_local_max<float>(row_max, logits, N, V, stream_);
  done();
}

void CudaKernelOps::cross_entropy_local_sumexp(float* sumexp, const float* logits, const float* row_max, std::int64_t N,
                                               std::int64_t V) {
  ku::cross_entropy_local_sumexp<float>(sumexp, logits, row_max, N, V, stream_);
  done();
}

void CudaKernelOps::cross_entropy_local_target(float* target_logit, const float* logits, const std::int32_t* targets,
                                               std::int64_t N, std::int64_t V, std::int64_t vocab_start) {
  ku::cross_entropy_local_target<float>(target_logit, logits, targets, N, V, vocab_start, stream_);
  done();
}

void CudaKernelOps::cross_entropy_loss(float* loss, const float* row_max, const float* sumexp,
                                       const float* target_logit, std::int64_t N) {
  ku::cross_entropy_loss(loss, row_max, sumexp, target_logit, N, stream_);
  done();
}

void CudaKernelOps::cross_entropy_backward(float* dlogits, const float* logits, const float* row_max,
                                           const float* sumexp, const std::int32_t* targets, const float* dloss,
                                           std::int64_t N, std::int64_t V, std::int64_t vocab_start) {
  ku::cross_entropy_backward<float>(dlogits, logits, row_max, sumexp, targets, dloss, N, V, vocab_start, stream_);
  done();
}

void CudaKernelOps::adamw_update(float* params, const float* grads, float* m, float* v, std::int64_t n, float lr,
                                 float beta1, float beta2, float eps, float weight_decay, std::int64_t step,
                                 float grad_scale) {
  ku::adamw_update<float>(params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, step, grad_scale, stream_);
  done();
}

void CudaKernelOps::moe_router_forward(float* probs, std::int32_t* experts, float* scores, const float* logits,
                                       std::int64_t N, std::int64_t E, std::int64_t k, bool renormalize) {
  ku::moe_router_forward<float>(probs, experts, scores, logits, N, E, k, renormalize, stream_);
  done();
}

void CudaKernelOps::moe_router_backward(float* dlogits, const float* dprobs, const std::int32_t* experts,
                                        const float* scores, std::int64_t N, std::int64_t E, std::int64_t k,
                                        bool renormalize) {
  ku::moe_router_backward<float>(dlogits, dprobs, experts, scores, N, E, k, renormalize, stream_);
  done();
}

void CudaKernelOps::moe_permute_indices(std::int32_t* row_to_slot, std::int32_t* slot_to_row, std::int64_t* counts,
                                        const std::int32_t* experts, std::int64_t N, std::int64_t E, std::int64_t k) {
  ku::moe_permute_indices(row_to_slot, slot_to_row, counts, experts, N, E, k, stream_);
  done();
}

void CudaKernelOps::moe_permute_forward(float* permuted, const float* inp, const std::int32_t* row_to_slot,
                                        std::int64_t N, std::int64_t C, std::int64_t k) {
  ku::moe_permute_forward<float>(permuted, inp, row_to_slot, N, C, k, stream_);
  done();
}

void CudaKernelOps::moe_permute_backward(float* dinp, const float* dpermuted, const std::int32_t* slot_to_row,
                                         std::int64_t N, std::int64_t C, std::int64_t k) {
  ku::moe_permute_backward<float>(dinp, dpermuted, slot_to_row, N, C, k, stream_);
  done();
}

void CudaKernelOps::moe_unpermute_forward(float* out, const float* expert_out, const float* probs,
                                          const std::int32_t* slot_to_row, std::int64_t N, std::int64_t C,
                                          std::int64_t k) {
  ku::moe_unpermute_forward<float>(out, expert_out, probs, slot_to_row, N, C, k, stream_);
  done();
}

void CudaKernelOps::moe_unpermute_backward(float* dexpert_out, float* dprobs, const float* dout,
                                           const float* expert_out, const float* probs, const std::int32_t* slot_to_row,
                                           std::int64_t N, std::int64_t C, std::int64_t k) {
  ku::moe_unpermute_backward<float>(dexpert_out, dprobs, dout, expert_out, probs, slot_to_row, N, C, k, stream_);
  done();
}

double CudaKernelOps::sum_squares(const float* x, std::int64_t n) {
  *acc_ = 0;
  ku::sum_squares<float>(acc_, x, n, stream_);
  done();
  return *acc_;
}

void* ManagedMemory::do_allocate(std::size_t bytes, std::size_t alignment) {
  constexpr std::size_t kManagedAlignment = 256;   // what cudaMallocManaged guarantees
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) throw std::bad_alloc();
  const std::size_t extra = alignment > kManagedAlignment ? alignment : 0;
  void* p = nullptr;
  MEGASCOPE_CUDA_CHECK(cudaMallocManaged(&p, (bytes == 0 ? 1 : bytes) + extra));
  if (extra == 0) return p;
  const auto a = (reinterpret_cast<std::uintptr_t>(p) + alignment - 1) & ~(std::uintptr_t{alignment} - 1);
  void* aligned = reinterpret_cast<void*>(a);
  const std::lock_guard<std::mutex> lock(mutex_);
  starts_.emplace(aligned, p);
  return aligned;
}

void ManagedMemory::do_deallocate(void* p, std::size_t, std::size_t alignment) {
  if (alignment > 256) {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = starts_.find(p); it != starts_.end()) {
      p = it->second;
      starts_.erase(it);
    }
  }
  (void)cudaFree(p);
}

Result<std::vector<StepLog>> run_cuda_training(const Setup& s, const Program& p, const RunOptions& o,
                                               std::ostream& out) {
  require_device();
  MpiEnv::get();
  select_device(mpi_local_rank());
  MpiEnv& env = MpiEnv::get();
  try {
    ManagedMemory managed;
    // A pool over it: the ranks allocate temporaries per op, and each
    // cudaFree synchronises the device. Buffers up to 64 MiB are pooled
    // (larger ones go straight to managed memory) and freed at the end.
    std::pmr::pool_options pooled;
    pooled.largest_required_pool_block = std::size_t{64} << 20;
    std::pmr::synchronized_pool_resource pool(pooled, &managed);
    ManagedDefault scope(&pool);
    CudaKernelOps ops(o.bf16);
    return run_training(s, p, o, out, ops, true);
  } catch (const std::exception& e) {
    if (env.size() == 1) throw;
    // The other ranks may be waiting for this one in a collective: stop the job, naming it.
    std::fprintf(stderr, "megascope run: rank %d: error: --backend cuda: %s; aborting the job\n", env.rank(), e.what());
    env.abort(1);
  }
}

}  // namespace megascope::exec::cuda
