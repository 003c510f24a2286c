// SearchService: runs the planner (planner::search) off the GUI thread with
// progress and cancel.
//
// Each start() gets a generation; cancel() or a newer start() supersedes the
// running search at once for the GUI (its progress and result are dropped).
// The planner itself stops at the next progress report during stage 1 (the
// closed-form pass over every plan); stage 2 (the simulations of the best K)
// runs on planner-owned threads that cannot be interrupted, so a search
// cancelled there finishes in the background and its result is discarded.
#pragma once

#include <QObject>
#include <QThreadPool>

#include <atomic>
#include <memory>

#include "planner/planner.hpp"

namespace megascope::gui {

using SearchResultPtr = std::shared_ptr<const planner::SearchResult>;

class SearchService : public QObject {
  Q_OBJECT
 public:
  explicit SearchService(QObject* parent = nullptr);
  ~SearchService() override;

  quint64 start(const planner::SearchInputs& inputs, int topK, int threads = 0);
  void cancel();
  [[nodiscard]] bool running() const { return m_active.load() == m_latest.load() && m_active.load() != 0; }
  void waitForIdle() { m_pool.waitForDone(); }

 signals:
  void progress(quint64 generation, const QString& stage, double fraction);
  void finished(quint64 generation, megascope::gui::SearchResultPtr result);
  void failed(quint64 generation, const QString& message);
  void cancelled(quint64 generation);

 private:
  QThreadPool m_pool;
  std::atomic<quint64> m_latest{0};
  std::atomic<quint64> m_active{0};   // generation of the search that may still report
};

}  // namespace megascope::gui

Q_DECLARE_METATYPE(megascope::gui::SearchResultPtr)
