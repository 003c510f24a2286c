#include "gui/searchservice.hpp"

#include <QMetaObject>

#include <cstring>

namespace megascope::gui {

namespace {
struct Cancelled {};
}  // namespace

SearchService::SearchService(QObject* parent) : QObject(parent) {
  qRegisterMetaType<SearchResultPtr>();
  m_pool.setMaxThreadCount(1);
  m_pool.setExpiryTimeout(-1);
}

SearchService::~SearchService() {
  m_latest = ~quint64{0};
  m_pool.clear();
  m_pool.waitForDone();
}

void SearchService::cancel() {
  const quint64 gen = m_active.load();
  ++m_latest;
  m_pool.clear();
  m_active = 0;
  if (gen != 0) emit cancelled(gen);
}

quint64 SearchService::start(const planner::SearchInputs& inputs, int topK, int threads) {
  if (m_active.load() != 0) cancel();
  const quint64 gen = ++m_latest;
  m_active = gen;
  m_pool.clear();
  m_pool.start([this, gen, inputs, topK, threads] {
    if (gen != m_latest.load()) return;
    planner::SearchOptions o;
    o.top_k = topK;
    o.threads = threads;
    double lastFraction = -1;
    o.progress = [this, gen, &lastFraction](const planner::Progress& p) {
      const bool stage1 = std::strcmp(p.stage, "stage 1") == 0;
      if (gen != m_latest.load()) {
        if (stage1) throw Cancelled{};   // stage 1 calls back on this thread only, and passes the exception on
        return;
      }
      // Stage 1 is the first half of the bar, stage 2 the second.
      const double f = p.total ? static_cast<double>(p.done) / static_cast<double>(p.total) : 0;
      const double fraction = stage1 ? 0.5 * f : 0.5 + 0.5 * f;
      if (fraction - lastFraction < 0.005) return;
      lastFraction = fraction;
      const QString stage = QString::fromLatin1(p.stage);
      QMetaObject::invokeMethod(this, [this, gen, stage, fraction] {
        if (gen == m_latest.load()) emit progress(gen, stage, fraction);
      }, Qt::QueuedConnection);
    };
    Result<planner::SearchResult> r = fail("", "not run");
    try {
      r = planner::search(inputs, o);
    } catch (const Cancelled&) {
      return;
    }
    if (gen != m_latest.load()) return;
    if (!r) {
      const QString message = QString::fromStdString(r.error().str());
      QMetaObject::invokeMethod(this, [this, gen, message] {
        if (gen != m_latest.load()) return;
        m_active = 0;
        emit failed(gen, message);
      }, Qt::QueuedConnection);
      return;
    }
    auto result = std::make_shared<const planner::SearchResult>(std::move(*r));
    QMetaObject::invokeMethod(this, [this, gen, result] {
      if (gen != m_latest.load()) return;
      m_active = 0;
      emit finished(gen, result);
    }, Qt::QueuedConnection);
  });
  return gen;
}

}  // namespace megascope::gui
