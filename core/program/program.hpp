// Program: what every rank does in one training iteration, as ordered
// operations on named streams. The one description that both the simulator
// (sim/) and the executor (exec/) consume, so that a simulated and a measured
// run can be compared op by op.
//
// Ranks of one pipeline stage run the same operations (their tp/cp/dp/ep
// positions differ only in whom they talk to), so a Program holds one
// StageProgram per pipeline rank and a RankGrid that resolves, for a concrete
// rank, the members of each communication group and its pipeline peers.
//
// Ordering rules:
//   - ops on the compute, tp, cp, ep, dp and dp_param streams run in list order per stream;
//   - ops on the pp_send/pp_recv streams are asynchronous: each starts when its
//     dependencies allow (with overlapped pipeline communication receives
//     have none and are posted up front, like pre-posted irecvs; synchronous,
//     each waits for the compute before its communication point);
//   - `deps` lists ops (same rank, any stream) that must finish first;
//   - a collective starts when every member of its group has reached it (the
//     k-th collective on a stream of a group matches the k-th on every member);
//   - a send matches the receive with the same tag on the peer stage.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "core/program/work.hpp"
#include "core/rank_grid.hpp"
#include "core/result.hpp"
#include "core/schedule/schedule.hpp"

namespace megascope {

// dp_param: sharded parameters' all-gathers (zero 3), beside the gradient
// reduce-scatters on dp, as FSDP runs them on streams of their own.
enum class Stream : std::uint8_t { compute, tp, cp, ep, dp, pp_send, pp_recv, dp_param };
inline constexpr int kStreamCount = 8;

enum class OpKind : std::uint8_t { compute, all_reduce, reduce_scatter, all_gather, all_to_all, send, recv };

// Which pairs of its group an all-to-all connects (the DeepEP dispatcher's
// two hops, docs/simulator.md): every pair (whole); each member with the
// member at its position in every other scale-up domain (rails, over the
// scale-out network); the members of its own domain (domain). For rails and
// domain the op's bytes are what a member sends in all, spread evenly over
// those peers.
enum class CommSpan : std::uint8_t { whole, rails, domain };

// What the op is part of, for reports and traces.
enum class Phase : std::uint8_t { forward, backward_input, backward_weight, recompute, optimizer, gradient_sync, param_sync };

// The op's role, for reports (exposed communication by kind, compute breakdown).
enum class OpLabel : std::uint8_t {
  embedding, attention, mlp, moe, output_loss, optimizer,          // compute
  tp_comm, cp_comm, ep_comm, dp_grad, dp_param, embedding_grad,     // collectives
  pp_activation, pp_gradient                                         // point-to-point
};
inline constexpr int kOpLabelCount = 14;

// An op's optional coordinate (layer, micro-batch, chunk) in four bytes
// instead of std::optional's eight: the part of std::optional<std::int32_t>'s
// interface the code uses, with INT32_MIN standing for "none". It converts
// to and from std::optional<std::int32_t>, so it compares with one and with
// a plain value as std::optional does.
class OptIndex {
 public:
  static constexpr std::int32_t kNoValue = std::numeric_limits<std::int32_t>::min();
  constexpr OptIndex() = default;
  constexpr OptIndex(std::nullopt_t) {}
  constexpr OptIndex(std::int32_t v) : v_(v) {}
  constexpr OptIndex(const std::optional<std::int32_t>& o) : v_(o ? *o : kNoValue) {}
  constexpr operator std::optional<std::int32_t>() const {
    return has_value() ? std::optional<std::int32_t>(v_) : std::nullopt;
  }
  [[nodiscard]] constexpr bool has_value() const { return v_ != kNoValue; }
  constexpr explicit operator bool() const { return has_value(); }
  constexpr const std::int32_t& operator*() const { return v_; }
  [[nodiscard]] constexpr std::int32_t value() const {
    if (!has_value()) throw std::bad_optional_access();
    return v_;
  }
  [[nodiscard]] constexpr std::int32_t value_or(std::int32_t fallback) const { return has_value() ? v_ : fallback; }
  constexpr void reset() { v_ = kNoValue; }
  friend constexpr bool operator==(OptIndex a, OptIndex b) { return a.v_ == b.v_; }
  friend constexpr bool operator==(OptIndex a, std::nullopt_t) { return !a.has_value(); }
  friend constexpr bool operator==(OptIndex a, const std::optional<std::int32_t>& b) { return a == OptIndex(b); }
  friend constexpr bool operator==(OptIndex a, std::int32_t b) { return a.has_value() && a.v_ == b; }

