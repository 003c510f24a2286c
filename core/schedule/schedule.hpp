// Pipeline schedules as data: for each pipeline rank, the order in which it
// runs the passes of each micro-batch on each of its model chunks. Pure
// functions of (schedule, pp, vpp, micro-batches); no timing, no work.
//
// Every schedule emits the backward pass split in two: B (gradient with
// respect to the input, which the previous stage waits for) and W (gradient
// with respect to the weights, which nobody waits for). Schedules without
// zero-bubble placement (gpipe, 1f1b, interleaved, DualPipe's non-zb
// backwards) run the backward unsplit, as one pass: each W right after its B
// and marked `paired`, so the input gradient leaves when both are done.
//
// Chunk c of rank r is virtual stage virtual_stage(schedule, pp, r, c) of the
// model (core/setup.hpp's layout): Megatron's interleaving c*pp + r, or the V
// shape of zb-v and dualpipev (chunk 0 = r, chunk 1 = 2pp - 1 - r). DualPipe
// runs two directions: chunk 0 is stage r of the forward direction, chunk 1
// stage pp-1-r of the reverse one; micro-batches [0, m/2) flow in direction 0
// and [m/2, m) in direction 1.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/plan.hpp"

namespace megascope {

enum class Pass : std::uint8_t { F, B, W };

struct ScheduleStep {
  Pass pass = Pass::F;
  int microbatch = 0;
  int chunk = 0;
  // A step with `paired` set runs together with the previous step of its
  // rank: one unit that starts when all its members may and whose members all
  // end (and are seen by other ranks) when the unit ends. Two uses:
  //   W after its own B   an unsplit backward (input and weight gradients in
  //                       one pass; the previous stage waits for both);
  //   B after an F        DualPipe(V)'s overlapped forward and backward of
  //                       different micro-batches (F&B in the DualPipe table),
  //                       possibly followed by that B's paired W.
  // An unpaired W is a split weight-gradient pass (zero-bubble placement).
  bool paired = false;

  friend bool operator==(const ScheduleStep&, const ScheduleStep&) = default;
};

using RankSchedule = std::vector<ScheduleStep>;

// Chunks per rank the schedule runs (1, vpp, or 2 for V/DualPipe shapes).
int schedule_chunks(Schedule s, int vpp);

// Virtual stage (position in the model's forward order) of chunk c on rank r.
int virtual_stage(Schedule s, int pp, int rank, int chunk);

// The order of steps on each of the pp ranks. Preconditions (checked by
// validate_setup): pp >= 1, vpp as the schedule needs, m >= 1 and the
// schedule's own constraints on m. Violations throw InternalError.
// `group`: the interleaved schedule's micro-batches per virtual-stage group
// (Megatron-Core's microbatch_group_size_per_vp_stage; 0: pp); other
// schedules ignore it.
std::vector<RankSchedule> make_schedule(Schedule s, int pp, int vpp, int microbatches, int group = 0);

// The interleaved schedule's warm-up forwards on pipeline rank r (Megatron-LM:
// 2 (pp - r - 1) + (vpp - 1) g, g the micro-batch group (0: pp), at most
// m vpp). The forwards after them run in steady-state pairs with the
// backward that follows each.
int interleaved_warmup(int pp, int vpp, int microbatches, int r, int group = 0);

// Megatron-Core's rules on the interleaved micro-batch group g for pp ranks
// and m micro-batches: pp <= g <= m, and the last group (m mod g) empty or of
// at least pp. Empty when they hold, else the broken rule in words.
std::string interleaved_group_rule(int pp, int m, int group);

// Times on an ideal cluster (no communication cost): each pass takes the
// given time on every stage; a step waits for its data dependencies
//   F(mb, vs) after F(mb, vs - 1);  B(mb, vs) after B(mb, vs + 1) and F(mb, vs);
//   W(mb, vs) after B(mb, vs);
// (vs = virtual_stage of the step's chunk; DualPipe's direction-1 micro-batches
// thus enter at rank pp - 1, whose chunk 1 is stage 0) and for the previous
// step (or paired unit) of its rank. A paired unit takes the sum of its
// members' times, except that one F and one B in it take fb_overlapped
// together when that is set. Throws InternalError on a malformed schedule or a
// deadlock (a rank's next step can never run).
struct IdealTimes {
  double f = 1.0, b = 1.0, w = 1.0;
  double fb_overlapped = -1;   // time of a paired F&B (a paired W adds w); < 0 means f + b (no overlap benefit)
};
struct IdealResult {
  double makespan = 0;
  std::vector<double> busy;        // per rank: time spent in passes
  double bubble_fraction = 0;      // (makespan - busiest rank's work) / busiest rank's work
  // Per rank: its first step's start to its last step's end. The longest is
  // the iteration with optimizer post-validation (PlanSpec::post_validation),
  // and Qi et al.'s bubble rate is (longest span - busiest work) / longest span.
  std::vector<double> span;
  double longest_span = 0;
  // Per rank: most micro-batch-chunks whose F ran and B did not. Counted along
  // the rank's order (+1 at F, -1 at B), so a paired F&B holds both.
  std::vector<int> peak_inflight;
};
IdealResult run_ideal(const std::vector<RankSchedule>& schedule, Schedule s, int pp, int vpp, int microbatches,
                      IdealTimes t = {});

// The same with each pipeline rank's own pass times (a stage of its own
// layers; the first and last stages with the embedding and the loss) and a
// transfer time between a pass on one rank and the pass on another rank that
// waits for it (a pipeline send of one micro-batch; none within a rank).
struct StageTimes {
  std::vector<double> f, b, w;   // per pipeline rank
  double comm = 0;
};
IdealResult run_stage_times(const std::vector<RankSchedule>& schedule, Schedule s, int pp, int vpp, int microbatches,
                            const StageTimes& t);

// The automatic zero-bubble schedules (zb-1p, zb-2p; Qi et al. 2024, Sec. 3):
// the order that finishes first under per-rank pass times and a memory limit.
// A micro-batch holds 1 (its full activations, M_B) on a rank from its F to
// its B, and w_memory (M_W / M_B) from its B to its W; a rank never holds more
// than memory_limit. Candidates: the paper's heuristic (warm-up forwards up to
// the limit, then F and B in turn, W where a gap would be longer than W or
// would become the largest accumulated bubble, or where memory must be freed),
// over its binary choices, and the handcrafted ZB-H1 and ZB-H2 orders where
// they fit the limit; each is timed with run_ideal and the fastest kept (the
// paper refines its heuristic with an ILP instead). `objective_span`: minimise
// the longest rank's span (optimizer post-validation) rather than the makespan.
struct AutoScheduleInputs {
  StageTimes times;                // per rank, and the transfer time
  double memory_limit = 0;         // in M_B; at least 1
  std::vector<double> w_memory;    // per rank, M_W / M_B in [0, 1]; empty: 1
  bool objective_span = false;
};
struct AutoSchedule {
  std::vector<RankSchedule> order;
  std::string chosen;              // which candidate: "heuristic (...)", "zb-h1", "zb-h2"
  double time = 0;                 // its objective under the inputs' times
};
AutoSchedule auto_zero_bubble(int pp, int microbatches, const AutoScheduleInputs& in);

// The memory limit, in M_B, of zb-1p (pp) and zb-2p (2 pp).
int auto_memory_limit(Schedule s, int pp);

// Peak of (F run, B not) + w_memory x (B run, W not) along one rank's order.
double order_peak_memory(const RankSchedule& order, double w_memory);

}  // namespace megascope
