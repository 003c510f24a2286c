#include "gui/simulationservice.hpp"

#include <QMetaObject>

#include <chrono>
#include <thread>

#include "core/program/builder.hpp"
#include "sim/cost_model.hpp"
#include "sim/network.hpp"
#include "sim/timed_program.hpp"

namespace megascope::gui {

Result<std::shared_ptr<SimulationOutcome>> simulateSetup(const Setup& setup, sim::Mode mode) {
  const auto t0 = std::chrono::steady_clock::now();
  auto out = std::make_shared<SimulationOutcome>();
  out->setup = setup;
  auto cost = sim::CostModel::for_device(setup.cluster.device);
  if (!cost) return tl::unexpected(cost.error());
  out->profileSource = cost->profile().source;
  const sim::Topology topo = sim::Topology::build(setup.cluster, setup.world);
  auto program = sim::build_timed_program(setup, *cost, topo);   // zb-1p/zb-2p: placed from the stages' times
  if (!program) return tl::unexpected(program.error());
  out->program = std::move(program->program);
  sim::SimOptions so;
  so.mode = mode;
  auto result = sim::simulate(out->program, topo, *cost, so);
  if (!result) return tl::unexpected(result.error());
  out->result = std::move(*result);
  // The report and the timeline's lanes read the same spans: build them side by side.
  std::thread reportThread([&] {
    out->report = sim::make_report(setup, out->program, out->result);
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
