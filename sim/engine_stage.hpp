// The engine's per-stage analysis (internal to sim/): each stage's ops packed
// into the records the event loop reads, and sends paired with receives.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/program/program.hpp"
#include "sim/activity.hpp"
#include "sim/cost_model.hpp"

namespace megascope::sim::detail {

constexpr std::uint32_t kNone = std::numeric_limits<std::uint32_t>::max();

inline bool is_async(Stream s) { return s == Stream::pp_send || s == Stream::pp_recv; }
inline bool is_p2p(OpKind k) { return k == OpKind::send || k == OpKind::recv; }

// An op's predecessors or successors: up to kNear of them as distances from
// the op (every op of a program has a few, close by), or, spilled, a range of
// StageInfo::preds or succs. Kept in the op's record, so that the event loop
// reads an op's neighbours from the line it has just read, not from two more
// arrays that dozens of ranks walk at once.
struct Adjacency {
  static constexpr std::uint32_t kNear = 4;
  static constexpr std::uint32_t kFar = 0xffff;       // the largest distance kept near
  static constexpr std::uint8_t kSpilled = 0xff;      // OpInfo::pred_n / succ_n of a spilled list
  struct Far {
    std::uint32_t begin, count;
  };
  union {
    std::uint16_t near[kNear];
    Far far;
  };
};

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
  // Its predecessors (StageInfo::all_preds): the op before it on its ordered
  // stream (if any) and its deps. It may start once they have all finished.
  // Its successors (StageInfo::each_succ): the op after it on its ordered
  // stream (if any) first, then the ops that depend on it, in program order.
  Adjacency pred{}, succ{};
  std::uint8_t pred_n = 0, succ_n = 0;      // how many of each kept near, or Adjacency::kSpilled
  OpKind kind = OpKind::compute;
  Stream stream = Stream::compute;
  CommGroup group = CommGroup::tp;
  std::uint8_t code = kActivityIgnored;     // its activity_code, for the report (sim/activity.hpp)
  [[nodiscard]] bool has_succs() const { return succ_n != 0; }
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
  std::vector<std::uint32_t> preds, succs;    // spilled lists (OpInfo::pred, OpInfo::succ)
  std::array<std::uint32_t, kStreamCount> first{};   // first op of each stream (analyse: kNone for none)
  std::array<std::vector<std::uint32_t>, kStreamCount> unordered;   // per unordered stream (pp_send, pp_recv): its ops
  std::vector<std::uint32_t> class_op;   // CommClass -> its first op
  std::vector<std::uint32_t> class_streams;   // CommClass -> bit mask of the streams of its ops
  std::vector<std::int32_t> class_peer;  // CommClass -> peer stage of its sends or receives (0: a collective)
  std::vector<P2pEnd> p2p;               // its sends and receives, in program order
  double compute_s = 0;                  // summed duration of its compute ops
  std::array<std::uint32_t, kActivityLists> list_ops{};   // its ops of each activity list (OpInfo::code)

  // f(p) for each predecessor p of op i, in order, while f returns true;
  // whether it always did. Both lists call f from two loops (near and
  // spilled): the engine marks its hot lambdas always_inline so that each
  // still inlines.
  template <class F>
  [[gnu::always_inline]] bool all_preds(std::uint32_t i, F&& f) const {
    const OpInfo& o = ops[i];
    if (o.pred_n != Adjacency::kSpilled) [[likely]] {
      for (std::uint32_t k = 0; k < o.pred_n; ++k)
        if (!f(i - o.pred.near[k])) return false;
      return true;
    }
    for (std::uint32_t p = o.pred.far.begin; p < o.pred.far.begin + o.pred.far.count; ++p)
      if (!f(preds[p])) return false;
    return true;
  }
  // f(s) for each successor s of op i, in order.
  template <class F>
  [[gnu::always_inline]] void each_succ(std::uint32_t i, F&& f) const {
    const OpInfo& o = ops[i];
    if (o.succ_n != Adjacency::kSpilled) [[likely]] {
      for (std::uint32_t k = 0; k < o.succ_n; ++k) f(i + o.succ.near[k]);
      return;
    }
    for (std::uint32_t p = o.succ.far.begin; p < o.succ.far.begin + o.succ.far.count; ++p) f(succs[p]);
  }
};

// Packs one stage: durations priced once per kernel range, predecessors and
// successors (stream order and deps), collective ordinals, communication
// classes, each op's activity code for the report.
StageInfo analyse(const StageProgram& s, const CostModel& cost);

// Pairs every send with the receive of the same tag on its peer stage.
void match_transfers(const Program& p, std::vector<StageInfo>& stages);

}  // namespace megascope::sim::detail
