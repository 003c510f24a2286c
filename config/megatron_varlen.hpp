// Variable-length training in Megatron-LM launch lines: the sequence-packing
// schedulers (--sequence-packing-scheduler dp_balanced / default_dynamic_cp,
// --dynamic-context-parallel), their per-rank budget, and the mock
// variable-length dataset's lognormal lengths, read into the training's
// lengths and the plan's dynamic_cp, and written back (megatron_args.cpp
// calls these). Internal to config/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/megatron_cmdline.hpp"
#include "core/plan.hpp"
#include "core/result.hpp"
#include "core/setup.hpp"
#include "core/training.hpp"

namespace megascope::megatron_detail {

// Sets t.varlen and p.dynamic_cp from the line's flags (p.cp already read);
// nothing when the line has none of them.
Result<void> import_varlen(Args& args, std::int64_t seq_length, TrainingSpec& t, PlanSpec& p);

// The scheduler's flags for the Setup's variable-length training (none
// without it). The lengths are the dataset's and have no flag.
std::vector<std::string> export_varlen(const Setup& s);

}  // namespace megascope::megatron_detail
