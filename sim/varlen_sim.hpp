// Variable-length training simulated step by step (docs/varlen.md).
//
// Each sampled step draws its global batch's sequence lengths from the
// training's distribution (core/varlen.hpp sample_lengths: the same lengths
// for the same seed and step on every platform), schedules them as
// Megatron-LM does, and simulates the Program of each replica with its own
// micro-batches:
//   pad         every micro-batch holds mbs sequences padded to seq_length:
//               the fixed-length step, with fewer real tokens;
//   dp_balanced packed micro-batches of up to seq_length tokens (THD), pack
//               i * dp + j to DP replica j (schedule_static); the CP ranks of a
//               replica split every document of its pack, so they carry equal
//               work, and the replicas differ by their packs' causal work;
//   dynamic_cp  the dp x cp ranks regrouped per micro-batch into CP groups
//               sized per sequence (schedule_dynamic_cp); each rank's
//               micro-batches carry its share of its group's documents and a
//               ring of its group's size.
// A replica's Program runs its micro-batches on every rank of it (its stages,
// TP and CP ranks), so its simulated step is its time; the step takes the
// slowest one's, as every replica waits for the others' gradients. With
// dynamic CP a rank's group-mates are priced as keeping pace with it (each
// micro-batch's groups are balanced to within 5% by the scheduler), so its
// step is a lower bound. At most `max_replicas` replicas (ranks, with dynamic
// CP) are simulated per step: those with the most causal attention work.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/program/program.hpp"
#include "core/setup.hpp"
#include "sim/cost_model.hpp"
#include "sim/network.hpp"

namespace megascope::sim {

struct VarlenStep {
  int step = 0;
  double step_s = 0;               // the slowest simulated replica's step
  double mean_replica_s = 0;       // the mean over the simulated replicas
  double fastest_replica_s = 0;
  std::int64_t sequences = 0;
  std::int64_t tokens = 0;         // real tokens (padding not counted)
  int microbatches = 0;            // per replica (per rank with dynamic CP)
  int replicas = 0;                // replicas (ranks) there were
  int simulated = 0;               // of them simulated
  double model_flops = 0;          // of the real tokens, causal within each document
  double model_flops_no_causal = 0;  // the same without causal halving
};

struct VarlenRun {
  std::string scheduler;           // "pad", "dp_balanced" or "dynamic_cp"
  std::vector<VarlenStep> steps;
  double mean_step_s = 0, p50_step_s = 0, p90_step_s = 0, max_step_s = 0, min_step_s = 0;
  double tokens_per_s = 0;         // all sampled steps' tokens over their time
  double tflops_per_gpu = 0, mfu = 0;            // model FLOPs, causal attention halved
  double tflops_per_gpu_no_causal = 0, mfu_no_causal = 0;   // every query against every earlier key of its document counted twice (the published tables' convention)
  // The replicas' mean time over the slowest one's, averaged over the steps:
  // 1 when balanced; the rest of the step the others wait.
  double balance = 1;
};

struct VarlenReport {
  double fixed_step_s = 0;               // every sequence seq_length tokens (mbs as planned)
  double fixed_tokens_per_s = 0;
  double mean_length = 0;                // of the distribution
  VarlenRun run;                         // the plan's scheduler
  std::optional<VarlenRun> static_cp;    // with dynamic_cp: dp_balanced on the same batches
};

Result<VarlenReport> simulate_varlen(const Setup& s, const CostModel& cost, const Topology& topo,
                                     int max_replicas = 64);

// One sampled step as a timeline draws it: the Program of its slowest
// replica (with dynamic CP, rank; the slowest of the 64 with the most
// attention work), built from `setup` (the Setup with the step's micro-batch
// count) and `loads` (each micro-batch's; empty when padded, which is the
// full-length Program), with the step's real tokens and model FLOPs.
struct VarlenProgram {
  Setup setup;
  std::vector<MicrobatchLoad> loads;
  Program program;
  int replica = 0, replicas = 1;
  std::int64_t tokens = 0;
  double model_flops = 0;
};
Result<VarlenProgram> slowest_replica_program(const Setup& s, const CostModel& cost, const Topology& topo, int step = 0);

}  // namespace megascope::sim
