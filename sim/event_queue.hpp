// The engine's event queue (internal to sim/): compute completions and lone
// transfers' ends, in (time, insertion) order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "sim/engine_stage.hpp"

namespace megascope::sim::detail {

// An op of a simulated rank: the rank's index among the simulated ranks
// (its state), and the op's index in its stage program.
struct Member {
  std::uint32_t state;
  std::uint32_t op;
};

// Compute completions in (time, insertion) order. Runs of consecutive
// insertions at the same time (the ranks of a group end a collective
// together and start equal computations) share one heap entry: a run is a
// FIFO, and runs are ordered by (time, first insertion), so events leave in
// exactly the order of a heap of single events, with far fewer heap steps
// when thousands of ranks compute in lockstep (full mode).
class EventQueue {
 public:
  [[nodiscard]] bool empty() const { return heap_.empty(); }
  [[nodiscard]] double top_time() const { return heap_.front().t; }
  [[nodiscard]] Member top() const {
    const Run& r = runs_[heap_.front().run];
    return r.items[r.head];
  }
  void push(double t, Member m) {
    if (last_ != kNone && runs_[last_].t == t) {
      runs_[last_].items.push_back(m);
      return;
    }
    std::uint32_t id;
    if (!free_.empty()) {
      id = free_.back();
      free_.pop_back();
    } else {
      id = static_cast<std::uint32_t>(runs_.size());
      runs_.emplace_back();
    }
    Run& r = runs_[id];
    r.t = t;
    r.head = 0;
    r.items.clear();
    r.items.push_back(m);
    heap_.push_back(Key{t, seq_++, id});
    std::push_heap(heap_.begin(), heap_.end(), later);
    last_ = id;
  }
  void pop() {
    const std::uint32_t id = heap_.front().run;
    Run& r = runs_[id];
    if (++r.head < r.items.size()) return;
    std::pop_heap(heap_.begin(), heap_.end(), later);
    heap_.pop_back();
    free_.push_back(id);
    if (last_ == id) last_ = kNone;
  }

 private:
  struct Run {
    double t = 0;
    std::size_t head = 0;
    std::vector<Member> items;
  };
  struct Key {
    double t;
    std::uint64_t seq;   // order of the run's first insertion
    std::uint32_t run;
  };
  struct Later {
    bool operator()(const Key& a, const Key& b) const { return a.t > b.t || (a.t == b.t && a.seq > b.seq); }
  };
  static constexpr Later later{};
  std::vector<Key> heap_;
  std::vector<Run> runs_;
  std::vector<std::uint32_t> free_;
  std::uint32_t last_ = kNone;   // the run the latest insertion went to, while queued
  std::uint64_t seq_ = 0;
};

}  // namespace megascope::sim::detail
