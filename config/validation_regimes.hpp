// Validation regimes: what the validation against published runs
// (docs/validation.md) says about a result's class of run. Each class (a
// GPU generation, 16-bit or FP8 GEMMs, dense or MoE, with or without context
// parallelism) carries the errors of the published runs of that class, as
// scripts/validation-report.sh measured them and wrote them to
// topologies/validation/regimes.toml; simulate and plan state them beside
// their figures, and say when a run is of no validated class or predicts a
// utilisation above every published run of its class.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "core/result.hpp"
#include "core/setup.hpp"

namespace megascope {

struct Regime {
  std::string generation;   // "volta", "ampere", "hopper", "blackwell"; empty: none of them (a CPU, another GPU)
  bool fp8 = false;         // FP8 GEMMs (else 16-bit)
  bool moe = false;
  bool cp = false;          // context parallelism
  bool sharded = false;     // ZeRO-2/3: gradients, or parameters too, sharded over DP (FSDP)
  bool operator==(const Regime&) const = default;
};

Regime regime_of(const DeviceSpec& device, const TrainingSpec& training, const ModelSpec& model, int cp,
                 int zero = 0);
Regime regime_of(const Setup& s);
std::string describe(const Regime& r);   // "Hopper, FP8, dense, with CP" (", ZeRO-2/3" when sharded)

// The published runs of one class, as validated.
struct RegimeStats {
  Regime regime;
  int rows = 0;
  double mean_abs_error = 0;     // of throughput, as a fraction
  double signed_mean_error = 0;  // predicted over published, minus 1, averaged
  double worst_abs_error = 0;
  double max_published_mfu = 0;  // the highest MFU published in the class (model FLOPs, causal halved, of bf16 peak)
  std::string tables;            // where the rows come from
};

// topologies/validation/regimes.toml under the data folder.
std::string regimes_path();
// Reads a regimes file; errors name the file, line and key.
Result<std::vector<RegimeStats>> load_regimes(const std::string& path);
// Writes one: what validation_report emits.
void write_regimes(std::ostream& out, const std::vector<RegimeStats>& regimes);

struct ExpectedError {
  Regime regime;
  std::optional<RegimeStats> stats;   // the class's, if validated
  double mfu = 0;                     // the result's
  // The result's MFU is above every published run of its class by more than 5 points.
  [[nodiscard]] bool above_published() const { return stats && mfu > stats->max_published_mfu + 0.05; }
};

ExpectedError expected_error(const Regime& regime, double mfu, const std::vector<RegimeStats>& regimes);
ExpectedError expected_error(const Setup& s, double mfu, const std::vector<RegimeStats>& regimes);
// The shipped regimes (cached); a missing or broken file gives no classes.
const std::vector<RegimeStats>& shipped_regimes();

// "throughput expected within 2.6% (mean |error| of 16 published runs of this class: ...)".
std::string expected_error_text(const ExpectedError& e);
// One short phrase for a title: "expected within 6.3% (10 published runs)",
// "class not validated", with ", MFU above every published run" when so.
std::string expected_error_brief(const ExpectedError& e);

}  // namespace megascope
