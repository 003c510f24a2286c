// The plan's keys, shared by inline plans on the command line
// ("tp=8,pp=8,vpp=3,dp=16,mbs=1,sp=on,recompute=selective,distopt=on,
// schedule=interleaved") and by plan TOML files, so that both accept exactly
// the same names and values.
//
// Keys (see docs/spec-format.md): tp pp vpp dp cp ep etp mbs sp recompute
// recompute_method recompute_layers distopt zero reshard_after_forward
// fsdp_prefetch fp8_param_gather grad_bucket dp_replicas overlap_grad_reduce
// overlap_param_gather tp_comm_overlap tp_grad_overlap grad_accum_fusion
// pp_scatter_gather overlap_p2p_comm moe_shared_expert_overlap schedule
// attention cp_comm moe_dispatcher first_stage_layers last_stage_layers. Booleans: on/off/true/false/1/0.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/plan.hpp"
#include "core/result.hpp"

namespace megascope {

// Sets one key. Errors have field "plan.<key>" and say what was expected.
// An unknown key is an error that lists the known ones.
Result<void> apply_plan_setting(PlanSpec& plan, std::string_view key, std::string_view value);

// "k=v,k=v,..." (spaces around items allowed). A key given twice is an error.
Result<PlanSpec> parse_inline_plan(std::string_view text);

// The canonical inline form: every key whose value differs from PlanSpec{}'s,
// in the order of plan_keys(). parse_inline_plan(format_inline_plan(p)) == p.
std::string format_inline_plan(const PlanSpec& plan);

const std::vector<std::string>& plan_keys();

bool operator==(const Recompute& a, const Recompute& b);
bool operator==(const PlanSpec& a, const PlanSpec& b);

}  // namespace megascope
