// Network: flows sharing link capacity max-min fairly, event by event.
//
// A flow first waits its latency (no bandwidth), then transfers its payload at
// a rate r (payload bytes/s) that puts r x load on each of its links. Rates
// are max-min fair, by progressive filling: all unfrozen flows' rates rise
// together; the link that saturates first freezes the flows crossing it at
// the current level; repeat. A flow's rate is thus set by its most
// constrained link, and capacity one flow cannot use goes to the others.
//
// Event-driven and incremental. Rates change only when a flow begins its
// transfer or finishes, and are then re-solved for a small set S of flows,
// the rest held at their rates (their use of each link is a fixed
// background): S is the flows on the links that changed. After the solve,
// every flow outside S on a link whose use changed must still have a
// bottleneck (a saturated link on which no flow is faster: the
// characterisation of max-min fairness), and no flow outside S may be faster
// than the S flows on the link that froze them. If so the allocation is the
// exact max-min one and only a handful of flows were touched; if not, the
// change reaches further and the whole component (every flow coupled to S
// through shared binding links) is solved, which is exact by construction.
//
// Only "binding" links take part: a link whose flows, each at its solo rate
// (the rate it would get alone: min over its links of capacity / load), would
// not fill it can never saturate first, so it is left out and each flow
// carries its solo rate as a private cap instead (exact). Progress is kept
// lazily per flow (remaining bytes at `last`); finish times sit in a heap
// ordered by (time, flow id), stale entries skipped by a version number.
// Scratch vectors are reused, so an event allocates nothing beyond growth.
#include <algorithm>
#include <bit>
#include <cmath>
#include <deque>
#include <limits>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <unordered_map>

#include "sim/network.hpp"

namespace megascope::sim {

namespace {

// Events this close together (relative) are one event: flows that finish
// "at the same time" up to rounding are reported together.
double tolerance(double t) { return 1e-12 * std::max(1.0, std::abs(t)); }
// A flow's latency as the network charges it: none if not positive and finite.
double latency_of(double latency_s) { return latency_s > 0 && std::isfinite(latency_s) ? latency_s : 0.0; }
constexpr double rel = 1e-9;  // saturation and rate comparisons
constexpr LinkId no_link = std::numeric_limits<LinkId>::max();

}  // namespace

struct Network::State {
  struct Member {
    std::uint32_t flow, k;  // slot, index into the flow's load
  };
  // A link's transferring flows: the first in the link's own record (most
  // links carry one flow at a time: a pipeline transfer on its NIC ports),
  // more in a buffer that grows and is kept. A flow's start then writes
  // nothing outside the link records it reads anyway.
  class Members {
   public:
    Members() = default;
    Members(const Members&) = delete;
    Members& operator=(const Members&) = delete;
    Members(Members&& o) noexcept : heap_(o.heap_), n_(o.n_), cap_(o.cap_), one_(o.one_) {
      o.heap_ = nullptr;
      o.n_ = 0;
      o.cap_ = 1;
    }
    Members& operator=(Members&&) = delete;
    ~Members() { delete[] heap_; }
    [[nodiscard]] std::size_t size() const { return n_; }
    [[nodiscard]] bool empty() const { return n_ == 0; }
    [[nodiscard]] const Member* begin() const { return heap_ ? heap_ : &one_; }
    [[nodiscard]] const Member* end() const { return begin() + n_; }
    [[nodiscard]] Member& operator[](std::size_t i) { return (heap_ ? heap_ : &one_)[i]; }
    [[nodiscard]] const Member& back() const { return begin()[n_ - 1]; }
    void pop_back() { --n_; }
    void push_back(Member m) {
      if (n_ == cap_) grow();
      (*this)[n_++] = m;
    }

