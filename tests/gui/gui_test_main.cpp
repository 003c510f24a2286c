// Runs the registered QtTest classes: `gui_tests [GROUP] [QtTest options]`.
// GROUP selects the classes of one test file (its stem without _test).
#include <QApplication>
#include <QtTest>

#include <cstring>

#include "gui_support.hpp"

int main(int argc, char** argv) {
  if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
  QApplication app(argc, argv);
  const char* group = nullptr;
  std::vector<char*> args{argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (!group && argv[i][0] != '-') group = argv[i];
    else args.push_back(argv[i]);
  }
  int failures = 0, ran = 0;
  for (const auto& t : megascope::gui::test::registry()) {
    if (group && std::strcmp(group, t.group) != 0) continue;
    QObject* o = t.make();
    failures += QTest::qExec(o, static_cast<int>(args.size()), args.data());
    delete o;
    ++ran;
  }
  if (ran == 0) {
    std::fprintf(stderr, "gui_tests: no test group '%s'\n", group ? group : "");
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
