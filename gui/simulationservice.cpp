#include "gui/simulationservice.hpp"

#include <QMetaObject>

#include <chrono>
#include <optional>
#include <thread>

#include "core/program/builder.hpp"
#include "sim/cost_model.hpp"
#include "sim/network.hpp"
#include "sim/timed_program.hpp"
#include "sim/varlen_sim.hpp"

namespace megascope::gui {

Result<std::shared_ptr<SimulationOutcome>> simulateSetup(const Setup& setup, sim::Mode mode) {
  const auto t0 = std::chrono::steady_clock::now();
  auto out = std::make_shared<SimulationOutcome>();
  out->setup = setup;
  auto cost = sim::CostModel::for_device(setup.cluster.device);
  if (!cost) return tl::unexpected(cost.error());
  out->profileSource = cost->profile().source;
  const sim::Topology topo = sim::Topology::build(setup.cluster, setup.world);
  // Variable-length training: the first sampled step's slowest replica, each
  // micro-batch at its own length (sim/varlen_sim.hpp).
  std::optional<sim::VarlenProgram> varlen;
  if (setup.training.varlen) {
    auto v = sim::slowest_replica_program(setup, *cost, topo, 0);
    if (!v) return tl::unexpected(v.error());
    out->program = std::move(v->program);
    varlen = std::move(*v);
  } else {
    auto program = sim::build_timed_program(setup, *cost, topo);   // zb-1p/zb-2p: placed from the stages' times
    if (!program) return tl::unexpected(program.error());
    out->program = std::move(program->program);
  }
  const Setup& built = varlen ? varlen->setup : setup;
  sim::SimOptions so;
  so.mode = mode;
  auto result = sim::simulate(out->program, topo, *cost, so);
  if (!result) return tl::unexpected(result.error());
  out->result = std::move(*result);
  // The report and the timeline's lanes read the same spans: build them side by side.
  std::thread reportThread([&] {
    out->report = sim::make_report(built, out->program, out->result);
    if (varlen && out->report.step_time_s > 0) {
      // The step's real tokens and their FLOPs, not full-length sequences'.
      sim::SimReport& r = out->report;
      r.tokens_per_s = static_cast<double>(varlen->tokens) / r.step_time_s;
      r.model_flops = varlen->model_flops;
      r.tflops_per_gpu = varlen->model_flops / r.step_time_s / static_cast<double>(setup.world) / 1e12;
      r.mfu = r.tflops_per_gpu * 1e12 / setup.cluster.device.peak_bf16_flops;
    }
    out->memory = memory_report(setup);
  });
  out->timeline = timelineFromSimulation(out->program, out->result.spans, out->result.step_time_s);
  reportThread.join();
  out->wallSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

SimulationService::SimulationService(QObject* parent) : QObject(parent) {
  qRegisterMetaType<OutcomePtr>();
  m_pool.setMaxThreadCount(1);
  m_pool.setExpiryTimeout(-1);
}

SimulationService::~SimulationService() {
  m_latest = ~quint64{0};   // nothing pending is wanted any more
  m_pool.clear();
  m_pool.waitForDone();
}

void SimulationService::waitForIdle() { m_pool.waitForDone(); }

quint64 SimulationService::request(const Setup& setup) {
  const quint64 gen = ++m_latest;
  m_pool.clear();   // queued, not started: superseded
  emit started(gen);
  const sim::Mode mode = m_mode;
  m_pool.start([this, gen, setup, mode] {
    if (gen != m_latest.load()) return;   // superseded before it started
    auto r = simulateSetup(setup, mode);
    if (gen != m_latest.load()) return;   // superseded while it ran
    if (!r) {
      const QString message = QString::fromStdString(r.error().str());
      QMetaObject::invokeMethod(this, [this, gen, message] {
        if (gen == m_latest.load()) emit failed(gen, message);
      }, Qt::QueuedConnection);
      return;
    }
    (*r)->generation = gen;
    OutcomePtr outcome = std::move(*r);
    QMetaObject::invokeMethod(this, [this, outcome] {
      if (outcome->generation == m_latest.load()) emit finished(outcome);
    }, Qt::QueuedConnection);
  });
  return gen;
}

}  // namespace megascope::gui
