// CUDA-event timing of a rank's ops, as the measured Trace's spans
// (core/trace.hpp: seconds from the start of the iteration).
//
// The runtime calls start_step() once per step on one stream (the compute
// stream, after the previous step has finished), then begin(op)/end(op)
// around the work of each op on the op's stream, and collect() after the
// step: it waits for the last event and returns one Span per op,
//   start = elapsed(step event, op's start event), end = elapsed(step event, op's end event),
// the two read with cudaEventElapsedTime (resolution about 0.5 us). Events
// of different streams of one device share a clock, so spans on the
// compute, tp, dp and pp streams are on one time line. What a span covers:
// from the moment its stream reaches begin() to the moment it passes end(),
// so call begin() after the op's cudaStreamWaitEvent()s (its cross-stream
// dependencies), else the wait is counted in the op; a collective's span
// includes the time it waits for the other members (as the CPU executor's
// MPI spans do). Events are pooled and reused from step to step.
//
// Does not: time host work between launches (launch gaps show as gaps
// between spans), synchronise anything before collect().
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "core/trace.hpp"
#include "exec/cuda/device.hpp"

namespace megascope::exec::cuda {

class OpTimer {
 public:
  explicit OpTimer(int rank) : rank_(rank) {}
  void start_step(cudaStream_t stream);
  void begin(std::uint32_t op, cudaStream_t stream);
  void end(std::uint32_t op, cudaStream_t stream);   // std::logic_error if `op` has no open begin()
  // Waits for every event recorded since start_step(); spans in the order the
  // ops were begun. Clears the step (the event pool is kept).
  std::vector<Span> collect();
  [[nodiscard]] std::size_t pooled_events() const { return pool_.size(); }

 private:
  Event& next_event();
  struct Record {
    std::uint32_t op;
    std::size_t start, end;   // indices into pool_; end == start while open
  };
  int rank_ = 0;
  std::vector<Event> pool_;
  std::size_t used_ = 0;
  bool started_ = false;
  std::vector<Record> records_;
  std::unordered_map<std::uint32_t, std::size_t> open_;   // op -> index in records_
};

}  // namespace megascope::exec::cuda
