// The planner against published runs: its pick is predicted at least as fast
// as the published plan, and the published plan (or, where the table gives
// only tp, pp and dp, the best plan of that split) ranks near the top of a
// search restricted to the options of its time. bench/planner_bench prints
// the same comparison for every row of both tables (README).
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <string>

#include "config/plan_settings.hpp"
#include "planner/planner.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::planner;

namespace {

struct Row {
  const char* model;
  const char* cluster;
  int gpus;
  std::int64_t batch;
  const char* published;
};

SearchInputs inputs_of(const Row& row) {
  SearchInputs in;
  in.model = test::shipped_model(row.model);
  in.cluster = *with_device_count(test::shipped_cluster(row.cluster), row.gpus);
  in.training.global_batch_size = row.batch;
  in.gpu_counts = {row.gpus};
  return in;
}

// The regime of a published run: its recomputation, sequence parallelism, optimizer and overlap options.
SearchInputs regime_of(SearchInputs in, const PlanSpec& plan) {
  Constraints& k = in.constraints;
  k.recompute = {plan.recompute.granularity};
  k.block_recompute = plan.recompute.method == RecomputeMethod::block;
  k.distopt = plan.distributed_optimizer;
  k.overlap_grad_reduce = plan.overlap_grad_reduce;
  k.overlap_param_gather = plan.overlap_param_gather;
  k.tp_comm_overlap = plan.tp_comm_overlap;
  if (plan.tp > 1) k.sp = plan.sequence_parallel;
  k.zero = {zero_stage(plan)};
  k.hsdp = plan.dp_replicas > 1;
  return in;
}

void check_row(const Row& row, int max_rank) {
  INFO(row.model << " on " << row.gpus << " GPUs, published " << row.published);
  const SearchInputs in = inputs_of(row);
  SearchOptions so;
  so.top_k = 8;
  auto open = search(in, so);
  REQUIRE(open);
  REQUIRE_FALSE(open->ranked.empty());
  auto plan = parse_inline_plan(row.published);
  REQUIRE(plan);
  auto published = simulate_plan(in, *plan, row.gpus, std::nullopt);
  REQUIRE(published);
  CHECK(open->ranked.front().report.step_time_s <= published->report.step_time_s);

  const SearchInputs reg = regime_of(in, *plan);
  auto r = search(reg, so);
  REQUIRE(r);
  PlanSpec flash = *plan;
  flash.attention = AttentionKernel::flash;   // the search's kernels, TP overlap and gradient accumulation
  flash.tp_grad_overlap = true;
  flash.grad_accum_fusion = true;
  auto ex = explain(reg, *r, flash, row.gpus, so);
  REQUIRE(ex);
  REQUIRE(ex->legal);
  CHECK(ex->fits);
  CHECK(ex->simulated_rank <= max_rank);
  REQUIRE(ex->stage1_rank);
  CHECK(*ex->stage1_rank <= static_cast<std::uint64_t>(max_rank));
}

// The H100 table gives tp, pp and dp but not the micro-batch size or the
// virtual stages: the best plan of the published split (those two open) in
// the published run's regime ranks near the top of the regime's search.
void check_split(const Row& row, int max_rank) {
  INFO(row.model << " on " << row.gpus << " GPUs, published " << row.published);
  const SearchInputs in = inputs_of(row);
  auto plan = parse_inline_plan(row.published);
  REQUIRE(plan);
  const SearchInputs reg = regime_of(in, *plan);
  SearchOptions so;
  so.top_k = 16;
  auto r = search(reg, so);
  REQUIRE(r);
  REQUIRE_FALSE(r->ranked.empty());
  SearchInputs split = reg;
  split.constraints.tp.values = {plan->tp};
  split.constraints.pp.values = {plan->pp};
  split.constraints.dp.values = {row.gpus / (plan->tp * plan->pp)};
  auto best = search(split, so);
  REQUIRE(best);
  REQUIRE_FALSE(best->ranked.empty());
  const SimulatedPlan& b = best->ranked.front();
  CHECK(b.plan.tp == plan->tp);
  CHECK(b.plan.pp == plan->pp);
  int rank = 1;
  for (const SimulatedPlan& p : r->ranked) rank += p.report.step_time_s < b.report.step_time_s;
  INFO("the split's best: " << format_inline_plan(b.plan) << ", rank " << rank << ", "
                               << b.report.step_time_s / r->ranked.front().report.step_time_s << " x the best step");
  CHECK(rank <= max_rank);
  // and within 5% of the regime's best plan
  CHECK(b.report.step_time_s <= 1.05 * r->ranked.front().report.step_time_s);
}

}  // namespace

TEST_CASE("Megatron-LM README H100, 16B to 462B: the published split's best plan ranks near the top of its regime") {
  // The rows whose published plan, with one sequence per micro-batch and no
  // interleaving (docs/validation.md's assumption), ranks low in its regime
  // (bench/planner_bench: 12th-33rd of 33). The split's best ranks 1st-6th.
  const std::string options = ",mbs=1,distopt=on,overlap_grad_reduce=on,overlap_param_gather=on,sp=on,tp_comm_overlap=on";
  const struct {
    const char* model;
    int gpus;
    std::int64_t batch;
    int tp, pp;
  } rows[] = {{"mcore-gpt-16b", 192, 192, 4, 1},    {"mcore-gpt-32b", 384, 192, 8, 1},   {"mcore-gpt-70b", 768, 384, 8, 2},
              {"mcore-gpt-119b", 1536, 768, 8, 4},  {"mcore-gpt-177b", 2304, 1152, 8, 6}, {"mcore-gpt-314b", 3072, 1536, 8, 8},
              {"mcore-gpt-462b", 6144, 3072, 8, 16}};
  for (const auto& r : rows) {
    const std::string plan = fmt::format("tp={},pp={}{}", r.tp, r.pp, options);
    check_split({r.model, "dgx-h100", r.gpus, r.batch, plan.c_str()}, 6);
  }
}

TEST_CASE("Narayanan Table 1, 530B on 2520 A100s: the pick beats the published plan, which ranks near the top") {
  check_row({"gpt-529.6b", "dgx-a100", 2520, 2520,
             "tp=8,pp=35,vpp=3,schedule=interleaved,mbs=1,recompute=full,recompute_method=uniform,recompute_layers=1,"
             "attention=unfused"},
            5);
}

TEST_CASE("Megatron-LM README H100, 1.7B on 48 GPUs: the pick beats the published plan, which ranks near the top") {
  // Load-balanced CP does a rank's share of the same work, so cp 2 and 4
  // with 2 and 4 times the micro-batch tie with the plans without CP that
  // hold as many tokens per rank (their only cost is the KV exchange): the
  // three micro-batch sizes above the published 1 take six places.
  check_row({"mcore-gpt-1.7b", "dgx-h100", 48, 192, "tp=1,pp=1,mbs=1,distopt=on,overlap_grad_reduce=on,overlap_param_gather=on"},
            9);
}

TEST_CASE("Megatron-LM README H100, 7.1B on 96 GPUs: the pick beats the published plan, which ranks near the top") {
  check_row({"mcore-gpt-7.1b", "dgx-h100", 96, 192,
             "tp=2,pp=1,mbs=1,sp=on,tp_comm_overlap=on,distopt=on,overlap_grad_reduce=on,overlap_param_gather=on"},
            9);
}
