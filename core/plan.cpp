#include "core/plan.hpp"

namespace megascope {

const char* to_string(Schedule s) {
  switch (s) {
    case Schedule::gpipe: return "gpipe";
    case Schedule::one_f_one_b: return "1f1b";
    case Schedule::interleaved: return "interleaved";
    case Schedule::zb_h1: return "zb-h1";
    case Schedule::zb_v: return "zb-v";
    case Schedule::dualpipe: return "dualpipe";
    case Schedule::dualpipev: return "dualpipev";
    case Schedule::zb_h2: return "zb-h2";
    case Schedule::zb_1p: return "zb-1p";
    case Schedule::zb_2p: return "zb-2p";
  }
  return "?";
}
const char* schedule_names() { return "gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-1p, zb-2p, zb-v, dualpipe, dualpipev"; }

const std::vector<Schedule>& all_schedules() {
  static const std::vector<Schedule> all = {Schedule::one_f_one_b, Schedule::interleaved, Schedule::gpipe,
                                            Schedule::zb_h1,       Schedule::zb_h2,       Schedule::zb_1p,
                                            Schedule::zb_2p,       Schedule::zb_v,        Schedule::dualpipe,
                                            Schedule::dualpipev};
  return all;
}

std::optional<Schedule> parse_schedule(std::string_view s) {
  for (Schedule v : all_schedules())
    if (s == to_string(v)) return v;
  return std::nullopt;
}

const char* to_string(RecomputeGranularity g) {
  switch (g) {
    case RecomputeGranularity::none: return "none";
    case RecomputeGranularity::selective: return "selective";
    case RecomputeGranularity::full: return "full";
  }
  return "?";
}
std::optional<RecomputeGranularity> parse_recompute_granularity(std::string_view s) {
  for (auto v : {RecomputeGranularity::none, RecomputeGranularity::selective, RecomputeGranularity::full})
    if (s == to_string(v)) return v;
  return std::nullopt;
}

unsigned recompute_modules(const Recompute& r) {
  if (r.granularity != RecomputeGranularity::selective) return 0;
  return r.modules.value_or(kRecomputeCoreAttn);
}

namespace {
constexpr std::pair<unsigned, const char*> kModuleNames[] = {{kRecomputeCoreAttn, "core_attn"},
                                                             {kRecomputeLayernorm, "layernorm"},
                                                             {kRecomputeMlaUpProj, "mla_up_proj"},
                                                             {kRecomputeMoeAct, "moe_act"},
                                                             {kRecomputeMlp, "mlp"},
                                                             {kRecomputeMoe, "moe"},
                                                             {kRecomputeSharedExperts, "shared_experts"}};
}  // namespace

std::string format_recompute_modules(unsigned modules) {
  std::string out;
  for (const auto& [bit, name] : kModuleNames)
    if (modules & bit) out += (out.empty() ? "" : "+") + std::string(name);
  return out;
}

std::optional<unsigned> parse_recompute_modules(std::string_view text) {
  unsigned out = 0;
  while (!text.empty()) {
    const std::size_t at = text.find('+');
    const std::string_view name = text.substr(0, at);
    if (at != std::string_view::npos && at + 1 == text.size()) return std::nullopt;   // a trailing '+'
    bool found = false;
    for (const auto& [bit, n] : kModuleNames)
      if (name == n) {
        out |= bit;
        found = true;
      }
    if (!found) return std::nullopt;
    text = at == std::string_view::npos ? std::string_view{} : text.substr(at + 1);
  }
  if (out == 0) return std::nullopt;
  return out;
}

const char* recompute_module_names() {
  return "core_attn, layernorm, mla_up_proj, moe_act, mlp, moe, shared_experts";
}

const char* to_string(RecomputeMethod m) { return m == RecomputeMethod::uniform ? "uniform" : "block"; }
std::optional<RecomputeMethod> parse_recompute_method(std::string_view s) {
  for (auto v : {RecomputeMethod::uniform, RecomputeMethod::block})
    if (s == to_string(v)) return v;
  return std::nullopt;
}

const char* to_string(AttentionKernel k) { return k == AttentionKernel::flash ? "flash" : "unfused"; }
std::optional<AttentionKernel> parse_attention_kernel(std::string_view s) {
  for (auto v : {AttentionKernel::flash, AttentionKernel::unfused})
    if (s == to_string(v)) return v;
  return std::nullopt;
}

const char* to_string(CpCommType c) {
  switch (c) {
    case CpCommType::p2p: return "p2p";
    case CpCommType::all_gather: return "all-gather";
    case CpCommType::a2a: return "a2a";
  }
  return "?";
}
const char* to_string(MoeDispatcher d) {
  switch (d) {
    case MoeDispatcher::alltoall: return "alltoall";
    case MoeDispatcher::allgather: return "allgather";
    case MoeDispatcher::flex: return "flex";
  }
  return "?";
}
std::optional<MoeDispatcher> parse_moe_dispatcher(std::string_view s) {
  if (s == "alltoall") return MoeDispatcher::alltoall;
  if (s == "allgather") return MoeDispatcher::allgather;
  if (s == "flex") return MoeDispatcher::flex;
  return std::nullopt;
}
std::optional<CpCommType> parse_cp_comm(std::string_view s) {
  if (s == "p2p" || s == "ring") return CpCommType::p2p;
  if (s == "all-gather" || s == "allgather") return CpCommType::all_gather;
  if (s == "a2a" || s == "all-to-all") return CpCommType::a2a;
  return std::nullopt;
}

bool default_overlap_p2p_comm(Schedule s) { return s != Schedule::gpipe && s != Schedule::one_f_one_b; }

int default_vpp(Schedule s) { return (s == Schedule::zb_v || s == Schedule::dualpipev) ? 2 : 1; }

}  // namespace megascope
