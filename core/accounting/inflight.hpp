// How many micro-batches' activations each model chunk of each pipeline rank
// holds at that rank's peak, per schedule (closed forms):
//
//   gpipe        every forward before any backward: m
//   1f1b         rank r holds min(p - r, m)                      (Narayanan 2021)
//   interleaved  Megatron warm-up 2(p - r - 1) + (v - 1)g forwards, plus the
//                first steady-state forward, spread over chunks in Megatron's
//                order (g micro-batches per chunk in turn, g = pp by default); on rank 0 this gives
//                L (1 + (p-1)/(p v)) layers' worth (Korthikanti 2022, 4.2.3)
//   zb-h1        as 1F1B for full activations, plus r micro-batches waiting
//                for their weight gradients (Qi et al. 2024, Table 2:
//                (p - i + 1) M_B + (i - 1) M_W for worker i = r + 1)
//   zb-h2        2(p - r) - 1, plus up to 2r + 1 awaiting W (core/schedule/zb_h2.cpp)
//   zb-1p, zb-2p at their memory limit: p (2p) micro-batches, an awaiting W
//                counted as a full one (core/schedule/zb_auto.cpp)
//   zb-v         V shape: chunk 0 is stage r, chunk 1 stage 2p-1-r of a 2p-stage
//                pipeline; 2p - r - 1 and r + 1 micro-batches (p M_B per rank)
//   dualpipe     rank r is stage r of one direction and stage p-1-r of the
//                other: p - r and r + 1 ((p + 1) M_B, DualPipe README table)
//   dualpipev    as a 2p-stage 1F1B folded in a V: 2p - r and r + 1
// Every count is capped by the micro-batches that reach the chunk.
#pragma once

#include <vector>

#include "core/setup.hpp"

namespace megascope {

struct ChunkInflight {
  int full = 0;               // micro-batches with all activations kept
  int weight_grad_only = 0;   // micro-batches past B waiting for W (zero-bubble)
};

// inflight[r][c] for pipeline rank r and chunk c of Setup::chunks.
std::vector<std::vector<ChunkInflight>> inflight_microbatches(const Setup& s);

// The same for one pipeline rank r of p, with v chunks per rank in the model
// split and m micro-batches; writes `out[0 .. chunks)` (chunks: 1, or v, or 2
// for the V-shaped and DualPipe schedules). No allocation: the planner calls
// it for every candidate plan.
// `group`: the interleaved schedule's micro-batch group (0: p).
void rank_inflight(Schedule schedule, int p, int v, int m, int r, ChunkInflight* out, int chunks, int group = 0);

// Where a rank's chunks keep different bytes per micro-batch (a layout, the
// embedding or the loss counted in the split), its activations peak at the
// step of its order that maximises sum over chunks of in-flight x bytes,
// which need not be the closed form's step. The full in-flight counts per
// chunk of rank r after each forward of its order (make_schedule's; the
// interleaved one walked from Megatron-Core's schedule table without
// building it), reduced to the maximal ones (none is at most another in
// every chunk): the peak of any non-negative weighting is at one of them.
// Their largest total is the closed form's (tests/core/schedule_inflight_test.cpp).
std::vector<std::vector<int>> inflight_candidates(Schedule schedule, int p, int v, int m, int r, int group = 0);

// Of `candidates`, the counts with the largest sum of count x bytes[c]
// (the first of equal ones); nullptr when there are none.
const std::vector<int>* heaviest_inflight(const std::vector<std::vector<int>>& candidates, const double* bytes);

}  // namespace megascope
