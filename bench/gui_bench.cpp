// gui_bench: speed of the GUI's path from a plan change to the redrawn
// timeline (the target: under 200 ms for GPT-3 175B on 1024 GPUs),
// with the background work split into its steps, and the cost of painting
// the timeline with a million spans. Prints a header row, a units row and one
// row per case, then the rows as JSON. Not a test.
//
//   QT_QPA_PLATFORM=offscreen ./build/bench/gui_bench [--repeat N]
//
// "plan change -> redrawn timeline" is measured in the real MainWindow: the
// plan panel's plan is replaced (alternating between two plans so that every
// change is a real one), the window validates it, the simulation service
// runs it off the GUI thread, the outcome comes back by queued signal, and
// the clock stops when the timeline widget has painted the new data.
#include <QApplication>
#include <QEventLoop>
#include <QImage>
#include <QPainter>
#include <QTimer>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "config/plan_settings.hpp"
#include "core/program/builder.hpp"
#include "gui/inputs.hpp"
#include "gui/mainwindow.hpp"
#include "gui/memorytimeline.hpp"
#include "gui/planpanel.hpp"
#include "gui/simulationservice.hpp"
#include "gui/timelinewidget.hpp"
#include "sim/cost_model.hpp"
#include "sim/network.hpp"

using namespace megascope;
using namespace megascope::gui;
using Clock = std::chrono::steady_clock;

namespace {

struct Row {
  std::string name;
  double min_ms = 0, median_ms = 0;
  std::string note;
};

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

Row summarise(std::string name, std::vector<double> v, std::string note = {}) {
  std::sort(v.begin(), v.end());
  return {std::move(name), v.front(), v[v.size() / 2], std::move(note)};
}

}  // namespace

