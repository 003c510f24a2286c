// The engine's per-stage analysis (internal to sim/): each stage's ops packed
// into the records the event loop reads, and sends paired with receives.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/program/program.hpp"
#include "sim/cost_model.hpp"

namespace megascope::sim::detail {

constexpr std::uint32_t kNone = std::numeric_limits<std::uint32_t>::max();

inline bool is_async(Stream s) { return s == Stream::pp_send || s == Stream::pp_recv; }
inline bool is_p2p(OpKind k) { return k == OpKind::send || k == OpKind::recv; }

// The engine's view of one op of a stage, packed in 32 bytes (two to a cache
// line): what try_start and finish read for every op (the Op itself is read
// only while preparing flows and to report a deadlock).
struct OpInfo {
  struct Comm {
    std::uint32_t pair;                     // collective: index among ops of its (stream, group);
                                            // send/recv: the op it pairs with on the peer stage
    std::uint32_t comm_class;               // its CommClass among the stage's
  };
  union {
    double duration = 0;                    // compute: summed kernel time
    Comm comm;                              // communication
  };
  // Its predecessors in StageInfo::preds: the op before it on its ordered
  // stream (if any) and its deps. It may start once they have all finished.
  std::uint32_t pred_begin = 0, pred_count = 0;
  // Its successors in StageInfo::succs: the op after it on its ordered
  // stream (if any) first, then the ops that depend on it, in program order.
  std::uint32_t succ_begin = 0, succ_count = 0;
  OpKind kind = OpKind::compute;
  Stream stream = Stream::compute;
  CommGroup group = CommGroup::tp;
  // Whether its preds start with the op before it on its stream (kPrev) and
  // its succs with the op after it (kNext).
  static constexpr std::uint8_t kPrev = 1, kNext = 2;
  std::uint8_t stream_links = 0;
};
static_assert(sizeof(OpInfo) == 32);

// A send or receive of a stage, for match_transfers.
struct P2pEnd {
  std::uint64_t tag;
  std::uint32_t op;
  std::int32_t peer_stage;
  bool send;
};

struct StageInfo {
  const StageProgram* prog = nullptr;
  std::vector<OpInfo> ops;
  std::vector<std::uint32_t> preds, succs;    // see OpInfo
  std::array<std::uint32_t, kStreamCount> first{};   // first op of each stream (analyse: kNone for none)
  std::vector<std::uint32_t> async_ops;       // ops of unordered streams (pp_send, pp_recv)
  std::vector<std::uint32_t> class_op;   // CommClass -> its first op
  std::vector<std::uint32_t> class_streams;   // CommClass -> bit mask of the streams of its ops
  std::vector<std::int32_t> class_peer;  // CommClass -> peer stage of its sends or receives (0: a collective)
  std::vector<P2pEnd> p2p;               // its sends and receives, in program order
  double compute_s = 0;                  // summed duration of its compute ops
  std::vector<std::uint8_t> codes;       // with codes asked for: activity_code of each op (sim/activity.hpp)
};

// Packs one stage: durations priced once per kernel range, predecessors and
// successors (stream order and deps), collective ordinals, communication
// classes; with `codes`, each op's activity code for the report.
StageInfo analyse(const StageProgram& s, const CostModel& cost, bool codes = false);

// Pairs every send with the receive of the same tag on its peer stage.
void match_transfers(const Program& p, std::vector<StageInfo>& stages);

}  // namespace megascope::sim::detail
