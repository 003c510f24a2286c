// megascope-gui: the Qt application. With --screenshot FILE it renders the
// main window for the given example and view, writes the PNG and exits
// (works under QT_QPA_PLATFORM=offscreen).
#include <QApplication>
#include <QCommandLineParser>
#include <QTimer>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "config/library.hpp"
#include "gui/compareview.hpp"
#include "gui/mainwindow.hpp"
#include "gui/screenshot.hpp"
#include "gui/timescale.hpp"

using namespace megascope;
using namespace megascope::gui;

namespace {

std::optional<std::string> opt(const QCommandLineParser& p, const QString& name) {
  if (!p.isSet(name)) return std::nullopt;
  return p.value(name).toStdString();
}

int usageError(const QString& message) {
  std::fprintf(stderr, "megascope-gui: error: %s\n", qPrintable(message));
  return 2;
}

// The command line's options, help and description.
void configure(QCommandLineParser& p) {
  p.setApplicationDescription(QStringLiteral("Megascope: plan, simulate and compare 5-D parallel transformer training"));
  p.addHelpOption();
  p.addOptions({
      {QStringLiteral("example"), QStringLiteral("An [example] TOML file (default: the shipped default example)."), QStringLiteral("FILE")},
      {QStringLiteral("model"), QStringLiteral("Shipped model name, model TOML or Hugging Face config.json."), QStringLiteral("NAME|FILE")},
      {QStringLiteral("cluster"), QStringLiteral("Shipped cluster name or cluster TOML."), QStringLiteral("NAME|FILE")},
      {QStringLiteral("plan"), QStringLiteral("Inline plan (tp=8,pp=4,...) or plan TOML."), QStringLiteral("PLAN")},
      {QStringLiteral("gpus"), QStringLiteral("Devices used."), QStringLiteral("N")},
      {QStringLiteral("nodes"), QStringLiteral("Nodes used."), QStringLiteral("N")},
      {QStringLiteral("global-batch"), QStringLiteral("Sequences per iteration."), QStringLiteral("B")},
      {QStringLiteral("seq-len"), QStringLiteral("Tokens per sequence."), QStringLiteral("S")},
      {QStringLiteral("full"), QStringLiteral("Simulate every rank (default: one per pipeline stage).")},
      {QStringLiteral("view"), QStringLiteral("View to show: timeline, memory, report, compare or search."), QStringLiteral("VIEW"), QStringLiteral("timeline")},
      {QStringLiteral("measured"), QStringLiteral("A measured trace to compare with (opens the compare view)."), QStringLiteral("FILE")},
      {QStringLiteral("demo-measured"), QStringLiteral("Compare with a synthetic measured trace: the simulation with compute x1.08 and communication x1.3.")},
      {QStringLiteral("baseline"), QStringLiteral("A plan pinned as the report's baseline (inline or TOML)."), QStringLiteral("PLAN")},
      {QStringLiteral("search-top"), QStringLiteral("Plans the search view simulates in screenshot mode (default 8)."), QStringLiteral("K"), QStringLiteral("8")},
      {QStringLiteral("screenshot"), QStringLiteral("Render the main window to FILE (PNG) and exit."), QStringLiteral("FILE")},
      {QStringLiteral("zoom"), QStringLiteral("Timeline range to show, START:END in seconds (e.g. 2:2.5)."), QStringLiteral("START:END")},
      {QStringLiteral("size"), QStringLiteral("Window size for --screenshot, WxH (default 1600x1000)."), QStringLiteral("WxH"), QStringLiteral("1600x1000")},
  });
}

bool asks_for_help(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h" || a == "-?" || a == "--help-all") return true;
  }
  return false;
}

