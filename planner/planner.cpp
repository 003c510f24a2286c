#include "planner/planner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <queue>
#include <system_error>
#include <thread>

#include "core/program/builder.hpp"
#include "sim/engine.hpp"
#include "sim/network.hpp"
#include "sim/timed_program.hpp"
#include "sim/varlen_sim.hpp"

namespace megascope::planner {

namespace {

using Clock = std::chrono::steady_clock;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

Result<sim::CostModel> cost_model(const SearchInputs& in, const std::optional<std::string>& calibration) {
  auto cost = sim::CostModel::for_device(in.cluster.device);
  if (!cost) return cost;
  if (calibration)
    if (auto ok = cost->apply_calibration(*calibration); !ok) return tl::unexpected(ok.error());
  return cost;
}

// Topologies by GPU count, built once and shared by the threads of stage 2
// (a Topology is immutable; its path caches are per thread or filled once).
class Topologies {
 public:
  const sim::Topology& get(const ClusterSpec& cluster, int world) {
    const std::lock_guard lock(mutex_);
    auto it = built_.find(world);
    if (it == built_.end()) it = built_.emplace(world, sim::Topology::build(cluster, world)).first;
    return it->second;
  }

 private:
  std::mutex mutex_;
  std::map<int, sim::Topology> built_;
};

Result<SimulatedPlan> simulate_with(const SearchInputs& in, const PlanSpec& plan, int gpus, const sim::CostModel& cost,
                                    Topologies* shared = nullptr) {
  auto s = validate_setup(in.model, in.cluster, in.training, plan, gpus);
  if (!s) return tl::unexpected(s.error());
  const sim::Topology topo = shared ? shared->get(s->cluster, s->world) : sim::Topology::build(s->cluster, s->world);
  auto timed = sim::build_timed_program(*s, cost, topo);
  if (!timed) return tl::unexpected(timed.error());
  const Program* program = &timed->program;
  sim::SimOptions so;
  so.mode = sim::Mode::reduced;
  so.record_trace = false;   // the report only: the engine gathers what it reads
  so.activity = true;
  auto result = sim::simulate(*program, topo, cost, so);
  if (!result) return tl::unexpected(result.error());
  SimulatedPlan out;
  out.plan = plan;
  out.gpus = gpus;
  out.report = sim::make_report(*s, *program, std::move(*result));
  if (s->training.varlen) {
    // Variable-length training: ranked by its sampled steps. Packed
    // sequences are also priced with dynamic CP on the same batches, and the
    // faster of the two schedulers kept.
    const bool try_dynamic = s->training.varlen->packing == Packing::pack && !plan.dynamic_cp;
    Setup priced = *s;
    priced.plan.dynamic_cp = priced.plan.dynamic_cp || try_dynamic;
    auto v = sim::simulate_varlen(priced, cost, topo);
    if (!v) return tl::unexpected(v.error());
    if (try_dynamic && v->static_cp && v->static_cp->mean_step_s <= v->run.mean_step_s) {
      v->run = std::move(*v->static_cp);   // static packing as fast: the plan as given
      v->static_cp.reset();
    } else if (try_dynamic) {
      out.plan.dynamic_cp = true;
    }
    const double hw_ratio = out.report.tflops_per_gpu_no_causal > 0
                                ? out.report.hardware_tflops_per_gpu_no_causal / out.report.tflops_per_gpu_no_causal
                                : 1.0;
    // The full-length step's shares of exposed communication, on the sampled step.
    const double scale = v->fixed_step_s > 0 ? v->run.mean_step_s / v->fixed_step_s : 1.0;
    for (double& e : out.report.exposed_comm_s) e *= scale;
    out.report.step_time_s = v->run.mean_step_s;
    out.report.tokens_per_s = v->run.tokens_per_s;
    out.report.tflops_per_gpu = v->run.tflops_per_gpu;
    out.report.mfu = v->run.mfu;
    out.report.tflops_per_gpu_no_causal = v->run.tflops_per_gpu_no_causal;
    out.report.mfu_no_causal = v->run.mfu_no_causal;
    out.report.hardware_tflops_per_gpu_no_causal = v->run.tflops_per_gpu_no_causal * hw_ratio;
    out.varlen = std::move(*v);
  }
  out.memory = memory_report(*s);
  if (auto c = from_setup(*s)) out.candidate = *c;
  return out;
}

// Stage 2's call on a worker thread: an exception (a defect, not a user
// error) becomes the search's error instead of ending the process.
Result<SimulatedPlan> simulate_guarded(const SearchInputs& in, const Candidate& c, const sim::CostModel& cost,
                                       Topologies& shared) {
  try {
    return simulate_with(in, to_plan(c), c.gpus, cost, &shared);
  } catch (const std::exception& e) {
    return fail("plan", fmt::format("simulating tp={} cp={} pp={} vpp={} ep={} dp={} mbs={} on {} GPUs failed (a planner "
                                    "defect): {}", c.tp, c.cp, c.pp, c.vpp, c.ep, c.dp, c.mbs, c.gpus, e.what()));
  }
}

// Ordering of stage-1 survivors: time, then enumeration order (deterministic).
struct Ranked {
  double step = 0;
  std::uint64_t index = 0;
  Candidate c;
  Estimate e;
  bool operator<(const Ranked& o) const { return step != o.step ? step < o.step : index < o.index; }
};

std::string pct(double x) { return fmt::format("{:.1f}%", 100.0 * x); }

// Joins threads however the scope that owns them is left (an exception
// included), so that none is destroyed while it runs (std::terminate).
// The system refused a thread (too many for its limits or its memory).
Error thread_error(int wanted, int started, const std::system_error& e) {
  return Error{fmt::format("could not start thread {} of {} ({}); give fewer with --threads", started + 1, wanted,
                           e.code().message()),
               "--threads", std::nullopt};
}

struct JoinAll {
  explicit JoinAll(std::vector<std::thread>& t) : threads(t) {}
  std::vector<std::thread>& threads;
  JoinAll(const JoinAll&) = delete;
  JoinAll& operator=(const JoinAll&) = delete;
  ~JoinAll() {
    for (std::thread& t : threads)
      if (t.joinable()) t.join();
  }
};

}  // namespace

double SimulatedPlan::exposed_comm_s() const {
  double t = 0;
  for (double e : report.exposed_comm_s) t += e;
  return t;
}

Result<SimulatedPlan> simulate_plan(const SearchInputs& in, const PlanSpec& plan, int gpus,
                                    const std::optional<std::string>& calibration) {
  auto cost = cost_model(in, calibration);
  if (!cost) return tl::unexpected(cost.error());
  return simulate_with(in, plan, gpus, *cost);
}

Result<SearchResult> search(const SearchInputs& raw, const SearchOptions& o) {
  auto checked = check_inputs(raw);
  if (!checked) return tl::unexpected(checked.error());
  const SearchInputs& in = *checked;
  auto cost = cost_model(in, o.calibration);
  if (!cost) return tl::unexpected(cost.error());

  SearchResult res;
  res.capacity_bytes = in.cluster.device.memory_bytes;
  res.headroom_bytes = in.constraints.headroom_bytes;
  res.profile_source = cost->profile().source;
  const auto t0 = Clock::now();

  // A counting pass for the progress bar (an order of magnitude cheaper than evaluating).
  std::uint64_t total = 0;
  if (o.progress) {
    Rejections scratch;
    enumerate(in, scratch, [&](const Candidate&) { ++total; });
  }

  // Stage 1 on every thread: each walks the whole space (enumerating is
  // cheap) and evaluates its share, whole structural tuples (gpus, tp, cp,
  // pp, split, ep, etp) dealt round-robin so that each estimator's caches
  // serve runs of similar plans. Candidates keep their global enumeration
  // index, so the merged K best (by time, then index) are the one-thread ones.
  const std::size_t k = static_cast<std::size_t>(std::max(1, o.top_k));
  constexpr double kNoBound = std::numeric_limits<double>::infinity();
  // Keeps the K fastest in a max-heap.
  const auto keep = [k](std::priority_queue<Ranked>& heap, const Ranked& r) {
    if (heap.size() < k) {
      heap.push(r);
    } else if (r < heap.top()) {
      heap.pop();
      heap.push(r);
    }
  };
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int stage1_threads = std::max(1, o.threads > 0 ? o.threads : hw);
  struct Share {
    std::priority_queue<Ranked> best;   // max-heap of the K fastest
    std::optional<Ranked> rejected;
    std::optional<std::pair<std::uint64_t, Error>> failure;   // the first, by index
    std::uint64_t evaluated = 0, fitting = 0, memory = 0, timed = 0;
    Rejections rejections;
    std::exception_ptr thrown;   // an exception out of the thread's part: the caller gets it
  };
  std::vector<Share> shares(static_cast<std::size_t>(stage1_threads));
  // Set when a thread throws (thread 0's progress callback may throw to cancel
  // the search, as the GUI does): the others leave their walk at the next plan.
  std::atomic<bool> stop{false};
  struct Stopped {};
  const auto stage1 = [&](int t) {
    Share& sh = shares[static_cast<std::size_t>(t)];
    try {
      Estimator est(in, *cost);
      std::uint64_t index = 0, tuple = 0;
      std::array<int, 9> last_key{};
      last_key[0] = -1;
      enumerate(in, sh.rejections, [&](const Candidate& c) {
        if (stop.load(std::memory_order_relaxed)) throw Stopped{};
        const std::uint64_t i = index++;
        const std::array<int, 9> key = {c.gpus, c.tp, c.cp, c.pp, c.first_layers, c.last_layers,
                                        c.embedding_in_split * 2 + c.loss_in_split, c.ep, c.etp};
        if (key != last_key) {
          ++tuple;
          last_key = key;
        }
        // Thread 0 walks every plan too: it reports progress by the global index.
        if (t == 0 && o.progress && (i & 0xFFFF) == 0) o.progress({"stage 1", i, total});
        if (sh.failure || tuple % static_cast<std::uint64_t>(stage1_threads) != static_cast<std::uint64_t>(t)) return;
        // A plan whose time cannot beat this share's K-th best (or, not
        // fitting, its best rejected) is not timed in full: a plan that
        // fails to enter a share's K best cannot enter the merged K best.
        auto e = est.evaluate(c, sh.best.size() < k ? kNoBound : sh.best.top().step,
                              sh.rejected ? sh.rejected->step : kNoBound);
        if (!e) {
          sh.failure = {i, e.error()};
          return;
        }
        ++sh.evaluated;
        if (!e->fits) {
          ++sh.memory;
          if (e->bounded) return;
          ++sh.timed;
          Ranked r{e->step_s, i, c, *e};
          if (!sh.rejected || r < *sh.rejected) sh.rejected = r;
          return;
        }
        ++sh.fitting;
        if (e->bounded) return;
        ++sh.timed;
        keep(sh.best, Ranked{e->step_s, i, c, *e});
      });
    } catch (const Stopped&) {
    } catch (...) {
      sh.thrown = std::current_exception();
      stop = true;
    }
  };
  {
    std::vector<std::thread> workers;
    const JoinAll join{workers};
    try {
      for (int t = 1; t < stage1_threads; ++t) workers.emplace_back(stage1, t);
    } catch (const std::system_error& e) {
      stop = true;   // a thread that could not start: those started stop and are joined
      return tl::unexpected(thread_error(stage1_threads, static_cast<int>(workers.size()) + 1, e));
    } catch (...) {
      stop = true;
      throw;
    }
    stage1(0);   // the calling thread reports progress
  }
  for (Share& sh : shares)   // the calling thread's exception first (a cancel), else the lowest thread's
    if (sh.thrown) std::rethrow_exception(sh.thrown);
  std::optional<std::pair<std::uint64_t, Error>> failure;
  std::optional<Ranked> rejected;
  std::priority_queue<Ranked> best;
  res.rejections = shares.front().rejections;   // every thread counted the same structural tuples
  for (Share& sh : shares) {
    if (sh.failure && (!failure || sh.failure->first < failure->first)) failure = sh.failure;
    if (sh.rejected && (!rejected || *sh.rejected < *rejected)) rejected = sh.rejected;
    res.evaluated += sh.evaluated;
    res.fitting += sh.fitting;
    res.timed += sh.timed;
    res.rejections.memory += sh.memory;
    for (; !sh.best.empty(); sh.best.pop()) keep(best, sh.best.top());
  }
  if (failure)
    return fail(failure->second.field,
                "a plan of the search space failed validation (a planner defect): " + failure->second.message);
  if (rejected) {
    res.best_rejected = rejected->c;
    res.best_rejected_estimate = rejected->e;
  }
  res.stage1_s = seconds_since(t0);
  if (o.stage1_only) return res;

  // Stage 2: simulate the K best, in parallel; results land in their slots.
  std::vector<Ranked> top;
  while (!best.empty()) {
    top.push_back(best.top());
    best.pop();
  }
  std::sort(top.begin(), top.end());
  const auto t1 = Clock::now();
  std::vector<std::optional<Result<SimulatedPlan>>> out(top.size());
  std::atomic<std::size_t> next{0};
  std::atomic<std::size_t> finished{0};
  Topologies topologies;   // every candidate of one GPU count runs on the same cluster
  // Longest first, so that no thread is left with a long simulation at the
  // end: a simulation's events grow with the micro-batches of a pipeline
  // (every stage runs each one through its share of the layers).
  std::vector<std::size_t> order(top.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto work_of = [&](const Ranked& r) {
    return static_cast<double>(in.training.global_batch_size) / (static_cast<double>(r.c.dp) * r.c.mbs) *
           (r.c.recompute == RecomputeGranularity::full ? 1.3 : 1.0);
  };
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return work_of(top[a]) > work_of(top[b]); });
  const auto work = [&] {
    for (std::size_t n = next++; n < top.size(); n = next++) {
      const std::size_t i = order[n];
      out[i] = simulate_guarded(in, top[i].c, *cost, topologies);
      ++finished;
    }
  };
  const int threads = std::clamp(o.threads > 0 ? o.threads : hw, 1, std::max<int>(1, static_cast<int>(top.size())));
  std::optional<Error> start_failure;
  {
    std::vector<std::thread> pool;
    const JoinAll join{pool};
    try {
      for (int t = 1; t < threads; ++t) pool.emplace_back(work);
      if (o.progress) {
        // The calling thread reports progress and works. The workers may take
        // every simulation before it takes one, so it reports the end too,
        // once they are joined.
        std::size_t reported = 0;
        for (std::size_t n = next++; n < top.size(); n = next++) {
          const std::size_t i = order[n];
          out[i] = simulate_guarded(in, top[i].c, *cost, topologies);
          reported = ++finished;
          o.progress({"stage 2", reported, top.size()});
        }
        for (std::thread& t : pool) t.join();
        if (reported < top.size()) o.progress({"stage 2", top.size(), top.size()});
      } else {
        work();
      }
    } catch (const std::system_error& e) {
      next = top.size();   // a thread that could not start: the workers take no more, and are joined
      start_failure = thread_error(threads, static_cast<int>(pool.size()) + 1, e);
    } catch (...) {
      next = top.size();   // a progress callback that threw: the workers take no more
      throw;
    }
  }
  if (start_failure) return tl::unexpected(*start_failure);
  for (std::size_t i = 0; i < top.size(); ++i) {
    if (!*out[i]) return tl::unexpected((*out[i]).error());
    SimulatedPlan p = std::move(**out[i]);
    p.candidate = top[i].c;
    p.stage1 = top[i].e;
    p.stage1_rank = i + 1;
    res.ranked.push_back(std::move(p));
  }
  std::stable_sort(res.ranked.begin(), res.ranked.end(), [](const SimulatedPlan& a, const SimulatedPlan& b) {
    return a.report.step_time_s < b.report.step_time_s;
  });
  res.stage2_s = seconds_since(t1);
  return res;
}

