// `megascope run --backend cuda`: the replay of a plan's Program on GPUs
// (exec/replay.hpp says what is launched), one MPI process per GPU, or one
// GPU measuring one rank of any plan (shard mode).
//
// Every compute op launches its kernels on the compute stream (cuBLASLt
// GEMMs, the CUDA kernels, bf16; fp8 GEMMs where the Program asks for fp8,
// the pass is the forward and the device has fp8); every collective runs on
// NCCL on its group's stream; every transfer runs on its route's own NCCL
// communicator and stream. Cross-stream dependencies are CUDA events. Each
// op is bracketed by two timing events, so the measured trace has the
// simulator's spans: an op's span starts when its stream reaches it (after
// its waits) and ends when its work ends; a collective's span includes the
// time it waits for the other members.
//
// Every communicator is connected before the first step (NCCL connects a
// pair on its first transfer and blocks the host until the peer's first
// call: two stages reaching their first transfers in opposite orders, as
// DualPipe's do, would wait forever). The host enqueues a whole step without
// blocking, then waits. `warmup` untimed steps come first (cuBLASLt picks
// its algorithms); the trace is the last step's. The caller should set
// CUDA_DEVICE_MAX_CONNECTIONS (apps/run_cuda.cpp sets 32) before CUDA starts,
// so that the replay's streams do not share hardware queues.
//
// Transfers of one channel run one after another on its stream, so a
// receive's span starts when the previous receive of its channel ends (with
// overlapped pipeline communication the Program posts receives up front):
// compare pipeline-transfer spans with the simulator's with that in mind.
//
// Failure: a refusal found before the device is used (the plan, the world,
// the routes) fails on every rank with the first failing rank's message; an
// error after that on one rank of a multi-rank job aborts the job, naming
// the rank (the others may be waiting for it in a collective). The data are synthetic (device buffers
// filled once with small random values and shared between the kernels of
// the Program, so memory use is that of the largest kernels, not of a
// training step): the replay measures time, not losses.
//
// Shard mode (`shard` set, a world of one process): the rank's compute ops
// only; communication is not run and its spans are absent from the trace.
//
// Without a device: throws NoCudaDevice.
#pragma once

#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "core/program/program.hpp"
#include "core/result.hpp"
#include "core/setup.hpp"

namespace megascope::exec::cuda {

struct ReplayOptions {
  int steps = 1;                      // measured steps
  int warmup = 1;                     // untimed steps first
  std::optional<int> shard;           // shard mode: the world rank of the plan this GPU measures
  std::optional<std::string> trace;   // measured trace of the last step (world rank 0 writes it)
  std::string plan_text, model_name;  // for the trace header
  double timeout_s = 120;             // the NCCL watchdog's limit on a host wait (run's --recv-timeout)
};

struct ReplayReport {
  std::vector<double> step_times_s;   // per measured step: the slowest rank's
  double gemm_flops = 0;              // the Program's GEMM FLOPs of one step on this rank (world rank 0's)
  std::size_t ops = 0, ops_run = 0;   // world rank 0's ops, and those run
  std::size_t kernels = 0, distinct_kernels = 0, skipped_kernels = 0;
  std::string device;                 // "NVIDIA H100 80GB HBM3, cc 9.0, 132 SMs"
  std::vector<std::string> skipped;   // names of the kernels with no GPU twin
};

// Collective over MPI_COMM_WORLD (a world of one without mpirun).
Result<ReplayReport> run_replay(const Setup& s, const Program& p, const ReplayOptions& o);

}  // namespace megascope::exec::cuda
