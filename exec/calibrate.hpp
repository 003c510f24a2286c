// Calibration measurements for the CPU executor: how long, on this machine,
// the exact kernels it runs take (kernels/, fp32, one thread per rank) and
// how long its MPI collectives and pipeline transfers take (exec/comm.hpp).
//
// Measures only. Turning the numbers into a cost profile and a cluster
// (fits, file formats) is apps/calibrate.cpp's work, which may use sim/;
// exec/ never does (DESIGN.md). Each measurement is described by the
// Program's own vocabulary (GemmShape, MemoryOp, AttentionShape,
// nccl-tests buffer sizes), so that the caller can line it up with what the
// simulator prices.
//
// Under mpirun every rank measures every kernel at the same time, as the
// ranks of a run compute side by side (they share caches and memory
// bandwidth); a kernel's time is the median over ranks of each rank's median
// over repetitions. Collectives are timed on communicators split off
// MPI_COMM_WORLD, one group size at a time, the slowest member's time.
//
// Does not: pin threads or ranks to cores, flush caches between calls (the
// executor reuses hot buffers too), measure GPU kernels.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/program/work.hpp"

namespace megascope::exec {

// Which of the executor's three matmul kernels runs a Program GEMM (m x k) @ (k x n):
//   forward          matmul_forward(N = m, C = k, OC = n)          (forward and recomputed ops)
//   backward_input   matmul_backward_input(N = m, C = n, OC = k)   (input-gradient ops)
//   backward_weight  matmul_backward_weight(N = k, C = m, OC = n)  (weight-gradient ops)
enum class GemmPass : std::uint8_t { forward, backward_input, backward_weight };
const char* to_string(GemmPass p);

struct GemmCase {
  GemmShape shape;
  GemmPass pass = GemmPass::forward;
  bool bias = false;        // forward: with a bias (GPT), backward_weight: with a bias gradient
};

// A memory-bound kernel of the executor and the bytes the Program charges
// for it (core/program/layer_ops.cpp and builder.cpp count bf16 tensors:
// 2 bytes per element read or written), so that program_bytes / seconds is
// the bandwidth the cost model needs in its [memory] <kind>_GBps.
enum class MemoryKernel : std::uint8_t {
  layernorm_fwd, layernorm_bwd, rmsnorm_fwd, rmsnorm_bwd,          // norm: 4, 6 bytes per element of (rows, width)
  gelu_fwd, gelu_bwd, swiglu_fwd, swiglu_bwd,                      // activation: 4, 6 (gelu), 6, 10 (swiglu) per element of (rows, ffn)
  bias_dropout_add_fwd, bias_dropout_add_bwd,                      // dropout_residual: 6, 4 per element
  embedding_fwd, embedding_bwd,                                    // embedding: 4, 6 per element of (rows, hidden)
  cross_entropy_fwd, cross_entropy_bwd,                            // cross_entropy: 12, 8 per logit of (rows, vocab)
  adamw                                                            // optimizer: 30 per parameter (rows x width of them)
};
inline constexpr int kMemoryKernelCount = 15;
const char* to_string(MemoryKernel k);
MemoryOp memory_op_of(MemoryKernel k);
// Whether the Program runs it in backward ops (a memory Kernel with backward set).
bool is_backward(MemoryKernel k);
// The bytes the Program charges for this kernel on (rows, width).
double program_bytes(MemoryKernel k, std::int64_t rows, std::int64_t width);

struct MemoryCase {
  MemoryKernel kernel = MemoryKernel::layernorm_fwd;
  std::int64_t rows = 0, width = 0;
  float dropout = 0.1f;     // bias_dropout_add: the model's hidden dropout (0 takes the kernel's no-mask path)
  bool program = false;     // at a size a Program uses: also written as an exact [[memory.measured]] entry
};

// Fused attention as the executor runs it: attention_forward / _backward on
// (batch, seq, heads, kv_heads, head_dim), plus RoPE on q and k (forward) or
// on their gradients (backward) when `rope` (the executor applies it inside
// the attention op, and the Program has no kernel of its own for it).
struct AttentionCase {
  AttentionShape shape;
  bool backward = false;
  bool rope = false;
};
// Self-attention over `seq` tokens (seq_q = seq_kv), causal.
inline AttentionCase self_attention_case(std::int64_t batch, std::int64_t heads, std::int64_t kv_heads,
                                         std::int64_t seq, std::int64_t head_dim, bool backward, bool rope) {
  AttentionCase a;
  a.shape.batch = batch;
  a.shape.heads = heads;
  a.shape.kv_heads = kv_heads;
  a.shape.seq_q = a.shape.seq_kv = seq;
  a.shape.head_dim = head_dim;
  a.backward = backward;
  a.rope = rope;
  return a;
}

enum class CommOp : std::uint8_t { all_reduce, reduce_scatter, all_gather, all_to_all, send_recv };
const char* to_string(CommOp c);

struct CommCase {
  CommOp op = CommOp::all_reduce;
  int group = 2;            // ranks in the group (send_recv: 2)
  double bytes = 0;         // nccl-tests "size": the per-rank buffer of all-reduce and all-to-all, the full
                            // (gathered / unscattered) buffer of all-gather and reduce-scatter, the message of send_recv
};

struct Timing {
  double seconds = 0;       // per call: median over ranks of each rank's median
  double spread = 0;        // (max - min) / median over ranks, a noise indicator
};

struct CalibrationSettings {
  int repeats = 9;                 // timed samples per case (the median is kept)
  double min_sample_s = 2e-3;      // each sample loops the call until this long (at least once)
  double warmup_s = 1e-3;          // untimed calls first
};

// Every rank of MPI_COMM_WORLD calls these together with the same cases (a
// single process without mpirun is a world of 1). Results are the same on
// every rank. `progress` (may be empty) is called on world rank 0 after each case.
using Progress = std::function<void(const std::string& what)>;
std::vector<Timing> time_gemms(const std::vector<GemmCase>& cases, const CalibrationSettings& s, const Progress& progress);
std::vector<Timing> time_memory(const std::vector<MemoryCase>& cases, const CalibrationSettings& s,
                                const Progress& progress);
std::vector<Timing> time_attention(const std::vector<AttentionCase>& cases, const CalibrationSettings& s,
                                   const Progress& progress);
// Cases whose group exceeds the world are skipped (seconds 0). send_recv is
// half the round trip of a ping-pong between world ranks 0 and 1 through
// PointToPoint (non-blocking send, receive waited as the executor waits).
std::vector<Timing> time_comms(const std::vector<CommCase>& cases, const CalibrationSettings& s, const Progress& progress);
// The executor's own cost of an op that does nothing: two clock reads and a
// span recorded around an empty call, as the runner wraps every op.
Timing time_empty_op(const CalibrationSettings& s);

}  // namespace megascope::exec