// Whether a windowing system can be reached: a display, or a platform named
// explicitly (QT_QPA_PLATFORM=offscreen for --screenshot).
bool has_display() {
  for (const char* v : {"DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"})
    if (const char* x = std::getenv(v); x && *x) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (asks_for_help(argc, argv)) {   // no display needed to print the help
    QCoreApplication core(argc, argv);
    QCoreApplication::setApplicationName(QStringLiteral("megascope-gui"));
    QCommandLineParser p;
    configure(p);
    p.process(core);   // prints the help and exits
    return 0;
  }
  if (!has_display()) {
    std::fprintf(stderr, "megascope-gui: error: no display: neither DISPLAY nor WAYLAND_DISPLAY is set; run it on a "
                         "desktop, or with QT_QPA_PLATFORM=offscreen and --screenshot FILE to render a view to a PNG\n");
    return 1;
  }
  QApplication app(argc, argv);
  QApplication::setApplicationName(QStringLiteral("megascope-gui"));
  QApplication::setOrganizationName(QStringLiteral("megascope"));

  QCommandLineParser p;
  configure(p);
  p.process(app);

  StartOptions so;
  so.example = opt(p, QStringLiteral("example"));
  so.model = opt(p, QStringLiteral("model"));
  so.cluster = opt(p, QStringLiteral("cluster"));
  so.plan = opt(p, QStringLiteral("plan"));
  bool ok = true;
  if (p.isSet(QStringLiteral("gpus"))) so.gpus = p.value(QStringLiteral("gpus")).toInt(&ok);
  if (!ok) return usageError(QStringLiteral("--gpus: expected an integer"));
  if (p.isSet(QStringLiteral("nodes"))) so.nodes = p.value(QStringLiteral("nodes")).toInt(&ok);
  if (!ok) return usageError(QStringLiteral("--nodes: expected an integer"));
  if (p.isSet(QStringLiteral("global-batch"))) so.globalBatch = p.value(QStringLiteral("global-batch")).toLongLong(&ok);
  if (!ok) return usageError(QStringLiteral("--global-batch: expected an integer"));
  if (p.isSet(QStringLiteral("seq-len"))) so.seqLen = p.value(QStringLiteral("seq-len")).toLongLong(&ok);
  if (!ok) return usageError(QStringLiteral("--seq-len: expected an integer"));

  const QString viewName = p.value(QStringLiteral("view"));
  const QStringList views{QStringLiteral("timeline"), QStringLiteral("memory"), QStringLiteral("report"),
                          QStringLiteral("compare"), QStringLiteral("search")};
  const auto viewIndex = views.indexOf(viewName);
  if (viewIndex < 0) return usageError(QStringLiteral("--view: expected one of %1").arg(views.join(QStringLiteral(", "))));
  ScreenshotRequest req;
  req.view = static_cast<MainWindow::View>(viewIndex);
  if (p.isSet(QStringLiteral("measured")) && !p.isSet(QStringLiteral("view"))) req.view = MainWindow::View::compare;
  req.measuredTrace = p.value(QStringLiteral("measured"));
  req.demoMeasured = p.isSet(QStringLiteral("demo-measured"));
  req.searchTopK = p.value(QStringLiteral("search-top")).toInt(&ok);
  if (!ok || req.searchTopK < 1) return usageError(QStringLiteral("--search-top: expected a positive integer"));
  const QStringList wh = p.value(QStringLiteral("size")).split(QLatin1Char('x'));
  if (wh.size() != 2 || wh[0].toInt() < 200 || wh[1].toInt() < 200)
    return usageError(QStringLiteral("--size: expected WxH, e.g. 1600x1000"));
  req.size = QSize(wh[0].toInt(), wh[1].toInt());
  if (p.isSet(QStringLiteral("zoom"))) {
    const QStringList se = p.value(QStringLiteral("zoom")).split(QLatin1Char(':'));
    bool a = false, b = false;
    const double start = se.size() == 2 ? se[0].toDouble(&a) : 0, end = se.size() == 2 ? se[1].toDouble(&b) : 0;
    if (!a || !b || !(end > start) || start < 0)
      return usageError(QStringLiteral("--zoom: expected START:END in seconds with START < END, e.g. 2:2.5"));
    req.zoom = TimeRange{start, end};
  }
  if (p.isSet(QStringLiteral("baseline"))) {
    auto b = resolve_plan(p.value(QStringLiteral("baseline")).toStdString());
    if (!b) return usageError(QString::fromStdString(b.error().str()));
    req.baselinePlan = *b;
  }

  auto inputs = loadInputs(so);
  if (!inputs) {
    std::fprintf(stderr, "megascope-gui: error: %s\n", inputs.error().str().c_str());
    return 1;
  }

  MainWindow window;
  if (p.isSet(QStringLiteral("full"))) window.setFullMode(true);
  if (!p.isSet(QStringLiteral("screenshot"))) {
    window.show();
    window.showView(req.view);
    window.setInputs(*inputs);
    if (!req.measuredTrace.isEmpty()) window.compareView()->loadMeasured(req.measuredTrace);
    return QApplication::exec();
  }

  const QString out = p.value(QStringLiteral("screenshot"));
  ScreenshotDriver driver(&window, req);
  int status = 0;
  QObject::connect(&driver, &ScreenshotDriver::done, &app, [&](const QString& error) {
    if (!error.isEmpty()) {
      std::fprintf(stderr, "megascope-gui: error: %s\n", qPrintable(error));
      status = 1;
    } else if (!driver.image().save(out)) {
      std::fprintf(stderr, "megascope-gui: error: cannot write %s\n", qPrintable(out));
      status = 1;
    } else {
      std::printf("%s\n", qPrintable(out));
    }
    QApplication::exit(status);
  });
  QTimer::singleShot(0, &driver, [&] { driver.start(*inputs); });
  QApplication::exec();
  return status;
}
