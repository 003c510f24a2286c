// Sharded data parallelism in Megatron-LM launch lines: Megatron-FSDP's
// --use-megatron-fsdp and --data-parallel-sharding-strategy, PyTorch FSDP2's
// --use-torch-fsdp2 under Megatron-LM's own asserts, read into the plan's
// zero, fsdp_prefetch and reshard_after_forward, and written back
// (megatron_args.cpp calls these). Internal to config/.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "config/megatron_cmdline.hpp"
#include "core/model.hpp"
#include "core/plan.hpp"
#include "core/result.hpp"
#include "core/setup.hpp"

namespace megascope::megatron_detail {

// Sets the plan's sharding from the line's flags (the plan's pp, ep and
// overlaps already read); `strategy` is --data-parallel-sharding-strategy.
Result<void> import_sharding(Args& args, const ModelSpec& model, const std::optional<std::string>& strategy, PlanSpec& p);

// The flags of the plan's optimizer and sharding: --use-distributed-optimizer,
// Megatron-FSDP's or FSDP2's; an error on what no flag expresses.
Result<std::vector<std::string>> export_sharding(const Setup& s);

}  // namespace megascope::megatron_detail
