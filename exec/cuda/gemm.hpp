// cuBLASLt GEMMs of a linear layer: the GPU twins of kernels/matmul.hpp, with
// the same shapes and the same overwrite/accumulate rules (row-major; see
// kernels/README.md):
//   forward          out (N, OC) = inp (N, C) . weight (OC, C)^T + bias (OC)     overwrites
//   backward_input   dinp (N, C) = dout (N, OC) . weight (OC, C)                 overwrites
//   backward_weight  dweight (OC, C) += dout (N, OC)^T . inp (N, C),
//                    dbias (OC) += column sums of dout                           accumulates
// T is float (fp32 in, fp32 compute, no TF32: the twin's numbers) or
// __nv_bfloat16 (bf16 in and out, fp32 accumulation). Parameter gradients are
// float whatever T is (Megatron's fp32 main_grad), as in kernels/cuda/.
//
// How a row-major product maps onto column-major cuBLASLt: a row-major (r, c)
// matrix is a column-major (c, r) one, so every product is computed
// transposed, out^T = W . inp^T etc.; the forward is cuBLAS's "TN" layout
// (the one FP8 requires), backward_input "NN", backward_weight "NT". The bias
// is the BIAS epilogue of the forward; the bias gradient is a small kernel of
// ours (exec/cuda/device_kernels.hpp), so that it accumulates in fp32.
//
// Algorithms: chosen once per (pass, dtype, N, C, OC, bias, pointer
// alignments) with cublasLtMatmulAlgoGetHeuristic (the first, best-ranked
// result) and cached with their descriptors; later calls with the same key
// only launch. Workspace: 32 MiB per stream the Gemm object is called on
// (allocated on first use), so that calls on different streams never share
// one. A Gemm object is not thread-safe: one per host thread.
//
// FP8 (E4M3, compute capability >= 8.9): forward_fp8 takes E4M3 input and
// weight with per-tensor dequantisation scales (device floats: the real value
// is scale x the stored E4M3 value), bf16 bias and output. Only the TN
// layout (the forward) exists on Hopper; the backward GEMMs of an FP8
// recipe need transposed copies (Transformer Engine keeps them) and are not
// here. UNTESTED ON A DEVICE: this repository's CI has no GPU; the plumbing
// compiles and its argument checks are tested, nothing more.
//
// cuBLASLt itself is opened on first use (exec/cuda/cublaslt.hpp), not linked.
//
// Errors: bad arguments throw std::invalid_argument (file:line); a cuBLASLt
// failure throws std::runtime_error with file:line and the status name
// (exec/cuda/check.hpp); constructing a Gemm without a device throws
// NoCudaDevice.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "exec/cuda/device.hpp"

namespace megascope::exec::cuda {

using bf16 = __nv_bfloat16;
using fp8e4m3 = __nv_fp8_e4m3;

enum class GemmDtype : std::uint8_t { fp32, bfloat16, fp8_e4m3 };
const char* to_string(GemmDtype d);

inline constexpr std::size_t kGemmWorkspaceBytes = 32u << 20;   // 32 MiB, as Megatron/TE give cuBLASLt on Hopper
// Cached plans at most: MoE training meets a new expert row count N almost
// every step, and an unbounded cache would grow for the whole run. When full,
// the cache is emptied before the next plan is made (a plan is only used
// within the call that looks it up; cuBLASLt reads its descriptors when the
// matmul is enqueued).
inline constexpr std::size_t kGemmMaxPlans = 1024;

class Gemm {
 public:
  Gemm();   // throws NoCudaDevice without a device
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  template <typename T>
  void forward(T* out, const T* inp, const T* weight, const T* bias /*nullable*/, std::int64_t N, std::int64_t C,
               std::int64_t OC, cudaStream_t stream);
  template <typename T>
  void backward_input(T* dinp, const T* dout, const T* weight, std::int64_t N, std::int64_t C, std::int64_t OC,
                      cudaStream_t stream);
  template <typename T>
  void backward_weight(float* dweight, float* dbias /*nullable*/, const T* dout, const T* inp, std::int64_t N,
                       std::int64_t C, std::int64_t OC, cudaStream_t stream);

  // out (N, OC) bf16 = (inp_scale * inp) (N, C) . (weight_scale * weight) (OC, C)^T + bias.
  // C and OC multiples of 16 (cuBLASLt's FP8 rule). The scales are device
  // floats; cuBLASLt needs them 16-byte aligned, and others cost a 4-byte
  // device copy each before the matmul. Throws std::runtime_error
  // on a device without FP8 (fp8_supported() false).
  void forward_fp8(bf16* out, const fp8e4m3* inp, const fp8e4m3* weight, const bf16* bias /*nullable*/,
                   const float* inp_scale, const float* weight_scale, std::int64_t N, std::int64_t C, std::int64_t OC,
                   cudaStream_t stream);
  [[nodiscard]] bool fp8_supported() const { return info_.fp8(); }

  [[nodiscard]] std::size_t cached_plans() const { return plans_.size(); }
  [[nodiscard]] const DeviceInfo& device() const { return info_; }

 private:
  enum class Pass : std::uint8_t { forward, backward_input, backward_weight };
  struct Plan;
  using Key = std::tuple<Pass, GemmDtype, std::int64_t, std::int64_t, std::int64_t, bool, std::uint32_t>;
  static const char* pass_name(Pass p);
  Plan& plan(const Key& key);
  void* workspace(cudaStream_t stream);
  const float* unit_scales();   // one device float 1.0: the FP8 plans' scales while the heuristic chooses
  // Runs D = alpha op(A) op(B) + beta C with plan p (bias and scale pointers set on its descriptor first).
  void run(Plan& p, const void* a, const void* b, const void* c, void* d, float beta, const void* bias,
           const float* a_scale, const float* b_scale, cudaStream_t stream);

  DeviceInfo info_;
  cublasLtHandle_t handle_ = nullptr;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  std::map<cudaStream_t, DeviceMemory> workspaces_;
  DeviceMemory unit_scales_;
  static constexpr std::size_t kScaleSlotBytes = 256;
  std::map<cudaStream_t, DeviceMemory> scale_slots_;   // aligned copies of misaligned FP8 scales, per stream
};

}  // namespace megascope::exec::cuda
