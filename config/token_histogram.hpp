// A measured per-expert token distribution (--moe-histogram FILE): what a
// real run's router sent to each expert, one line per MoE layer measured.
//
// Format (docs/spec-format.md): plain text; blank lines and lines starting
// with '#' are skipped; every other line holds one layer's token counts,
// one per expert in expert order, separated by commas (spaces around them
// allowed). Every line must hold the same number of counts.
#pragma once

#include <string>
#include <vector>

#include "core/model.hpp"
#include "core/result.hpp"

namespace megascope {

// The most layers' lines a histogram may hold (a model has at most a few
// hundred MoE layers; each plan's load reads every line).
inline constexpr std::size_t kMaxHistogramLayers = 1024;

// The layers' counts as written; an error names the file, the line and the
// rule (a count that is not a finite number >= 0, rows of different
// lengths, no rows at all, more than kMaxHistogramLayers rows).
Result<std::vector<std::vector<double>>> load_token_histogram(const std::string& path);

// Sets the model's MoeSpec::token_histogram from the file and validates the
// model with it (the expert count must match): an error for a dense model.
Result<void> apply_token_histogram(ModelSpec& m, const std::string& path);

}  // namespace megascope
