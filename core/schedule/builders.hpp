// Internal to core/schedule: the per-schedule order generators behind
// make_schedule() and a small writer that appends one rank's steps.
//
// Each generator returns the orders of all pp ranks and assumes the
// preconditions make_schedule() checked (see schedule.cpp).
#pragma once

#include <deque>
#include <utility>
#include <vector>

#include "core/schedule/schedule.hpp"

namespace megascope::schedule_detail {

// Appends the steps of one rank. A backward is either unsplit (b_w: B, then
// its W paired with it, one backward pass whose input gradient leaves when
// both are done) or split (b_defer: B now, its W queued in a FIFO and written
// later, oldest first, by pop_w, like the WeightGradStore queue of the
// zero-bubble and DualPipe implementations).
class RankWriter {
 public:
  explicit RankWriter(RankSchedule& out) : out_(out) {}

  void f(int mb, int chunk, bool paired = false) { out_.push_back({Pass::F, mb, chunk, paired}); }
  void b(int mb, int chunk, bool paired = false) { out_.push_back({Pass::B, mb, chunk, paired}); }
  void w(int mb, int chunk) { out_.push_back({Pass::W, mb, chunk, false}); }   // a split W
  // Unsplit backward: B, then its W paired with it.
  void b_w(int mb, int chunk, bool paired = false) {
    b(mb, chunk, paired);
    out_.push_back({Pass::W, mb, chunk, true});
  }
  // B now, its W queued for a later pop_w().
  void b_defer(int mb, int chunk, bool paired = false) {
    b(mb, chunk, paired);
    deferred_.emplace_back(mb, chunk);
  }
  // Writes the oldest deferred W (none pending: nothing).
  void pop_w() {
    if (deferred_.empty()) return;
    w(deferred_.front().first, deferred_.front().second);
    deferred_.pop_front();
  }
  void flush_w() {
    while (!deferred_.empty()) pop_w();
  }

 private:
  RankSchedule& out_;
  std::deque<std::pair<int, int>> deferred_;   // (micro-batch, chunk)
};

std::vector<RankSchedule> gpipe_order(int pp, int m);
std::vector<RankSchedule> one_f_one_b_order(int pp, int m);
std::vector<RankSchedule> interleaved_order(int pp, int vpp, int m, int group);
// Megatron-Core's get_schedule_table: (micro-batch, chunk) of each virtual micro-batch in forward order.
std::vector<std::pair<int, int>> interleaved_table(int vpp, int m, int group);
std::vector<RankSchedule> zb_h1_order(int pp, int m);
std::vector<RankSchedule> zb_h2_order(int pp, int m);
std::vector<RankSchedule> zb_v_order(int pp, int m);
std::vector<RankSchedule> dualpipe_order(int pp, int m);
std::vector<RankSchedule> dualpipev_order(int pp, int m);

}  // namespace megascope::schedule_detail
