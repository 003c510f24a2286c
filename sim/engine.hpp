// The discrete-event engine: runs a Program over a cost model and a network.
//
// Each simulated rank has one cursor per ordered stream (compute, tp, cp, ep,
// dp) and asynchronous point-to-point ops. An op starts when it heads its
// stream (ordered streams) and its dependencies have finished; a compute op
// then takes its kernels' time; a collective waits until every member of its
// group has reached it and then runs as one flow on the shared network; a send
// and its receive run as one flow once both are posted. Events come from a
// time-ordered heap (compute completions) and from the network resource
// (transfer completions); the engine always advances to the earlier one.
// Deterministic: ties are broken by insertion order.
//
// Modes: full simulates every rank; reduced simulates one representative per
// pipeline stage (tp = cp = dp = 0), which is exact when all ranks of a stage
// are symmetric and their flows do not share links with other groups' flows.
//
// Execution: streams (a GPU: the streams above overlap) or serial (a CPU
// rank of the CPU executor: one op at a time in list order, whatever its
// stream; dependencies are implied by the order; a send is posted and the
// rank goes on, its transfer starting once the receive is posted; a receive
// or a collective holds the rank until its transfer ends). A span of a
// serial rank is the time the op held the rank, waiting included, as the
// executor measures it; a send's span is its posting (zero length).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/program/program.hpp"
#include "core/result.hpp"
#include "core/trace.hpp"
#include "sim/activity.hpp"
#include "sim/cost_model.hpp"
#include "sim/network.hpp"

namespace megascope::sim {

// The collective a communication op runs (send and receive: send_recv; an
// all-to-all by its CommSpan). The engine and the planner's probes both use it.
inline Collective collective_of(const Op& op) {
  switch (op.kind) {
    case OpKind::all_reduce: return Collective::all_reduce;
    case OpKind::reduce_scatter: return Collective::reduce_scatter;
    case OpKind::all_gather: return Collective::all_gather;
    case OpKind::all_to_all:
      return op.span == CommSpan::rails    ? Collective::all_to_all_rails
             : op.span == CommSpan::domain ? Collective::all_to_all_domain
                                           : Collective::all_to_all;
    default: return Collective::send_recv;
  }
}

enum class Mode : std::uint8_t { full, reduced };
enum class Execution : std::uint8_t { streams, serial };

struct SimOptions {
  Mode mode = Mode::reduced;
  bool record_trace = true;
  // Ranks whose spans are recorded; empty: every simulated rank when there
  // are at most 64 of them, else one representative per stage.
  std::vector<int> trace_ranks;
  // Absent: serial for a CPU device (DeviceSpec::kind, as the CPU executor
  // runs), streams otherwise.
  std::optional<Execution> execution = std::nullopt;
  // Collectives that always have their links to themselves (a TP group on
  // its NVLink ports) end by formula instead of as network flows: the same
  // times up to the network's 1e-12 event tolerance, far fewer network
  // events. Off: every transfer is a network flow (for comparison).
  bool lone_flows = true;
  // A transfer that starts while no other flow uses any of its links (a
  // pipeline transfer on its NIC ports between DP synchronisations, a CP
  // exchange between TP collectives) is held outside the network and ends
  // by formula, unless another flow comes onto one of its links first; it
  // then enters the network as it would have started (Network::hold). The
  // same times up to the network's 1e-12 event tolerance, one event per
  // such transfer instead of two network events and their solves. Off:
  // every transfer that is not lone is a network flow (for comparison).
  bool idle_flows = true;
  // The ops one op's end lets start that touch nothing shared (compute, lone
  // collectives with no other member), and the ops theirs let start, are
  // one event (a region); lone collectives with members to wait for are
  // posted ahead and end for all members in one event: the same times, far
  // fewer events. Off: one event per op.
  bool regions = true;
  // Gather the traced ranks' activity (sim/activity.hpp) as their ops end,
  // for make_report, whether or not spans are recorded.
  bool activity = false;
};

// The execution a simulation of `device` uses when SimOptions leaves it open.
Execution default_execution(const DeviceSpec& device);

using megascope::Span;   // core/trace.hpp

struct SimResult {
  double step_time_s = 0;
  std::vector<Span> spans;                 // traced ranks only; in completion order, except that a region's
                                           // ops that nothing outside it waits for come when it starts
  std::vector<int> traced_ranks;
  std::vector<int> simulated_ranks;
  std::uint64_t events = 0;                // op completions + network events processed
  std::vector<double> compute_time_s;      // per stage program: summed duration of its compute ops
  std::vector<RankActivity> activity;      // SimOptions::activity: per traced rank (once each), in traced_ranks' order
};

// Duration of each compute op of a stage (sum of its kernels' costs).
std::vector<double> compute_durations(const StageProgram& stage, const CostModel& cost);

// `program` must pass validate_program (build_program's output does): sends
// and receives pair by tag, and a tag used twice on one channel would pair
// by position.
Result<SimResult> simulate(const Program& program, const Topology& topo, const CostModel& cost,
                           const SimOptions& options = {});

}  // namespace megascope::sim
