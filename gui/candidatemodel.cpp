#include "gui/candidatemodel.hpp"

#include "config/plan_settings.hpp"

namespace megascope::gui {

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
}

CandidateModel::CandidateModel(QObject* parent) : QAbstractTableModel(parent) {}

void CandidateModel::setPlans(std::vector<planner::SimulatedPlan> plans) {
  beginResetModel();
  m_plans = std::move(plans);
  endResetModel();
}

int CandidateModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(m_plans.size());
}

int CandidateModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : ColumnCount; }

QVariant CandidateModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= static_cast<int>(m_plans.size())) return {};
  const planner::SimulatedPlan& p = m_plans[static_cast<std::size_t>(index.row())];
  const sim::SimReport& r = p.report;
  const double exposed = r.step_time_s > 0 ? p.exposed_comm_s() / r.step_time_s : 0;
  if (role == Qt::UserRole) {
    switch (index.column()) {
      case Rank: return index.row() + 1;
      case Plan: return QString::fromStdString(format_inline_plan(p.plan));
      case TokensPerS: return r.tokens_per_s;
      case Mfu: return r.mfu;
      case StepTime: return r.step_time_s;
      case PeakMemory: return p.memory.peak_bytes;
      case Bubble: return r.bubble_fraction;
      case ExposedComm: return exposed;
      case Stage1Rank: return static_cast<qulonglong>(p.stage1_rank);
    }
  }
  if (role == Qt::DisplayRole) {
    switch (index.column()) {
      case Rank: return index.row() + 1;
      case Plan: return QString::fromStdString(format_inline_plan(p.plan));
      case TokensPerS: return QString::number(r.tokens_per_s, 'f', 0);
      case Mfu: return QString::number(100 * r.mfu, 'f', 1);
      case StepTime: return QString::number(r.step_time_s, 'f', 3);
      case PeakMemory: return QString::number(p.memory.peak_bytes / kGiB, 'f', 1);
      case Bubble: return QString::number(100 * r.bubble_fraction, 'f', 1);
      case ExposedComm: return QString::number(100 * exposed, 'f', 1);
      case Stage1Rank: return static_cast<qulonglong>(p.stage1_rank);
    }
  }
  if (role == Qt::TextAlignmentRole && index.column() != Plan)
    return QVariant::fromValue(Qt::Alignment(Qt::AlignRight | Qt::AlignVCenter));
  if (role == Qt::ToolTipRole) {
    QString t;
    for (const std::string& line : planner::bounding_factors(p)) t += QString::fromStdString(line) + QLatin1Char('\n');
    return t.trimmed();
  }
  return {};
}

QVariant CandidateModel::headerData(int section, Qt::Orientation o, int role) const {
  if (o != Qt::Horizontal || role != Qt::DisplayRole) return QAbstractTableModel::headerData(section, o, role);
  switch (section) {
    case Rank: return tr("#");
    case Plan: return tr("plan");
    case TokensPerS: return tr("tokens/s");
    case Mfu: return tr("MFU %");
    case StepTime: return tr("step s");
    case PeakMemory: return tr("peak GiB");
    case Bubble: return tr("bubble %");
    case ExposedComm: return tr("exposed comm %");
    case Stage1Rank: return tr("stage-1 rank");
  }
  return {};
}

}  // namespace megascope::gui
