// Sections of docs/validation.md built outside validation_report.cpp.
#pragma once

#include <string>
#include <vector>

#include "published.hpp"

namespace megascope {

// The Megatron-Bridge / NeMo dense rows: a table and each class's error (markdown).
std::string bridge_nemo_section(const std::string& ref_dir);
// The sustained clock fitted per GPU generation, with leave-one-model-out (markdown).
std::string sustained_clock_section(const std::string& ref_dir);

// The MoE rows (bench::bridge_nemo_moe) predicted, and how the runs of each
// model on each GPU rank.
struct MoeRow {
  bench::PublishedRun run;
  bool ok = false;
  std::string error;           // the simulation's error when !ok
  double predicted = 0;        // tokens/s per GPU
  double error_frac = 0;       // predicted / published - 1
  double peak_gib = 0;
  bool fits = false;
};
struct MoeRanking {
  std::string model, gpu;
  std::vector<std::string> published_order, predicted_order;   // labels, fastest first
  int pairs = 0, right = 0;    // pairs with different published throughput; those predicted in that order
  // Of those, the pairs whose split differs (tp, pp, vp, ep, micro-batch, GPUs,
  // batch or sequence length), not only the release, precision or token dropping.
  int split_pairs = 0, split_right = 0;
};
struct MoeValidation {
  std::vector<MoeRow> rows;
  std::vector<MoeRanking> rankings;
};
MoeValidation moe_validation(const std::string& ref_dir);
std::string moe_section(const std::string& ref_dir);

// Every pipeline schedule on the zero-bubble paper's setups: throughput and
// bubble rate per schedule, and their order (markdown).
std::string schedules_section(const std::string& ref_dir);

// Shoeybi et al. 2019 on V100 (bench::shoeybi_2019): the rows and the
// scaling efficiency from one GPU (markdown).
std::string shoeybi_section();
// The Megatron-LM README's H100 strong scaling (bench::readme_strong_scaling),
// as 1F1B and interleaved (markdown).
std::string strong_scaling_section();
// Narayanan Table 2's ZeRO-3 rows against its PTD-P rows, and the
// Megatron-Bridge FSDP rows (markdown).
std::string sharding_section(const std::string& ref_dir);
// Each table's error with compute slowed by collectives at the published SM
// count, beside the shipped profiles' (markdown).
std::string interference_section(const std::string& ref_dir);

}  // namespace megascope