   private:
    void grow() {
      const std::uint32_t cap = std::max<std::uint32_t>(4, 2 * cap_);
      auto* fresh = new Member[cap];
      std::copy(begin(), end(), fresh);
      delete[] heap_;
      heap_ = fresh;
      cap_ = cap;
    }
    Member* heap_ = nullptr;
    std::uint32_t n_ = 0, cap_ = 1;
    Member one_{0, 0};
  };
  // What every flow's start and end reads and writes of each of its links,
  // in one cache line (attach and detach touch every link of every flow;
  // the solve's scratch, needed on binding links only, is kept apart).
  struct alignas(64) Link {
    double capacity = 0;
    double demand = 0;          // sum over its flows of load x solo rate
    double usage = 0;           // sum over its flows of load x rate
    Members flows;              // transferring flows on this link
    std::uint32_t touched = 0;  // epoch
    std::uint32_t version = 0;  // of its water-filling level (heap entries)
    bool dirty = false;
  };
  static constexpr std::uint32_t kHeldBit = 0x80000000u;
  // A link's water-filling scratch and its fastest-flow cache.
  struct Fill {
    std::uint32_t solved = 0, max_epoch = 0;  // epochs
    double max_rate = 0;
    double set_usage = 0, residual = 0, unfrozen_load = 0;
    int unfrozen = 0;
  };
  // A normalised FlowSpec: links sorted and merged, positive weights only.
  struct Shape {
    std::vector<std::pair<LinkId, double>> load;
    double solo = 0;
    double payload = 0, latency = 0;
  };
  struct Flow {
    FlowId id = 0;
    std::uint32_t version = 0;
    std::span<const std::pair<LinkId, double>> load;   // its shape's, or `own`
    std::vector<std::pair<LinkId, double>> own;        // a flow started from a FlowSpec
    std::vector<std::uint32_t> pos;  // position in links[load[k].first].flows
    double remaining = 0, rate = 0, last = 0, new_rate = 0;
    double solo = 0;                 // rate alone on the network
    LinkId bottleneck = no_link;     // the link that froze it (no_link: its solo rate)
    LinkId new_bottleneck = no_link;
    std::uint32_t in_set = 0;        // epoch
    bool live = false, transferring = false, frozen = false;
  };
  static_assert(sizeof(Link) == 64, "a link record is one cache line");
  static_assert(std::is_nothrow_move_constructible_v<Flow>, "a Flow's load may point into its own storage");
  struct Event {
    double t;
    FlowId id;
    std::uint32_t slot, version;
  };
  struct Level {   // a link saturating, or (link == no_link) a flow reaching its solo rate
    double level;
    LinkId link;
    std::uint32_t version;  // the link's version, or the flow's slot
  };
  // Heap orders (function objects, so that the heap operations inline them).
  struct Later {
    bool operator()(const Event& a, const Event& b) const { return a.t > b.t || (a.t == b.t && a.id > b.id); }
  };
  struct Higher {
    bool operator()(const Level& a, const Level& b) const {
      return a.level > b.level ||
             (a.level == b.level && (a.link > b.link || (a.link == b.link && a.version > b.version)));
    }
  };
  static constexpr Later later{};
  static constexpr Higher higher{};
  // Can this link saturate before its flows reach their solo rates?
  static bool binding(const Link& L) { return L.flows.size() > 1 && L.demand > L.capacity * (1 + 1e-12); }

  std::vector<Link> links;
  std::vector<Fill> fill;     // per link, beside links
  // Links merged by seal(): link l keeps its state in links[rep[l]] (rep[l] =
  // l unless merged); the links merged into representative r are
  // dups[dup_begin[r] .. dup_begin[r + 1]). Only a merged link's heap
  // version is its own.
  std::vector<LinkId> rep;
  std::vector<std::uint32_t> dup_begin;
  std::vector<LinkId> dups;
  bool sealed = false;
  std::vector<Flow> flows;
  std::deque<Shape> shapes;   // prepared flows (a deque: their loads never move)
  std::vector<std::uint32_t> free_slots;
  std::vector<Event> events;  // heap
  double now = 0;
  FlowId next_id = 1;
  std::size_t live = 0;
  std::uint32_t epoch = 0, solve_epoch = 0;
  std::vector<LinkId> dirty, touched, solve_links;
  std::vector<std::pair<LinkId, double>> bottlenecks;  // (link, level) of this solve
  std::vector<std::uint32_t> set;
  std::vector<Level> levels;
  // Held flows (Network::hold), by handle.
  struct HeldFlow {
    Prepared shape = 0;
    double start = 0;
    bool held = false;   // false once admitted (the handle waits for its release)
  };
  std::vector<HeldFlow> held;
  std::vector<Held> free_held;
  // Per link: the live flows that load it (in their latency or
  // transferring), plus kHeldBit while a held flow loads it (held_on names
  // which). Apart from the link records, 16 links to a cache line: hold()
  // reads it for every link of every flow that starts, most of which it
  // finds idle without touching their records.
  std::vector<std::uint32_t> users;
  std::vector<Held> held_on;   // per link: the held flow on it, when its users have kHeldBit
  std::vector<std::pair<Held, FlowId>> admitted;   // by the last start()

