// ZB-V (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", Sec. 6, the
// handcrafted V schedule of sail-sg/zero-bubble-pipeline-parallelism).
//
// Chunk 0 of rank r is stage r and chunk 1 stage 2pp - 1 - r of a 2pp-stage
// model, so a micro-batch goes down the ranks and back up. Rank r runs:
//   warm-up   2(pp - r) - 1 forwards of chunk 0, then r pairs (F chunk 1,
//             F chunk 0), then pp - r triples (F, B, W) of chunk 1: 2pp - 1
//             forwards in all before its first backward (2pp - r - 1 of
//             chunk 0 and r of chunk 1, the paper's "2p - i" and "i - 1");
//   steady    F-B-W on chunk 0, then F-B-W on chunk 1, until every forward ran;
//   cool-down r pairs (B chunk 0, B chunk 1) with W deferred, pp - r pairs
//             (B chunk 0, oldest deferred W of chunk 0), then the deferred W
//             of chunk 1, then those of chunk 0.
// The order is built for max(m, 2pp - 1) micro-batches, and steps of
// micro-batches >= m are dropped (the reference pads the same way). With
// T_F = T_B = T_W every rank then runs without a gap from its first step to
// its last (the "zero bubble" of the paper); see the tests for the exact
// makespan.
#include <algorithm>
#include <deque>

#include "core/schedule/builders.hpp"

namespace megascope::schedule_detail {

namespace {

// One rank's order for n micro-batches (some beyond the real m).
class VRank {
 public:
  VRank(RankSchedule& out, int m) : out_(out), m_(m) {}

  void f(int chunk) { put(Pass::F, next_f_[chunk]++, chunk); }
  void b(int chunk, bool defer) {
    const int mb = next_b_[chunk]++;
    put(Pass::B, mb, chunk);
    if (defer)
      pending_[chunk].push_back(mb);
    else
      put(Pass::W, mb, chunk);
  }
  void pop_w(int chunk) {
    if (pending_[chunk].empty()) return;
    put(Pass::W, pending_[chunk].front(), chunk);
    pending_[chunk].pop_front();
  }
  void flush_w(int chunk) {
    while (!pending_[chunk].empty()) pop_w(chunk);
  }
  [[nodiscard]] int forwards(int chunk) const { return next_f_[chunk]; }

 private:
  void put(Pass p, int mb, int chunk) {
    if (mb < m_) out_.push_back({p, mb, chunk, false});
  }
  RankSchedule& out_;
  int m_;
  int next_f_[2] = {0, 0};
  int next_b_[2] = {0, 0};
  std::deque<int> pending_[2];
};

}  // namespace

std::vector<RankSchedule> zb_v_order(int pp, int m) {
  const int n = std::max(m, 2 * pp - 1);
  std::vector<RankSchedule> out(static_cast<std::size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    VRank v(out[static_cast<std::size_t>(r)], m);
    for (int i = 0; i < 2 * (pp - r) - 1; ++i) v.f(0);
    for (int i = 0; i < r; ++i) {
      v.f(1);
      v.f(0);
    }
    for (int i = 0; i < pp - r; ++i) {
      v.f(1);
      v.b(1, false);
    }
    while (v.forwards(1) < v.forwards(0) || v.forwards(0) < n) {
      if (v.forwards(0) < n) v.f(0);
      v.b(0, false);
      v.f(1);
      v.b(1, false);
    }
    for (int i = 0; i < r; ++i) {
      v.b(0, true);
      v.b(1, true);
    }
    for (int i = 0; i < pp - r; ++i) {
      v.b(0, true);
      v.pop_w(0);
    }
    v.flush_w(1);
    v.flush_w(0);
  }
  return out;
}

}  // namespace megascope::schedule_detail
