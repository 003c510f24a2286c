// The GPU runtime's call for one case of the Program's vocabulary (a GEMM
// pass, a memory-bound kernel, fused attention): what calibration times in a
// loop (exec/cuda/calibrate_cuda.cpp) and what the replay launches for every
// kernel of a compute op (exec/cuda/replay_cuda.cpp). A case's device buffers
// come from a `Buffers`: calibration owns one set per case, the replay shares
// a few arenas between all the cases of a Program.
//
// The calls are the runtime's own: cuBLASLt GEMMs (exec/cuda/gemm.hpp) and
// the CUDA kernels (kernels/cuda/kernels.hpp), in bf16 as a bf16 run
// launches them. A case with no GPU call (fp8 outside the forward, attention
// with a head dimension above 256 or a different value head dimension) has
// none (std::nullopt).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <optional>

#include "exec/calibrate.hpp"
#include "exec/cuda/gemm.hpp"

namespace megascope::exec::cuda {

using Call = std::function<void()>;

// Device buffers of a case. alloc<E>(n) returns n elements of E (at least
// one) holding small values (uniform in [lo, hi) where the provider fills by
// type); ids(n, modulo) returns n token ids in [0, modulo) spread over the range.
class Buffers {
 public:
  virtual ~Buffers() = default;
  template <typename E>
  E* alloc(std::int64_t n, float lo = -1.0f, float hi = 1.0f) {
    const std::size_t count = static_cast<std::size_t>(n < 1 ? 1 : n);
    bool fresh = false;
    void* p = block(count * sizeof(E), fresh);
    if (fresh) fill(static_cast<E*>(p), static_cast<std::int64_t>(count), lo, hi);
    return static_cast<E*>(p);
  }
  // Like alloc, but never shared with another case, always filled: for
  // inputs whose values decide how much work a kernel does (attention
  // backward skips the keys whose probabilities vanish, so its q, k, v, out
  // and lse must be the forward's own, not another kernel's leftovers).
  template <typename E>
  E* own(std::int64_t n, float lo = -1.0f, float hi = 1.0f) {
    const std::size_t count = static_cast<std::size_t>(n < 1 ? 1 : n);
    auto* p = static_cast<E*>(own_block(count * sizeof(E)));
    fill(p, static_cast<std::int64_t>(count), lo, hi);
    return p;
  }
  virtual std::int32_t* ids(std::int64_t n, std::int64_t modulo) = 0;
  [[nodiscard]] virtual cudaStream_t stream() const = 0;

 protected:
  // `bytes` of device memory; `fresh` set when the caller should fill it.
  virtual void* block(std::size_t bytes, bool& fresh) = 0;
  // `bytes` of device memory of this case alone (default: block's, for a
  // provider that gives every case its own buffers anyway).
  virtual void* own_block(std::size_t bytes) {
    bool fresh = false;
    return block(bytes, fresh);
  }
  void fill(float* p, std::int64_t n, float lo, float hi);
  void fill(bf16* p, std::int64_t n, float lo, float hi);
  void fill(fp8e4m3* p, std::int64_t n, float lo, float hi);
  std::uint64_t seed_ = 0;
};

// The three passes of a linear layer as exec/calibrate.hpp maps a Program
// GEMM onto them, in `dtype` (fp8_e4m3: forward only).
std::optional<Call> gemm_call(const GemmCase& c, GemmDtype dtype, Gemm& gemm, Buffers& b);
// The executor's kernel of a memory case on (rows, width), in bf16.
std::optional<Call> memory_call(const MemoryCase& c, Buffers& b);
// Fused attention (with RoPE on q and k, or on their gradients, when c.rope), in bf16.
std::optional<Call> attention_call(const AttentionCase& c, Buffers& b);

}  // namespace megascope::exec::cuda
