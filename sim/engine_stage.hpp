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
// line): what try_start and finish read for every op (the Op itself is only
// read to report a deadlock).
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
  std::uint32_t dep_begin = 0, dep_count = 0;    // its deps, in StageProgram::deps
  std::uint32_t next_begin = 0, next_count = 0;  // the ops that depend on it, in StageInfo::dependents
  std::uint32_t position = 0;               // index in its ordered stream
  OpKind kind = OpKind::compute;
  Stream stream = Stream::compute;
  CommGroup group = CommGroup::tp;
};
static_assert(sizeof(OpInfo) == 32);

struct StageInfo {
  const StageProgram* prog = nullptr;
  std::vector<OpInfo> ops;
  std::array<std::vector<std::uint32_t>, kStreamCount> stream_ops;
  std::vector<std::uint32_t> dependents;
  std::vector<std::uint32_t> class_op;   // CommClass -> its first op
  std::vector<std::uint32_t> class_streams;   // CommClass -> bit mask of the streams of its ops
  std::vector<std::int32_t> class_peer;  // CommClass -> peer stage of its sends or receives (0: a collective)
  std::vector<std::uint32_t> p2p;        // its sends and receives
  double compute_s = 0;                  // summed duration of its compute ops
};

// Packs one stage: durations priced once per kernel range, stream positions,
// dependents, collective ordinals, communication classes.
StageInfo analyse(const StageProgram& s, const CostModel& cost);

// Pairs every send with the receive of the same tag on its peer stage.
void match_transfers(const Program& p, std::vector<StageInfo>& stages);

}  // namespace megascope::sim::detail
