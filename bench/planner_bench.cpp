// planner_bench: speed and quality of the planner. Prints tables, not a test.
//
//   ./build/bench/planner_bench [--quick] [--repeat N] [reference dir, default tests/reference]
//
// Speed: for GPT-3 175B on 1024 A100s and the 530B model of Narayanan Table 1
// on 2520 A100s, every dimension open: plans in the space; the stage-1 rate on
// one core as the search runs it (a fresh estimator, so cold caches; plans
// that cannot enter the K best or beat the best rejected are not timed in
// full, and the share that is is printed); the estimator's rate when every
// plan is timed in full (cold: caches filled during the pass; warm: a second
// pass); and the wall time of the whole search (stage 1 + 32 simulations on
// all cores; with --repeat N, the medians of N runs and the searches' spread).
// Quality: for every row of Narayanan Table 1 and the Megatron-LM README H100
// table, the published plan's simulated throughput against the planner's pick
// (open search), where the published plan ranks in a search restricted
// to the options of its time (--explain), and where the best plan of its
// split (tp, pp, dp; the micro-batch size and virtual stages open) ranks there.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "config/library.hpp"
#include "config/plan_settings.hpp"
#include "planner/planner.hpp"
#include "published.hpp"

using namespace megascope;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

planner::SearchInputs inputs(const std::string& model, const std::string& cluster, int gpus, std::int64_t batch) {
  planner::SearchInputs in;
  in.model = *resolve_model(model);
  in.cluster = *with_device_count(*resolve_cluster(cluster), gpus);
  in.training.global_batch_size = batch;
  in.gpu_counts = {gpus};
  return in;
}

// A published run's search: its model, cluster, batch and number formats.
planner::SearchInputs inputs(const bench::PublishedRun& run) {
  planner::SearchInputs in = inputs(run.model, run.cluster, run.gpus, run.batch);
  in.training.params_dtype = run.params_dtype;
  in.training.grad_dtype = run.grad_dtype;
  return in;
}

// The median of a list (the lower middle of an even count).
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[(v.size() - 1) / 2];
}

