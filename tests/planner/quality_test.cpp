// The planner against published runs: its pick is predicted at least as fast
// as the published plan, and the published plan ranks near the top of a
// search restricted to the options of its time. bench/planner_bench prints
// the same comparison for every row of both tables (docs/planner.md).
#include <catch2/catch.hpp>

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

void check_row(const Row& row, int max_rank) {
  INFO(row.model << " on " << row.gpus << " GPUs, published " << row.published);
  SearchInputs in;
  in.model = test::shipped_model(row.model);
  in.cluster = *with_device_count(test::shipped_cluster(row.cluster), row.gpus);
  in.training.global_batch_size = row.batch;
  in.gpu_counts = {row.gpus};
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

  // The regime of the published run: its recomputation, sequence parallelism, optimizer and overlap options.
  SearchInputs reg = in;
  reg.constraints.recompute = {plan->recompute.granularity};
  reg.constraints.block_recompute = plan->recompute.method == RecomputeMethod::block;
  reg.constraints.distopt = plan->distributed_optimizer;
  reg.constraints.overlap_grad_reduce = plan->overlap_grad_reduce;
  reg.constraints.overlap_param_gather = plan->overlap_param_gather;
  reg.constraints.tp_comm_overlap = plan->tp_comm_overlap;
  if (plan->tp > 1) reg.constraints.sp = plan->sequence_parallel;
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

}  // namespace

TEST_CASE("Narayanan Table 1, 530B on 2520 A100s: the pick beats the published plan, which ranks near the top") {
  check_row({"gpt-529.6b", "dgx-a100", 2520, 2520,
             "tp=8,pp=35,vpp=3,schedule=interleaved,mbs=1,recompute=full,recompute_method=uniform,recompute_layers=1,"
             "attention=unfused"},
            5);
}

TEST_CASE("Megatron-LM README H100, 1.7B on 48 GPUs: the pick beats the published plan, which ranks near the top") {
  check_row({"mcore-gpt-1.7b", "dgx-h100", 48, 192, "tp=1,pp=1,mbs=1,distopt=on,overlap_grad_reduce=on,overlap_param_gather=on"},
            5);
}

TEST_CASE("Megatron-LM README H100, 7.1B on 96 GPUs: the pick beats the published plan, which ranks near the top") {
  check_row({"mcore-gpt-7.1b", "dgx-h100", 96, 192,
             "tp=2,pp=1,mbs=1,sp=on,tp_comm_overlap=on,distopt=on,overlap_grad_reduce=on,overlap_param_gather=on"},
            9);
}