  double normalise(const FlowSpec& f, std::vector<std::pair<LinkId, double>>& out) const;
  void seal();
  Link& state_of(LinkId l) { return links[rep[l]]; }
  Fill& fill_of(LinkId l) { return fill[rep[l]]; }
  FlowId begin(std::uint32_t slot, double solo, double payload, double latency_s, double at);
  std::uint32_t take_slot(double at);
  void admit_held_on(std::span<const std::pair<LinkId, double>> load);
  void admit(Held h);

  bool valid(const Event& e) const {
    const Flow& f = flows[e.slot];
    return f.live && f.version == e.version;
  }
  void push_event(double t, std::uint32_t slot) {
    const Flow& f = flows[slot];
    events.push_back(Event{t, f.id, slot, f.version});
    std::push_heap(events.begin(), events.end(), later);
  }
  void drop_stale() {
    while (!events.empty() && !valid(events.front())) {
      std::pop_heap(events.begin(), events.end(), later);
      events.pop_back();
    }
    if (events.size() > 4 * live + 1024) {  // compact
      std::erase_if(events, [&](const Event& e) { return !valid(e); });
      std::make_heap(events.begin(), events.end(), later);
    }
  }
  void touch(LinkId l) {
    if (links[l].touched != epoch) touched.push_back(l);
    links[l].touched = epoch;
  }
  void make_dirty(LinkId l) {
    if (!links[l].dirty) dirty.push_back(l);
    links[l].dirty = true;
  }
  void enlist(std::uint32_t slot) {
    if (flows[slot].in_set != epoch) set.push_back(slot);
    flows[slot].in_set = epoch;
  }
  // Epoch marks compare for equality: before the counter wraps, clear them.
  void renew_epochs() {
    if (epoch < 0xfffffff0u && solve_epoch < 0xfffffff0u) return;
    for (Link& L : links) L.touched = 0;
    for (Fill& F : fill) F.solved = F.max_epoch = 0;
    for (Flow& f : flows) f.in_set = 0;
    epoch = solve_epoch = 0;
  }
  // Puts a flow on its links. `resolve`: they need a re-solve (not for a held
  // flow admitted at its solo rate, whose links nothing else used).
  void attach(std::uint32_t slot, bool resolve = true) {
    Flow& f = flows[slot];
    f.pos.resize(f.load.size());
    for (std::uint32_t k = 0; k < f.load.size(); ++k) {
      Link& L = links[f.load[k].first];
      f.pos[k] = static_cast<std::uint32_t>(L.flows.size());
      L.flows.push_back(Member{slot, k});
      L.demand += f.load[k].second * f.solo;
      if (resolve) make_dirty(f.load[k].first);
    }
  }
  void detach(std::uint32_t slot) {
    Flow& f = flows[slot];
    for (std::uint32_t k = 0; k < f.load.size(); ++k) {
      Link& L = links[f.load[k].first];
      const std::uint32_t at = f.pos[k];
      const Member moved = L.flows.back();
      L.flows[at] = moved;
      flows[moved.flow].pos[moved.k] = at;
      L.flows.pop_back();
      L.demand = L.flows.empty() ? 0.0 : L.demand - f.load[k].second * f.solo;
      L.usage = L.flows.empty() ? 0.0 : L.usage - f.load[k].second * f.rate;
      make_dirty(f.load[k].first);
    }
  }
  void retire(std::uint32_t slot) {
    Flow& f = flows[slot];
    for (const auto& [l, w] : f.load) --users[l];
    f.live = false;
    f.transferring = false;
    ++f.version;
    free_slots.push_back(slot);
    --live;
  }

