// Shared pieces of the GUI tests: a registry of QtTest classes (so that one
// binary holds them all), a small setup that simulates in milliseconds, and
// pixel counting for screenshot checks.
#pragma once

#include <QColor>
#include <QImage>
#include <QObject>

#include <functional>
#include <memory>
#include <vector>

#include "gui/inputs.hpp"
#include "gui/simulationservice.hpp"

namespace megascope::gui::test {

struct Registered {
  const char* group;
  std::function<QObject*()> make;
};
std::vector<Registered>& registry();
struct Register {
  Register(const char* group, std::function<QObject*()> make) { registry().push_back({group, std::move(make)}); }
};

// gpt-1.7b on 8 A100s, tp=2, pp=4, 1F1B, global batch 16 (16 micro-batches).
Inputs smallInputs();
std::shared_ptr<SimulationOutcome> simulateSmall(const std::string& plan = "tp=2,pp=4,mbs=1,schedule=1f1b");
// The run of the measured fixture (fixtures/tiny-gpt-pp2-measured.json):
// tiny-gpt on 2 cpu-host ranks, global batch 8, with `plan`.
std::shared_ptr<SimulationOutcome> simulateFixtureRun(const std::string& plan);

// Pixels of `img` within `tolerance` (per channel) of `c`.
int countColor(const QImage& img, const QColor& c, int tolerance = 6);

}  // namespace megascope::gui::test

#define MEGASCOPE_GUI_TEST(group, Class) \
  static ::megascope::gui::test::Register register_##Class(group, [] { return new Class; });
