// Runs a Program for real, on CPUs, one MPI process per rank: every rank
// walks its stage's ops in the Program's order and does what each op says
// with the CPU kernels (kernels/) and MPI (exec/comm.hpp): the same ops the
// simulator times, so that a measured trace lines up with a simulated one
// op by op. See docs/executor.md for how each op maps onto the numerics.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "core/program/program.hpp"
#include "core/result.hpp"
#include "core/setup.hpp"
#include "exec/kernel_ops.hpp"

namespace megascope::exec {

struct RunOptions {
  int steps = 1;
  std::string data = "";                     // text file; empty: kDefaultCorpus
  std::optional<std::string> trace;          // measured trace of the last step (rank 0 writes it)
  std::optional<std::string> checkpoint_dir; // sharded checkpoints (one file per rank per step)
  int save_every = 0;                        // steps between checkpoints (0: only at the end, if a dir is given)
  bool resume = false;                       // continue from the latest checkpoint in checkpoint_dir
  // Fault injection, for testing the failure path: world rank `fail_rank`
  // at step `fail_step` exits abruptly (no message, no cleanup, as a crash
  // would), or stays alive and does nothing more (hang: a stopped or
  // deadlocked process), or gets a NaN in its gradients (nan, as an
  // overflow would give).
  enum class Fail : std::uint8_t { exit, hang, nan };
  std::optional<int> fail_rank;
  int fail_step = 1;
  Fail fail = Fail::exit;
  // A step whose gradient norm is NaN or infinite (the loss finite) makes no
  // update and the run goes on, as Megatron-LM's loss scaler skips an
  // iteration; off: the run stops before that step's checkpoint.
  bool skip_nonfinite = false;
  std::uint64_t seed = 1234;
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.01f;
  double clip_grad = 1.0;                    // global-norm clipping (0: off)
  double recv_timeout_s = 120;               // a pipeline receive or a collective waiting longer names its peer or group and aborts
  bool bf16 = false;                         // bf16 GEMMs (exec/kernel_ops.hpp), fp32 elsewhere
  std::string plan_text, model_name;         // for the trace header and the checkpoint check
  // Packed variable-length training: builds the Program of a step's Setup
  // (the run's, with the step's micro-batch count) as the run's own was
  // built (`megascope run`: the simulator's order for zb-1p/zb-2p). Unset:
  // core's build_program.
  std::function<Result<Program>(const Setup&)> build_program;
};

struct StepLog {
  int step = 0;                // 1-based over the whole training (continues after a resume)
  double loss = 0;             // mean cross-entropy over the global batch's tokens with a target (nats per byte)
  double grad_norm = 0;        // global gradient norm before clipping
  double step_time_s = 0;      // slowest rank
  bool skipped = false;        // no update: the gradient norm was not finite (RunOptions::skip_nonfinite)
};

// Runs on the MPI world (its size must be the plan's world). Every rank
// returns the same logs. Writes progress lines to `out` on world rank 0.
// Variable-length training (s.training.varlen): each step's documents from
// varlen_batch (exec/data.hpp); with packing, each step runs a Program of its
// own micro-batch count (the Setup's num_microbatches replaced by the
// scheduler's; `p` is then only the first step's fallback and the grid).
Result<std::vector<StepLog>> run_cpu(const Setup& s, const Program& p, const RunOptions& o, std::ostream& out);

// run_cpu's training loop with any kernels (exec/kernel_ops.hpp): the cuda
// backend's (exec/cuda/kernel_ops_cuda.hpp) runs the same ranks on the GPU
// kernels. `staged`: the communicators work on host copies of the buffers.
Result<std::vector<StepLog>> run_training(const Setup& s, const Program& p, const RunOptions& o, std::ostream& out,
                                          KernelOps& ops, bool staged);

}  // namespace megascope::exec
