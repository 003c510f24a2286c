#include "gui_support.hpp"

#include <QtTest>

#include <cstdlib>

#include "config/library.hpp"
#include "config/plan_settings.hpp"

namespace megascope::gui::test {

std::vector<Registered>& registry() {
  static std::vector<Registered> r;
  return r;
}

namespace {

Inputs inputsOf(const StartOptions& o) {
  auto in = loadInputs(o);
  if (!in) qFatal("test inputs: %s", in.error().str().c_str());
  return *in;
}

std::shared_ptr<SimulationOutcome> simulateInputs(const Inputs& in) {
  auto setup = makeSetup(in);
  if (!setup) qFatal("test simulation: %s", setup.error().str().c_str());
  auto out = simulateSetup(*setup);
  if (!out) qFatal("test simulation: %s", out.error().str().c_str());
  return *out;
}

}  // namespace

Inputs smallInputs() {
  StartOptions o;
  o.model = "gpt-1.7b";
  o.cluster = "dgx-a100";
  o.gpus = 8;
  o.plan = "tp=2,pp=4,mbs=1,schedule=1f1b";
  o.globalBatch = 16;
  return inputsOf(o);
}

std::shared_ptr<SimulationOutcome> simulateSmall(const std::string& plan) {
  Inputs in = smallInputs();
  auto p = parse_inline_plan(plan);
  if (!p) qFatal("simulateSmall: %s", p.error().str().c_str());
  in.plan = *p;
  return simulateInputs(in);
}

std::shared_ptr<SimulationOutcome> simulateFixtureRun(const std::string& plan) {
  StartOptions o;
  o.model = "tiny-gpt";
  o.cluster = "cpu-host";
  o.gpus = 2;
  o.plan = plan;
  o.globalBatch = 8;
  return simulateInputs(inputsOf(o));
}

int countColor(const QImage& img, const QColor& c, int tolerance) {
  const QImage im = img.convertToFormat(QImage::Format_RGB32);
  int n = 0;
  for (int y = 0; y < im.height(); ++y) {
    const auto* line = reinterpret_cast<const QRgb*>(im.constScanLine(y));
    for (int x = 0; x < im.width(); ++x) {
      const QRgb p = line[x];
      if (std::abs(qRed(p) - c.red()) <= tolerance && std::abs(qGreen(p) - c.green()) <= tolerance &&
          std::abs(qBlue(p) - c.blue()) <= tolerance)
        ++n;
    }
  }
  return n;
}

}  // namespace megascope::gui::test