int main(int argc, char** argv) {
  if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
  QApplication app(argc, argv);
  int repeat = 5;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--repeat") == 0 && i + 1 < argc) repeat = std::max(1, std::atoi(argv[++i]));

  auto inputs = loadInputs({});   // the default example: gpt3-175b, dgx-a100, 1024 GPUs
  if (!inputs) {
    fmt::print(stderr, "gui_bench: {}\n", inputs.error().str());
    return 1;
  }
  Inputs changed = *inputs;
  changed.plan.recompute.granularity = RecomputeGranularity::none;   // the "what if" the user types
  const std::string planA = format_inline_plan(inputs->plan), planB = format_inline_plan(changed.plan);
  std::vector<Row> rows;

  // The background steps, one by one, on this thread.
  {
    auto setup = makeSetup(*inputs);
    if (!setup) {
      fmt::print(stderr, "gui_bench: {}\n", setup.error().str());
      return 1;
    }
    std::vector<double> validate, build, sim, report, memory, timeline, total;
    std::size_t spans = 0;
    for (int r = 0; r < repeat; ++r) {
      auto t = Clock::now();
      auto s = makeSetup(r % 2 ? changed : *inputs);   // both plans, as in the window below
      validate.push_back(ms_since(t));
      t = Clock::now();
      auto program = build_program(*s);
      build.push_back(ms_since(t));
      t = Clock::now();
      auto cost = sim::CostModel::for_device(s->cluster.device);
      const sim::Topology topo = sim::Topology::build(s->cluster, s->world);
      auto result = sim::simulate(*program, topo, *cost, {});
      sim.push_back(ms_since(t));
      t = Clock::now();
      auto rep = sim::make_report(*s, *program, *result);
      report.push_back(ms_since(t));
      t = Clock::now();
      auto mem = memory_report(*s);
      memory.push_back(ms_since(t));
      t = Clock::now();
      auto tl = timelineFromSimulation(*program, result->spans, result->step_time_s);
      timeline.push_back(ms_since(t));
      spans = tl->spanCount;
      t = Clock::now();
      auto all = simulateSetup(*s);
      if (!all) return 1;
      total.push_back(ms_since(t));
    }
    rows.push_back(summarise("validate_setup", validate, "GUI thread, on every edit"));
    rows.push_back(summarise("build_program", build));
    rows.push_back(summarise("simulate (reduced)", sim, "cost model + topology + engine"));
    rows.push_back(summarise("make_report", report));
    rows.push_back(summarise("memory_report", memory));
    rows.push_back(summarise("timeline lanes", timeline, fmt::format("{} spans", spans)));
    rows.push_back(summarise("worker total", total, "simulateSetup: all of the above but validation (report and lanes side by side)"));
    auto o = simulateSetup(*setup);
    std::vector<double> memTime;
    for (int r = 0; r < repeat; ++r) {
      const auto t = Clock::now();
      auto m = memoryOverTime((*o)->setup, (*o)->program, (*o)->result.spans, 0);
      memTime.push_back(ms_since(t));
    }
    rows.push_back(summarise("memory over time, one rank", memTime, "GUI thread, Memory view only"));
    // The same pipeline on another thread, as the service runs it (both plans).
    std::vector<double> pooled;
    for (int r = 0; r < repeat; ++r) {
      auto s2 = makeSetup(r % 2 ? changed : *inputs);
      double ms = 0;
      std::thread worker([&] {
        const auto t0 = Clock::now();
        auto all = simulateSetup(*s2);
        ms = ms_since(t0);
      });
      worker.join();
      pooled.push_back(ms);
    }
    rows.push_back(summarise("worker total, on a fresh thread", pooled, "a new std::thread per run"));
  }

  // End to end in the window.
  {
    MainWindow w;
    w.resize(1600, 1000);
    w.show();
    bool waiting = false, gotOutcome = false, done = false;
    Clock::time_point changedAt = Clock::now();
    std::vector<double> arrival, worker;
    QObject::connect(&w, &MainWindow::outcomeChanged, [&](OutcomePtr o) {
      gotOutcome = waiting;
      if (waiting) {
        arrival.push_back(ms_since(changedAt));
        worker.push_back(1e3 * o->wallSeconds);
      }
    });
    QEventLoop loop;   // sleeps between events, so the GUI thread takes no CPU from the worker
    QObject::connect(w.timeline(), &TimelineWidget::rendered, [&] {
      if (waiting && gotOutcome && !done) {
        done = true;
        loop.quit();
      }
    });
    auto waitFor = [&](bool& flag) {
      QTimer guard;
      guard.setSingleShot(true);
      QObject::connect(&guard, &QTimer::timeout, &loop, &QEventLoop::quit);
      guard.start(120000);
      if (!flag) loop.exec();
      return flag;
    };
    // The first load (not timed), then alternate between the two plans.
    waiting = true;
    w.setInputs(*inputs);
    if (!waitFor(done)) return 1;
    std::vector<double> e2e;
    for (int r = 0; r < repeat; ++r) {
      const PlanSpec next = (r % 2 == 0) ? changed.plan : inputs->plan;
      waiting = true;
      gotOutcome = done = false;
      const auto t = Clock::now();
      changedAt = t;
      w.planPanel()->setPlan(next);
      if (!waitFor(done)) {
        fmt::print(stderr, "gui_bench: no redraw\n");
        return 1;
      }
      e2e.push_back(ms_since(t));
      waiting = false;
    }
    arrival.erase(arrival.begin());   // the first load
    worker.erase(worker.begin());
    rows.push_back(summarise("  of which: simulation thread", worker, "simulateSetup, both plans"));
    rows.push_back(summarise("  of which: outcome on GUI thread", arrival, "plan change -> queued outcome handled"));
    rows.push_back(summarise("plan change -> redrawn timeline", e2e,
                             fmt::format("MainWindow 1600x1000, {} <-> {}", planA, planB)));

    // Painting alone: the current timeline, whole and zoomed in.
    std::vector<double> paintAll;
    for (int r = 0; r < repeat; ++r) {
      const auto t = Clock::now();
      w.timeline()->repaint();
      paintAll.push_back(ms_since(t));
    }
    rows.push_back(summarise("paint gpt3-175b timeline", paintAll,
                             fmt::format("{} spans, whole iteration", w.timeline()->data()->spanCount)));
  }

  // A million spans: 64 lanes x 15625.
  {
    TimelineWidget tw;
    tw.resize(1600, 1000);
    tw.show();
    tw.setData(syntheticTimeline(64, 15625));
    QApplication::processEvents();
    std::vector<double> whole, zoomed;
    for (int r = 0; r < repeat; ++r) {
      tw.showAll();
      auto t = Clock::now();
      tw.repaint();
      whole.push_back(ms_since(t));
      const double d = tw.data()->duration;
      tw.setVisibleRange({0.4 * d, 0.4 * d + d / 1000});
      t = Clock::now();
      tw.repaint();
      zoomed.push_back(ms_since(t));
    }
    rows.push_back(summarise("paint 1M spans, whole", whole, "64 lanes x 15625 spans, level of detail"));
    rows.push_back(summarise("paint 1M spans, zoomed 1000x", zoomed, "same data, 0.1% of it visible"));
  }

  fmt::print("{:<36} {:>10} {:>10}  {}\n", "case", "min", "median", "note");
  fmt::print("{:<36} {:>10} {:>10}  {}\n", "", "ms", "ms", "");
  for (const Row& r : rows) fmt::print("{:<36} {:>10.1f} {:>10.1f}  {}\n", r.name, r.min_ms, r.median_ms, r.note);
  fmt::print("[");
  for (std::size_t i = 0; i < rows.size(); ++i)
    fmt::print("{}{{\"case\":\"{}\",\"min_ms\":{:.3f},\"median_ms\":{:.3f},\"repeat\":{}}}", i ? ",\n " : "",
               rows[i].name, rows[i].min_ms, rows[i].median_ms, repeat);
  fmt::print("]\n");
  return 0;
}
