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

#include <mutex>
#include <unordered_map>

#include <array>
#include <memory_resource>

#include "exec/cuda/device.hpp"
#include "exec/cuda/gemm.hpp"
#include "exec/kernel_ops.hpp"
#include "exec/runner.hpp"

namespace megascope::exec::cuda {

class CudaKernelOps final : public KernelOps {
 public:
  explicit CudaKernelOps(bool bf16_gemms = false);   // bf16 GEMMs: exec/kernel_ops.hpp
  ~CudaKernelOps() override;
  CudaKernelOps(const CudaKernelOps&) = delete;
  CudaKernelOps& operator=(const CudaKernelOps&) = delete;
  MEGASCOPE_KERNEL_OPS(MEGASCOPE_KERNEL_OP_OVERRIDE)
  double sum_squares(const float* x, std::int64_t n) override;
  [[nodiscard]] const char* name() const override { return name_.c_str(); }

 private:
  void done();  // waits for the stream (and surfaces an asynchronous error)
  // x[0, n) converted to bf16 in scratch slot `slot` (grown as needed); null stays null.
  bf16* staged(int slot, const float* x, std::int64_t n);
  bf16* output(std::int64_t n);   // scratch slot 3, at least n elements
  bool bf16_ = false;
  std::array<DeviceBuffer<bf16>, 4> scratch_;   // operands (0-2) and the bf16 output (3)
  cudaStream_t stream_ = nullptr;
  Gemm gemm_;
  double* acc_ = nullptr;  // sum_squares's accumulator (managed)
  std::string name_;
};

// cudaMallocManaged / cudaFree: memory the host and the device both address.
// cudaMallocManaged returns 256-byte-aligned blocks; a larger alignment (a
// pool resource asks its upstream for chunks aligned to their block size,
// up to the largest pooled block) is met by over-allocating by the alignment
// and keeping the block's start to free.
class ManagedMemory final : public std::pmr::memory_resource {
 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment) override;
  std::mutex mutex_;
  std::unordered_map<void*, void*> starts_;   // aligned pointer -> cudaMallocManaged's, for alignments > 256
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
