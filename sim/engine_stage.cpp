// The engine's per-stage analysis: see sim/engine_stage.hpp.
#include "sim/engine_stage.hpp"

#include <algorithm>
#include <bit>
#include <span>
#include <unordered_map>

#include "sim/activity.hpp"
#include "sim/engine.hpp"

namespace megascope::sim {

namespace {

// Compute op durations of one stage. Ops of one stage repeat a few kernel
// lists (and the builder shares their ranges): each range is priced once,
// summed in the same order.
class Pricer {
 public:
  Pricer(const StageProgram& stage, const CostModel& cost)
      : stage_(stage), cost_(cost), forward_factor_(1.0 / cost.forward_efficiency()), memo_(stage.kernels.size(), {0, 0.0}) {}
  double operator()(const Op& op) {
    if (op.kind != OpKind::compute || op.kernel_count == 0) return 0.0;
    const bool memoisable = op.kernel_begin < memo_.size();
    // Ops of different phases may share a kernel range: the memo holds the
    // kernels' price, the phase's factor applies on top.
    const double f = op.phase == Phase::forward || op.phase == Phase::recompute ? forward_factor_ : 1.0;
    double t = 0;
    if (memoisable && memo_[op.kernel_begin].first == op.kernel_count) {
      t = memo_[op.kernel_begin].second;
    } else {
      t = cost_.op_overhead_s();
      for (std::uint32_t k = op.kernel_begin; k < op.kernel_begin + op.kernel_count; ++k) t += cost_.kernel_s(stage_.kernels[k]);
      if (memoisable && memo_[op.kernel_begin].first == 0) memo_[op.kernel_begin] = {op.kernel_count, t};
    }
    if (!op.host_paced) return t * f;
    // The host launches the op's kernels in step with the GPU: the op lasts
    // at least as long as its launches.
    double host = 0;
    for (std::uint32_t k = op.kernel_begin; k < op.kernel_begin + op.kernel_count; ++k) host += cost_.host_s(stage_.kernels[k]);
    return std::max(t * f, host);
  }

