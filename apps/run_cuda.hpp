// `megascope run --backend cuda`: the replay of a plan's Program on GPUs
// (exec/cuda/replay_cuda.hpp), one process per GPU under mpirun, or one GPU
// measuring one rank of any plan with --shard RANK (compute only). Prints
// each measured step's time, the median, tokens/s and the rank's GEMM
// TFLOP/s; --trace writes the measured trace of the last step in the
// simulator's format (compare with `megascope compare`); --json prints one
// object. The cluster defaults to the shipped one of the GPU's name.
//
// Refused before any work: options of the cpu backend's training
// (--data, --checkpoint-dir, --resume, --inject-failure; they apply with
// --train), a plan whose world is not the job's (without --shard), --shard
// under a multi-process job.
// Without a device (or built without CUDA): status 1, one line saying so.
#pragma once

#include <ostream>

#include "apps/run.hpp"

namespace megascope::cli {

int run_cuda_command(const RunCommandOptions& o, std::ostream& out, std::ostream& err);

// `run --backend cuda --train`: the cpu backend's training on this process's
// GPU kernels (exec/cuda/kernel_ops_cuda.hpp). Without a device (or CUDA in
// the build): an error naming --backend.
Result<std::vector<exec::StepLog>> train_cuda(const Setup& s, const Program& p, const exec::RunOptions& o,
                                              std::ostream& out);

}  // namespace megascope::cli
