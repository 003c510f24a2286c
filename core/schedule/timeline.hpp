// Internal to core/schedule (and its tests): the ideal-cluster evaluation of
// a schedule step by step, of which run_ideal() reports the summary.
#pragma once

#include <vector>

#include "core/schedule/schedule.hpp"

namespace megascope::schedule_detail {

struct StepTiming {
  double start = 0;
  double end = 0;
};

struct IdealTimeline {
  std::vector<std::vector<StepTiming>> steps;   // [rank][index in that rank's RankSchedule]
  IdealResult result;
};

// Every step starts as early as its rank's previous step (or paired group)
// and its data dependencies allow; see run_ideal() in schedule.hpp. Throws
// InternalError on a malformed schedule (a step outside the model, a pass
// listed twice, a dependency no rank runs) and on a deadlock.
// `per_rank`: per-rank times and the transfer time instead of t's (run_stage_times).
IdealTimeline ideal_timeline(const std::vector<RankSchedule>& schedule, Schedule s, int pp, int vpp, int microbatches,
                             IdealTimes t = {}, const StageTimes* per_rank = nullptr);

}  // namespace megascope::schedule_detail