void speed(const std::string& name, const planner::SearchInputs& in, int repeat) {
  auto cost = sim::CostModel::for_device(in.cluster.device);
  planner::Estimator est(in, *cost);
  planner::Rejections rej;
  std::uint64_t n = 0, fit = 0;
  auto t0 = Clock::now();
  planner::enumerate(in, rej, [&](const planner::Candidate& c) {
    auto e = est.evaluate(c);
    ++n;
    fit += e && e->fits;
  });
  const double cold = since(t0);
  t0 = Clock::now();
  planner::enumerate(in, rej, [&](const planner::Candidate& c) { (void)est.evaluate(c); });
  const double warm = since(t0);
  planner::SearchOptions so;
  so.top_k = 32;
  // Stage 1 as the search runs it, on one core: its median rate over `repeat` runs.
  std::vector<double> one_core;
  double timed = 0;
  for (int k = 0; k < repeat; ++k) {
    planner::SearchOptions o1 = so;
    o1.threads = 1;
    o1.stage1_only = true;
    auto r = planner::search(in, o1);
    one_core.push_back(r && r->stage1_s > 0 ? static_cast<double>(r->evaluated) / r->stage1_s / 1e6 : 0.0);
    timed = r && r->evaluated > 0 ? static_cast<double>(r->timed) / static_cast<double>(r->evaluated) : 0.0;
  }
  // The whole search `repeat` times: medians, and the spread of the total
  // (this machine's speed drifts from run to run; one run says little).
  std::vector<double> s1, s2, whole;
  std::string best = "-";
  for (int k = 0; k < repeat; ++k) {
    t0 = Clock::now();
    auto r = planner::search(in, so);
    whole.push_back(since(t0));
    s1.push_back(r ? r->stage1_s : 0.0);
    s2.push_back(r ? r->stage2_s : 0.0);
    if (r && !r->ranked.empty()) best = format_inline_plan(r->ranked.front().plan);
  }
  const auto [lo, hi] = std::minmax_element(whole.begin(), whole.end());
  fmt::print("{:<24} {:>8} {:>7} {:>9.2f} {:>6.1f} {:>9.2f} {:>9.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>10}   {}\n", name, n,
             fit, median(one_core), 100.0 * timed, static_cast<double>(n) / cold / 1e6,
             static_cast<double>(n) / warm / 1e6, median(s1), median(s2), median(whole),
             fmt::format("{:.2f}-{:.2f}", *lo, *hi), best);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int repeat = 1;
  std::string ref = "tests/reference";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--repeat") == 0 && i + 1 < argc) {
      repeat = std::atoi(argv[++i]);
      if (repeat < 1) {
        fmt::print(stderr, "planner_bench: --repeat needs a count of at least 1\n");
        return 2;
      }
    } else {
      ref = argv[i];
    }
  }
  fmt::print("planner speed ({} hardware threads; the search runs both stages on every thread)\n",
             std::thread::hardware_concurrency());
  fmt::print("  stage 1, 1 core: the search's stage 1 on one thread (fresh caches), plans per second; timed: the\n"
             "  share of plans timed in full (the rest could not enter the 32 best or beat the best rejected);\n"
             "  all timed: the estimator timing every plan in full on one core, cold and warm caches\n");
  fmt::print("  (medians of {} run{}; search range: the fastest and slowest whole search)\n", repeat,
             repeat == 1 ? "" : "s");
  fmt::print("{:<24} {:>8} {:>7} {:>9} {:>6} {:>9} {:>9} {:>8} {:>8} {:>8} {:>10}   {}\n", "case", "plans", "fit",
             "stage 1", "timed", "all timed", "all timed", "stage1", "stage2", "search", "search", "best plan");
  fmt::print("{:<24} {:>8} {:>7} {:>9} {:>6} {:>9} {:>9} {:>8} {:>8} {:>8} {:>10}\n", "", "", "", "1 core M/s", "%",
             "M/s cold", "M/s warm", "s", "s (32)", "s total", "s range");
  speed("gpt3-175b, 1024 A100", inputs("gpt3-175b", "dgx-a100", 1024, 1536), repeat);
  speed("gpt-529.6b, 2520 A100", inputs("gpt-529.6b", "dgx-a100", 2520, 2520), repeat);
  if (quick) return 0;

  fmt::print("\nquality: published plan vs the planner's pick (simulated tokens/s; open search, top 32)\n");
  fmt::print("  regime: the published plan's rank among plans with the options of its time (--explain), and its\n"
             "  simulated throughput as a share of the best plan of that regime\n");
  fmt::print("  split: the best plan of the published tp, pp and dp in that regime (the micro-batch size and virtual\n"
             "  stages open; --explain's split search), its rank there, and its micro-batch size and virtual stages\n");
  fmt::print("{:<18} {:>6} {:>12} {:>12} {:>8}   {:>14} {:>9} {:>16} {:>11} {:>16}   {}\n", "row", "gpus", "published",
             "planner", "gain", "regime rank", "of best", "stage-1 rank", "split rank", "split's best", "planner's pick");
  for (const auto& rows : {bench::narayanan_table1(ref), bench::megatron_h100(ref)}) {
    for (const bench::PublishedRun& run : rows) {
      planner::SearchInputs in = inputs(run);
      planner::SearchOptions so;
      auto open = planner::search(in, so);
      auto plan = parse_inline_plan(run.plan);
      if (!open || !plan || open->ranked.empty()) {
        fmt::print("{:<18} {:>6} search failed\n", run.table.substr(0, 9) + " " + run.label, run.gpus);
        continue;
      }
      auto published = planner::simulate_plan(in, *plan, run.gpus, std::nullopt);
      // The regime of the published run: its recomputation, optimizer and overlap options fixed.
      planner::SearchInputs reg = in;
      planner::Constraints& k = reg.constraints;
      k.recompute = {plan->recompute.granularity};
      k.block_recompute = plan->recompute.method == RecomputeMethod::block;
      k.distopt = plan->distributed_optimizer;
      k.overlap_grad_reduce = plan->overlap_grad_reduce;
      k.overlap_param_gather = plan->overlap_param_gather;
      k.tp_comm_overlap = plan->tp_comm_overlap;
      if (plan->tp > 1) k.sp = plan->sequence_parallel;
      k.zero = {zero_stage(*plan)};
      k.hsdp = plan->dp_replicas > 1;
      PlanSpec flash = *plan;
      flash.attention = AttentionKernel::flash;   // the search has fused attention only
      flash.tp_grad_overlap = true;               // and the asynchronous TP all-reduce
      flash.grad_accum_fusion = true;             // and fused gradient accumulation
      flash.pp_scatter_gather = false;            // and Megatron-Core's pipeline transfers
      flash.overlap_p2p_comm.reset();             // overlapped as its schedule has them
      auto in_regime = planner::search(reg, so);
      std::string regime = "-", s1 = "-", share = "-", split_rank = "-", split_pick = "-";
      if (in_regime) {
        auto ex = planner::explain(reg, *in_regime, flash, run.gpus, so);
        if (ex && ex->legal) {
          regime = fmt::format("{} of {}", ex->simulated_rank, in_regime->ranked.size() + 1);
          if (!in_regime->ranked.empty())
            share = fmt::format("{:.1f}%", 100.0 * std::min(1.0, ex->plan.report.tokens_per_s /
                                                                   in_regime->ranked.front().report.tokens_per_s));
          if (ex->stage1_rank) s1 = fmt::format("{} of {}", *ex->stage1_rank, in_regime->fitting);
          else if (!ex->fits) s1 = "does not fit";
          // The published split alone, the rest of the regime open (--explain's
          // split search): the micro-batch size and virtual stages, which the
          // H100 table does not give, at their best. Without a faster plan of
          // the split, the published plan is its best.
          const planner::SimulatedPlan& best = ex->split_best ? *ex->split_best : ex->plan;
          const int rank = ex->split_best ? ex->split_rank : ex->simulated_rank;
          split_rank = fmt::format("{} of {}", rank, in_regime->ranked.size() + 1);
          split_pick = fmt::format("mbs {}, vpp {}", best.plan.micro_batch_size, best.plan.vpp.value_or(1));
        }
      }
      const double pub = published ? published->report.tokens_per_s : 0;
      const double best = open->ranked.front().report.tokens_per_s;
      fmt::print("{:<18} {:>6} {:>12.0f} {:>12.0f} {:>+7.1f}%   {:>14} {:>9} {:>16} {:>11} {:>16}   {}\n",
                 run.table.substr(0, 9) + " " + run.label, run.gpus, pub, best, pub > 0 ? 100 * (best / pub - 1) : 0.0,
                 regime, share, s1, split_rank, split_pick, format_inline_plan(open->ranked.front().plan));
    }
  }
  return 0;
}
