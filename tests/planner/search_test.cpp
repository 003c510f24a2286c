// The search's threads: stage 1 deals its plans to several threads and must
// give the one-thread result; a progress callback that throws, in either
// stage (the GUI cancels a search so in stage 1), ends the search with that
// exception on the calling thread after the other threads have stopped,
// never with std::terminate.
#include <catch2/catch.hpp>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "config/plan_settings.hpp"
#include "planner/estimate.hpp"
#include "planner/planner.hpp"
#include "small_models.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::planner;

namespace {

SearchInputs small_inputs() {
  SearchInputs in;
  in.model = test::small_gpt();
  in.cluster = *with_device_count(test::shipped_cluster("dgx-h100"), 16);
  in.training.global_batch_size = 16;
  in.gpu_counts = {16};
  in.constraints.max_mbs = 4;
  return in;
}

struct Stop {};   // not a std::exception, as the GUI's

}  // namespace

TEST_CASE("Stage 1 on 1, 2 and 5 threads: the same K best, counts and best rejected plan") {
  const SearchInputs in = small_inputs();
  std::string reference;
  for (int threads : {1, 2, 5}) {
    SearchOptions o;
    o.top_k = 6;
    o.threads = threads;
    auto r = search(in, o);
    REQUIRE(r);
    std::string got = fmt::format("{} {} {} {} {} |", r->evaluated, r->fitting, r->rejections.memory,
                                  r->rejections.divisibility, r->rejections.constraint);
    for (const SimulatedPlan& p : r->ranked) got += " " + format_inline_plan(to_plan(p.candidate)) + fmt::format(" {}", p.stage1_rank);
    if (r->best_rejected) got += " / " + format_inline_plan(to_plan(*r->best_rejected));
    INFO(threads << " threads");
    if (reference.empty()) reference = got;
    CHECK(got == reference);
  }
}

TEST_CASE("Stage 1's bounds change nothing: the K best and the best rejected plan of every plan timed in full") {
  // The search times a plan in full only when its lower bound could still
  // beat its share's K-th best (or best rejected); the reference times every
  // plan and sorts them all.
  SearchInputs gpt3;
  gpt3.model = test::shipped_model("gpt3-175b");
  gpt3.cluster = *with_device_count(test::shipped_cluster("dgx-a100"), 256);
  gpt3.training.global_batch_size = 512;
  gpt3.gpu_counts = {256};
  gpt3.constraints.schedules = {Schedule::one_f_one_b, Schedule::interleaved, Schedule::zb_h1, Schedule::zb_v,
                                Schedule::dualpipev};
  SearchInputs small = small_inputs();
  small.constraints.schedules = gpt3.constraints.schedules;
  int with_rejected = 0;
  for (const SearchInputs* in : {&small, &gpt3}) {
    auto cost = sim::CostModel::for_device(in->cluster.device);
    REQUIRE(cost);
    Estimator est(*in, *cost);
    Rejections rej;
    using Key = std::tuple<double, std::uint64_t, std::string>;
    std::vector<Key> fitting;
    std::optional<Key> rejected;
    std::uint64_t index = 0;
    enumerate(*in, rej, [&](const Candidate& c) {
      auto e = est.evaluate(c);
      REQUIRE(e);
      Key key{e->step_s, index++, format_inline_plan(to_plan(c))};
      if (e->fits) fitting.push_back(key);
      else if (!rejected || key < *rejected) rejected = key;
    });
    std::sort(fitting.begin(), fitting.end());
    for (int threads : {1, 2}) {
      SearchOptions o;
      o.top_k = 5;
      o.threads = threads;
      auto r = search(*in, o);
      REQUIRE(r);
      INFO(in->model.name << ", " << threads << " threads");
      CHECK(r->evaluated == index);
      CHECK(r->fitting == fitting.size());
      CHECK(r->timed < r->evaluated);   // the bounds spared some plans their communication terms
      REQUIRE(r->ranked.size() == 5);
      std::vector<const SimulatedPlan*> by_stage1;
      for (const SimulatedPlan& p : r->ranked) by_stage1.push_back(&p);
      std::sort(by_stage1.begin(), by_stage1.end(),
                [](const SimulatedPlan* a, const SimulatedPlan* b) { return a->stage1_rank < b->stage1_rank; });
      for (std::size_t i = 0; i < by_stage1.size(); ++i) {
        CHECK(format_inline_plan(to_plan(by_stage1[i]->candidate)) == std::get<2>(fitting[i]));
        CHECK(by_stage1[i]->stage1.step_s == std::get<0>(fitting[i]));
        CHECK_FALSE(by_stage1[i]->stage1.bounded);
      }
      REQUIRE(r->best_rejected.has_value() == rejected.has_value());   // every plan of the small model fits
      if (!rejected) continue;
      ++with_rejected;
      CHECK(format_inline_plan(to_plan(*r->best_rejected)) == std::get<2>(*rejected));
      CHECK(r->best_rejected_estimate.step_s == std::get<0>(*rejected));
      CHECK_FALSE(r->best_rejected_estimate.bounded);
    }
  }
  CHECK(with_rejected == 2);   // GPT-3 on 256 GPUs has plans that do not fit, on each thread count
}

