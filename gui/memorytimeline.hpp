// Memory over time for one traced rank, derived from the simulated spans
// (the simulator itself does not track memory in time).
//
// Approximation (docs/gui.md): weights, gradients, optimizer state and the
// runtime overheads of memory_report() are resident the whole iteration. A
// layer's activations for one micro-batch (layer_activations().stored) are
// allocated when the first forward op of that (layer, micro-batch) starts and
// freed when its last backward op (input or weight gradient) ends. A layer
// with full recomputation keeps only its checkpoint (input) from its forward
// on, and its full activations from the start of its recompute to the end of
// its backward. The embedding and output-layer activations of a micro-batch
// follow the same rule on the first and last stages. Freeing at the end of
// the weight gradient overstates zero-bubble schedules slightly (only the
// weight-gradient state stays alive after the input gradient).
// Plain data: no widgets.
#pragma once

#include <vector>

#include "core/program/program.hpp"
#include "core/setup.hpp"
#include "core/trace.hpp"

namespace megascope::gui {

struct MemoryPoint {
  double time = 0;     // seconds
  double bytes = 0;    // activations from this time until the next point
};

struct MemoryTimeline {
  int rank = 0;
  int stage = 0;
  double staticBytes = 0;                   // weights + gradients + optimizer + other
  double capacityBytes = 0;
  std::vector<MemoryPoint> activations;     // step function, times ascending
  double peakActivationBytes = 0;
  double peakTime = 0;
  [[nodiscard]] double peakTotalBytes() const { return staticBytes + peakActivationBytes; }
};

MemoryTimeline memoryOverTime(const Setup& setup, const Program& program, const std::vector<Span>& spans, int rank);

}  // namespace megascope::gui
