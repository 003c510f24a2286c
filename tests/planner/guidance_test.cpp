// The guidance of Narayanan et al. 2021 ("Efficient Large-Scale Language
// Model Training on GPU Clusters using Megatron-LM", Sec. 3 takeaways) as
// emergent behaviour of the search, with no rule for it in the planner:
//   1. tensor parallelism stays within a node: with the TP-in-scale-up-domain
//      constraint lifted, plans with TP across nodes fit and are searched, yet
//      the pick keeps TP <= GPUs per node, and the best cross-node-TP plan
//      (a search restricted to them) simulates slower than the pick;
//   2. model parallelism (tp x pp x cp) just large enough to fit: the pick's
//      is at most twice the smallest of any plan that fits in memory (every
//      plan of the same space through stage 1's exact memory);
//   3. data parallelism takes the rest: dp > 1 whenever the smallest fitting
//      model parallelism leaves GPUs over, at least half the dp that the
//      smallest fitting model parallelism would leave, and the best plan with
//      half the pick's dp (twice its model parallelism) simulates slower.
// Setups: GPT-3 175B on 128 A100s, Llama 3 70B on 64 H100s, and the 18.4B
// row of Narayanan Table 1 (256 A100s, batch 1024), all on DGX nodes of 8.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "config/plan_settings.hpp"
#include "planner/estimate.hpp"
#include "planner/planner.hpp"
#include "sim/cost_model.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::planner;

