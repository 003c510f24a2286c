// The planner: every legal plan through stage 1 (exact memory, closed-form
// time), the best K fitting ones through the simulator (stage 2, in
// parallel, deterministic), ranked by simulated step time.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/accounting/memory.hpp"
#include "planner/estimate.hpp"
#include "planner/space.hpp"
#include "sim/report.hpp"
#include "sim/varlen_sim.hpp"

namespace megascope::planner {

struct SimulatedPlan {
  Candidate candidate;
  PlanSpec plan;
  int gpus = 0;
  Estimate stage1;
  std::uint64_t stage1_rank = 0;     // 1-based among fitting plans by stage-1 time (0: not from the search)
  sim::SimReport report;             // step time, tokens/s, MFU, bubble, exposed communication
  // Variable-length training: the sampled steps (sim/varlen_sim.hpp). The
  // report's step time, tokens/s, TFLOP/s and MFU are then theirs (the mean
  // step of the plan's scheduler); its bubble and exposed communication stay
  // the full-length step's.
  std::optional<sim::VarlenReport> varlen;
  MemoryReport memory;
  std::vector<std::string> megatron_notes;  // filled by the CLI
  [[nodiscard]] double headroom_bytes() const { return memory.capacity_bytes - memory.peak_bytes; }
  [[nodiscard]] double exposed_comm_s() const;
};

struct Progress {
  const char* stage = "";            // "stage 1" or "stage 2"
  std::uint64_t done = 0, total = 0;
};

struct SearchOptions {
  int top_k = 32;
  int threads = 0;                   // stage 1 and stage 2 workers; 0: the machine's cores
  std::optional<std::string> calibration;   // cost-model profile applied over the default
  std::function<void(const Progress&)> progress;   // called from the calling thread only
  bool stage1_only = false;          // stop after stage 1: `ranked` stays empty (benchmarks)
};

struct SearchResult {
  std::vector<SimulatedPlan> ranked;      // simulated, fastest first
  Rejections rejections;
  std::uint64_t evaluated = 0;            // plans through stage 1
  std::uint64_t fitting = 0;              // ... that fit in memory with the headroom
  std::uint64_t timed = 0;                // ... whose time was estimated in full (the others could
                                          // not beat the K best or the best rejected: Estimate::bounded)
  std::optional<Candidate> best_rejected; // fastest (stage 1) plan that does not fit
  Estimate best_rejected_estimate;
  double capacity_bytes = 0;
  double headroom_bytes = 0;
  double stage1_s = 0, stage2_s = 0;      // wall time
  std::string profile_source;
};

Result<SearchResult> search(const SearchInputs& in, const SearchOptions& o);

// Stage 2 for one plan (also used by --explain for a plan outside the top K).
Result<SimulatedPlan> simulate_plan(const SearchInputs& in, const PlanSpec& plan, int gpus,
                                    const std::optional<std::string>& calibration);

// Where a given plan stands against a finished search.
struct Explanation {
  SimulatedPlan plan;
  bool legal = true;
  std::string illegal_reason;              // validate_setup's message when not legal
  bool fits = true;
  std::optional<std::uint64_t> stage1_rank;   // among fitting plans (nullopt: not representable or not fitting)
  int simulated_rank = 0;                  // 1-based among the simulated plans with it inserted
  std::vector<std::string> reasons;        // why it is slower than the winner (or that it is the winner)
  // The fastest plan of the same split (gpus, tp, cp, pp, dp, ep, etp fixed;
  // everything else as the search's constraints allow), when the search
  // finds one faster than the plan; split_rank is its rank among the
  // simulated plans with it inserted. It says whether the split or the rest
  // of the plan (micro-batch size, virtual stages, recomputation, overlaps)
  // costs the time.
  std::optional<SimulatedPlan> split_best;
  int split_rank = 0;
};
Result<Explanation> explain(const SearchInputs& in, const SearchResult& r, const PlanSpec& plan, int gpus,
                            const SearchOptions& o);

// What bounds a simulated plan, one line per factor, largest loss first.
std::vector<std::string> bounding_factors(const SimulatedPlan& p);

}  // namespace megascope::planner
