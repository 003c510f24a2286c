// Helpers of the engine tests that build programs by hand (engine_test.cpp,
// serial_engine_test.cpp): a device whose timings are computed by hand, a
// kernel of a given length, and a span looked up by rank and op.
#pragma once

#include <catch2/catch.hpp>

#include "core/program/program.hpp"
#include "sim/cost_model.hpp"
#include "sim/engine.hpp"

namespace megascope::test {

// A device whose memory kernels move 1 GB/s with no launch overhead: a
// memory kernel of N bytes takes N / 1e9 seconds exactly.
inline sim::CostModel unit_cost(DeviceKind kind = DeviceKind::gpu) {
  DeviceSpec d;
  d.name = "unit";
  d.kind = kind;
  d.peak_bf16_flops = 1e12;
  d.peak_fp32_flops = 1e12;
  d.memory_bytes = 1e12;
  d.memory_bandwidth_Bps = 1e9;
  sim::CostProfile p;
  p.memory_efficiency = 1.0;
  p.launch_overhead_s = 0;
  return sim::CostModel(d, p);
}

// A memory kernel that takes `s` seconds on unit_cost().
inline Kernel seconds(double s) {
  Kernel k;
  k.kind = KernelKind::memory;
  k.memory = MemoryOp::other;
  k.bytes = s * 1e9;
  return k;
}

// Two pipeline stages with no ops yet.
inline Program two_stages() {
  Program p;
  p.grid = RankGrid{1, 1, 1, 2, 1, 1, 1};
  p.stages.resize(2);
  p.stages[0].stage = 0;
  p.stages[1].stage = 1;
  return p;
}

inline const Span& span_of(const sim::SimResult& r, int rank, std::uint32_t op) {
  for (const Span& s : r.spans)
    if (s.rank == rank && s.op == op) return s;
  FAIL("no span for rank " << rank << " op " << op);
  return r.spans.front();
}

}  // namespace megascope::test
