#include "gui/spankind.hpp"

namespace megascope::gui {

SpanKind spanKindOf(OpKind kind, Phase phase, OpLabel label) {
  if (kind != OpKind::compute) {
    switch (label) {
      case OpLabel::tp_comm: return SpanKind::tpComm;
      case OpLabel::cp_comm: return SpanKind::cpComm;
      case OpLabel::ep_comm: return SpanKind::epComm;
      case OpLabel::dp_grad:
      case OpLabel::dp_param:
      case OpLabel::embedding_grad: return SpanKind::dpComm;
      case OpLabel::pp_activation:
      case OpLabel::pp_gradient: return SpanKind::ppComm;
      default: return SpanKind::other;
    }
  }
  switch (phase) {
    case Phase::forward: return SpanKind::forward;
    case Phase::backward_input: return SpanKind::backwardInput;
    case Phase::backward_weight: return SpanKind::backwardWeight;
    case Phase::recompute: return SpanKind::recompute;
    case Phase::optimizer: return SpanKind::optimizer;
    default: return SpanKind::other;
  }
}

QColor spanKindColor(SpanKind k) {
  switch (k) {
    case SpanKind::forward: return QColor(0x3b, 0x82, 0xd6);         // blue
    case SpanKind::backwardInput: return QColor(0xf2, 0x8e, 0x2b);   // orange
    case SpanKind::backwardWeight: return QColor(0xe0, 0xc0, 0x30);  // ochre
    case SpanKind::recompute: return QColor(0x9b, 0x6f, 0xd6);       // purple
    case SpanKind::optimizer: return QColor(0x6e, 0x6e, 0x6e);       // grey
    case SpanKind::tpComm: return QColor(0x2c, 0xa0, 0x2c);          // green
    case SpanKind::cpComm: return QColor(0x17, 0xbe, 0xcf);          // cyan
    case SpanKind::epComm: return QColor(0x8c, 0x9d, 0x1a);          // olive
    case SpanKind::dpComm: return QColor(0xd6, 0x27, 0x28);          // red
    case SpanKind::ppComm: return QColor(0xe3, 0x77, 0xc2);          // pink
    case SpanKind::other: return QColor(0x8c, 0x56, 0x4b);           // brown
  }
  return Qt::black;
}

QString spanKindName(SpanKind k) {
  switch (k) {
    case SpanKind::forward: return QStringLiteral("forward");
    case SpanKind::backwardInput: return QStringLiteral("input gradient");
    case SpanKind::backwardWeight: return QStringLiteral("weight gradient");
    case SpanKind::recompute: return QStringLiteral("recompute");
    case SpanKind::optimizer: return QStringLiteral("optimizer");
    case SpanKind::tpComm: return QStringLiteral("TP comm");
    case SpanKind::cpComm: return QStringLiteral("CP comm");
    case SpanKind::epComm: return QStringLiteral("EP comm");
    case SpanKind::dpComm: return QStringLiteral("DP comm");
    case SpanKind::ppComm: return QStringLiteral("PP comm");
    case SpanKind::other: return QStringLiteral("other");
  }
  return {};
}

bool isCommunication(SpanKind k) {
  return k == SpanKind::tpComm || k == SpanKind::cpComm || k == SpanKind::epComm || k == SpanKind::dpComm ||
         k == SpanKind::ppComm;
}

const char* phaseName(Phase p) {
  switch (p) {
    case Phase::forward: return "forward";
    case Phase::backward_input: return "backward_input";
    case Phase::backward_weight: return "backward_weight";
    case Phase::recompute: return "recompute";
    default: return to_string(p);
  }
}

std::string opName(OpKind kind, Phase phase, OpLabel label) {
  if (kind != OpKind::compute) return std::string(to_string(label)) + " " + to_string(kind);
  const std::string p = phaseName(phase), l = to_string(label);
  return p == l ? p : p + " " + l;
}

std::optional<Phase> parsePhase(std::string_view s) {
  for (int i = 0; i <= static_cast<int>(Phase::param_sync); ++i)
    if (s == to_string(static_cast<Phase>(i))) return static_cast<Phase>(i);
  return std::nullopt;
}

std::optional<OpLabel> parseOpLabel(std::string_view s) {
  for (int i = 0; i < kOpLabelCount; ++i)
    if (s == to_string(static_cast<OpLabel>(i))) return static_cast<OpLabel>(i);
  return std::nullopt;
}

}  // namespace megascope::gui
