// `megascope calibrate --backend cuda`: the GPU half of apps/calibrate.hpp.
// Measures, on this rank's GPU (one per MPI rank under mpirun), with what the
// GPU runtime runs (exec/cuda/calibrate_cuda.hpp):
//   - cuBLASLt bf16 GEMMs: the exact shapes of the shipped models' Programs
//     for typical plans (tp 1, 2, 4, 8; micro-batches 1 and 2), all three
//     passes, plus a sweep of square and thin shapes for the size curve;
//     the forward GEMMs again in FP8 (E4M3) where the device has it
//     (reported, not written: the profile writer knows bf16 entries only);
//   - every memory-bound CUDA kernel (bf16) at the models' widths and over
//     sizes, as achieved GB/s (bytes as the Program counts them) against a
//     measured device-to-device copy;
//   - fused attention forward and backward at the Programs' shapes;
//   - under mpirun with several GPUs, NCCL all-reduce, reduce-scatter,
//     all-gather, all-to-all and send/recv over sizes and group sizes
//     2, 4, ... up to the world.
// Then fits and writes a profile and a cluster with apps/calibrate.hpp's
// fit_calibration / profile_toml / cluster_toml, like the CPU backend.
//
// Without a device (or built without CUDA): exit status 1 and one line,
// "megascope calibrate: error: --backend cuda: no CUDA device (...)".
// Options of CalibrateOptions that still hold the CPU defaults (cluster
// cpu-host, models tiny-gpt and tiny-llama, tp 1,2, micro-batches 1,2,4,8)
// are replaced by the GPU defaults above (the cluster by the device's name).
#pragma once

#include <ostream>

#include "apps/calibrate.hpp"

namespace megascope::cli {

int run_calibrate_cuda(const CalibrateOptions& o, std::ostream& out, std::ostream& err);

}  // namespace megascope::cli
