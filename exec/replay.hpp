// The replay of a Program on a device: every compute op launches the kernels
// the Program lists for it (the GEMMs by shape, fused attention by shape,
// each memory-bound kernel on the rows its bytes give), every collective
// runs on its group with the Program's byte count, every send and receive
// moves the Program's message to its peer stage; the data are synthetic.
// This measures a plan's step as the simulator prices it, kernel for
// kernel, on any model size, without the training numerics (those run on
// the CPU backend, exec/runner.hpp). The GPU runtime runs it
// (exec/cuda/replay_cuda.hpp); this file is the device-independent part:
// which calls each op makes, on which GPU stream ("lane"), after which ops.
//
// Lanes: 0-4 are the Program's compute, tp, cp, ep and dp streams (ops on a
// lane run in list order, as the Program says); each point-to-point channel
// (activations, or gradients, sent to one peer stage or received from one)
// gets a lane of its own, 5, 6, ..., so that a transfer waits only for the
// earlier transfers of its channel. Each route (stage a sends a label to
// stage b) runs on a communicator of its own: the k-th such send of a must be
// the k-th such receive of b, which plan_replay checks (it holds for every
// schedule the builder emits, tested; ZB-V and DualPipe send activations and
// gradients the same way, hence one route per label).
// Dependencies on another lane become event waits; dependencies on the same
// lane are kept by stream order and dropped.
//
// Shard mode (one device measuring one rank of a larger plan): collectives
// and transfers are not run and their spans are not measured; compute ops
// drop their waits on them, so the rank's compute runs back to back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/program/program.hpp"
#include "core/result.hpp"
#include "core/setup.hpp"
#include "exec/calibrate.hpp"

namespace megascope::exec {

inline constexpr int kReplayProgramLanes = 5;   // compute, tp, cp, ep, dp

// One kernel launch: the calibration case that runs it (exec/calibrate.hpp).
struct ReplayKernel {
  enum class Type : std::uint8_t { gemm, memory, copy, attention };
  Type type = Type::gemm;
  GemmCase gemm;                    // gemm: pass from the op's phase, bias never (the Program folds it into the GEMM)
  Precision precision = Precision::bf16;
  MemoryCase memory;                // memory: the executor's kernel on (rows, width), rows from the Program's bytes
  double bytes = 0;                 // memory and copy: the bytes the Program charges (copy: half read, half written)
  AttentionCase attention;          // attention
  [[nodiscard]] std::string name() const;
  bool operator==(const ReplayKernel& o) const;
};

struct ReplayOp {
  int lane = 0;
  bool run = true;                  // false: not run (shard mode's communication)
  std::vector<std::uint32_t> waits; // ops on other lanes that must finish first (their end events)
  std::vector<std::uint32_t> kernels;   // compute: indices into ReplayPlan::kernels, in launch order
  std::int64_t elements = 0;        // communication: bf16 elements of the buffer (collectives: nccl-tests "size")
  int channel = -1;                 // send/recv: index into ReplayPlan::channels
};

// Transfers of one label (activations or gradients) to one peer stage, or from one.
struct ReplayChannel {
  bool send = true;
  int peer_stage = 0;
  OpLabel label = OpLabel::pp_activation;
  int lane = 0;
};

// A directed route: stage `from` sends `label` transfers to stage `to`.
struct ReplayRoute {
  int from = 0, to = 0;
  OpLabel label = OpLabel::pp_activation;
  auto operator<=>(const ReplayRoute&) const = default;
};

struct ReplayPlan {
  int stage = 0;
  bool shard = false;
  std::vector<ReplayKernel> kernels;     // distinct kernels of the stage
  std::vector<ReplayOp> ops;             // one per op of the StageProgram, same index
  std::vector<ReplayChannel> channels;   // this stage's point-to-point channels, in order of first use
  int lanes = kReplayProgramLanes;       // program lanes + channels
  std::int64_t skipped_kernels = 0;      // launches with no kernel of the runtime (ReplayKernel::name says why)
};

// The stream a group's collectives run on, in the replay and the GPU
// runtime: tp and etp on tp, cp on cp, ep on ep, dp, dp_cp, edp and
// embedding on dp (pp: pp_send; pipeline transfers have routes of their own).
Stream stream_of(CommGroup g);

// The kernel that replays one Program kernel of an op in `phase`.
ReplayKernel replay_kernel(const Setup& s, const Kernel& k, Phase phase);

// The replay of pipeline stage `stage`. Fails, naming the stages, when the
// sends of a stage to another are not received in the order they are sent.
Result<ReplayPlan> plan_replay(const Setup& s, const Program& p, int stage, bool shard);

// Every route with traffic, sorted (one order all ranks agree on): the
// communicators the replay creates, one per route.
std::vector<ReplayRoute> replay_channels(const Program& p);

}  // namespace megascope::exec
