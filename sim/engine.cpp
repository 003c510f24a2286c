#include "sim/engine.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <limits>
#include <map>
#include <span>
#include <tuple>
#include <unordered_map>

#include "sim/engine_interference.hpp"
#include "sim/engine_stage.hpp"
#include "sim/event_queue.hpp"

namespace megascope::sim {

Execution default_execution(const DeviceSpec& device) {
  return device.kind == DeviceKind::cpu ? Execution::serial : Execution::streams;
}

namespace {

using detail::is_async;
using detail::is_p2p;
using detail::EventQueue;
using detail::kNone;
using detail::Member;
using detail::OpInfo;
using detail::StageInfo;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr std::uint32_t kAhead = 16;   // ops whose records a rank's events keep prefetched (Engine::prefetch)
constexpr std::uint32_t kLone = kNone - 1;   // a heap entry that ends a lone transfer: op is its waiting list
constexpr std::uint32_t kHeld = kNone - 2;   // a heap entry that ends a held transfer: op is its Network::Held


// One simulated rank: what every event of the rank reads, in one cache line.
struct alignas(64) RankState {
  std::uint32_t stage = 0;
  std::int32_t rank = 0;
  std::uint32_t index = 0;              // its index among the simulated ranks (Engine::word, Engine::per_class)
  std::uint32_t remaining = 0;
  std::uint32_t ahead = 0;              // its ops' records before this index are prefetched
  double* start_time = nullptr;         // traced ranks, when spans or activity are recorded: start of each op
  std::uint32_t next = 0;               // serial execution: the next op of the list
  RankActivity* activity = nullptr;     // traced ranks, SimOptions::activity
};

// Collectives of one (group instance, stream) waiting for members, by
// ordinal: slots[head + (ordinal - base)] is the waiting list (kNone: none).
// Members reach a group's collectives in order, so the window only slides.
struct Channel {
  std::vector<std::uint32_t> slots;
  std::uint32_t head = 0, base = 0;
};

class Engine {
 public:
  Engine(const Program& p, const Topology& topo, const CostModel& cost, const SimOptions& opt)
      : p_(p), topo_(topo), opt_(opt), net_(topo),
        serial_(opt.execution.value_or(default_execution(cost.device())) == Execution::serial) {
    // Collectives take SMs from compute (CostProfile::comm_sms): each
    // running one slows its GPU's compute ops by this share.
    const CostProfile& prof = cost.profile();
    if (!serial_ && prof.comm_sms > 0 && prof.sms > 0)
      comm_share_ = static_cast<double>(prof.comm_sms) / static_cast<double>(prof.sms);
    stages_.reserve(p.stages.size());
    for (const StageProgram& s : p.stages) stages_.push_back(detail::analyse(s, cost));
    detail::match_transfers(p, stages_);
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
    const std::size_t n_states = out.simulated_ranks.size();
    states_.reserve(n_states);
    group_id_.reserve(n_states);
    // Group sizes depend only on the group kind's shape; computed for one
    // rank per stage and shared (full mode only).
    group_size_.assign(static_cast<std::size_t>(g.pp), {});
    if (opt_.mode == Mode::full)
      for (int s = 0; s < g.pp; ++s)
        for (int k = 0; k < kCommGroupCount; ++k)
          group_size_[static_cast<std::size_t>(s)][static_cast<std::size_t>(k)] =
              static_cast<std::int32_t>(g.group(g.rank_of(0, 0, 0, s), static_cast<CommGroup>(k)).size());
    std::size_t words = 0, classes = 0;   // the most 64-op words and CommClasses of any stage
    for (int r : out.simulated_ranks) {
      RankState st;
      st.rank = r;
      st.stage = static_cast<std::uint32_t>(g.coord(r).pp);
      const StageInfo& info = stages_[st.stage];
      const std::size_t n = info.ops.size();
      st.index = static_cast<std::uint32_t>(states_.size());
      words = std::max(words, (n + 63) / 64);
      st.remaining = static_cast<std::uint32_t>(n);
      classes = std::max(classes, info.class_op.size());
      std::array<std::int64_t, kCommGroupCount> ids{};
      for (int k = 0; k < kCommGroupCount; ++k) ids[static_cast<std::size_t>(k)] = g.group_id(r, static_cast<CommGroup>(k));
      group_id_.push_back(ids);
      state_of_rank_[static_cast<std::size_t>(r)] = static_cast<int>(states_.size());
      states_.push_back(st);
    }
    bits_.assign(2 * words * n_states, 0);
    stride_ = 2 * n_states;
    flow_of_class_.assign(classes * n_states, kNone);
    start_times_.resize(n_states);
    if (opt_.activity) activity_.reserve(traced.size());   // no reallocation: the ranks point into it
    for (int r : traced) {
      if (r < 0 || r >= g.world() || state_of_rank_[static_cast<std::size_t>(r)] < 0)
        return fail("simulate", fmt::format("rank {} to trace is not simulated in this mode", r));
      const auto s = static_cast<std::size_t>(state_of_rank_[static_cast<std::size_t>(r)]);
      RankState& st = states_[s];
      if (opt_.record_trace || opt_.activity) {   // start times serve only the spans and the activity
        start_times_[s].assign(stages_[st.stage].ops.size(), 0.0);
        st.start_time = start_times_[s].data();
      }
      if (opt_.activity && !st.activity) {   // a rank named twice is gathered once
        RankActivity& a = activity_.emplace_back();
        a.rank = r;
        for (std::size_t k = 0; k < kActivityLists; ++k) a.list(k).reserve(stages_[st.stage].list_ops[k]);   // no regrowth
        st.activity = &a;
      }
      out.traced_ranks.push_back(r);
    }
    record_ = opt_.record_trace;
    // A region prices its compute ops when it starts; with interference a
    // collective that starts later (another rank's arrival) changes their rate.
    interference_.init(comm_share_, n_states);
    regions_ = opt_.regions && !serial_ && !interference_.on();
    if (regions_) {
      std::size_t most = 0;
      for (const StageInfo& info : stages_) most = std::max(most, info.ops.size());
      slot_.assign(most, Slot{});
    }
    if (record_) {   // one span per op of each traced rank
      std::size_t spans = 0;
      for (const RankState& st : states_)
        if (st.start_time) spans += stages_[st.stage].ops.size();
      spans_.reserve(spans);
    }
    prepare_flows();

    // Start: every stream head and every op with no predecessor constraint
    // (serial: the first op of the list).
    for (std::uint32_t s = 0; s < states_.size(); ++s) {
      const StageInfo& info = stages_[states_[s].stage];
      if (serial_) {
        if (!info.ops.empty()) try_start(s, 0, 0.0);
        continue;
      }
      // By stream: the first op of an ordered one, every op of an unordered one.
      for (int k = 0; k < kStreamCount; ++k) {
        const auto stream = static_cast<Stream>(k);
        if (!is_async(stream)) {
          if (info.first[static_cast<std::size_t>(k)] != kNone) try_start(s, info.first[static_cast<std::size_t>(k)], 0.0);
          continue;
        }
        for (const std::uint32_t op : info.unordered[static_cast<std::size_t>(k)]) try_start(s, op, 0.0);
      }
    }
    double now = 0;
    std::vector<FlowId> done;
    while (true) {
      const double t_heap = heap_.empty() ? kInf : heap_.top_time();
      if (net_changed_) {   // only starts and advances move the network's next event
        const std::optional<double> tn = net_.next_event_time();
        t_net_ = tn ? *tn : kInf;
        net_changed_ = false;
      }
      const double t_net = t_net_;
      if (t_heap == kInf && t_net == kInf) break;
      if (t_heap <= t_net) {
        const Member e = heap_.top();
        now = t_heap;
        heap_.pop();
        if (e.state == kLone) {
          finish_members(e.op, now);
        } else if (e.state == kHeld) {
          // Still held: it ended alone. Admitted: the network ends it; its
          // entry here is spent (not an event).
          const std::uint32_t w = held_wait_[e.op];
          held_wait_[e.op] = kNone;
          if (!net_.release(e.op)) continue;
          finish_members(w, now);
        } else {
          if (interference_.on() && stages_[states_[e.state].stage].ops[e.op].kind == OpKind::compute &&
              !interference_.due(e.state, e.op, now))
            continue;   // a compute op's earlier end: it has moved since
          finish(e.state, e.op, now);
        }
      } else {
        now = t_net;
        net_.advance_to(t_net, done);
        net_changed_ = true;
        for (FlowId f : done) {
          MEGASCOPE_CHECK(f < waiting_.size() && waiting_[f] != kNone, "a finished flow has no waiting ops");
          const std::uint32_t w = waiting_[f];
          waiting_[f] = kNone;
          finish_members(w, now);
        }
      }
      ++events_;
    }
    for (const RankState& st : states_) {
      if (st.remaining == 0) continue;
      const StageInfo& info = stages_[st.stage];
      for (std::uint32_t i = 0; i < info.ops.size(); ++i) {
        if (finished(st, i)) continue;
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
    for (RankActivity& a : activity_) a.flush();
    out.activity = std::move(activity_);
    out.events = events_;
    for (const StageInfo& info : stages_) out.compute_time_s.push_back(info.compute_s);
    return out;
  }

 private:
  // The (rank, CommClass) entries of flow_of_class_ and local_comm_: by
  // class, ranks side by side, for the same reason as the bits below.
  [[nodiscard]] std::size_t per_class(const RankState& st, std::size_t c) const {
    return c * states_.size() + st.index;
  }
  // Started and finished bits of the ranks' ops: for each 64 ops, a row of
  // every rank's (started, finished) word pair, ranks side by side. The ranks
  // of a stage run in near lockstep at the same op indices, so the words that
  // the events of a moment touch sit together in a few pages and cache lines,
  // instead of one page per rank (full mode: thousands, past the TLB's reach).
  [[nodiscard]] std::size_t word(const RankState& st, std::uint32_t i) const { return (i >> 6) * stride_ + 2 * st.index; }
  [[nodiscard]] bool started(const RankState& st, std::uint32_t i) const { return (bits_[word(st, i)] >> (i & 63)) & 1U; }
  [[nodiscard]] bool finished(const RankState& st, std::uint32_t i) const {
    return (bits_[word(st, i) + 1] >> (i & 63)) & 1U;
  }
  void set_started(const RankState& st, std::uint32_t i) { bits_[word(st, i)] |= std::uint64_t{1} << (i & 63); }
  void set_finished(const RankState& st, std::uint32_t i) { bits_[word(st, i) + 1] |= std::uint64_t{1} << (i & 63); }

  // Every predecessor of op i (the op before it on its stream, its deps) finished.
  bool preds_done(const RankState& st, const StageInfo& info, std::uint32_t i) const {
    return info.all_preds(i, [&](std::uint32_t p) __attribute__((always_inline)) { return finished(st, p); });
  }

  int expected_members(std::uint32_t s, CommGroup g) const {
    if (opt_.mode == Mode::full) return group_size_[states_[s].stage][static_cast<std::size_t>(g)];
    // Reduced: the other members of an intra-stage group are symmetric copies.
    return g == CommGroup::embedding ? (p_.grid.pp > 1 ? 2 : 1) : 1;
  }

  // Waiting lists of members, reused.
  std::uint32_t acquire() {
    if (!free_.empty()) {
      const std::uint32_t w = free_.back();
      free_.pop_back();
      pool_[w].clear();
      pool_at_[w] = 0;
      pool_flow_[w] = kNone;
      return w;
    }
    pool_.emplace_back();
    pool_at_.push_back(0);
    pool_flow_.push_back(kNone);
    return static_cast<std::uint32_t>(pool_.size() - 1);
  }
  void release(std::uint32_t w) { free_.push_back(w); }

  // A transfer ended: every member of waiting list w finishes its op, in order.
  void finish_members(std::uint32_t w, double now) {
    // finish() may start flows and take lists from the pool: index afresh each time.
    for (std::size_t k = 0; k < pool_[w].size(); ++k) {
      const Member m = pool_[w][k];
      finish(m.state, m.op, now);
    }
    release(w);
  }

  // Every flow a rank can start, prepared before the first starts, so that
  // the network can merge links that all flows load alike (Network::seal).
  // A send or receive without a partner (or whose peer is not simulated)
  // never starts and gets none.
  void prepare_flows() {
    for (std::size_t s = 0; s < states_.size(); ++s) {
      const RankState& st = states_[s];
      const StageInfo& info = stages_[st.stage];
      for (std::size_t c = 0; c < info.class_op.size(); ++c) {
        const std::uint32_t i = info.class_op[c];
        const Op& op = info.prog->ops[i];
        Network::Prepared& flow = flow_of_class_[per_class(st, c)];
        if (is_p2p(op.kind)) {
          if (info.ops[i].comm.pair == kNone) continue;
          const int peer = p_.grid.on_stage(st.rank, op.peer_stage);
          if (peer < 0 || peer >= p_.grid.world() || state_of_rank_[static_cast<std::size_t>(peer)] < 0) continue;
          flow = op.kind == OpKind::send ? p2p_flow(st.rank, peer, op.bytes) : p2p_flow(peer, st.rank, op.bytes);
        } else {
          flow = collective_flow_of(st.rank, group_id_[s][static_cast<std::size_t>(op.group)], op);
        }
      }
    }
    if (opt_.lone_flows) find_lone_flows();
    net_.seal();
    // The end of every prepared flow alone on its links: a lone flow's, and a
    // held one's (SimOptions::idle_flows).
    std::size_t prepared = 0;
    for (const Network::Prepared f : flow_of_class_)
      if (f != kNone) prepared = std::max<std::size_t>(prepared, f + 1);
    terms_.resize(prepared);
    for (std::size_t f = 0; f < prepared; ++f) terms_[f] = net_.lone_terms(static_cast<Network::Prepared>(f));
    prepare_local_comm();
  }

  // Prepared flows that always run alone on their links: every flow on any
  // of their links is started by one ordered stream of one group (the
  // collectives of a (group, stream) run one after another), never by a
  // send or receive or by ops of one class on several streams. Such a flow's
  // end is known when it starts (Network::lone_terms), so it goes on the
  // event heap and skips the network: a tensor-parallel group's collectives
  // on its own NVLink ports, typically most of a step's communication ops.
  void find_lone_flows() {
    constexpr std::uint64_t unset = std::numeric_limits<std::uint64_t>::max();
    constexpr std::uint64_t mixed = unset - 1;
    std::vector<std::uint64_t> key_of_flow;
    const auto claim = [](std::uint64_t& slot, std::uint64_t key) { slot = slot == unset || slot == key ? key : mixed; };
    for (std::size_t s = 0; s < states_.size(); ++s) {
      const RankState& st = states_[s];
      const StageInfo& info = stages_[st.stage];
      for (std::size_t c = 0; c < info.class_op.size(); ++c) {
        const Network::Prepared f = flow_of_class_[per_class(st, c)];
        if (f == kNone) continue;
        if (f >= key_of_flow.size()) key_of_flow.resize(f + 1, unset);
        const Op& op = info.prog->ops[info.class_op[c]];
        const std::uint32_t streams = info.class_streams[c];
        const bool one_stream = std::has_single_bit(streams) && !is_async(op.stream);
        const std::uint64_t key = is_p2p(op.kind) || !one_stream
                                      ? mixed
                                      : static_cast<std::uint64_t>(group_id_[s][static_cast<std::size_t>(op.group)]) * kStreamCount +
                                            static_cast<std::uint64_t>(op.stream);
        claim(key_of_flow[f], key);
      }
    }
    std::unordered_map<LinkId, std::uint64_t> owner;
    for (std::size_t f = 0; f < key_of_flow.size(); ++f) {
      if (key_of_flow[f] == unset) continue;
      for (const auto& [l, w] : net_.links_of(static_cast<Network::Prepared>(f))) claim(owner.try_emplace(l, unset).first->second, key_of_flow[f]);
    }
    lone_.assign(key_of_flow.size(), 0);
    for (std::size_t f = 0; f < key_of_flow.size(); ++f) {
      if (key_of_flow[f] == unset || key_of_flow[f] == mixed) continue;
      bool alone = true;
      for (const auto& [l, w] : net_.links_of(static_cast<Network::Prepared>(f))) alone = alone && owner.at(l) == key_of_flow[f];
      if (alone) lone_[f] = 1;
    }
  }

  static constexpr double kJoinable = -2;
  [[nodiscard]] bool joinable(std::uint32_t s, const OpInfo& op) const {
    return op.kind != OpKind::compute && !is_p2p(op.kind) &&
           local_comm_[per_class(states_[s], op.comm.comm_class)].latency == kJoinable;
  }

  [[nodiscard]] bool lone(Network::Prepared flow) const { return flow < lone_.size() && lone_[flow] != 0; }

  // Starts the transfer of the members in waiting list w, when the last of
  // them arrives (a member a region posted ahead arrives after `now`).
  void launch(std::uint32_t w, Network::Prepared flow, double now) {
    MEGASCOPE_CHECK(flow != kNone, "a transfer starts without a prepared flow");
    const double start = std::max(now, pool_at_[w]);
    mark_transfer_start(pool_[w], start);
    if (lone(flow)) {
      const Network::LoneTerms& t = terms_[flow];
      // Network::lone_terms from the engine's clock, as local_end
      // prices it (the network's clock may run ahead by its event tolerance).
      const double end = (start + t.latency) + t.transfer;
      if (pool_[w].size() == 1) {   // one member (reduced mode): its own event, no list
        heap_.push(end, pool_[w].front());
        release(w);
      } else {
        heap_.push(end, {kLone, w});   // one event ends every member
      }
      return;
    }
    MEGASCOPE_CHECK(start == now, "a network transfer was posted ahead of time");
    if (opt_.idle_flows)
      if (const std::optional<Network::Held> h = net_.hold(flow, now)) {
        const Network::LoneTerms& t = terms_[flow];
        if (*h >= held_wait_.size()) held_wait_.resize(*h + 1, kNone);
        held_wait_[*h] = w;
        heap_.push((now + t.latency) + t.transfer, {kHeld, *h});
        return;
      }
    const FlowId id = net_.start(flow, now);
    net_changed_ = true;
    wait_on(id, w);
    // Held flows on its links entered the network first: their members now
    // wait on their flows (their heap entries are spent).
    for (const auto& [h, f] : net_.admitted()) {
      wait_on(f, held_wait_[h]);
      held_wait_[h] = kNone;
    }
  }

  void wait_on(FlowId id, std::uint32_t w) {
    if (id >= waiting_.size()) waiting_.resize(std::max<std::size_t>(id + 1, 2 * waiting_.size()), kNone);
    waiting_[id] = w;
  }

  void try_start(std::uint32_t s, std::uint32_t i, double now) {
    RankState& st = states_[s];
    if (started(st, i)) return;
    const StageInfo& info = stages_[st.stage];
    const OpInfo& op = info.ops[i];
    if (serial_) {
      // The list order implies the dependencies: every earlier op has
      // finished, except sends, which the rank does not wait for.
      if (i != st.next) return;
    } else if (!preds_done(st, info, i)) {
      return;
    }
    set_started(st, i);
    if (st.start_time) st.start_time[i] = now;
    if (regions_)
      if (const std::optional<double> end = local_end(s, i, now)) {
        run_region(s, i, now, *end);
        return;
      }
    switch (op.kind) {
      case OpKind::compute:
        if (interference_.on()) {
          heap_.push(interference_.start(s, i, now, op.duration), {s, i});
          return;
        }
        heap_.push(now + op.duration, {s, i});
        return;
      case OpKind::send:
      case OpKind::recv: {
        // The pair starts when its second end is posted; the first waits.
        // Serial: a posted send lets the rank go on to its next op.
        post_transfer(s, i, now);
        if (serial_ && op.kind == OpKind::send) advance_serial(s, i, now);
        return;
      }
      default:
        if (interference_.on()) comm_changed(s, now, +1);
        join(s, i, now, now);
        return;
    }
  }

  // A collective of rank s starts (+1) or ends (-1): its running compute
  // ops get their new ends (Interference::changed).
  void comm_changed(std::uint32_t s, double now, int delta) {
    interference_.changed(s, now, delta, [&](double end, std::uint32_t op) { heap_.push(end, {s, op}); });
  }

  // Member (s, i) reaches its collective at `arrival` (now, or later for a
  // lone collective a region posts ahead); the last member launches it.
  void join(std::uint32_t s, std::uint32_t i, double arrival, double now) {
    const RankState& st = states_[s];
    const OpInfo& op = stages_[st.stage].ops[i];
    const int expected = expected_members(s, op.group);
    std::uint32_t w;
    if (expected <= 1) {
      w = acquire();
      pool_[w].push_back({s, i});
      pool_at_[w] = arrival;
      pool_flow_[w] = flow_of_class_[per_class(st, op.comm.comm_class)];
    } else {
      const std::int64_t gid = group_id_[s][static_cast<std::size_t>(op.group)];
      Channel& ch = channel(gid, op.stream);
      const std::uint32_t ordinal = op.comm.pair;
      MEGASCOPE_CHECK(ordinal >= ch.base, "a member reached a collective its group has finished");
      const std::size_t k = ch.head + (ordinal - ch.base);
      if (k >= ch.slots.size()) ch.slots.resize(k + 1, kNone);
      if (ch.slots[k] == kNone) ch.slots[k] = acquire();
      w = ch.slots[k];
      pool_[w].push_back({s, i});
      if (pool_[w].size() == 1 || arrival >= pool_at_[w]) {   // the last to arrive launches it, with its flow
        pool_at_[w] = arrival;
        pool_flow_[w] = flow_of_class_[per_class(st, op.comm.comm_class)];
      }
      if (static_cast<int>(pool_[w].size()) < expected) return;
      ch.slots[k] = kNone;
      while (ch.head < ch.slots.size() && ch.slots[ch.head] == kNone) {
        ++ch.head;
        ++ch.base;
      }
      if (ch.head == ch.slots.size()) {
        ch.slots.clear();
        ch.head = 0;
      } else if (ch.head >= 64 && 2 * ch.head >= ch.slots.size()) {
        ch.slots.erase(ch.slots.begin(), ch.slots.begin() + ch.head);
        ch.head = 0;
      }
    }
    launch(w, pool_flow_[w], now);
  }

  // An op whose end is known when it starts and that touches nothing shared:
  // a compute op, or a lone collective with no other member to wait for.
  // Its end time started at `start`, or nullopt. A lone flow is priced from
  // the engine's clock, as launch() prices it: the network's clock can run
  // ahead by its event tolerance after an event, and a lone flow never
  // touches the network.
  std::optional<double> local_end(std::uint32_t s, std::uint32_t i, double start) const {
    const RankState& st = states_[s];
    const OpInfo& op = stages_[st.stage].ops[i];
    if (op.kind == OpKind::compute) return start + op.duration;
    const Network::LoneTerms& t = local_comm_[per_class(st, op.comm.comm_class)];
    if (t.latency < 0) return std::nullopt;
    return (start + t.latency) + t.transfer;   // Network::lone_terms
  }

  // local_end's terms of every (rank, CommClass): a collective with no other
  // member to wait for whose flow is lone; latency kJoinable for a lone
  // collective with members to wait for (a region may post it ahead, see
  // run_region), -1 for the rest.
  void prepare_local_comm() {
    local_comm_.assign(flow_of_class_.size(), {-1.0, 0.0});
    for (std::uint32_t s = 0; s < states_.size(); ++s) {
      const RankState& st = states_[s];
      const StageInfo& info = stages_[st.stage];
      for (std::size_t c = 0; c < info.class_op.size(); ++c) {
        const Op& op = info.prog->ops[info.class_op[c]];
        const Network::Prepared flow = flow_of_class_[per_class(st, c)];
        if (is_p2p(op.kind) || !lone(flow)) continue;
        if (expected_members(s, op.group) > 1) local_comm_[per_class(st, c)].latency = kJoinable;
        else local_comm_[per_class(st, c)] = terms_[flow];
      }
    }
  }

  // Regions: op x0 has just started and its end is known (local_end). The
  // ops its end lets start whose ends are known too (compute, lone
  // collectives with no other member), and the ops theirs let start, and so
  // on, are one event: on one rank, with no other rank or flow involved,
  // each starts at the latest end among its predecessors (its dependencies
  // and the op before it on its stream), exactly when op-by-op events would
  // start it. An op joins when every predecessor is in the region or has
  // finished; so the region is closed under "lets start", forks and joins
  // included (a layer's backward: the weight gradients beside the last TP
  // collective, and the op waiting for both). An op whose successors are all
  // in the region is finished at once: nothing outside the region reads its
  // state. The others (the region's exits: an op before a transfer, or
  // before an op still waiting for something) end as normal events at their
  // end times, so an op outside the region starts only when it would have.
  void run_region(std::uint32_t s, std::uint32_t x0, double now, double x0_end) {
    RankState& st = states_[s];
    const StageInfo& info = stages_[st.stage];
    if (++stamp_ == 0) {   // wrapped: clear the marks once
      std::fill(slot_.begin(), slot_.end(), Slot{});
      stamp_ = 1;
    }
    const std::uint32_t g = stamp_;
    region_.clear();
    ahead_.clear();
    region_.push_back(x0);
    slot_[x0].mark = g;
    slot_[x0].start = now;
    slot_[x0].end = x0_end;
    // Breadth-first over "lets start": an op is tried once per predecessor
    // in the region and joins at the last one, so the list is in
    // topological order.
    for (std::size_t k = 0; k < region_.size(); ++k) {
      info.each_succ(region_[k], [&](std::uint32_t y) __attribute__((always_inline)) {
        if (slot_[y].mark == g || slot_[y].posted == g || started(st, y)) return;
        const OpInfo& o = info.ops[y];
        double start = now;
        const auto pred = [&](std::uint32_t d) __attribute__((always_inline)) {
          if (slot_[d].mark == g) {
            start = std::max(start, slot_[d].end);
            return true;
          }
          return finished(st, d);
        };
        if (!info.all_preds(y, pred)) return;
        const std::optional<double> end = local_end(s, y, start);
        if (!end) {
          if (joinable(s, o)) {   // posted ahead; its successors wait for its end
            slot_[y].posted = g;
            slot_[y].start = start;
            ahead_.push_back(y);
          }
          return;
        }
        slot_[y].mark = g;
        slot_[y].start = start;
        slot_[y].end = *end;
        region_.push_back(y);
      });
    }
    if (region_.size() == 1 && ahead_.empty() && info.ops[x0].has_succs()) {   // x0 alone: an exit
      heap_.push(x0_end, {s, x0});
      return;
    }
    prefetch(st, info, x0);
    for (const std::uint32_t x : region_) {
      const double start = slot_[x].start;
      if (x != x0) {
        set_started(st, x);
        if (st.start_time) st.start_time[x] = start;
      }
      // Inside: every op x lets start is in the region, posted ahead, or
      // waits for a collective posted ahead that starts after x ends (it
      // cannot start before that collective ends, which is an event).
      bool inside = true;
      info.each_succ(x, [&](std::uint32_t y) __attribute__((always_inline)) {
        if (!inside || slot_[y].mark == g || slot_[y].posted == g) return;
        bool guarded = false;
        info.all_preds(y, [&](std::uint32_t d) __attribute__((always_inline)) {
          guarded = slot_[d].posted == g && slot_[d].start >= slot_[x].end;
          return !guarded;
        });
        inside = guarded;
      });
      if (!inside) {
        heap_.push(slot_[x].end, {s, x});
        continue;
      }
      set_finished(st, x);
      st.remaining -= 1;
      end_ = std::max(end_, slot_[x].end);
      if (st.start_time) record(st, x, start, slot_[x].end);
    }
    // Collectives whose members the region reaches: each joins its group at
    // its arrival time, which only sets when the group's last member
    // launches it (launch); the group's end finishes every member.
    for (const std::uint32_t y : ahead_) {
      set_started(st, y);
      if (st.start_time) st.start_time[y] = slot_[y].start;
      join(s, y, slot_[y].start, now);
    }
  }

  void post_transfer(std::uint32_t s, std::uint32_t i, double now) {
    const RankState& st = states_[s];
    const OpInfo& op = stages_[st.stage].ops[i];
    const std::uint32_t j = op.comm.pair;
    if (j == kNone) return;
    const StageInfo& info = stages_[st.stage];
    const int peer = p_.grid.on_stage(st.rank, info.class_peer[op.comm.comm_class]);
    const int ps = state_of_rank_[static_cast<std::size_t>(peer)];
    if (ps < 0 || !started(states_[static_cast<std::size_t>(ps)], j)) return;
    const std::uint32_t w = acquire();
    pool_[w].push_back({static_cast<std::uint32_t>(ps), j});
    pool_[w].push_back({s, i});
    launch(w, flow_of_class_[per_class(st, op.comm.comm_class)], now);
  }

  // Serial execution: op i gives the rank up; its next op of the list starts.
  void advance_serial(std::uint32_t s, std::uint32_t i, double now) {
    RankState& st = states_[s];
    st.next = i + 1;
    if (st.next < stages_[st.stage].ops.size()) try_start(s, st.next, now);
  }

  Channel& channel(std::int64_t gid, Stream stream) {
    if (channel_of_.empty()) channel_of_.assign(static_cast<std::size_t>(kCommGroupCount) * p_.grid.world() * kStreamCount, kNone);
    const std::size_t key = static_cast<std::size_t>(gid) * kStreamCount + static_cast<std::size_t>(stream);
    MEGASCOPE_CHECK(key < channel_of_.size(), "a group id out of range");
    if (channel_of_[key] == kNone) {
      channel_of_[key] = static_cast<std::uint32_t>(channels_.size());
      channels_.emplace_back();
    }
    return channels_[channel_of_[key]];
  }

  // A transfer's span starts when the data moves, not when a member posted it:
  // waiting for the peer is idle time (a bubble), not communication.
  // Serial ranks keep the time they reached the op (they waited in it).
  void mark_transfer_start(const std::vector<Member>& members, double now) {
    if (serial_) return;
    for (const Member& m : members) {
      RankState& st = states_[m.state];
      if (st.start_time) st.start_time[m.op] = now;
    }
  }

  // Routes repeat (the same neighbours exchange the same sizes every micro-batch).
  Network::Prepared p2p_flow(int from, int to, double bytes) {
    const auto key = std::make_tuple(from, to, bytes);
    auto it = p2p_cache_.find(key);
    if (it != p2p_cache_.end()) return it->second;
    const std::vector<int> devices = {from, to};
    const Network::Prepared f = net_.prepare(collective_flow(topo_, Collective::send_recv, devices, bytes));
    p2p_cache_.emplace(key, f);
    return f;
  }

  Network::Prepared collective_flow_of(int rank, std::int64_t gid, const Op& op) {
    const auto key = std::make_tuple(gid, static_cast<int>(collective_of(op)), op.bytes);
    auto it = spec_cache_.find(key);
    if (it != spec_cache_.end()) return it->second;
    const std::vector<int> members = p_.grid.group(rank, op.group);
    const Network::Prepared f = net_.prepare(collective_flow(topo_, collective_of(op), members, op.bytes));
    spec_cache_.emplace(key, f);
    return f;
  }

  // A rank walks its ops roughly in list order, each rank in its own stretch
  // of these arrays: with dozens of ranks interleaved that is more streams
  // than the hardware prefetcher follows, and most of an event's time went
  // into the first touch of an op's record. Each event of a rank at op i
  // fetches the records up to op i + kAhead it has not fetched yet (the
  // rank's next region, read at its next event, dozens of other events
  // later); a record is fetched at most once.
  void prefetch(RankState& st, const StageInfo& info, std::uint32_t i) {
    const auto n = static_cast<std::uint32_t>(info.ops.size());
    const std::uint32_t to = std::min(n, i + kAhead);
    for (std::uint32_t j = std::max(st.ahead, i + 1); j < to; ++j) {
      __builtin_prefetch(&info.ops[j]);
      if (st.start_time && j % 8 == 0) __builtin_prefetch(st.start_time + j, 1);
    }
    st.ahead = std::max(st.ahead, to);
  }

  // Op i of a traced rank ran from start to end: its span and its activity.
  void record(const RankState& st, std::uint32_t i, double start, double end) {
    if (record_) spans_.push_back({st.rank, i, start, end});
    if (st.activity) st.activity->add(stages_[st.stage].ops[i].code, start, end);
  }

  void finish(std::uint32_t s, std::uint32_t i, double now) {
    RankState& st = states_[s];
    const StageInfo& info = stages_[st.stage];
    const OpInfo& op = info.ops[i];
    prefetch(st, info, i);
    set_finished(st, i);
    st.remaining -= 1;
    end_ = std::max(end_, now);
    if (interference_.on() && op.kind != OpKind::compute && !is_p2p(op.kind)) comm_changed(s, now, -1);
    if (serial_) {
      // A send held the rank only while it was posted.
      const bool send = op.kind == OpKind::send;
      if (st.start_time) record(st, i, st.start_time[i], send ? st.start_time[i] : now);
      if (!send) advance_serial(s, i, now);
      return;
    }
    if (st.start_time) record(st, i, st.start_time[i], now);
    info.each_succ(i, [&](std::uint32_t d) __attribute__((always_inline)) { try_start(s, d, now); });
  }

  const Program& p_;
  const Topology& topo_;
  SimOptions opt_;
  Network net_;
  std::vector<StageInfo> stages_;
  std::vector<RankState> states_;
  std::vector<std::uint64_t> bits_;                       // every rank's started/finished bits (word())
  std::size_t stride_ = 0;                                 // words per row of bits_: two per simulated rank
  std::vector<std::array<std::int64_t, kCommGroupCount>> group_id_;    // per rank, per CommGroup
  std::vector<std::array<std::int32_t, kCommGroupCount>> group_size_;  // per stage (full mode): every rank of a stage alike
  std::vector<Network::Prepared> flow_of_class_;         // per rank, per CommClass of its stage (per_class)
  std::vector<char> lone_;                                // per prepared flow: always alone on its links (find_lone_flows)
  std::vector<Network::LoneTerms> terms_;                 // per prepared flow: its end alone on its links (Network::lone_terms)
  std::vector<Network::LoneTerms> local_comm_;            // per rank, per CommClass (per_class): see prepare_local_comm
  std::vector<std::uint32_t> held_wait_;                  // Network::Held -> waiting list (kNone: none)
  std::vector<std::vector<double>> start_times_;          // per traced rank
  std::vector<int> state_of_rank_;
  EventQueue heap_;   // compute completions
  std::vector<std::vector<Member>> pool_;   // waiting lists
  std::vector<double> pool_at_;             // per waiting list: its latest member's arrival
  std::vector<Network::Prepared> pool_flow_;   // and that member's flow (members' flows agree on a valid program)
  std::vector<std::uint32_t> free_;         // free waiting lists
  std::vector<std::uint32_t> waiting_;      // FlowId -> waiting list of its members
  std::vector<std::uint32_t> channel_of_;   // (group id, stream) -> channel
  std::vector<Channel> channels_;
  std::map<std::tuple<std::int64_t, int, double>, Network::Prepared> spec_cache_;
  std::map<std::tuple<int, int, double>, Network::Prepared> p2p_cache_;
  std::vector<Span> spans_;
  std::vector<RankActivity> activity_;                   // SimOptions::activity: per traced rank
  bool record_ = true;
  bool net_changed_ = true;   // t_net_ is stale
  bool regions_ = false;      // SimOptions::regions, streams execution only
  std::vector<std::uint32_t> region_;     // run_region's ops, reused
  // run_region's scratch per op index of a stage, one record per op (one
  // cache line touched, not four).
  struct Slot {
    std::uint32_t mark = 0;     // stamp_ while in the region
    std::uint32_t posted = 0;   // stamp_ while posted ahead by the region
    double start = 0, end = 0;  // its times in the region
  };
  std::vector<Slot> slot_;
  std::vector<std::uint32_t> ahead_;      // run_region's collectives posted ahead, reused
  std::uint32_t stamp_ = 0;
  // Interference (CostProfile::comm_sms): the share of SMs one running
  // collective takes (0: off) and the state it moves compute ends with.
  double comm_share_ = 0;
  detail::Interference interference_;
  double t_net_ = kInf;       // the network's next event time
  bool serial_ = false;   // Execution::serial
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
