#include "gui/memorytimeline.hpp"

#include <algorithm>
#include <limits>
#include <unordered_map>

#include "core/accounting/activations.hpp"
#include "core/accounting/memory.hpp"

namespace megascope::gui {

namespace {

struct Interval {
  double forwardStart = std::numeric_limits<double>::infinity();
  double recomputeStart = std::numeric_limits<double>::infinity();
  double backwardEnd = -std::numeric_limits<double>::infinity();
};

}  // namespace

MemoryTimeline memoryOverTime(const Setup& setup, const Program& program, const std::vector<Span>& spans, int rank) {
  MemoryTimeline m;
  m.rank = rank;
  m.stage = program.grid.coord(rank).pp;
  const MemoryReport report = memory_report(setup);
  m.capacityBytes = report.capacity_bytes;
  if (m.stage < static_cast<int>(report.stages.size())) {
    const StageMemory& st = report.stages[static_cast<std::size_t>(m.stage)];
    m.staticBytes = st.weights_bytes + st.grads_bytes + st.optimizer_bytes + st.other_bytes;
  }
  const StageProgram& stage = program.of_rank(rank);
  const int layers = setup.model.num_layers;
  const int embeddingKey = layers, outputKey = layers + 1;
  // (micro-batch, layer or edge) -> when its activations are alive.
  std::unordered_map<long long, Interval> alive;
  auto key = [&](int mb, int slot) { return static_cast<long long>(mb) * (layers + 2) + slot; };
  for (const Span& sp : spans) {
    if (sp.rank != rank) continue;
    const Op& op = stage.ops.at(sp.op);
    if (!op.microbatch) continue;
    int slot = -1;
    if (op.layer) slot = *op.layer;
    else if (op.label == OpLabel::embedding && op.kind == OpKind::compute) slot = embeddingKey;
    else if (op.label == OpLabel::output_loss && op.kind == OpKind::compute) slot = outputKey;
    if (slot < 0 || slot >= layers + 2) continue;
    Interval& iv = alive[key(*op.microbatch, slot)];
    switch (op.phase) {
      case Phase::forward: iv.forwardStart = std::min(iv.forwardStart, sp.start); break;
      case Phase::recompute: iv.recomputeStart = std::min(iv.recomputeStart, sp.start); break;
      case Phase::backward_input:
      case Phase::backward_weight: iv.backwardEnd = std::max(iv.backwardEnd, sp.end); break;
      default: break;
    }
  }
  std::vector<LayerActivations> perLayer(static_cast<std::size_t>(layers));
  std::vector<char> computed(static_cast<std::size_t>(layers), 0);
  const EdgeActivations edges = edge_activations(setup);

  std::vector<MemoryPoint> events;   // +bytes / -bytes deltas
  for (const auto& [k, iv] : alive) {
    const int slot = static_cast<int>(k % (layers + 2));
    if (!(iv.forwardStart < iv.backwardEnd)) continue;   // forward or backward not traced
    double stored = 0, checkpoint = 0;
    if (slot == embeddingKey) stored = checkpoint = edges.embedding_bytes();
    else if (slot == outputKey) stored = checkpoint = edges.output_bytes();
    else {
      auto& la = perLayer[static_cast<std::size_t>(slot)];
      if (!computed[static_cast<std::size_t>(slot)]) {
        la = layer_activations(setup, slot);
        computed[static_cast<std::size_t>(slot)] = 1;
      }
      stored = la.stored;
      checkpoint = la.checkpoint;
    }
    if (iv.recomputeStart < iv.backwardEnd) {
      events.push_back({iv.forwardStart, checkpoint});
      events.push_back({iv.recomputeStart, stored});
      events.push_back({iv.backwardEnd, -(stored + checkpoint)});
    } else {
      events.push_back({iv.forwardStart, stored});
      events.push_back({iv.backwardEnd, -stored});
    }
  }
  std::sort(events.begin(), events.end(), [](const MemoryPoint& a, const MemoryPoint& b) {
    return a.time < b.time || (a.time == b.time && a.bytes < b.bytes);   // frees first at equal times
  });
  double level = 0;
  m.activations.push_back({0, 0});
  for (const MemoryPoint& e : events) {
    level += e.bytes;
    if (level < 0 && level > -1) level = 0;   // rounding
    if (!m.activations.empty() && m.activations.back().time == e.time) m.activations.back().bytes = level;
    else m.activations.push_back({e.time, level});
    if (level > m.peakActivationBytes) {
      m.peakActivationBytes = level;
      m.peakTime = e.time;
    }
  }
  return m;
}

}  // namespace megascope::gui