 private:
  std::int32_t v_ = kNoValue;
};

// 64 bytes: a stage's ops are written by the builder and read by
// validate_program and the simulator's analysis in order, thousands to
// millions of them, so their size is those passes' memory traffic.
struct Op {
  OpKind kind = OpKind::compute;
  Stream stream = Stream::compute;
  Phase phase = Phase::forward;
  OpLabel label = OpLabel::attention;
  CommGroup group = CommGroup::tp;      // collectives only
  CommSpan span = CommSpan::whole;      // all-to-alls only
  // Compute only: the host issues this op's kernels in step with the GPU
  // (it synchronised with the GPU since the last op it could run ahead of:
  // a dropless MoE layer copies its token counts to the host every layer),
  // so the op takes at least its kernels' launch time on the host.
  bool host_paced = false;
  OptIndex layer;                       // transformer layer, when the op belongs to one
  OptIndex microbatch;
  OptIndex chunk;
  std::uint32_t kernel_begin = 0;       // compute: kernels [begin, begin + count) of the stage (ops with
                                        // equal kernels may share one range)
  std::uint32_t kernel_count = 0;
  std::uint32_t dep_begin = 0;          // deps [begin, begin + count) of the stage
  std::uint32_t dep_count = 0;
  std::int32_t peer_stage = 0;          // send/recv: the other pipeline rank
  double bytes = 0;                     // collectives: per-rank buffer (nccl-tests "size"); p2p: message
  double flops = 0;                     // compute: model FLOPs (GEMMs) of the op
  std::uint64_t tag = 0;                // send/recv: equal on both sides
};
static_assert(sizeof(Op) == 64);

// Variable-length training (core/varlen.hpp): what one micro-batch of the
// ranks a Program is built for holds, against a full-length sequence.
struct MicrobatchLoad {
  // The sequence length the micro-batch's ops are shaped at: its tokens per
  // rank times cp (a pack shorter than seq_length runs shorter GEMMs, norms,
  // transfers); 0: seq_length. The attention figures are relative to it.
  std::int64_t tokens = 0;
  double attention = 1.0;        // causal query-key pairs per rank over a full-length sequence's share (AttentionShape::packed)
  double attention_tiles = 1.0;  // the same for the attention kernel's tiles (AttentionShape::packed_tiles)
  // Dynamic CP: the ranks this micro-batch's sequences are split over (its
  // CP ring has cp - 1 steps of this rank's tokens); 0: the plan's cp.
  int cp = 0;
};

struct StageProgram {
  int stage = 0;
  std::vector<Op> ops;
  std::vector<Kernel> kernels;
  std::vector<std::uint32_t> deps;      // op indices
};

struct Program {
  RankGrid grid;
  std::vector<StageProgram> stages;     // indexed by pipeline rank
  Schedule schedule = Schedule::one_f_one_b;
  int microbatches = 0;

  [[nodiscard]] const StageProgram& of_rank(int rank) const {
    return stages.at(static_cast<std::size_t>(grid.coord(rank).pp));
  }
  [[nodiscard]] std::size_t op_count() const;   // summed over stages (one rank each)
};

// Checks the invariants the engines rely on: kernels and deps in range and
// pointing at earlier ops, every send has a receive with the same tag on the
// peer stage and vice versa, and collectives of every group kind appear in
// the same sequence on all stages that share the group. Returns the first
// violation.
Result<void> validate_program(const Program& p);

const char* to_string(Stream s);
const char* to_string(OpKind k);
const char* to_string(Phase p);
const char* to_string(OpLabel l);

}  // namespace megascope
