#include "harness.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>

#include "config/plan_settings.hpp"
#include "core/accounting/flops.hpp"
#include "core/accounting/memory.hpp"
#include "sim/cost_model.hpp"
#include "sim/engine.hpp"
#include "sim/report.hpp"
#include "sim/timed_program.hpp"
#include "sim/varlen_sim.hpp"
#include "core/varlen.hpp"
#include "sim/network.hpp"

namespace megascope::fuzz {
namespace {

[[noreturn]] void impossible(const char* what, double value) {
  std::fprintf(stderr, "megascope fuzz: an accepted input gave an impossible %s: %g\n", what, value);
  std::abort();
}

void non_negative(const char* what, double v) {
  if (!std::isfinite(v) || v < 0) impossible(what, v);
}

void positive(const char* what, double v) {
  if (!std::isfinite(v) || v <= 0) impossible(what, v);
}

const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("megascope-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

// Steps whose op count (micro-batches x layers, over every stage) is below
// this are simulated; larger ones are only accounted, so that an input takes
// milliseconds and the fuzzer explores.
constexpr double kSimulatedWork = 4096;

}  // namespace

std::string write_input(const std::uint8_t* data, std::size_t size, std::string_view name) {
  const auto path = scratch() / std::string(name);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path.string();
}

std::string as_text(const std::uint8_t* data, std::size_t size) {
  std::string s(reinterpret_cast<const char*>(data), size);
  if (const auto nul = s.find('\0'); nul != std::string::npos) s.resize(nul);
  return s;
}

cli::ScenarioOptions small_scenario() {
  cli::ScenarioOptions o;
  o.model = "tiny-gpt";
  o.cluster = "dgx-a100";
  o.plan = "tp=2,pp=2,mbs=1";
  o.gpus = 8;
  o.global_batch = 16;
  return o;
}

namespace {
// Variable-length training: two sampled steps through both schedulers (every
// document placed once, no pack over its budget) and the simulation of them.
void check_varlen(const Setup& s, const sim::CostModel& cost, const sim::Topology& topo) {
  const VarlenSpec* v = s.training.varlen.get();
  if (!v || s.training.global_batch_size > 4096) return;
  const auto B = static_cast<std::size_t>(s.training.global_batch_size);
  for (std::uint64_t step = 0; step < 2; ++step) {
    const auto lengths = sample_lengths(v->lengths, v->seed, step, B);
    if (lengths.size() != B) impossible("sampled lengths (count)", static_cast<double>(lengths.size()));
    std::int64_t tokens = 0;
    for (const std::int64_t d : lengths) {
      if (d < 1 || d > s.seq_length) impossible("a sampled length", static_cast<double>(d));
      tokens += d;
    }
    if (v->packing != Packing::pack) continue;
    auto st = schedule_static(lengths, s.seq_length, s.dp, s.dp);
    if (!st) impossible("static packing (refused)", 0);
    std::int64_t packed = 0;
    for (const auto& replica : st->packs)
      for (const auto& pack : replica) {
        std::int64_t t = 0;
        for (const std::int64_t d : pack) t += d;
        if (t > s.seq_length && pack.size() > 1) impossible("a pack over its budget", static_cast<double>(t));
        packed += t;
      }
    if (packed != tokens) impossible("tokens packed (not every document once)", static_cast<double>(packed));
    auto dy = schedule_dynamic_cp(lengths, s.seq_length / s.plan.cp, s.dp * s.plan.cp, 1, 1);
    if (!dy) impossible("dynamic CP schedule (refused)", 0);
    double share = 0;   // each document's tokens over its group, summed over the ranks holding it
    for (const auto& mb : dy->work)
      for (const auto& w : mb)
        for (const std::int64_t d : w.docs) share += static_cast<double>(d) / w.cp;
    if (std::abs(share - static_cast<double>(tokens)) > 1e-6 * static_cast<double>(tokens))
      impossible("tokens scheduled by dynamic CP (not every document once)", share);
  }
  Setup two = s;
  auto spec = std::make_shared<VarlenSpec>(*v);
  spec->steps = std::min(spec->steps, 2);
  two.training.varlen = spec;
  auto r = sim::simulate_varlen(two, cost, topo);
  if (!r) return;
  positive("sampled step time", r->run.mean_step_s);
  positive("sampled tokens per second", r->run.tokens_per_s);
  if (r->run.mfu > 1.0) impossible("sampled MFU (over 100%)", r->run.mfu);
  if (r->run.balance > 1.0 + 1e-9 || r->run.balance <= 0) impossible("balance", r->run.balance);
}
}  // namespace

void check_setup(const Setup& s, const std::optional<std::string>& calibration) {
  const auto flops = iteration_flops(s);
  non_negative("model FLOPs", flops.model);
  non_negative("hardware FLOPs", flops.hardware);
  if (flops.hardware + 1e-6 * flops.hardware < flops.model) impossible("hardware FLOPs below model FLOPs", flops.hardware);

  const auto mem = memory_report(s);
  for (const auto& st : mem.stages) {
    non_negative("parameters of a stage", st.params);
    non_negative("weights bytes", st.weights_bytes);
    non_negative("gradient bytes", st.grads_bytes);
    non_negative("optimizer bytes", st.optimizer_bytes);
    non_negative("activation bytes", st.activations_bytes);
    non_negative("other bytes", st.other_bytes);
    non_negative("total bytes", st.total_bytes);
  }
  non_negative("peak bytes", mem.peak_bytes);

  const double work = static_cast<double>(s.num_microbatches) * s.model.num_layers * s.plan.pp;
  if (work > kSimulatedWork) return;
  auto cost = sim::CostModel::for_device(s.cluster.device);
  if (!cost) return;
  if (calibration && !cost->apply_calibration(*calibration)) return;
  const auto topo = sim::Topology::build(s.cluster, s.world);
  auto timed = sim::build_timed_program(s, *cost, topo);
  if (!timed) return;
  sim::SimOptions so;
  so.record_trace = false;
  auto result = sim::simulate(timed->program, topo, *cost, so);
  if (!result) return;
  const auto r = sim::make_report(s, timed->program, *result);
  positive("step time", r.step_time_s);
  positive("tokens per second", r.tokens_per_s);
  non_negative("MFU", r.mfu);
  if (r.mfu > 1.0) impossible("MFU (over 100%)", r.mfu);
  non_negative("bubble fraction", r.bubble_fraction);
  for (const double c : r.exposed_comm_s) non_negative("exposed communication", c);
  check_varlen(s, *cost, topo);
}

const TraceFile& reference_trace() {
  static const TraceFile trace = [] {
    auto sc = cli::load_scenario(small_scenario());
    if (!sc) impossible("default scenario (refused)", 0);
    const Setup& s = sc->setup;
    auto cost = sim::CostModel::for_device(s.cluster.device);
    if (!cost) impossible("default cost model (refused)", 0);
    const auto topo = sim::Topology::build(s.cluster, s.world);
    auto timed = sim::build_timed_program(s, *cost, topo);
    if (!timed) impossible("default program (refused)", 0);
    auto result = sim::simulate(timed->program, topo, *cost, sim::SimOptions{});
    if (!result) impossible("default simulation (refused)", 0);
    const auto path = (scratch() / "reference-trace.json").string();
    if (!sim::write_trace(path, timed->program, *result,
                          {TraceSource::simulated, 0, format_inline_plan(s.plan), s.model.name, s.world}))
      impossible("reference trace (not written)", 0);
    auto t = read_trace(path);
    if (!t) impossible("reference trace (not read back)", 0);
    return std::move(*t);
  }();
  return trace;
}

void load_and_check(const cli::ScenarioOptions& o, const std::optional<std::string>& calibration) {
  auto sc = cli::load_scenario(o);
  if (!sc) return;
  check_setup(sc->setup, calibration);
}

}  // namespace megascope::fuzz
