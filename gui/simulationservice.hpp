// SimulationService: simulates a Setup off the GUI thread.
//
// Every request gets a new generation number. Requests run one at a time on
// the service's own thread; a request that a newer one superseded before it
// started is skipped, and the result of one superseded while it ran is
// dropped, so only the newest request's outcome arrives, through a queued
// signal on the GUI thread. The GUI never waits for a simulation.
#pragma once

#include <QObject>
#include <QThreadPool>

#include <atomic>
#include <memory>

#include "core/accounting/memory.hpp"
#include "core/program/program.hpp"
#include "core/setup.hpp"
#include "gui/timelinedata.hpp"
#include "sim/engine.hpp"
#include "sim/report.hpp"

namespace megascope::gui {

struct SimulationOutcome {
  quint64 generation = 0;
  Setup setup;
  Program program;
  sim::SimResult result;
  sim::SimReport report;
  MemoryReport memory;
  std::shared_ptr<const TimelineData> timeline;
  std::string profileSource;
  double wallSeconds = 0;        // build + simulate + report + timeline
};
using OutcomePtr = std::shared_ptr<const SimulationOutcome>;

// The whole pipeline, synchronously (the service runs it on its thread).
Result<std::shared_ptr<SimulationOutcome>> simulateSetup(const Setup& setup, sim::Mode mode = sim::Mode::reduced);

class SimulationService : public QObject {
  Q_OBJECT
 public:
  explicit SimulationService(QObject* parent = nullptr);
  ~SimulationService() override;

  // Starts simulating `setup`; returns the request's generation.
  quint64 request(const Setup& setup);
  [[nodiscard]] quint64 latestGeneration() const { return m_latest.load(); }
  [[nodiscard]] bool busy() const { return m_pool.activeThreadCount() > 0; }
  void setMode(sim::Mode mode) { m_mode = mode; }   // for the next requests
  [[nodiscard]] sim::Mode mode() const { return m_mode; }
  // Blocks until no request runs (for tests and shutdown).
  void waitForIdle();

 signals:
  void started(quint64 generation);
  void finished(megascope::gui::OutcomePtr outcome);
  void failed(quint64 generation, const QString& message);

 private:
  QThreadPool m_pool;
  std::atomic<quint64> m_latest{0};
  sim::Mode m_mode = sim::Mode::reduced;
};

}  // namespace megascope::gui

Q_DECLARE_METATYPE(megascope::gui::OutcomePtr)
