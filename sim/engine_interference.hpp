// Interference (CostProfile::comm_sms, docs/simulator.md): a collective
// running on a GPU holds SMs, and the GPU's compute ops progress at
// 1 - n comm_sms / sms of their rate with n of its collectives running.
// The engine (sim/engine.cpp) keeps one Interference: it asks it for a
// compute op's end when the op starts, tells it when a collective of a rank
// starts or ends (the rank's running compute ops then get new ends, pushed
// to the event heap), and asks it whether a compute op's heap entry is still
// the op's end (an earlier one is skipped).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace megascope::sim::detail {

class Interference {
 public:
  // `share`: the fraction of a GPU's SMs one collective holds (0: off, and
  // nothing below is used); `ranks`: the simulated ranks.
  void init(double share, std::size_t ranks) {
    share_ = std::min(1.0, share);
    if (share_ <= 0) return;
    running_.assign(ranks, {});
    active_.assign(ranks, 0);
  }
  [[nodiscard]] bool on() const { return share_ > 0; }

  // Compute op `op` of rank `s` starts at `now` with `work` seconds at the
  // full rate: its end at the rank's current rate.
  double start(std::uint32_t s, std::uint32_t op, double now, double work) {
    const double r = rate(active_[s]);
    const double end = r == 1.0 ? now + work : now + work / r;
    running_[s].push_back({op, work, now, r, end});
    return end;
  }

  // A collective of rank `s` starts (+1) or ends (-1) at `now`: the rank's
  // running compute ops keep the work they have done and finish the rest at
  // the new rate; push(end, op) is called for each new end.
  template <class Push>
  void changed(std::uint32_t s, double now, int delta, Push push) {
    const double before = rate(active_[s]);
    active_[s] = static_cast<std::uint32_t>(static_cast<int>(active_[s]) + delta);
    const double r = rate(active_[s]);
    if (r == before) return;
    for (Running& c : running_[s]) {
      c.work = std::max(0.0, c.work - (now - c.last) * c.rate);
      c.last = now;
      c.rate = r;
      c.end = now + c.work / r;
      push(c.end, c.op);
    }
  }

  // Whether compute op `op` of rank `s` ends at `now`: true once, for the
  // latest end it was given (the op is then no longer running); false for
  // an earlier end, or when it has ended already.
  bool due(std::uint32_t s, std::uint32_t op, double now) {
    std::vector<Running>& run = running_[s];
    for (std::size_t k = 0; k < run.size(); ++k) {
      if (run[k].op != op) continue;
      if (run[k].end != now) return false;
      run[k] = run.back();
      run.pop_back();
      return true;
    }
    return false;
  }

 private:
  static constexpr double kMinRate = 0.1;
  struct Running {
    std::uint32_t op;
    double work;   // seconds of it left at the full rate, as of `last`
    double last;   // when `work` was last brought up to date
    double rate;   // the rate since `last`
    double end;    // its end at that rate: its one heap entry still due
  };
  [[nodiscard]] double rate(std::uint32_t n) const { return std::max(kMinRate, 1.0 - static_cast<double>(n) * share_); }

  double share_ = 0;
  std::vector<std::vector<Running>> running_;   // per rank: its compute ops in flight
  std::vector<std::uint32_t> active_;           // per rank: its collectives running
};

}  // namespace megascope::sim::detail