 private:
  const StageProgram& stage_;
  const CostModel& cost_;
  const double forward_factor_;   // the price factor of forward and recompute ops
  std::vector<std::pair<std::uint32_t, double>> memo_;   // kernel begin -> (count, time)
};

}  // namespace

std::vector<double> compute_durations(const StageProgram& stage, const CostModel& cost) {
  std::vector<double> out(stage.ops.size(), 0.0);
  Pricer price(stage, cost);
  for (std::size_t i = 0; i < stage.ops.size(); ++i) out[i] = price(stage.ops[i]);
  return out;
}

namespace detail {

namespace {

// What fixes a communication op's flow on a given rank: for a collective its
// kind, group and size; for a send or receive its direction, peer and size.
struct CommClass {
  OpKind kind;
  std::uint8_t group;    // CommGroup of a collective (and its CommSpan, above bit 4); 0 for send/recv
  std::int32_t peer;     // peer stage of a send/recv; 0 for a collective
  double bytes;
  bool operator==(const CommClass&) const = default;
};
struct CommClassHash {
  std::size_t operator()(const CommClass& c) const {
    std::uint64_t h = std::bit_cast<std::uint64_t>(c.bytes);
    h ^= (static_cast<std::uint64_t>(c.kind) << 8 | c.group | static_cast<std::uint64_t>(c.peer) << 16) * 0x9e3779b97f4a7c15ULL;
    return static_cast<std::size_t>(h ^ (h >> 29));
  }
};

}  // namespace

StageInfo analyse(const StageProgram& s, const CostModel& cost) {
  StageInfo info;
  info.prog = &s;
  Pricer price(s, cost);
  const auto n = static_cast<std::uint32_t>(s.ops.size());
  // Each record is made when the loop below reaches its op (later ops only update
  // earlier records): one write of the array while it is in cache, not a
  // zero fill of it first.
  info.ops.reserve(n);
  OpInfo* const ops = info.ops.data();   // stable: reserved
  constexpr std::uint32_t kNear = Adjacency::kNear;
  constexpr std::uint32_t kFar = Adjacency::kFar;
  info.first.fill(kNone);
  std::array<std::uint32_t, kStreamCount> last;
  last.fill(kNone);
  std::array<std::uint32_t, kStreamCount * kCommGroupCount> counters{};
  std::unordered_map<CommClass, std::uint32_t, CommClassHash> classes;
  // Recent classes, direct-mapped by hash, in front of the map: a stage
  // cycles through a few classes (a layer's all-gathers and reduce-scatters).
  std::array<std::pair<CommClass, std::uint32_t>, 256> recent;   // indexed by 8 bits of the hash
  recent.fill({CommClass{OpKind::compute, 0, 0, 0.0}, kNone});
  // Op i (being packed) is a successor of op p: the one after p on its
  // stream goes first in p's list, the ops that depend on p follow in
  // program order. Kept near until p has more than kNear or a far one; then
  // p's list moves to `spilled` (its index in succ.far.begin until the end).
  std::vector<std::vector<std::uint32_t>> spilled;
  std::vector<std::uint32_t> spilled_op;   // whose list each is
  const auto spill_succ = [&](std::uint32_t p, std::uint32_t i, bool on_stream) __attribute__((noinline)) {
    OpInfo& before = ops[p];
    if (before.succ_n != Adjacency::kSpilled) {   // its near list moves
      std::vector<std::uint32_t>& list = spilled.emplace_back();
      spilled_op.push_back(p);
      for (std::uint32_t j = 0; j < before.succ_n; ++j) list.push_back(p + before.succ.near[j]);
      before.succ_n = Adjacency::kSpilled;
      before.succ.far.begin = static_cast<std::uint32_t>(spilled.size() - 1);
    }
    std::vector<std::uint32_t>& list = spilled[before.succ.far.begin];
    if (on_stream) list.insert(list.begin(), i);
    else list.push_back(i);
  };
  const auto add_succ = [&](std::uint32_t p, std::uint32_t i, bool on_stream) __attribute__((always_inline)) {
    OpInfo& before = ops[p];
    const std::uint32_t k = before.succ_n;   // kSpilled is more than kNear
    if (k >= kNear || i - p > kFar) [[unlikely]] {
      spill_succ(p, i, on_stream);
      return;
    }
    if (on_stream) {
      for (std::uint32_t j = k; j > 0; --j) before.succ.near[j] = before.succ.near[j - 1];
      before.succ.near[0] = static_cast<std::uint16_t>(i - p);
    } else {
      before.succ.near[k] = static_cast<std::uint16_t>(i - p);
    }
    before.succ_n = static_cast<std::uint8_t>(k + 1);
  };
  // Each op's record, its predecessors and its place among theirs' successors.
  for (std::uint32_t i = 0; i < n; ++i) {
    const Op& op = s.ops[i];
    OpInfo& o = info.ops.emplace_back();
    o.code = activity_code(op);
    if (o.code != kActivityIgnored) info.list_ops[activity_list(o.code)] += 1;
    o.kind = op.kind;
    o.stream = op.stream;
    o.group = op.group;
    const auto k = static_cast<std::size_t>(op.stream);
    if (info.first[k] == kNone) info.first[k] = i;
    std::uint32_t stream_pred = kNone;
    if (is_async(op.stream)) {
      info.unordered[k].push_back(i);
    } else {
      stream_pred = last[k];
      last[k] = i;
    }
    // Its predecessors, the op before it on its stream first, kept near
    // unless there are more than kNear or one is far (then the near slots
    // written are overwritten); it joins each one's successors.
    std::uint32_t m = 0, furthest = 0;
    if (stream_pred != kNone) {
      furthest = i - stream_pred;
      o.pred.near[m++] = static_cast<std::uint16_t>(furthest);
      add_succ(stream_pred, i, true);
    }
    const std::uint32_t* const deps = s.deps.data() + op.dep_begin;
    for (std::uint32_t d = 0; d < op.dep_count; ++d) {
      const std::uint32_t dep = deps[d];
      MEGASCOPE_CHECK(dep < i, "an op depends on a later op (simulate needs a program validate_program accepts)");
      const std::uint32_t distance = i - dep;
      furthest = std::max(furthest, distance);
      if (m < kNear) o.pred.near[m] = static_cast<std::uint16_t>(distance);
      ++m;
      add_succ(dep, i, false);
    }
    if (m <= kNear && furthest <= kFar) {
      o.pred_n = static_cast<std::uint8_t>(m);
    } else {
      o.pred_n = Adjacency::kSpilled;
      o.pred.far.begin = static_cast<std::uint32_t>(info.preds.size());
      o.pred.far.count = m;
      if (stream_pred != kNone) info.preds.push_back(stream_pred);
      info.preds.insert(info.preds.end(), deps, deps + op.dep_count);
    }
    if (op.kind == OpKind::compute) {
      o.duration = price(op);
      info.compute_s += o.duration;
      continue;
    }
    o.comm = {kNone, kNone};
    if (is_p2p(op.kind)) {
      info.p2p.push_back({op.tag, i, op.peer_stage, op.kind == OpKind::send});
    } else {
      o.comm.pair = counters[k * kCommGroupCount + static_cast<std::size_t>(op.group)]++;
    }
    const CommClass c = is_p2p(op.kind) ? CommClass{op.kind, 0, op.peer_stage, op.bytes}
                                        : CommClass{op.kind,
                                                    static_cast<std::uint8_t>(static_cast<unsigned>(op.group) |
                                                                              static_cast<unsigned>(op.span) << 4),
                                                    0, op.bytes};
    // The hash's high bits after one more multiply pick the slot (its low
    // bits alone put most of a stage's few classes in one slot).
    auto& hit = recent[(CommClassHash{}(c) * 0x9e3779b97f4a7c15ULL) >> 56];
    if (hit.second != kNone && hit.first == c) {
      o.comm.comm_class = hit.second;
    } else {
      const auto [it, added] = classes.try_emplace(c, static_cast<std::uint32_t>(classes.size()));
      if (added) {
        info.class_op.push_back(i);
        info.class_streams.push_back(0);
        info.class_peer.push_back(c.peer);
      }
      o.comm.comm_class = it->second;
      hit = {c, it->second};
    }
    info.class_streams[o.comm.comm_class] |= 1U << static_cast<unsigned>(op.stream);
  }
  // The spilled successor lists, each in one range of succs.
  for (std::size_t k = 0; k < spilled.size(); ++k) {
    OpInfo& o = ops[spilled_op[k]];
    o.succ.far.begin = static_cast<std::uint32_t>(info.succs.size());
    o.succ.far.count = static_cast<std::uint32_t>(spilled[k].size());
    info.succs.insert(info.succs.end(), spilled[k].begin(), spilled[k].end());
  }
  return info;
}

// Pairs every send with the receive of the same tag on its peer stage (and
// back). A transfer is matched by (source stage, destination stage, tag);
// one without a partner never starts (the engine then reports a deadlock).
// Per channel (source, destination), the k-th send in program order usually
// carries the tag of the k-th receive (the schedules post them in the same
// order): then they pair as they come; otherwise that channel is sorted by
// tag and each send takes the first receive of its tag.
void match_transfers(const Program& p, std::vector<StageInfo>& stages) {
  struct End {
    std::uint64_t tag;
    std::uint32_t op;
    bool operator<(const End& o) const { return tag != o.tag ? tag < o.tag : op < o.op; }
  };
  const std::size_t n = stages.size();
  const auto stage_ok = [&](int st) { return st >= 0 && static_cast<std::size_t>(st) < n; };
  // Ends bucketed by channel (from * n + to), each bucket in program order.
  std::vector<std::uint32_t> send_begin(n * n + 1, 0), recv_begin(n * n + 1, 0);
  const auto each_end = [&](auto&& f) {
    for (std::size_t si = 0; si < p.stages.size(); ++si) {
      const int stage = p.stages[si].stage;
      for (const P2pEnd& e : stages[si].p2p) {
        if (!stage_ok(stage) || !stage_ok(e.peer_stage)) continue;
        const auto from = static_cast<std::size_t>(e.send ? stage : e.peer_stage);
        const auto to = static_cast<std::size_t>(e.send ? e.peer_stage : stage);
        f(e.send, from * n + to, End{e.tag, e.op});
      }
    }
  };
  each_end([&](bool send, std::size_t ch, const End&) { ++(send ? send_begin : recv_begin)[ch + 1]; });
  for (std::size_t c = 0; c < n * n; ++c) {
    send_begin[c + 1] += send_begin[c];
    recv_begin[c + 1] += recv_begin[c];
  }
  std::vector<End> sends(send_begin[n * n]), recvs(recv_begin[n * n]);
  {
    std::vector<std::uint32_t> sf(send_begin.begin(), send_begin.end() - 1), rf(recv_begin.begin(), recv_begin.end() - 1);
    each_end([&](bool send, std::size_t ch, const End& e) { (send ? sends[sf[ch]++] : recvs[rf[ch]++]) = e; });
  }
  for (std::size_t c = 0; c < n * n; ++c) {
    const std::span<End> sc(sends.data() + send_begin[c], send_begin[c + 1] - send_begin[c]);
    const std::span<End> rc(recvs.data() + recv_begin[c], recv_begin[c + 1] - recv_begin[c]);
    if (sc.empty() || rc.empty()) continue;
    StageInfo& from = stages[c / n];
    StageInfo& to = stages[c % n];
    const bool in_order = sc.size() == rc.size() &&
                          std::equal(sc.begin(), sc.end(), rc.begin(), [](const End& a, const End& b) { return a.tag == b.tag; });
    if (!in_order) {
      std::sort(sc.begin(), sc.end());
      std::sort(rc.begin(), rc.end());
    }
    std::size_t j = 0;
    for (std::size_t k = 0; k < sc.size(); ++k) {
      const End& e = sc[k];
      if (in_order) {
        j = k;
      } else {
        while (j < rc.size() && rc[j] < End{e.tag, 0}) ++j;
        if (j == rc.size() || rc[j].tag != e.tag) continue;
      }
      from.ops[e.op].comm.pair = rc[j].op;
      to.ops[rc[j].op].comm.pair = e.op;
    }
  }
}

}  // namespace detail
}  // namespace megascope::sim