  // A flow outside the set keeps a bottleneck: its solo rate, or a saturated
  // link on which no flow is faster.
  bool has_bottleneck(const Flow& f) {
    if (f.bottleneck == no_link) return true;
    const Link& L = state_of(f.bottleneck);
    if (L.usage < L.capacity * (1 - rel)) return false;
    Fill& F = fill_of(f.bottleneck);
    if (F.max_epoch != epoch) {  // the fastest flow on the link, once per recompute
      F.max_epoch = epoch;
      F.max_rate = 0;
      for (const Member& m : L.flows) F.max_rate = std::max(F.max_rate, flows[m.flow].rate);
    }
    return F.max_rate <= f.rate * (1 + rel);
  }

  // Max-min rates for the set, the other flows' use of each link held fixed;
  // applies the new rates (pushing finish events) and touches the links whose
  // use changed.
  void solve() {
    ++solve_epoch;
    solve_links.clear();
    bottlenecks.clear();
    levels.clear();
    for (std::uint32_t slot : set) {
      Flow& f = flows[slot];
      catch_up(f);
      f.frozen = false;
      for (const auto& [l, w] : f.load) {
        if (!binding(links[l])) continue;
        Fill& F = fill[l];
        if (F.solved != solve_epoch) {
          F.solved = solve_epoch;
          F.set_usage = F.unfrozen_load = 0;
          F.unfrozen = 0;
          solve_links.push_back(l);
        }
        F.set_usage += w * f.rate;
        F.unfrozen_load += w;
        ++F.unfrozen;
      }
      levels.push_back(Level{f.solo, no_link, slot});
    }
    // A merged link takes part as itself (its own heap entries and version)
    // with its representative's state, exactly as it would unmerged.
    auto push_level = [&](LinkId l) {
      const Fill& F = fill_of(l);
      const std::uint32_t version = ++links[l].version;
      levels.push_back(Level{F.residual / std::max(F.unfrozen_load, 1e-300), l, version});
    };
    for (LinkId l : solve_links) {
      const Link& L = links[l];
      Fill& F = fill[l];
      F.residual = std::max(0.0, L.capacity - std::max(0.0, L.usage - F.set_usage));
      push_level(l);
      if (sealed)
        for (std::uint32_t d = dup_begin[l]; d < dup_begin[l + 1]; ++d) push_level(dups[d]);
    }
    std::make_heap(levels.begin(), levels.end(), higher);
    double floor = 0;
    auto freeze = [&](std::uint32_t slot, double level, LinkId by) {
      Flow& f = flows[slot];
      f.frozen = true;
      f.new_rate = level;
      f.new_bottleneck = by;
      for (const auto& [l2, w] : f.load) {
        Fill& F2 = fill[l2];
        if (F2.solved != solve_epoch) continue;
        F2.residual = std::max(0.0, F2.residual - level * w);
        F2.unfrozen_load -= w;
        --F2.unfrozen;
      }
    };
    while (!levels.empty()) {
      const Level top = levels.front();
      std::pop_heap(levels.begin(), levels.end(), higher);
      levels.pop_back();
      if (top.link == no_link) {  // a flow reaches its solo rate
        if (flows[top.version].frozen) continue;
        floor = std::max(top.level, floor);
        freeze(top.version, floor, no_link);
        continue;
      }
      // A link's level only rises as flows freeze elsewhere, so its heap key
      // is a lower bound: re-queue it at its current level if that is higher.
      const Link& L = state_of(top.link);
      const Fill& F = fill_of(top.link);
      if (top.version != links[top.link].version || F.unfrozen <= 0) continue;
      const double current = F.residual / std::max(F.unfrozen_load, 1e-300);
      if (current > top.level * (1 + 1e-12)) {
        push_level(top.link);
        std::push_heap(levels.begin(), levels.end(), higher);
        continue;
      }
      floor = std::max(top.level, floor);
      bottlenecks.emplace_back(top.link, floor);
      for (const Member& m : L.flows) {
        const Flow& f = flows[m.flow];
        if (f.in_set == epoch && !f.frozen) freeze(m.flow, floor, top.link);
      }
    }
    for (std::uint32_t slot : set) commit(slot);
  }

