// What the report reads of one traced rank's spans: its compute intervals,
// its communication intervals by kind and its compute time by label. The
// report gathers them from SimResult::spans, or the engine gathers them as
// ops end (SimOptions::activity), which spares a search that needs only the
// report the spans and their second pass. Both add the same spans in the
// same order through RankActivity::add, so the reports are identical.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/program/program.hpp"

namespace megascope::sim {

enum class CommKind : std::uint8_t { tp, cp, ep, dp, pp };
inline constexpr int kCommKinds = 5;
const char* to_string(CommKind k);

using Intervals = std::vector<std::pair<double, double>>;

// What a span needs of its op, one byte per op: compute (kActivityCompute |
// its label), a kind of communication, or kActivityIgnored (a transfer the
// report does not count).
inline constexpr std::uint8_t kActivityCompute = 0x80, kActivityIgnored = 0x7f;
static_assert(kOpLabelCount < kActivityIgnored && kCommKinds < kActivityIgnored);
inline std::uint8_t activity_code(const Op& op) {
  if (op.kind == OpKind::compute) return static_cast<std::uint8_t>(kActivityCompute | static_cast<std::uint8_t>(op.label));
  switch (op.label) {
    case OpLabel::tp_comm: return static_cast<std::uint8_t>(CommKind::tp);
    case OpLabel::cp_comm: return static_cast<std::uint8_t>(CommKind::cp);
    case OpLabel::ep_comm: return static_cast<std::uint8_t>(CommKind::ep);
    case OpLabel::dp_grad:
    case OpLabel::dp_param:
    case OpLabel::embedding_grad: return static_cast<std::uint8_t>(CommKind::dp);
    case OpLabel::pp_activation:
    case OpLabel::pp_gradient: return static_cast<std::uint8_t>(CommKind::pp);
    default: return kActivityIgnored;
  }
}
// One code per op of a stage.
std::vector<std::uint8_t> activity_codes(const StageProgram& stage);

// The report reads only the union of each list (sorted, touching and
// overlapping intervals joined, endpoints kept exactly), so a span that
// starts within the list's last interval extends it instead of being
// appended: the union is the same, and the back-to-back ops of one stream
// make one entry instead of thousands.
inline void add_interval(Intervals& v, double start, double end) {
  if (!v.empty() && start >= v.back().first && start <= v.back().second) {
    v.back().second = std::max(v.back().second, end);
    return;
  }
  v.emplace_back(start, end);
}

struct RankActivity {
  int rank = 0;
  Intervals compute;                              // compute spans, as added (add_interval)
  std::array<Intervals, kCommKinds> comm;         // communication spans by kind, as added
  std::array<double, kOpLabelCount> by_label{};   // compute time by label, summed in that order
  std::array<bool, kOpLabelCount> has_label{};
  bool any = false;                               // a span was added (the report skips ranks with none)

  void add(std::uint8_t code, double start, double end) {
    any = true;
    if (code & kActivityCompute) {
      add_interval(compute, start, end);
      const auto l = static_cast<std::size_t>(code & ~kActivityCompute);
      by_label[l] += end - start;
      has_label[l] = true;
    } else if (code != kActivityIgnored) {
      add_interval(comm[code], start, end);
    }
  }
};

}  // namespace megascope::sim
