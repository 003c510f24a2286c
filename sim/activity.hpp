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

// Activity lists: compute, then communication by kind.
inline constexpr int kActivityLists = 1 + kCommKinds;
// The list of a code other than kActivityIgnored.
inline std::size_t activity_list(std::uint8_t code) {
  return (code & kActivityCompute) ? 0 : 1 + static_cast<std::size_t>(code);
}

// The report reads only the union of each list (sorted, touching and
// overlapping intervals joined, endpoints kept exactly). So each list's
// last interval is held open: a span that starts within it extends it
// (the union is the same, and the back-to-back ops of one stream make one
// entry instead of thousands); another span closes it into the list and
// opens the next. The open intervals sit in the record, where the next span
// of the rank finds them in cache; the lists are only written. flush()
// closes them: whoever gathers the lists (the engine, activity_of_spans)
// flushes before handing them over, so the report reads closed lists.
struct RankActivity {
  int rank = 0;
  Intervals compute;                              // compute spans, as added and joined
  std::array<Intervals, kCommKinds> comm;         // communication spans by kind, as added and joined
  std::array<double, kOpLabelCount> by_label{};   // compute time by label, summed in that order
  std::array<bool, kOpLabelCount> has_label{};
  bool any = false;                               // a span was added (the report skips ranks with none)
  std::array<std::pair<double, double>, kActivityLists> open{};   // each list's open interval
  std::uint8_t is_open = 0;                                       // bit k: list k has one

  Intervals& list(std::size_t k) { return k == 0 ? compute : comm[k - 1]; }

  void add(std::uint8_t code, double start, double end) {
    any = true;
    if (code == kActivityIgnored) return;
    if (code & kActivityCompute) {
      const auto l = static_cast<std::size_t>(code & ~kActivityCompute);
      by_label[l] += end - start;
      has_label[l] = true;
    }
    const std::size_t k = activity_list(code);
    std::pair<double, double>& o = open[k];
    const auto bit = static_cast<std::uint8_t>(1U << k);
    if (is_open & bit) {
      if (start >= o.first && start <= o.second) {
        o.second = std::max(o.second, end);
        return;
      }
      list(k).push_back(o);
    }
    o = {start, end};
    is_open |= bit;
  }

  // Closes the open intervals into their lists.
  void flush() {
    for (std::size_t k = 0; k < kActivityLists; ++k)
      if (is_open & (1U << k)) list(k).push_back(open[k]);
    is_open = 0;
  }
};

}  // namespace megascope::sim