  // A flow's progress up to now at its current rate.
  void catch_up(Flow& f) {
    f.remaining = std::max(0.0, f.remaining - f.rate * (now - f.last));
    f.last = now;
  }
  // Applies a flow's new rate and bottleneck: its links' use, and a new
  // finish event when the rate changed (else its finish event stands).
  void commit(std::uint32_t slot) {
    Flow& f = flows[slot];
    f.bottleneck = f.new_bottleneck;
    if (f.new_rate == f.rate) return;
    for (const auto& [l, w] : f.load) {
      links[l].usage += w * (f.new_rate - f.rate);
      touch(l);
    }
    f.rate = f.new_rate;
    ++f.version;
    if (f.rate > 0) push_event(now + f.remaining / f.rate, slot);
  }

  // A transferring flow that is alone on every one of its links (a pipeline
  // transfer on its own NIC ports, typically): no other flow's rate depends
  // on it, nor its on theirs, so its max-min rate is its solo rate.
  bool isolated(const Flow& f) const {
    for (const auto& [l, w] : f.load)
      if (links[l].flows.size() != 1) return false;
    return true;
  }
  // What solve() does for a set of that one flow (its level is its solo
  // rate; none of its links is binding), through the same steps, without the
  // solve's heaps and scratch: pipeline transfers are most of the network's
  // flows. Marked as visited for this epoch, not as in the set.
  void settle_alone(std::uint32_t slot) {
    Flow& f = flows[slot];
    f.in_set = epoch;
    catch_up(f);
    f.frozen = true;   // as freeze() leaves it
    f.new_rate = std::max(f.solo, 0.0);
    f.new_bottleneck = no_link;
    commit(slot);
  }

  // Re-solves around the dirty links until the allocation is max-min fair.
  void recompute() {
    if (dirty.empty()) return;
    renew_epochs();
    ++epoch;
    set.clear();
    touched.clear();
    for (LinkId l : dirty) {
      links[l].dirty = false;
      touch(l);
      for (const Member& m : links[l].flows) {
        if (flows[m.flow].in_set == epoch) continue;
        if (isolated(flows[m.flow])) settle_alone(m.flow);
        else enlist(m.flow);
      }
    }
    dirty.clear();
    if (set.empty()) return;
    solve();
    bool fair = true;
    for (std::size_t i = 0; fair && i < touched.size(); ++i) {
      const Link& L = links[touched[i]];
      if (!binding(L)) continue;
      fair = std::all_of(L.flows.begin(), L.flows.end(), [&](const Member& m) {
        return flows[m.flow].in_set == epoch || has_bottleneck(flows[m.flow]);
      });
    }
    for (std::size_t i = 0; fair && i < bottlenecks.size(); ++i) {
      const LinkId l = bottlenecks[i].first;
      const double level = bottlenecks[i].second;  // not a structured binding: clang 14 cannot capture one
      const Link& L = state_of(l);
      fair = std::none_of(L.flows.begin(), L.flows.end(), [&](const Member& m) {
        return flows[m.flow].in_set != epoch && flows[m.flow].rate > level * (1 + rel);
      });
    }
    if (fair) return;
    // The change reaches further: solve the whole component, every flow
    // coupled to the set through binding links (exact, no check needed).
    for (std::size_t i = 0; i < set.size(); ++i)
      for (const auto& [l, w] : flows[set[i]].load)
        if (binding(links[l]) && links[l].touched != epoch + 1) {
          links[l].touched = epoch + 1;  // visited (touched lists are not needed any more)
          for (const Member& m : links[l].flows) enlist(m.flow);
        }
    ++epoch;  // keeps the set: re-mark it under the new epoch
    for (std::uint32_t slot : set) flows[slot].in_set = epoch;
    touched.clear();
    solve();
  }