std::vector<std::string> bounding_factors(const SimulatedPlan& p) {
  const sim::SimReport& r = p.report;
  const double step = r.step_time_s;
  std::vector<std::pair<double, std::string>> f;
  f.push_back({r.bubble_fraction, fmt::format("pipeline bubble: {} of the step", pct(r.bubble_fraction))});
  const char* names[] = {"TP", "CP", "EP", "DP", "PP"};
  for (int k = 0; k < sim::kCommKinds; ++k) {
    const double x = r.exposed_comm_s[static_cast<std::size_t>(k)] / step;
    if (x > 0.0005) f.push_back({x, fmt::format("{} communication not hidden by compute: {} of the step", names[k], pct(x))});
  }
  std::stable_sort(f.begin(), f.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> out;
  for (const auto& [x, s] : f) out.push_back(s);
  const double head = p.headroom_bytes();
  const double frac = p.memory.peak_bytes / p.memory.capacity_bytes;
  out.push_back(fmt::format("memory: {:.1f} of {:.1f} GiB on stage {} ({} free){}", p.memory.peak_bytes / kGiB,
                            p.memory.capacity_bytes / kGiB, p.memory.peak_stage, fmt::format("{:.1f} GiB", head / kGiB),
                            frac > 0.9 ? "; memory binds: a larger micro-batch or less recomputation would not fit"
                                       : ""));
  return out;
}

Result<Explanation> explain(const SearchInputs& raw, const SearchResult& r, const PlanSpec& plan, int gpus,
                            const SearchOptions& o) {
  auto checked = check_inputs(raw);
  if (!checked) return tl::unexpected(checked.error());
  const SearchInputs& in = *checked;
  Explanation ex;
  auto s = validate_setup(in.model, in.cluster, in.training, plan, gpus);
  if (!s) {
    ex.legal = false;
    ex.illegal_reason = s.error().str();
    return ex;
  }
  auto cost = cost_model(in, o.calibration);
  if (!cost) return tl::unexpected(cost.error());
  auto sp = simulate_with(in, plan, gpus, *cost);
  if (!sp) return tl::unexpected(sp.error());
  ex.plan = std::move(*sp);
  ex.fits = ex.plan.memory.peak_bytes + in.constraints.headroom_bytes <= ex.plan.memory.capacity_bytes;

  // Stage-1 rank: fitting plans of the search predicted faster.
  if (auto c = from_setup(*s); c && ex.fits) {
    Estimator est(in, *cost);
    auto mine = est.evaluate(*c);
    if (mine) {
      ex.plan.stage1 = *mine;
      std::uint64_t faster = 0;
      Rejections scratch;
      enumerate(in, scratch, [&](const Candidate& other) {
        // Only fitting plans faster than this one count: the others need not be timed in full.
        auto e = est.evaluate(other, mine->step_s, 0.0);
        if (e && e->fits && !e->bounded && e->step_s < mine->step_s) ++faster;
      });
      ex.stage1_rank = faster + 1;
    }
  }
  ex.simulated_rank = 1;
  for (const SimulatedPlan& p : r.ranked)
    if (p.report.step_time_s < ex.plan.report.step_time_s) ++ex.simulated_rank;

  // The best plan of its split: a search with the split fixed.
  {
    SearchInputs split = in;
    split.gpu_counts = {gpus};
    Constraints& k = split.constraints;
    k.tp = IntSet{{s->plan.tp}, {}, {}};
    k.cp = IntSet{{s->plan.cp}, {}, {}};
    k.pp = IntSet{{s->plan.pp}, {}, {}};
    k.dp = IntSet{{s->dp}, {}, {}};
    k.ep = IntSet{{s->plan.ep}, {}, {}};
    k.etp = IntSet{{s->etp}, {}, {}};
    SearchOptions so = o;
    so.progress = nullptr;
    so.top_k = std::min(o.top_k, 8);
    auto best = search(split, so);
    if (!best) return tl::unexpected(best.error());
    if (!best->ranked.empty() && best->ranked.front().report.step_time_s < ex.plan.report.step_time_s) {
      ex.split_best = best->ranked.front();
      ex.split_rank = 1;
      for (const SimulatedPlan& p : r.ranked)
        if (p.report.step_time_s < ex.split_best->report.step_time_s) ++ex.split_rank;
    }
  }

  if (!ex.fits) {
    ex.reasons.push_back(fmt::format("does not fit: needs {:.1f} GiB on stage {} plus {:.1f} GiB headroom, the GPU has "
                                     "{:.1f} GiB",
                                     ex.plan.memory.peak_bytes / kGiB, ex.plan.memory.peak_stage,
                                     in.constraints.headroom_bytes / kGiB, ex.plan.memory.capacity_bytes / kGiB));
  }
  if (r.ranked.empty()) return ex;
  const SimulatedPlan& w = r.ranked.front();
  const double ds = ex.plan.report.step_time_s - w.report.step_time_s;
  if (ds <= 0) {
    ex.reasons.push_back("it is as fast as the search's best plan or faster");
    return ex;
  }
  ex.reasons.push_back(fmt::format("{:.1f}% slower than the best plan ({:.3f} s vs {:.3f} s per step)",
                                   100.0 * ds / w.report.step_time_s, ex.plan.report.step_time_s,
                                   w.report.step_time_s));
  // Differences in where the time goes, largest first.
  std::vector<std::pair<double, std::string>> diffs;
  const auto busy = [](const sim::SimReport& rep) {
    double b = 0;
    for (const auto& st : rep.stages) b = std::max(b, st.compute_busy_s);
    return b;
  };
  diffs.push_back({busy(ex.plan.report) - busy(w.report),
                   fmt::format("compute on the busiest stage: {:+.3f} s", busy(ex.plan.report) - busy(w.report))});
  const double bub = ex.plan.report.bubble_fraction * ex.plan.report.step_time_s - w.report.bubble_fraction * w.report.step_time_s;
  diffs.push_back({bub, fmt::format("pipeline bubble: {:+.3f} s", bub)});
  const char* names[] = {"TP", "CP", "EP", "DP", "PP"};
  for (int k = 0; k < sim::kCommKinds; ++k) {
    const double d = ex.plan.report.exposed_comm_s[static_cast<std::size_t>(k)] - w.report.exposed_comm_s[static_cast<std::size_t>(k)];
    if (std::abs(d) > 1e-4) diffs.push_back({d, fmt::format("exposed {} communication: {:+.3f} s", names[k], d)});
  }
  std::stable_sort(diffs.begin(), diffs.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [d, text] : diffs)
    if (d > 1e-4) ex.reasons.push_back(text);
  return ex;
}

}  // namespace megascope::planner
