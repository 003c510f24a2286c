// GPU calibration measurements: the CUDA backend of exec/calibrate.hpp.
// The same cases (GemmCase, MemoryCase, AttentionCase, CommCase: the
// Program's own vocabulary) and the same result (one Timing per case, equal
// on every rank), measured on this rank's GPU with what the GPU runtime
// runs: cuBLASLt GEMMs (exec/cuda/gemm.hpp), the CUDA kernels
// (kernels/cuda/kernels.hpp) in bf16 as a bf16 run launches them, NCCL
// collectives (exec/cuda/nccl_comm.hpp). Turning timings into a profile is
// the caller's work (apps/), as for the CPU backend.
//
// Timing: CUDA events around a loop of back-to-back calls on one stream;
// untimed calls first (at least warmup_s of GPU time, which also lets
// cuBLASLt pick and cache its algorithm and NCCL connect), then `repeats`
// samples of a fixed number of calls, each at least min_sample_s long; a
// rank's time is the median sample per call. Under mpirun every rank
// (one GPU each) measures at once and the result is the median over ranks.
// Collectives run on NCCL communicators of the first `group` world ranks,
// the slowest member's time per sample. Buffers are filled once with small
// random values and reused (hot in L2 where they fit, as in a run).
//
// Without a device every function throws NoCudaDevice ("no CUDA device
// (...)"). Does not: lock clocks, flush L2, measure fp8 attention.
#pragma once

#include "exec/calibrate.hpp"
#include "exec/cuda/device.hpp"
#include "exec/cuda/gemm.hpp"

namespace megascope::exec::cuda {

// The GEMM of a case, as exec/calibrate.hpp maps it onto the linear layer's
// three GEMMs (forward, backward_input, backward_weight), in `dtype` (bf16:
// bf16 in and out, fp32 parameter gradients; fp8_e4m3: forward_fp8, the
// other passes are not available in fp8 and time 0).
std::vector<Timing> time_gemms(const std::vector<GemmCase>& cases, const CalibrationSettings& s,
                               const Progress& progress, GemmDtype dtype = GemmDtype::bfloat16);
std::vector<Timing> time_memory(const std::vector<MemoryCase>& cases, const CalibrationSettings& s,
                                const Progress& progress);
std::vector<Timing> time_attention(const std::vector<AttentionCase>& cases, const CalibrationSettings& s,
                                   const Progress& progress);
// Cases whose group exceeds the world time 0. send_recv: half a ping-pong
// between world ranks 0 and 1 (ncclSend/ncclRecv).
std::vector<Timing> time_comms(const std::vector<CommCase>& cases, const CalibrationSettings& s,
                               const Progress& progress);
// The GPU's cost of an op that does nothing: one empty kernel, back to back.
Timing time_empty_op(const CalibrationSettings& s);
// cudaMemcpyAsync device to device of `bytes`: seconds per copy. Bandwidth =
// 2 * bytes / seconds (each byte read once and written once), the reference
// the memory-bound kernels' achieved bandwidth is compared with.
Timing time_copy(double bytes, const CalibrationSettings& s);

// The device this rank measures on (selected by its rank on the node), with
// the library versions, for the profile's [profile] source line.
struct GpuDescription {
  DeviceInfo device;
  std::string cublaslt_version, nccl_version;
  int world = 1;   // ranks (one GPU each) measuring
};
GpuDescription describe_gpu();

}  // namespace megascope::exec::cuda