TEST_CASE("A progress callback that throws in stage 1 ends the search with its exception, whatever the threads") {
  const SearchInputs in = small_inputs();
  for (int threads : {1, 2, 4}) {
    SearchOptions o;
    o.threads = threads;
    const std::thread::id caller = std::this_thread::get_id();
    int calls = 0;
    o.progress = [&](const Progress& p) {
      CHECK(std::this_thread::get_id() == caller);   // progress comes on the calling thread only
      if (std::string(p.stage) == "stage 1" && ++calls == 1) throw Stop{};
    };
    INFO(threads << " threads");
    CHECK_THROWS_AS(search(in, o), Stop);
    CHECK(calls == 1);
    // A standard exception goes to the caller as well, not into an error result.
    calls = 0;
    o.progress = [&](const Progress& p) {
      if (std::string(p.stage) == "stage 1" && ++calls == 1) throw std::runtime_error("cancelled by the caller");
    };
    CHECK_THROWS_WITH(search(in, o), "cancelled by the caller");
  }
}

TEST_CASE("A progress callback that throws in stage 2 ends the search with its exception, the workers joined") {
  const SearchInputs in = small_inputs();
  for (int threads : {1, 2, 3}) {
    SearchOptions o;
    o.threads = threads;
    o.top_k = 8;
    int calls = 0;
    o.progress = [&](const Progress& p) {
      if (std::string(p.stage) == "stage 2" && ++calls == 1) throw Stop{};
    };
    INFO(threads << " threads");
    CHECK_THROWS_AS(search(in, o), Stop);
    CHECK(calls == 1);
  }
}

TEST_CASE("explain names the fastest plan of the given plan's split, the one a search with that split finds") {
  const SearchInputs in = small_inputs();
  SearchOptions o;
  o.top_k = 8;
  auto r = search(in, o);
  REQUIRE(r);
  REQUIRE(r->ranked.size() > 1);
  // A slow plan: a split the search also ran, with its slowest settings.
  auto plan = parse_inline_plan("tp=2,pp=2,mbs=1,recompute=full,recompute_method=uniform,recompute_layers=1");
  REQUIRE(plan);
  auto ex = explain(in, *r, *plan, 16, o);
  REQUIRE(ex);
  REQUIRE(ex->legal);
  REQUIRE(ex->split_best);
  const SimulatedPlan& b = *ex->split_best;
  CHECK(b.plan.tp == 2);
  CHECK(b.plan.pp == 2);
  CHECK(b.plan.cp == 1);
  CHECK(b.plan.dp.value_or(0) == 4);
  CHECK(b.report.step_time_s < ex->plan.report.step_time_s);
  // The same plan and time as the best of a search restricted to that split.
  SearchInputs split = in;
  split.constraints.tp.values = {2};
  split.constraints.pp.values = {2};
  split.constraints.dp.values = {4};
  auto s = search(split, o);
  REQUIRE(s);
  REQUIRE_FALSE(s->ranked.empty());
  CHECK(format_inline_plan(b.plan) == format_inline_plan(s->ranked.front().plan));
  CHECK(b.report.step_time_s == s->ranked.front().report.step_time_s);
  int rank = 1;
  for (const SimulatedPlan& p : r->ranked) rank += p.report.step_time_s < b.report.step_time_s;
  CHECK(ex->split_rank == rank);
  // The winner is the best of its own split: none.
  auto top = explain(in, *r, r->ranked.front().plan, 16, o);
  REQUIRE(top);
  CHECK_FALSE(top->split_best);
}