  // One event: a flow's latency ends (it starts transferring, or is done if
  // it has nothing to transfer) or its transfer ends.
  void handle(const Event& e, std::vector<FlowId>& done) {
    Flow& f = flows[e.slot];
    if (f.transferring) {
      detach(e.slot);
      done.push_back(f.id);
      retire(e.slot);
    } else if (f.load.empty() || !(f.remaining > 0)) {
      done.push_back(f.id);
      retire(e.slot);
    } else {
      f.transferring = true;
      f.rate = 0;
      f.bottleneck = no_link;
      f.last = now;
      ++f.version;  // no event until its rate is known
      attach(e.slot);
    }
  }
};

Network::Network(const Topology& topo) : state_(std::make_shared<State>()) {
  const auto& links = topo.links();
  state_->links.resize(links.size());
  state_->fill.resize(links.size());
  state_->rep.resize(links.size());
  state_->users.resize(links.size());
  for (std::size_t i = 0; i < links.size(); ++i) {
    state_->links[i].capacity = links[i].capacity_Bps;
    state_->rep[i] = static_cast<LinkId>(i);
  }
}

// Two links are merged when they have the same capacity and every prepared
// flow puts the same load on both (or none on either): then every update
// one gets the other gets too, in the same order, and their states stay
// equal (bit for bit). Each class keeps its lowest link as representative;
// flows carry only representatives, and the solve lets a merged link take
// part under its own id and heap version with the shared state, so that ties
// and re-queued levels resolve exactly as without merging.
void Network::State::seal() {
  if (sealed) throw std::logic_error("Network::seal: already sealed");
  if (next_id != 1) throw std::logic_error("Network::seal: flows have started");
  const std::size_t n = links.size();
  // The shapes loading each link, in shape order, with their loads.
  std::vector<std::uint32_t> begin(n + 1, 0);
  for (const Shape& sh : shapes)
    for (const auto& [l, w] : sh.load) ++begin[l + 1];
  for (std::size_t l = 0; l < n; ++l) begin[l + 1] += begin[l];
  std::vector<std::pair<std::uint32_t, double>> uses(begin[n]);
  std::vector<std::uint32_t> cursor(begin.begin(), begin.end() - 1);
  for (std::uint32_t i = 0; i < shapes.size(); ++i)
    for (const auto& [l, w] : shapes[i].load) uses[cursor[l]++] = {i, w};
  const auto uses_of = [&](std::size_t l) {
    return std::span<const std::pair<std::uint32_t, double>>(uses.data() + begin[l], begin[l + 1] - begin[l]);
  };
  std::unordered_map<std::uint64_t, std::vector<LinkId>> classes;   // by hash: representatives
  for (std::size_t l = 0; l < n; ++l) {
    if (begin[l] == begin[l + 1]) continue;
    std::uint64_t h = std::bit_cast<std::uint64_t>(links[l].capacity);
    for (const auto& [i, w] : uses_of(l)) {
      h ^= (std::bit_cast<std::uint64_t>(w) + 0x9e3779b97f4a7c15ULL * (i + 1)) + (h << 6) + (h >> 2);
      h *= 0xff51afd7ed558ccdULL;
    }
    auto& reps = classes[h];
    const auto same = [&](LinkId r) {
      const auto a = uses_of(l), b = uses_of(r);
      return links[r].capacity == links[l].capacity && std::equal(a.begin(), a.end(), b.begin(), b.end());
    };
    const auto it = std::find_if(reps.begin(), reps.end(), same);
    if (it != reps.end()) rep[l] = *it;
    else reps.push_back(static_cast<LinkId>(l));
  }
  dup_begin.assign(n + 1, 0);
  for (std::size_t l = 0; l < n; ++l)
    if (rep[l] != l) ++dup_begin[rep[l] + 1];
  for (std::size_t l = 0; l < n; ++l) dup_begin[l + 1] += dup_begin[l];
  dups.assign(dup_begin[n], 0);
  std::vector<std::uint32_t> at(dup_begin.begin(), dup_begin.end() - 1);
  for (std::size_t l = 0; l < n; ++l)
    if (rep[l] != l) dups[at[rep[l]]++] = static_cast<LinkId>(l);
  for (Shape& sh : shapes) std::erase_if(sh.load, [&](const auto& e) { return rep[e.first] != e.first; });
  sealed = true;
}

// Checks and normalises a FlowSpec's load into `out` (links sorted, repeated
// links merged, weights > 0) and returns its solo rate.
double Network::State::normalise(const FlowSpec& f, std::vector<std::pair<LinkId, double>>& out) const {
  out.clear();
  for (const auto& [l, w] : f.load) {
    if (l >= links.size()) throw std::out_of_range("Network::start: link " + std::to_string(l) + " is not in the topology");
    if (w > 0) out.emplace_back(l, w);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::size_t w = 0;  // merge repeated links
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (w > 0 && out[w - 1].first == out[i].first) {
      out[w - 1].second += out[i].second;
    } else {
      out[w++] = out[i];
    }
  }
  out.resize(w);
  double solo = std::numeric_limits<double>::infinity();
  for (const auto& [l, x] : out) solo = std::min(solo, links[l].capacity / x);
  return solo;
}

// Starts a flow in `slot` (its load already set): the common part of both starts.
// Started at `at`: now, or a held flow's start (admit).
FlowId Network::State::begin(std::uint32_t slot, double solo, double payload, double latency_s, double at) {
  Flow& fl = flows[slot];
  fl.solo = solo;
  fl.id = next_id++;
  ++fl.version;
  fl.remaining = std::max(0.0, payload);
  fl.rate = 0;
  fl.last = at;
  fl.live = true;
  fl.transferring = false;
  ++live;
  for (const auto& [l, w] : fl.load) ++users[l];
  push_event(at + latency_of(latency_s), slot);
  // Its links' records are read when its latency ends (attach): on a large
  // cluster they are no longer in the core's caches, so fetch them now,
  // while other events run.
  for (const auto& [l, w] : fl.load) __builtin_prefetch(&links[l], 1);
  return fl.id;
}

// Admits the held flows on any link of `load` (before a flow that loads it starts).
void Network::State::admit_held_on(std::span<const std::pair<LinkId, double>> load) {
  for (const auto& [l, w] : load)
    if (users[l] & kHeldBit) admit(held_on[l]);
}

// Held flow h enters the network as the flow it would be had it started at
// its start time: in its latency (the same event), or transferring at its
// solo rate since its latency ended, alone on its links until now (what
// handle() and settle_alone() would have made of it; its links are not
// marked dirty, as nothing about them changed). Its id is the next one.
void Network::State::admit(Held h) {
  HeldFlow& hf = held[h];
  hf.held = false;
  const Shape& sh = shapes[hf.shape];
  for (const auto& [l, w] : sh.load) users[l] &= ~kHeldBit;
  const std::uint32_t slot = take_slot(now);
  Flow& fl = flows[slot];
  fl.load = sh.load;
  admitted.emplace_back(h, begin(slot, sh.solo, sh.payload, sh.latency, hf.start));
  const double attached = hf.start + latency_of(sh.latency);
  if (attached > now || fl.load.empty() || !(fl.remaining > 0)) return;   // its latency event stands
  fl.transferring = true;
  fl.last = attached;
  fl.bottleneck = no_link;
  attach(slot, false);
  for (const auto& [l, w] : fl.load) links[l].usage += w * fl.solo;
  fl.rate = fl.solo;
  ++fl.version;   // its latency event is spent
  push_event(attached + fl.remaining / fl.rate, slot);
}

std::uint32_t Network::State::take_slot(double at) {
  if (at > now) now = at;  // never earlier than the network's clock
  std::uint32_t slot;
  if (!free_slots.empty()) {
    slot = free_slots.back();
    free_slots.pop_back();
  } else {
    slot = static_cast<std::uint32_t>(flows.size());
    flows.emplace_back();
  }
  return slot;
}

FlowId Network::start(const FlowSpec& f, double now) {
  State& s = *state_;
  if (s.sealed) throw std::logic_error("Network::start: a sealed network starts prepared flows only");
  std::vector<std::pair<LinkId, double>> load;
  const double solo = s.normalise(f, load);
  s.admitted.clear();
  if (now > s.now) s.now = now;   // the clock first: admissions see it
  s.admit_held_on(load);
  const std::uint32_t slot = s.take_slot(now);
  State::Flow& fl = s.flows[slot];
  fl.own = std::move(load);
  fl.load = fl.own;
  return s.begin(slot, solo, f.payload_bytes, f.latency_s, s.now);
}

Network::Prepared Network::prepare(const FlowSpec& f) {
  State& s = *state_;
  if (s.sealed) throw std::logic_error("Network::prepare: the network is sealed");
  State::Shape& shape = s.shapes.emplace_back();
  shape.solo = s.normalise(f, shape.load);
  shape.payload = f.payload_bytes;
  shape.latency = f.latency_s;
  return static_cast<Prepared>(s.shapes.size() - 1);
}

FlowId Network::start(Prepared f, double now) {
  State& s = *state_;
  if (f >= s.shapes.size()) throw std::out_of_range("Network::start: no prepared flow " + std::to_string(f));
  const State::Shape& shape = s.shapes[f];
  s.admitted.clear();
  if (now > s.now) s.now = now;   // the clock first: admissions see it
  s.admit_held_on(shape.load);
  const std::uint32_t slot = s.take_slot(now);
  s.flows[slot].load = shape.load;
  return s.begin(slot, shape.solo, shape.payload, shape.latency, s.now);
}

std::optional<Network::Held> Network::hold(Prepared f, double now) {
  State& s = *state_;
  if (f >= s.shapes.size()) throw std::out_of_range("Network::hold: no prepared flow " + std::to_string(f));
  const State::Shape& shape = s.shapes[f];
  for (const auto& [l, w] : shape.load)
    if (s.users[l] != 0) return std::nullopt;
  Held h;
  if (!s.free_held.empty()) {
    h = s.free_held.back();
    s.free_held.pop_back();
  } else {
    h = static_cast<Held>(s.held.size());
    s.held.emplace_back();
  }
  s.held[h] = {f, now, true};
  if (s.held_on.size() < s.links.size()) s.held_on.resize(s.links.size());
  for (const auto& [l, w] : shape.load) {
    s.users[l] = State::kHeldBit;
    s.held_on[l] = h;
  }
  return h;
}

bool Network::release(Held h) {
  State& s = *state_;
  if (h >= s.held.size()) throw std::out_of_range("Network::release: no held flow " + std::to_string(h));
  State::HeldFlow& hf = s.held[h];
  const bool was_held = hf.held;
  if (was_held)
    for (const auto& [l, w] : s.shapes[hf.shape].load) s.users[l] &= ~State::kHeldBit;
  hf.held = false;
  s.free_held.push_back(h);
  return was_held;
}

std::span<const std::pair<Network::Held, FlowId>> Network::admitted() const { return state_->admitted; }

void Network::seal() { state_->seal(); }

std::span<const std::pair<LinkId, double>> Network::links_of(Prepared f) const {
  const State& s = *state_;
  if (f >= s.shapes.size()) throw std::out_of_range("Network::links_of: no prepared flow " + std::to_string(f));
  return s.shapes[f].load;
}

Network::LoneTerms Network::lone_terms(Prepared f) const {
  const State& s = *state_;
  if (f >= s.shapes.size()) throw std::out_of_range("Network::lone_terms: no prepared flow " + std::to_string(f));
  const State::Shape& shape = s.shapes[f];
  // As begin(), handle() and solve() do for a flow alone on its links: the
  // latency event, then the transfer at the solo rate.
  LoneTerms t;
  t.latency = latency_of(shape.latency);
  const double remaining = std::max(0.0, shape.payload);
  if (!shape.load.empty() && remaining > 0) t.transfer = remaining / shape.solo;
  return t;
}

std::optional<double> Network::next_event_time() const {
  State& s = *state_;
  s.recompute();
  s.drop_stale();
  if (s.events.empty()) return std::nullopt;
  return std::max(s.events.front().t, s.now);
}

std::vector<FlowId> Network::advance_to(double t) {
  std::vector<FlowId> done;
  advance_to(t, done);
  return done;
}

void Network::advance_to(double t, std::vector<FlowId>& done) {
  State& s = *state_;
  done.clear();
  if (!(t >= s.now)) t = s.now;
  s.recompute();
  for (;;) {
    s.drop_stale();
    if (s.events.empty() || s.events.front().t > t + tolerance(t)) break;
    const double at = std::max(s.now, s.events.front().t);
    s.now = at;
    while (!s.events.empty()) {
      s.drop_stale();
      if (s.events.empty() || s.events.front().t > at + tolerance(at)) break;
      const State::Event e = s.events.front();
      std::pop_heap(s.events.begin(), s.events.end(), State::later);
      s.events.pop_back();
      s.handle(e, done);
    }
    s.recompute();
  }
  s.now = std::max(s.now, t);
  std::sort(done.begin(), done.end());
}

std::size_t Network::active() const { return state_->live; }

}  // namespace megascope::sim
