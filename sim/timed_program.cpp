#include "sim/timed_program.hpp"

#include <algorithm>
#include <map>

#include "core/accounting/activations.hpp"

namespace megascope::sim {

namespace {

bool auto_schedule(Schedule s) { return s == Schedule::zb_1p || s == Schedule::zb_2p; }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

int pass_of(Phase ph) {
  switch (ph) {
    case Phase::forward: return 0;
    case Phase::recompute:
    case Phase::backward_input: return 1;
    case Phase::backward_weight: return 2;
    default: return -1;
  }
}

}  // namespace

AutoScheduleInputs measured_stage_times(const Setup& s, const Program& p, const SimResult& r) {
  const int pp = p.grid.pp;
  const int m = p.microbatches;
  AutoScheduleInputs in;
  in.times.f.assign(static_cast<std::size_t>(pp), 0.0);
  in.times.b = in.times.w = in.times.f;
  in.w_memory.assign(static_cast<std::size_t>(pp), 1.0);
  // The first traced rank of each stage.
  std::vector<int> rank_of_stage(static_cast<std::size_t>(pp), -1);
  for (const int rank : r.traced_ranks) {
    int& slot = rank_of_stage[static_cast<std::size_t>(p.grid.coord(rank).pp)];
    if (slot < 0) slot = rank;
  }
  // Spans by (rank, op).
  std::map<int, std::vector<const Span*>> by_rank;
  for (const int rank : rank_of_stage)
    if (rank >= 0) by_rank[rank].assign(p.of_rank(rank).ops.size(), nullptr);
  for (const Span& sp : r.spans) {
    auto it = by_rank.find(sp.rank);
    if (it != by_rank.end() && sp.op < it->second.size()) it->second[sp.op] = &sp;
  }
  std::vector<double> transfers;
  for (int st = 0; st < pp; ++st) {
    const int rank = rank_of_stage[static_cast<std::size_t>(st)];
    if (rank < 0) continue;
    const StageProgram& prog = p.stages[static_cast<std::size_t>(st)];
    const std::vector<const Span*>& spans = by_rank[rank];
    // [pass][micro-batch] -> (first start, last end)
    std::vector<std::vector<std::pair<double, double>>> extent(
        3, std::vector<std::pair<double, double>>(static_cast<std::size_t>(m), {1e300, -1e300}));
    for (std::size_t i = 0; i < prog.ops.size(); ++i) {
      const Op& op = prog.ops[i];
      const Span* sp = spans[i];
      if (!sp || op.kind == OpKind::send || op.kind == OpKind::recv || !op.microbatch) continue;
      const int pass = pass_of(op.phase);
      const int mb = *op.microbatch;
      if (pass < 0 || mb < 0 || mb >= m) continue;
      auto& e = extent[static_cast<std::size_t>(pass)][static_cast<std::size_t>(mb)];
      e.first = std::min(e.first, sp->start);
      e.second = std::max(e.second, sp->end);
    }
    std::vector<double>* out[3] = {&in.times.f, &in.times.b, &in.times.w};
    for (int pass = 0; pass < 3; ++pass) {
      std::vector<double> d;
      for (const auto& [a, b] : extent[static_cast<std::size_t>(pass)])
        if (b >= a) d.push_back(b - a);
      (*out[pass])[static_cast<std::size_t>(st)] = median(std::move(d));
    }
    // Transfers into this stage: a receive and the send with its tag on the peer.
    if (st > 0 && rank_of_stage[static_cast<std::size_t>(st - 1)] >= 0) {
      const StageProgram& prev = p.stages[static_cast<std::size_t>(st - 1)];
      const std::vector<const Span*>& prev_spans = by_rank[rank_of_stage[static_cast<std::size_t>(st - 1)]];
      std::map<std::uint64_t, std::size_t> send_of_tag;
      for (std::size_t i = 0; i < prev.ops.size(); ++i)
        if (prev.ops[i].kind == OpKind::send && prev.ops[i].peer_stage == st) send_of_tag[prev.ops[i].tag] = i;
      for (std::size_t i = 0; i < prog.ops.size(); ++i) {
        const Op& op = prog.ops[i];
        if (op.kind != OpKind::recv || op.peer_stage != st - 1 || !spans[i]) continue;
        auto it = send_of_tag.find(op.tag);
        if (it == send_of_tag.end() || !prev_spans[it->second]) continue;
        transfers.push_back(spans[i]->end - std::max(spans[i]->start, prev_spans[it->second]->start));
      }
    }
    // M_W / M_B of the stage's layers.
    double stored = 0, weight_grad = 0;
    for (const ChunkLayers& ch : s.chunks[static_cast<std::size_t>(st)])
      for (int l = ch.first; l < ch.first + ch.count; ++l) {
        const LayerActivations la = layer_activations(s, l);
        stored += la.stored;
        weight_grad += la.weight_grad_state;
      }
    if (stored > 0) in.w_memory[static_cast<std::size_t>(st)] = std::clamp(weight_grad / stored, 0.0, 1.0);
  }
  in.times.comm = median(std::move(transfers));
  in.objective_span = s.plan.post_validation;
  in.memory_limit = auto_memory_limit(s.plan.schedule, pp);
  return in;
}

Result<TimedProgram> build_timed_program(const Setup& s, const CostModel& cost, const Topology& topo) {
  auto seed = build_program(s);
  if (!seed) return tl::unexpected(seed.error());
  if (!auto_schedule(s.plan.schedule) || s.plan.pp < 2) return TimedProgram{std::move(*seed), {}, {}};
  SimOptions so;
  so.mode = Mode::reduced;
  auto run = simulate(*seed, topo, cost, so);
  if (!run) return tl::unexpected(run.error());
  TimedProgram out;
  out.inputs = measured_stage_times(s, *seed, *run);
  AutoSchedule placed = auto_zero_bubble(s.plan.pp, s.num_microbatches, out.inputs);
  BuildOptions bo;
  bo.order = &placed.order;
  auto program = build_program(s, bo);
  if (!program) return tl::unexpected(program.error());
  out.program = std::move(*program);
  out.chosen = std::move(placed.chosen);
  return out;
}

}  // namespace megascope::sim
