// Builds the Program of a validated Setup: the schedule's steps turned into
// kernels and communication per pipeline stage. See program.hpp for the
// ordering rules and docs/program.md for what each layer emits.
#pragma once

#include "core/program/program.hpp"
#include "core/schedule/schedule.hpp"
#include "core/setup.hpp"

namespace megascope {

Result<Program> build_program(const Setup& s);
// fb_overlap false: DualPipe(V)'s F&B units run their forward, then their
// backward, one after the other (no interleaving; for comparisons).
// order: the schedule's steps per pipeline rank to build instead of
// make_schedule's (the automatic zero-bubble schedules placed from priced
// times, sim/timed_program.hpp); they must be a valid order of the Setup's
// schedule, pp and micro-batches.
struct BuildOptions {
  bool fb_overlap = true;
  const std::vector<RankSchedule>* order = nullptr;
  // Variable-length training: micro-batch k of every rank holds loads[k]
  // (its attention scaled, and with dynamic CP its ring shortened); the
  // Setup's num_microbatches must equal loads->size(). Null: full-length.
  const std::vector<MicrobatchLoad>* loads = nullptr;
};
Result<Program> build_program(const Setup& s, const BuildOptions& options);

// One transformer layer's ops for one micro-batch on one rank, exactly as
// build_program emits them inside a pass (same kernels, collectives and
// dependencies), for estimates that cost a layer without a whole Program.
// `last` is the op the next layer waits for; ops after it (the tail of an
// overlapped TP collective) run beside the next layer.
enum class LayerPass : std::uint8_t { forward, backward_input, backward_weight };
struct LayerProbe {
  StageProgram ops;
  std::uint32_t last = 0;
};
LayerProbe probe_layer(const Setup& s, int layer, LayerPass pass);
// The same for the work at the ends of the model, per micro-batch.
enum class EdgePass : std::uint8_t { embedding_forward, embedding_weight, output_forward, output_backward_input,
                                     output_weight };
LayerProbe probe_edge(const Setup& s, EdgePass pass);
// A forward of `layer` and the backward (input and weight gradients) of
// another micro-batch through it, interleaved as DualPipe's F&B units are
// (detail::interleave_fb). `last` is the backward's weight-gradient op; the
// pair takes until its last op to end, so a caller runs every op.
// `interleave` false: the same ops, the forward's then the backward's.
LayerProbe probe_fb_pair(const Setup& s, int layer, bool interleave = true);

}  // namespace megascope
