// Chunk placement and the dispatch to the per-schedule order generators
// (one file per schedule family in this folder).
#include "core/schedule/schedule.hpp"

#include <fmt/format.h>

#include "core/result.hpp"
#include "core/schedule/builders.hpp"

namespace megascope {

int schedule_chunks(Schedule s, int vpp) {
  switch (s) {
    case Schedule::interleaved: return vpp;
    case Schedule::zb_v:
    case Schedule::dualpipe:
    case Schedule::dualpipev: return 2;
    case Schedule::gpipe:
    case Schedule::one_f_one_b:
    case Schedule::zb_h1:
    case Schedule::zb_h2:
    case Schedule::zb_1p:
    case Schedule::zb_2p: return 1;
  }
  return 1;
}

// The one definition of chunk placement; core/setup.cpp lays out layers with it.
int virtual_stage(Schedule s, int pp, int rank, int chunk) {
  switch (s) {
    case Schedule::zb_v:
    case Schedule::dualpipev: return chunk == 0 ? rank : 2 * pp - 1 - rank;   // V: down, then back up
    case Schedule::dualpipe: return chunk == 0 ? rank : pp - 1 - rank;        // two directions over pp stages
    default: return chunk * pp + rank;                                      // Megatron's interleaving
  }
}

namespace {

[[noreturn]] void precondition(Schedule s, const std::string& what) {
  throw InternalError(fmt::format("make_schedule({}): {}", to_string(s), what));
}

}  // namespace

std::string interleaved_group_rule(int pp, int m, int group) {
  if (group < pp || group > m)
    return fmt::format("the micro-batch group ({}) must be between pp ({}) and the micro-batch count ({})", group, pp,
                       m);
  if (const int last = m % group; last > 0 && last < pp)
    return fmt::format("the micro-batch count ({}) leaves a last group of {} micro-batches (m mod {}), which must be 0 "
                       "or at least pp ({})",
                       m, last, group, pp);
  return {};
}

std::vector<RankSchedule> make_schedule(Schedule s, int pp, int vpp, int microbatches, int group) {
  using namespace schedule_detail;
  const int m = microbatches;
  if (pp < 1) precondition(s, fmt::format("pp must be >= 1, found {}", pp));
  if (m < 1) precondition(s, fmt::format("the micro-batch count must be >= 1, found {}", m));
  switch (s) {
    case Schedule::gpipe: return gpipe_order(pp, m);
    case Schedule::one_f_one_b: return one_f_one_b_order(pp, m);
    case Schedule::interleaved:
      if (vpp < 1) precondition(s, fmt::format("vpp must be >= 1, found {}", vpp));
      if (group <= 0) group = pp;
      if (const std::string why = interleaved_group_rule(pp, m, group); !why.empty()) precondition(s, why);
      return interleaved_order(pp, vpp, m, group);
    case Schedule::zb_h1: return zb_h1_order(pp, m);
    case Schedule::zb_h2: return zb_h2_order(pp, m);
    case Schedule::zb_1p:
    case Schedule::zb_2p: {
      // Without the stages' times: equal unit passes, no transfer time, and
      // M_W = M_B (sim/timed_program.cpp places the order from priced times).
      AutoScheduleInputs in;
      in.times = {std::vector<double>(static_cast<std::size_t>(pp), 1.0), std::vector<double>(static_cast<std::size_t>(pp), 1.0),
                  std::vector<double>(static_cast<std::size_t>(pp), 1.0), 0.0};
      in.memory_limit = auto_memory_limit(s, pp);
      return auto_zero_bubble(pp, m, in).order;
    }
    case Schedule::zb_v: return zb_v_order(pp, m);
    case Schedule::dualpipe:
      if (pp % 2 != 0) precondition(s, fmt::format("pp must be even, found {}", pp));
      if (m % 2 != 0 || m < 2 * pp)
        precondition(s, fmt::format("the micro-batch count must be even and >= 2 x pp = {}, found {}", 2 * pp, m));
      return dualpipe_order(pp, m);
    case Schedule::dualpipev:
      if (m < 2 * pp)
        precondition(s, fmt::format("the micro-batch count must be >= 2 x pp = {}, found {}", 2 * pp, m));
      return dualpipev_order(pp, m);
  }
  precondition(s, "unknown schedule");
}

}  // namespace megascope