namespace {

struct Case {
  const char* model;
  const char* cluster;
  int gpus;
  std::int64_t batch;
};

SearchInputs open_inputs(const Case& c) {
  SearchInputs in;
  in.model = test::shipped_model(c.model);
  auto cluster = with_device_count(test::shipped_cluster(c.cluster), c.gpus);
  if (!cluster) FAIL(cluster.error().str());
  in.cluster = *cluster;
  in.training.global_batch_size = c.batch;
  in.gpu_counts = {c.gpus};
  in.constraints.tp_in_scale_up = false;   // TP may span nodes: nothing keeps it inside one but its cost
  // The guidance is PTD-P's, with the optimizer state at most sharded: ZeRO-2
  // and ZeRO-3 fit models by sharding instead of model parallelism (the
  // paper's Table 2 compares the two; tests/apps/validation_test.cpp).
  in.constraints.zero = {0, 1};
  return in;
}

int model_parallel(const Candidate& c) { return c.tp * c.pp * c.cp; }

// Every plan of the space through stage 1's exact memory (the same sums as
// memory_report, with the search's headroom): the smallest model parallelism
// of a plan that fits, and how many fitting plans put TP across nodes.
struct Survey {
  std::uint64_t plans = 0, fitting = 0, failed = 0;
  int min_fitting_mp = std::numeric_limits<int>::max();
  std::uint64_t fitting_tp_across_nodes = 0;
};

Survey survey(const SearchInputs& raw, int node) {
  auto in = check_inputs(raw);
  if (!in) FAIL(in.error().str());
  auto cost = sim::CostModel::for_device(in->cluster.device);
  if (!cost) FAIL(cost.error().str());
  Estimator est(*in, *cost);
  Survey s;
  Rejections rej;
  enumerate(*in, rej, [&](const Candidate& c) {
    ++s.plans;
    auto e = est.memory(c);
    if (!e) {
      ++s.failed;
      return;
    }
    if (!e->fits) return;
    ++s.fitting;
    s.min_fitting_mp = std::min(s.min_fitting_mp, model_parallel(c));
    if (c.tp > node) ++s.fitting_tp_across_nodes;
  });
  return s;
}

std::string describe(const SimulatedPlan& p) {
  return format_inline_plan(p.plan) + " (tp " + std::to_string(p.candidate.tp) + ", pp " +
         std::to_string(p.candidate.pp) + ", cp " + std::to_string(p.candidate.cp) + ", dp " +
         std::to_string(p.candidate.dp) + "): " + std::to_string(p.report.tokens_per_s) + " tokens/s";
}

void check_guidance(const Case& c) {
  INFO(c.model << " on " << c.gpus << " GPUs of " << c.cluster << ", global batch " << c.batch);
  const SearchInputs in = open_inputs(c);
  const int node = in.cluster.node.devices_per_node;
  REQUIRE(node == 8);
  REQUIRE(c.gpus > node);   // several nodes: TP across nodes is possible

  SearchOptions so;
  so.top_k = 32;   // the CLI's default
  auto r = search(in, so);
  REQUIRE(r);
  REQUIRE_FALSE(r->ranked.empty());
  const SimulatedPlan& pick = r->ranked.front();
  const Candidate& k = pick.candidate;
  INFO("pick: " << describe(pick));
  std::uint64_t ranked_tp_across = 0;
  for (const SimulatedPlan& p : r->ranked) ranked_tp_across += p.candidate.tp > node;
  INFO(ranked_tp_across << " of the " << r->ranked.size() << " simulated plans have TP across nodes");

  const Survey s = survey(in, node);
  INFO(s.fitting << " of " << s.plans << " plans fit; smallest fitting tp*pp*cp " << s.min_fitting_mp << "; "
                 << s.fitting_tp_across_nodes << " fitting plans have TP across nodes");
  REQUIRE(s.failed == 0);
  REQUIRE(s.plans == r->evaluated);    // the survey walks the search's own space
  REQUIRE(s.fitting == r->fitting);
  REQUIRE(s.fitting > 0);

  // 1. TP within a node: cross-node TP is legal and fits, but neither the
  // pick nor the best plan of the cross-node-TP slice beats in-node TP.
  REQUIRE(s.fitting_tp_across_nodes > 0);
  CHECK(k.tp <= node);
  SearchInputs across = in;
  across.constraints.tp.lo = node + 1;
  SearchOptions few;
  few.top_k = 8;
  auto ra = search(across, few);
  REQUIRE(ra);
  REQUIRE_FALSE(ra->ranked.empty());
  INFO("best with TP across nodes: " << describe(ra->ranked.front()));
  CHECK(ra->ranked.front().report.tokens_per_s < pick.report.tokens_per_s);

  // 2. Model parallelism just large enough to fit.
  const int mp = model_parallel(k);
  CHECK(mp >= s.min_fitting_mp);   // the pick fits, so it cannot need less than the smallest fitting
  CHECK(mp <= 2 * s.min_fitting_mp);

  // 3. Data parallelism takes the rest.
  CHECK(k.dp * mp == c.gpus);
  const int dp_room = c.gpus / s.min_fitting_mp;   // dp at the smallest fitting model parallelism
  if (dp_room > 1) CHECK(k.dp > 1);
  CHECK(2 * k.dp >= dp_room);
  if (k.dp % 2 == 0) {
    SearchInputs half = in;
    half.constraints.dp.values = {k.dp / 2};
    auto rh = search(half, few);
    REQUIRE(rh);
    if (!rh->ranked.empty()) {
      INFO("best with half the pick's dp: " << describe(rh->ranked.front()));
      CHECK(rh->ranked.front().report.tokens_per_s < pick.report.tokens_per_s);
    }
  }
}

}  // namespace

TEST_CASE("Narayanan guidance, GPT-3 175B on 128 DGX A100s: with TP free to cross nodes, the pick keeps TP in a "
          "node, model parallelism just fits, data parallelism takes the rest",
          "[planner]") {
  check_guidance({"gpt3-175b", "dgx-a100", 128, 256});
}

TEST_CASE("Narayanan guidance, Llama 3 70B on 64 DGX H100s: with TP free to cross nodes, the pick keeps TP in a "
          "node, model parallelism just fits, data parallelism takes the rest",
          "[planner]") {
  check_guidance({"llama3-70b", "dgx-h100", 64, 128});
}

TEST_CASE("Narayanan guidance, 18.4B on 256 DGX A100s: with TP free to cross nodes, the pick keeps TP in a "
          "node, model parallelism just fits, data parallelism takes the rest",
          "[planner]") {
  check_guidance({"gpt-18.4b", "dgx-a100", 256, 1024});
}
