// SpanKind: what a timeline span is, for its colour, its legend entry and the
// per-kind error of a measured trace. One kind per compute phase (forward,
// input gradient, weight gradient, recompute, optimizer) and one per kind of
// communication (TP, CP, EP, DP, PP), derived from an op's phase and label.
// Plain data: no widgets.
#pragma once

#include <QColor>
#include <QString>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/program/program.hpp"

namespace megascope::gui {

enum class SpanKind : std::uint8_t {
  forward, backwardInput, backwardWeight, recompute, optimizer,
  tpComm, cpComm, epComm, dpComm, ppComm, other
};
inline constexpr int kSpanKindCount = 11;

inline constexpr std::array<SpanKind, kSpanKindCount> allSpanKinds() {
  return {SpanKind::forward, SpanKind::backwardInput, SpanKind::backwardWeight, SpanKind::recompute,
          SpanKind::optimizer, SpanKind::tpComm, SpanKind::cpComm, SpanKind::epComm,
          SpanKind::dpComm, SpanKind::ppComm, SpanKind::other};
}

// Communication ops by label (tp_comm -> TP, dp_grad/dp_param/embedding_grad
// -> DP, pp_* -> PP, ...), compute ops by phase.
SpanKind spanKindOf(OpKind kind, Phase phase, OpLabel label);
inline SpanKind spanKindOf(const Op& op) { return spanKindOf(op.kind, op.phase, op.label); }

QColor spanKindColor(SpanKind k);
QString spanKindName(SpanKind k);   // "forward", "input gradient", "TP comm", ...
bool isCommunication(SpanKind k);

// "forward", "backward_input", "backward_weight", "recompute", "optimizer",
// ... (core's to_string abbreviates the first four to F, B, W, R).
const char* phaseName(Phase p);
// An op's name as `megascope compare` groups ops: "forward mlp" (compute:
// phase and label), "tp all-gather" (communication: label and op kind),
// "optimizer".
std::string opName(OpKind kind, Phase phase, OpLabel label);

// Inverse of core's to_string for the spellings a trace file carries.
std::optional<Phase> parsePhase(std::string_view s);
std::optional<OpLabel> parseOpLabel(std::string_view s);

}  // namespace megascope::gui
