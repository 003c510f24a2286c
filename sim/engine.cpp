#include "sim/engine.hpp"

#include <fmt/format.h>

#include <array>
#include <limits>
#include <map>
#include <tuple>
#include <queue>
#include <unordered_map>

namespace megascope::sim {

std::vector<double> compute_durations(const StageProgram& stage, const CostModel& cost) {
  std::vector<double> out(stage.ops.size(), 0.0);
  for (std::size_t i = 0; i < stage.ops.size(); ++i) {
    const Op& op = stage.ops[i];
    if (op.kind != OpKind::compute) continue;
    double t = 0;
    for (std::uint32_t k = op.kernel_begin; k < op.kernel_begin + op.kernel_count; ++k) {
      const Kernel& kr = stage.kernels[k];
      switch (kr.kind) {
        case KernelKind::gemm: t += cost.gemm_s(kr.gemm, kr.precision); break;
        case KernelKind::attention_fwd: t += cost.attention_fwd_s(kr.attention); break;
        case KernelKind::attention_bwd: t += cost.attention_bwd_s(kr.attention); break;
        case KernelKind::memory: t += cost.memory_s(kr.memory, kr.bytes); break;
      }
    }
    out[i] = t;
  }
  return out;
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

bool is_async(Stream s) { return s == Stream::pp_send || s == Stream::pp_recv; }

Collective collective_of(OpKind k) {
  switch (k) {
    case OpKind::all_reduce: return Collective::all_reduce;
    case OpKind::reduce_scatter: return Collective::reduce_scatter;
    case OpKind::all_gather: return Collective::all_gather;
    case OpKind::all_to_all: return Collective::all_to_all;
    default: return Collective::send_recv;
  }
}

struct StageInfo {
  const StageProgram* prog = nullptr;
  std::vector<double> duration;
  std::array<std::vector<std::uint32_t>, kStreamCount> stream_ops;
  std::vector<std::uint32_t> position;   // op -> index in its ordered stream
  std::vector<std::uint32_t> ordinal;    // collective -> index among ops of its (stream, group)
  std::vector<std::uint32_t> dependents_begin;
  std::vector<std::uint32_t> dependents;
};

StageInfo analyse(const StageProgram& s, const CostModel& cost) {
  StageInfo info;
  info.prog = &s;
  info.duration = compute_durations(s, cost);
  const std::size_t n = s.ops.size();
  info.position.assign(n, 0);
  info.ordinal.assign(n, 0);
  std::map<std::pair<int, int>, std::uint32_t> counters;
  std::vector<std::uint32_t> count(n + 1, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const Op& op = s.ops[i];
    auto& list = info.stream_ops[static_cast<std::size_t>(op.stream)];
    info.position[i] = static_cast<std::uint32_t>(list.size());
    list.push_back(static_cast<std::uint32_t>(i));
    if (op.kind != OpKind::compute && op.kind != OpKind::send && op.kind != OpKind::recv)
      info.ordinal[i] = counters[{static_cast<int>(op.stream), static_cast<int>(op.group)}]++;
    for (std::uint32_t d = op.dep_begin; d < op.dep_begin + op.dep_count; ++d) count[s.deps[d]] += 1;
  }
  info.dependents_begin.assign(n + 1, 0);
  for (std::size_t i = 0; i < n; ++i) info.dependents_begin[i + 1] = info.dependents_begin[i] + count[i];
  info.dependents.assign(info.dependents_begin[n], 0);
  std::vector<std::uint32_t> fill(info.dependents_begin.begin(), info.dependents_begin.end() - 1);
  for (std::size_t i = 0; i < n; ++i) {
    const Op& op = s.ops[i];
    for (std::uint32_t d = op.dep_begin; d < op.dep_begin + op.dep_count; ++d)
      info.dependents[fill[s.deps[d]]++] = static_cast<std::uint32_t>(i);
  }
  return info;
}

struct RankState {
  int rank = 0;
  int stage = 0;
  std::array<std::uint32_t, kStreamCount> head{};
  std::vector<std::uint64_t> started, finished;   // bitsets over the stage's ops
  std::size_t remaining = 0;
  std::vector<double> start_time;                 // traced ranks only
  std::array<std::int64_t, kCommGroupCount> group_id{};         // per CommGroup, computed once
};

bool test(const std::vector<std::uint64_t>& bits, std::uint32_t i) { return (bits[i >> 6] >> (i & 63)) & 1U; }
void set(std::vector<std::uint64_t>& bits, std::uint32_t i) { bits[i >> 6] |= (std::uint64_t{1} << (i & 63)); }

struct Member {
  std::uint32_t state;
  std::uint32_t op;
};

struct CollKey {
  std::int64_t group;
  std::uint32_t ordinal;
  std::uint8_t stream;
  bool operator==(const CollKey&) const = default;
};
struct CollKeyHash {
  std::size_t operator()(const CollKey& k) const {
    return std::hash<std::int64_t>()(k.group) ^ (std::hash<std::uint32_t>()(k.ordinal) * 0x9e3779b97f4a7c15ULL) ^
           (static_cast<std::size_t>(k.stream) << 59);
  }
};
struct P2PKey {
  int from, to;
  std::uint64_t tag;
  bool operator==(const P2PKey&) const = default;
};
struct P2PKeyHash {
  std::size_t operator()(const P2PKey& k) const {
    return std::hash<std::uint64_t>()(k.tag) ^ (static_cast<std::size_t>(k.from) * 0x9e3779b97f4a7c15ULL) ^
           (static_cast<std::size_t>(k.to) << 32);
  }
};

struct Event {
  double t;
  std::uint64_t seq;
  std::uint32_t state;
  std::uint32_t op;
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

class Engine {
 public:
  Engine(const Program& p, const Topology& topo, const CostModel& cost, const SimOptions& opt)
      : p_(p), topo_(topo), opt_(opt), net_(topo) {
    for (const StageProgram& s : p.stages) stages_.push_back(analyse(s, cost));
  }

  Result<SimResult> run() {
    SimResult out;
    const RankGrid& g = p_.grid;
    if (topo_.devices() < g.world())
      return fail("simulate", fmt::format("the topology has {} devices, the program needs {}", topo_.devices(), g.world()));
    // Simulated ranks.
    if (opt_.mode == Mode::full) {
      for (int r = 0; r < g.world(); ++r) out.simulated_ranks.push_back(r);
    } else {
      for (int s = 0; s < g.pp; ++s) out.simulated_ranks.push_back(g.rank_of(0, 0, 0, s));
    }
    std::vector<int> traced = opt_.trace_ranks;
    if (traced.empty()) {
      if (out.simulated_ranks.size() <= 64) traced = out.simulated_ranks;
      else
        for (int s = 0; s < g.pp; ++s) traced.push_back(g.rank_of(0, 0, 0, s));
    }
    state_of_rank_.assign(static_cast<std::size_t>(g.world()), -1);
    for (int r : out.simulated_ranks) {
      RankState st;
      st.rank = r;
      st.stage = g.coord(r).pp;
      const std::size_t n = stages_[static_cast<std::size_t>(st.stage)].prog->ops.size();
      st.started.assign((n + 63) / 64, 0);
      st.finished.assign((n + 63) / 64, 0);
      st.remaining = n;
      for (int k = 0; k < kCommGroupCount; ++k) st.group_id[static_cast<std::size_t>(k)] = g.group_id(r, static_cast<CommGroup>(k));
      state_of_rank_[static_cast<std::size_t>(r)] = static_cast<int>(states_.size());
      states_.push_back(std::move(st));
    }
    for (int r : traced) {
      if (r < 0 || r >= g.world() || state_of_rank_[static_cast<std::size_t>(r)] < 0)
        return fail("simulate", fmt::format("rank {} to trace is not simulated in this mode", r));
      RankState& st = states_[static_cast<std::size_t>(state_of_rank_[static_cast<std::size_t>(r)])];
      st.start_time.assign(stages_[static_cast<std::size_t>(st.stage)].prog->ops.size(), 0.0);
      out.traced_ranks.push_back(r);
    }
    record_ = opt_.record_trace;

    // Start: every stream head and every op with no predecessor constraint.
    for (std::uint32_t s = 0; s < states_.size(); ++s) {
      const StageInfo& info = stages_[static_cast<std::size_t>(states_[s].stage)];
      for (int k = 0; k < kStreamCount; ++k) {
        const auto& list = info.stream_ops[static_cast<std::size_t>(k)];
        if (is_async(static_cast<Stream>(k))) {
          for (std::uint32_t op : list) try_start(s, op, 0.0);
        } else if (!list.empty()) {
          try_start(s, list.front(), 0.0);
        }
      }
    }
    double now = 0;
    while (true) {
      const double t_heap = heap_.empty() ? kInf : heap_.top().t;
      const std::optional<double> tn = net_.next_event_time();
      const double t_net = tn ? *tn : kInf;
      if (t_heap == kInf && t_net == kInf) break;
      if (t_heap <= t_net) {
        const Event e = heap_.top();
        heap_.pop();
        now = e.t;
        finish(e.state, e.op, now);
      } else {
        now = t_net;
        for (FlowId f : net_.advance_to(t_net)) {
          auto it = flows_.find(f);
          MEGASCOPE_CHECK(it != flows_.end(), "a finished flow has no waiting ops");
          const std::vector<Member> members = std::move(it->second);
          flows_.erase(it);
          for (const Member& m : members) finish(m.state, m.op, now);
        }
      }
      ++events_;
    }
    for (const RankState& st : states_) {
      if (st.remaining == 0) continue;
      const StageInfo& info = stages_[static_cast<std::size_t>(st.stage)];
      for (std::uint32_t i = 0; i < info.prog->ops.size(); ++i) {
        if (test(st.finished, i)) continue;
        const Op& op = info.prog->ops[i];
        return fail("simulate", fmt::format("deadlock: rank {} (stage {}) cannot finish op {} ({} {} on stream {}, "
                                            "micro-batch {}); {} of its ops never ran",
                                            st.rank, st.stage, i, to_string(op.kind), to_string(op.label),
                                            to_string(op.stream), op.microbatch ? std::to_string(*op.microbatch) : "none",
                                            st.remaining));
      }
    }
    out.step_time_s = end_;
    out.spans = std::move(spans_);
    out.events = events_;
    for (const StageInfo& info : stages_) {
      double t = 0;
      for (double d : info.duration) t += d;
      out.compute_time_s.push_back(t);
    }
    return out;
  }

 private:
  bool deps_done(const RankState& st, const StageProgram& sp, const Op& op) const {
    for (std::uint32_t d = op.dep_begin; d < op.dep_begin + op.dep_count; ++d)
      if (!test(st.finished, sp.deps[d])) return false;
    return true;
  }

  int expected_members(const RankState& st, CommGroup g) const {
    if (opt_.mode == Mode::full) return static_cast<int>(p_.grid.group(st.rank, g).size());
    // Reduced: the other members of an intra-stage group are symmetric copies.
    return g == CommGroup::embedding ? (p_.grid.pp > 1 ? 2 : 1) : 1;
  }

  void try_start(std::uint32_t s, std::uint32_t i, double now) {
    RankState& st = states_[s];
    if (test(st.started, i)) return;
    const StageInfo& info = stages_[static_cast<std::size_t>(st.stage)];
    const StageProgram& sp = *info.prog;
    const Op& op = sp.ops[i];
    if (!is_async(op.stream) && info.position[i] != st.head[static_cast<std::size_t>(op.stream)]) return;
    if (!deps_done(st, sp, op)) return;
    set(st.started, i);
    if (!st.start_time.empty()) st.start_time[i] = now;
    switch (op.kind) {
      case OpKind::compute:
        heap_.push({now + info.duration[i], seq_++, s, i});
        return;
      case OpKind::send:
      case OpKind::recv: {
        const int peer = p_.grid.on_stage(st.rank, op.peer_stage);
        const P2PKey key = op.kind == OpKind::send ? P2PKey{st.rank, peer, op.tag} : P2PKey{peer, st.rank, op.tag};
        auto& slot = p2p_[key];
        slot.push_back({s, i});
        if (slot.size() == 2) {
          const FlowSpec& f = p2p_spec(key.from, key.to, op.bytes);
          mark_transfer_start(slot, now);
          const FlowId id = net_.start(f, now);
          flows_[id] = std::move(slot);
          p2p_.erase(key);
        }
        return;
      }
      default: {
        const std::int64_t gid = st.group_id[static_cast<std::size_t>(op.group)];
        const CollKey key{gid, info.ordinal[i], static_cast<std::uint8_t>(op.stream)};
        auto& slot = coll_[key];
        slot.push_back({s, i});
        if (static_cast<int>(slot.size()) == expected_members(st, op.group)) {
          const FlowSpec& f = collective_spec(st.rank, gid, op);
          mark_transfer_start(slot, now);
          const FlowId id = net_.start(f, now);
          flows_[id] = std::move(slot);
          coll_.erase(key);
        }
        return;
      }
    }
  }

  // A transfer's span starts when the data moves, not when a member posted it:
  // waiting for the peer is idle time (a bubble), not communication.
  void mark_transfer_start(const std::vector<Member>& members, double now) {
    for (const Member& m : members) {
      RankState& st = states_[m.state];
      if (!st.start_time.empty()) st.start_time[m.op] = now;
    }
  }

  // Routes repeat (the same neighbours exchange the same sizes every micro-batch).
  const FlowSpec& p2p_spec(int from, int to, double bytes) {
    const auto key = std::make_tuple(from, to, bytes);
    auto it = p2p_cache_.find(key);
    if (it != p2p_cache_.end()) return it->second;
    const std::vector<int> devices = {from, to};
    return p2p_cache_.emplace(key, collective_flow(topo_, Collective::send_recv, devices, bytes)).first->second;
  }

  const FlowSpec& collective_spec(int rank, std::int64_t gid, const Op& op) {
    const auto key = std::make_tuple(gid, static_cast<int>(op.kind), op.bytes);
    auto it = spec_cache_.find(key);
    if (it != spec_cache_.end()) return it->second;
    const std::vector<int> members = p_.grid.group(rank, op.group);
    return spec_cache_.emplace(key, collective_flow(topo_, collective_of(op.kind), members, op.bytes)).first->second;
  }

  void finish(std::uint32_t s, std::uint32_t i, double now) {
    RankState& st = states_[s];
    const StageInfo& info = stages_[static_cast<std::size_t>(st.stage)];
    const Op& op = info.prog->ops[i];
    set(st.finished, i);
    st.remaining -= 1;
    end_ = std::max(end_, now);
    if (record_ && !st.start_time.empty()) spans_.push_back({st.rank, i, st.start_time[i], now});
    if (!is_async(op.stream)) {
      auto& head = st.head[static_cast<std::size_t>(op.stream)];
      head += 1;
      const auto& list = info.stream_ops[static_cast<std::size_t>(op.stream)];
      if (head < list.size()) try_start(s, list[head], now);
    }
    for (std::uint32_t d = info.dependents_begin[i]; d < info.dependents_begin[i + 1]; ++d)
      try_start(s, info.dependents[d], now);
  }

  const Program& p_;
  const Topology& topo_;
  SimOptions opt_;
  Network net_;
  std::vector<StageInfo> stages_;
  std::vector<RankState> states_;
  std::vector<int> state_of_rank_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> heap_;
  std::unordered_map<FlowId, std::vector<Member>> flows_;
  std::unordered_map<CollKey, std::vector<Member>, CollKeyHash> coll_;
  std::unordered_map<P2PKey, std::vector<Member>, P2PKeyHash> p2p_;
  std::map<std::tuple<std::int64_t, int, double>, FlowSpec> spec_cache_;
  std::map<std::tuple<int, int, double>, FlowSpec> p2p_cache_;
  std::vector<Span> spans_;
  bool record_ = true;
  std::uint64_t seq_ = 0;
  std::uint64_t events_ = 0;
  double end_ = 0;
};

}  // namespace

Result<SimResult> simulate(const Program& program, const Topology& topo, const CostModel& cost,
                           const SimOptions& options) {
  Engine e(program, topo, cost, options);
  return e.run();
}

}  // namespace megascope::sim
