// Estimator::Impl, shared by planner/estimate.cpp (memory, the caches and
// the entry points) and planner/estimate_time.cpp (the step time): the
// cache keys and entries, collective tables and layer probes.
#pragma once

#include "planner/estimate.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <stdexcept>
#include <unordered_map>

#include "core/accounting/activations.hpp"
#include "core/accounting/inflight.hpp"
#include "core/accounting/memory.hpp"
#include "core/accounting/params.hpp"
#include "core/program/builder.hpp"
#include "core/rank_grid.hpp"
#include "core/setup.hpp"
#include "sim/engine.hpp"
#include "sim/network.hpp"

namespace megascope::planner {

namespace estimate_detail {

// Cache keys: the fields a cached value depends on, packed into two words
// with a width per field; a value too wide for its field throws instead of
// colliding (20 bits hold any tp, pp, vpp, cp, ep, etp or micro-batch size;
// the activation key packs ep in 16 and etp in 15, which hold any value of
// the Candidate's int16 fields; 12 bits any layer count of a stage).
using Key = std::array<std::uint64_t, 2>;
struct KeyHash {
  std::size_t operator()(const Key& k) const {
    const std::uint64_t h = (k[0] ^ (k[1] * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
    return static_cast<std::size_t>(h ^ (h >> 31));
  }
};
struct KeyEq {   // two compares, not a call of memcmp
  bool operator()(const Key& a, const Key& b) const { return a[0] == b[0] && a[1] == b[1]; }
};
[[noreturn, gnu::noinline, gnu::cold]] inline void key_overflow(std::int64_t v, int bits) {
  throw std::length_error(fmt::format("stage-1 cache key: {} does not fit in {} bits", v, bits));
}
// v, checked to fit in `bits`, shifted to bit `at`.
inline std::uint64_t field(std::int64_t v, int bits, int at) {
  if (static_cast<std::uint64_t>(v) >> bits != 0) [[unlikely]]
    key_overflow(v, bits);
  return static_cast<std::uint64_t>(v) << at;
}
using LayoutKey = Key;   // tp, pp, vpp, schedule | ep, etp, first and last stage layers
using ActKey = Key;      // tp, cp, mbs, sp, recompute | ep, etp, recompute modules
using TimeKey = Key;     // ActKey's fields (of recomputation, the selective set only) | ... and one stage or more, GPUs, TP overlap
using CommKey = Key;     // GPUs, collective, group size | stride

// The entry of the latest key: consecutive candidates mostly share their
// layout, activations and layer times (the enumeration varies the flags
// innermost), so most lookups skip the hash. Map entries never move.
template <class K, class V>
struct LastEntry {
  K key{};
  const V* value = nullptr;
  const V* find(const K& k) const { return value && KeyEq{}(key, k) ? value : nullptr; }
  const V* keep(const K& k, const V* v) {
    key = k;
    value = v;
    return v;
  }
};

struct LayerAct {
  double stored = 0, checkpoint = 0, wgs = 0;
};
struct ActEntry {
  LayerAct dense, moe;
  double embedding = 0, output = 0;
};

struct LayerTime {
  double f = 0, b = 0, w = 0;
  // Of each pass, the collectives over groups that leave the scale-up
  // domain (its scale-out links, which the sharded DP traffic shares).
  double net_f = 0, net_b = 0, net_w = 0;
  double fb_saving = 0;   // a DualPipe F&B pair through the layer, sequential less interleaved (probe_fb_pair)
};
struct TimeEntry {
  bool has_fb = false;    // fb_saving filled (DualPipe candidates only)
  LayerTime dense, moe;
  double emb_f = 0, emb_w = 0, out_f = 0, out_b = 0, out_w = 0;
};

struct ChunkInfo {
  int count = 0;
  int virtual_stage = 0;
  bool embedding = false, loss = false;   // holds the embedding; the output layer and loss
  std::vector<int> moe_prefix;   // moe layers among the chunk's first k layers, k = 0..count
};
struct RankLayout {
  ParamSplit params;
  std::vector<ChunkInfo> chunks;
  int dense_layers = 0, moe_layers = 0;
  bool embedding = false, output = false;
};
struct Layout {
  std::vector<RankLayout> ranks;
  int virtual_stages = 0;
  bool last_layer_moe = false;
  // One rank's parameters of a dense and of a MoE layer (ZeRO-2/3's units),
  // and of a MoE layer its dense and expert parts.
  double unit_dense = 0, unit_moe = 0;
  ParamSplit moe_unit;
};

// Isolated collective time over one group of one topology, by size.
// A communication time, and its part over scale-out links.
struct Link {
  double all = 0, net = 0;
  Link operator+(const Link& o) const { return {all + o.all, net + o.net}; }
  Link operator*(double k) const { return {all * k, net * k}; }
};

struct CommTable {
  std::vector<int> devices;      // group members (device ids)
  sim::CollectiveCurve curve;
  bool scale_out = false;        // the group spans more than one scale-up domain
};

}  // namespace estimate_detail

using namespace estimate_detail;


struct Estimator::Impl {
  SearchInputs in;
  sim::CostModel cost;
  BytesPerParam bpp;
  bool have_bpp = false;
  std::unordered_map<LayoutKey, Layout, KeyHash, KeyEq> layouts;
  std::unordered_map<ActKey, ActEntry, KeyHash, KeyEq> acts;
  std::unordered_map<TimeKey, TimeEntry, KeyHash, KeyEq> times;
  std::unordered_map<TimeKey, const TimeEntry*, KeyHash, KeyEq> time_bases;   // layer_times
  std::map<std::array<int, 3>, std::vector<int>> units;   // fb_units
  // inflight_candidates by (schedule, pp, vpp, m, rank), with each one's total.
  struct Peaks {
    std::vector<std::vector<int>> counts;
    std::vector<int> totals;
  };
  std::map<std::array<int, 5>, Peaks> peaks;
  std::vector<int> odd_chunks;   // scratch: chunks whose bytes differ from the rank's common value
  const Peaks* last_peaks = nullptr;   // the last key's entry of `peaks`
  std::array<int, 5> last_peaks_key{};
  std::vector<double> chunk_bytes;   // scratch: per chunk of a rank, one micro-batch's activations
  std::map<int, sim::Topology> topologies;
  std::unordered_map<CommKey, CommTable, KeyHash, KeyEq> comm;
  LastEntry<Key, Layout> last_layout;
  LastEntry<Key, ActEntry> last_act;
  LastEntry<Key, TimeEntry> last_time;
  std::vector<double> back;   // scratch: per rank, B + W of one micro-batch
  std::vector<ChunkInflight> inflight;   // scratch: per chunk of a rank, its in-flight micro-batches

  int domain = 1;   // devices per scale-up domain

  Impl(const SearchInputs& i, const sim::CostModel& c)
      : in(i), cost(c),
        domain(i.cluster.scale_up_domain > 0 ? i.cluster.scale_up_domain : std::max(1, i.cluster.node.devices_per_node)) {}

  Result<Setup> setup_of(const Candidate& c) {
    auto s = validate_setup(in.model, in.cluster, in.training, to_plan(c), c.gpus);
    if (s && !have_bpp) {
      bpp = bytes_per_param(*s);
      have_bpp = true;
    }
    return s;
  }

  // Weight bytes per parameter: the 16-bit weights (and their FP8 copy), or
  // the FP8 weights alone with fp8_param_gather (bytes_per_param's rule).
  double weight_bytes(const Candidate& c) const {
    if (c.fp8_param_gather) return 1.0;
    return bytes_of(in.training.params_dtype) + (in.training.precision == Precision::fp8 ? 1.0 : 0.0);
  }
  double gather_bytes(const Candidate& c) const { return c.fp8_param_gather ? 1.0 : bytes_of(in.training.params_dtype); }

  // zero 2 and 3: one rank's parameters of a dense layer and of a MoE layer
  // (the FSDP units), and the rest of the rank's (embedding, output, MTP).
  struct Units {
    double dense = 0, moe = 0, root = 0;
  };
  static Units units_of(const Layout& lay, const RankLayout& rl) {
    Units u;
    u.dense = lay.unit_dense;
    u.moe = lay.unit_moe;
    u.root = std::max(0.0, rl.params.total() - rl.dense_layers * u.dense - rl.moe_layers * u.moe);
    return u;
  }

  static RankGrid grid_of(const Candidate& c) {
    const int edp = c.gpus / (c.etp * c.ep * c.pp);
    return RankGrid{c.tp, c.cp, c.dp, c.pp, c.etp, c.ep, edp, c.dp_replicas > 1 ? shard_size(c) : 0};
  }
  // The group the sharded collectives run over: DP x CP, or with HSDP one replica of it.
  static CommGroup shard_group(const Candidate& c) { return c.dp_replicas > 1 ? CommGroup::dp_shard : CommGroup::dp_cp; }
  // The members of that group: DP x CP, or one replica's share of it.
  static int shard_size(const Candidate& c) { return c.dp * c.cp / c.dp_replicas; }

  const sim::Topology& topology(int n) {
    auto it = topologies.find(n);
    if (it == topologies.end()) it = topologies.emplace(n, sim::Topology::build(in.cluster, n)).first;
    return it->second;
  }

  // Rank 0's group as (size, stride): every group of rank 0 is 0, stride, 2 stride, ...
  static std::pair<int, int> group_shape(const RankGrid& g, CommGroup group, sim::Collective kind) {
    switch (group) {
      case CommGroup::tp: return {g.tp, 1};
      case CommGroup::cp: return {g.cp, g.tp};
      case CommGroup::dp: return {g.dp, g.tp * g.cp};
      case CommGroup::dp_cp: return {g.dp * g.cp, g.tp};
      case CommGroup::pp:   // point-to-point: rank 0 and the next stage
        return {kind == sim::Collective::send_recv ? std::min(2, g.pp) : g.pp, g.tp * g.cp * g.dp};
      case CommGroup::etp: return {g.etp, 1};
      case CommGroup::ep: return {g.ep, g.etp};
      case CommGroup::edp: return {g.edp, g.etp * g.ep};
      case CommGroup::embedding: return {std::min(2, g.pp), g.tp * g.cp * g.dp * std::max(1, g.pp - 1)};
      case CommGroup::dp_shard: return {g.shard > 0 ? g.shard : g.dp * g.cp, g.tp};
      case CommGroup::dp_replica: return {g.shard > 0 ? g.dp * g.cp / g.shard : 1, g.tp * (g.shard > 0 ? g.shard : 1)};
    }
    return {1, 1};
  }

  // The table of a collective over rank 0's `group`; nullptr when the group has one member.
  CommTable* table(int n, const RankGrid& grid, sim::Collective kind, CommGroup group) {
    const auto [size, stride] = group_shape(grid, group, kind);
    if (size < 2) return nullptr;
    const CommKey key = {field(n, 24, 0) | field(static_cast<std::int64_t>(kind), 8, 24) | field(size, 24, 32),
                         static_cast<std::uint64_t>(stride)};
    auto it = comm.find(key);
    if (it == comm.end()) {
      CommTable t;
      for (int i = 0; i < size; ++i) t.devices.push_back(i * stride);
      if (kind != sim::Collective::send_recv)
        MEGASCOPE_CHECK(t.devices == grid.group(0, group), "group shape differs from the rank grid's group");
      t.curve = sim::collective_curve(topology(n), kind, t.devices);
      t.scale_out = t.devices.front() / domain != t.devices.back() / domain;
      it = comm.emplace(key, std::move(t)).first;
    }
    return &it->second;
  }

  // Seconds of `bytes` per rank on a table (exactly the simulator's isolated time).
  static double time_on(const CommTable* t, double bytes) { return t ? t->curve.at(bytes) : 0.0; }

  double comm_s(int n, const RankGrid& grid, sim::Collective kind, CommGroup group, double bytes) {
    return time_on(table(n, grid, kind, group), bytes);
  }

  // Runs one probe's ops on their streams for one rank of an idle cluster;
  // returns when its `last` op ends (`all`: when its last op to end does).
  // `net`, when given, gets the time of its collectives over scale-out groups.
  double run_probe(const LayerProbe& p, int n, const RankGrid& grid, bool all = false, double* net = nullptr) {
    const std::vector<double> dur = sim::compute_durations(p.ops, cost);
    std::array<double, kStreamCount> free{};
    std::vector<double> end(p.ops.ops.size(), 0.0);
    for (std::size_t i = 0; i < p.ops.ops.size(); ++i) {
      const Op& op = p.ops.ops[i];
      double start = free[static_cast<std::size_t>(op.stream)];
      for (std::uint32_t d = op.dep_begin; d < op.dep_begin + op.dep_count; ++d)
        start = std::max(start, end[p.ops.deps[d]]);
      double t = dur[i];
      if (op.kind != OpKind::compute) {
        const CommTable* tb = table(n, grid, sim::collective_of(op), op.group);
        t = time_on(tb, op.bytes);
        if (net && tb && tb->scale_out) *net += t;
      }
      end[i] = start + t;
      free[static_cast<std::size_t>(op.stream)] = end[i];
    }
    if (all) return end.empty() ? 0.0 : *std::max_element(end.begin(), end.end());
    return p.ops.ops.empty() ? 0.0 : end[p.last];
  }

  // DualPipe(V)'s F&B units per pipeline rank (make_schedule), by (schedule, pp, m).
  const std::vector<int>& fb_units(Schedule sch, int pp, int m) {
    const std::array<int, 3> key{static_cast<int>(sch), pp, m};
    auto it = units.find(key);
    if (it != units.end()) return it->second;
    std::vector<int> n(static_cast<std::size_t>(pp), 0);
    const std::vector<RankSchedule> steps = make_schedule(sch, pp, 1, m);
    for (int r = 0; r < pp; ++r) {
      const RankSchedule& st = steps[static_cast<std::size_t>(r)];
      for (std::size_t i = 1; i < st.size(); ++i)
        n[static_cast<std::size_t>(r)] += st[i].pass == Pass::B && st[i].paired && st[i - 1].pass == Pass::F;
    }
    return units.emplace(key, std::move(n)).first->second;
  }

  static LayoutKey layout_key(const Candidate& c) {
    return {field(c.tp, 20, 0) | field(c.pp, 20, 20) | field(c.vpp, 16, 40) | field(c.embedding_in_split, 1, 56) |
                field(c.loss_in_split, 1, 57) | field(static_cast<std::int64_t>(c.schedule), 4, 60),
            field(c.ep, 20, 0) | field(c.etp, 20, 20) | field(c.first_layers, 12, 40) | field(c.last_layers, 12, 52)};
  }

  Result<const Layout*> layout(const Candidate& c) {
    const LayoutKey key = layout_key(c);
    if (const Layout* l = last_layout.find(key)) return l;
    if (auto it = layouts.find(key); it != layouts.end()) return last_layout.keep(key, &it->second);
    auto valid = setup_of(c);
    if (!valid) return tl::unexpected(valid.error());
    const Setup& s = *valid;
    Layout l;
    l.virtual_stages = s.virtual_stages;
    l.last_layer_moe = s.model.is_moe_layer(s.model.num_layers - 1);
    const Sharding sh{s.plan.tp, s.etp, s.plan.ep};
    for (int layer = 0; layer < s.model.num_layers && (l.unit_dense == 0 || l.unit_moe == 0); ++layer) {
      const ParamSplit ps = layer_params(s.model, layer, sh);
      if (!s.model.is_moe_layer(layer)) {
        if (l.unit_dense == 0) l.unit_dense = ps.total();
      } else if (l.unit_moe == 0) {
        l.unit_moe = ps.total();
        l.moe_unit = ps;
      }
    }
    for (int r = 0; r < s.plan.pp; ++r) {
      RankLayout rl;
      rl.params = rank_params(s, r);
      rl.embedding = s.holds_embedding(r);
      rl.output = s.holds_output(r);
      for (const ChunkLayers& ch : s.chunks[static_cast<std::size_t>(r)]) {
        ChunkInfo ci;
        ci.count = ch.count;
        ci.virtual_stage = ch.virtual_stage;
        ci.embedding = ch.embedding;
        ci.loss = ch.loss;
        ci.moe_prefix.assign(static_cast<std::size_t>(ch.count) + 1, 0);
        for (int i = 0; i < ch.count; ++i)
          ci.moe_prefix[static_cast<std::size_t>(i) + 1] =
              ci.moe_prefix[static_cast<std::size_t>(i)] + (s.model.is_moe_layer(ch.first + i) ? 1 : 0);
        rl.moe_layers += ci.moe_prefix.back();
        rl.dense_layers += ch.count - ci.moe_prefix.back();
        rl.chunks.push_back(std::move(ci));
      }
      l.ranks.push_back(std::move(rl));
    }
    return last_layout.keep(key, &layouts.emplace(key, std::move(l)).first->second);
  }

  static ActKey act_key(const Candidate& c) {
    return {field(c.tp, 20, 0) | field(c.cp, 20, 20) | field(c.mbs, 20, 40) | field(c.sp, 1, 60) |
                field(static_cast<std::int64_t>(c.recompute), 3, 61),
            field(c.ep, 16, 0) | field(c.etp, 15, 16) | field(c.recompute_modules, 7, 31)};
  }

  // The first layer of each kind (dense, MoE); -1 when the model has none.
  std::pair<int, int> kind_layers() const {
    int dense = -1, moe = -1;
    for (int l = 0; l < in.model.num_layers; ++l) {
      if (in.model.is_moe_layer(l)) {
        if (moe < 0) moe = l;
      } else if (dense < 0) {
        dense = l;
      }
    }
    return {dense, moe};
  }

  Result<const ActEntry*> activations(const Candidate& c) {
    const ActKey key = act_key(c);
    if (const ActEntry* a = last_act.find(key)) return a;
    if (auto it = acts.find(key); it != acts.end()) return last_act.keep(key, &it->second);
    auto have = setup_of(c);
    if (!have) return tl::unexpected(have.error());
    ActEntry e;
    const auto [dense, moe] = kind_layers();
    const auto fill = [&](int layer, LayerAct& out) {
      if (layer < 0) return;
      const LayerActivations la = layer_activations(*have, layer);
      out = {la.stored, la.checkpoint, la.weight_grad_state};
    };
    fill(dense, e.dense);
    fill(moe, e.moe);
    const EdgeActivations edges = edge_activations(*have);
    e.embedding = edges.embedding_bytes();
    e.output = edges.output_bytes();
    return last_act.keep(key, &acts.emplace(key, e).first->second);
  }

  // The layer and edge times of a candidate's micro-batch. Recomputation
  // changes one probe only: the layer's input-gradient op, which runs the
  // selective set's forward kernels again (builder.cpp probe_layer; full
  // recomputation's extra forward is counted from F). So the key keeps of
  // it only the selective set, and an entry takes its forwards,
  // weight-gradient ops and edges from any entry of the same other fields
  // (`time_bases`), probing only the input-gradient ops anew.
  Result<const TimeEntry*> layer_times(const Candidate& c) {
    const ActKey a = act_key(c);
    const bool selective = c.recompute == RecomputeGranularity::selective;
    // A single stage holds both embedding tables: tied, they share one
    // gradient, which changes the edge ops' work (builder.cpp).
    const TimeKey base = {a[0] & ~field(7, 3, 61),
                          (a[1] & ~field(127, 7, 31)) | field(c.pp == 1, 1, 39) | field(c.gpus, 23, 40) |
                              field(c.tp_comm_overlap, 1, 63)};
    const TimeKey key = {base[0] | field(selective, 1, 61), base[1] | field(selective ? c.recompute_modules : 0, 7, 31)};
    const bool fb = c.schedule == Schedule::dualpipe || c.schedule == Schedule::dualpipev;
    if (const TimeEntry* t = last_time.find(key); t && (t->has_fb || !fb)) return t;
    if (auto it = times.find(key); it != times.end()) {
      if (fb && !it->second.has_fb) {
        auto s = setup_of(c);
        if (!s) return tl::unexpected(s.error());
        fill_fb(*s, c.gpus, grid_of(c), it->second);
      }
      return last_time.keep(key, &it->second);
    }
    auto s = setup_of(c);
    if (!s) return tl::unexpected(s.error());
    const RankGrid grid = grid_of(c);
    TimeEntry e;
    const auto [dense, moe] = kind_layers();
    const TimeEntry* shared = nullptr;   // an entry of the same split, any recomputation
    if (auto it = time_bases.find(base); it != time_bases.end()) shared = it->second;
    const auto fill_one = [&](int layer, LayerTime& out, const LayerTime* from) {
      out.net_f = from ? from->net_f : 0.0;
      out.net_w = from ? from->net_w : 0.0;
      out.net_b = 0;
      out.f = from ? from->f : run_probe(probe_layer(*s, layer, LayerPass::forward), c.gpus, grid, false, &out.net_f);
      out.b = run_probe(probe_layer(*s, layer, LayerPass::backward_input), c.gpus, grid, false, &out.net_b);
      out.w = from ? from->w
                   : run_probe(probe_layer(*s, layer, LayerPass::backward_weight), c.gpus, grid, false, &out.net_w);
    };
    // A model with sliding-window layers: each kind's time is the mean of
    // its windowed and its full layers', weighted by how many it has of each
    // (exact over a chunk that holds the model's mix, as alternating layers do).
    const auto fill = [&](int layer, LayerTime& out, const LayerTime* from) {
      if (layer < 0) return;
      fill_one(layer, out, from);
      const ModelSpec& m = in.model;
      if (m.window_size <= 0) return;
      const bool moe_kind = m.is_moe_layer(layer);
      int other = -1, same = 0, total = 0;
      for (int l = 0; l < m.num_layers; ++l) {
        if (m.is_moe_layer(l) != moe_kind) continue;
        ++total;
        if (m.is_window_layer(l) == m.is_window_layer(layer)) ++same;
        else if (other < 0) other = l;
      }
      if (other < 0) return;
      LayerTime o;
      fill_one(other, o, from);   // with `from`, f and w are its (already the mix's)
      const double own = static_cast<double>(same) / total, rest = 1 - own;
      out.f = own * out.f + rest * o.f;
      out.b = own * out.b + rest * o.b;
      out.w = own * out.w + rest * o.w;
      out.net_f = own * out.net_f + rest * o.net_f;
      out.net_b = own * out.net_b + rest * o.net_b;
      out.net_w = own * out.net_w + rest * o.net_w;
    };
    fill(dense, e.dense, shared ? &shared->dense : nullptr);
    fill(moe, e.moe, shared ? &shared->moe : nullptr);
    if (shared) {
      const TimeEntry& b = *shared;
      e.emb_f = b.emb_f;
      e.emb_w = b.emb_w;
      e.out_f = b.out_f;
      e.out_b = b.out_b;
      e.out_w = b.out_w;
    } else {
      e.emb_f = run_probe(probe_edge(*s, EdgePass::embedding_forward), c.gpus, grid);
      e.emb_w = run_probe(probe_edge(*s, EdgePass::embedding_weight), c.gpus, grid);
      e.out_f = run_probe(probe_edge(*s, EdgePass::output_forward), c.gpus, grid);
      e.out_b = run_probe(probe_edge(*s, EdgePass::output_backward_input), c.gpus, grid);
      e.out_w = run_probe(probe_edge(*s, EdgePass::output_weight), c.gpus, grid);
    }
    if (fb) fill_fb(*s, c.gpus, grid, e);
    const TimeEntry* made = &times.emplace(key, e).first->second;
    if (!shared) time_bases.emplace(base, made);
    return last_time.keep(key, made);
  }

  // What a DualPipe F&B pair through a layer saves over the same ops one
  // pass after the other (both timed to their last op's end).
  void fill_fb(const Setup& s, int n, const RankGrid& grid, TimeEntry& e) {
    const auto [dense, moe] = kind_layers();
    const auto saving = [&](int layer, LayerTime& t) {
      if (layer < 0) return;
      const double pair = run_probe(probe_fb_pair(s, layer, true), n, grid, true);
      const double sequential = run_probe(probe_fb_pair(s, layer, false), n, grid, true);
      t.fb_saving = std::max(0.0, sequential - pair);
    };
    saving(dense, e.dense);
    saving(moe, e.moe);
    e.has_fb = true;
  }

  int communicators(const Candidate& c) const {
    const bool moe = in.model.moe.has_value();
    const int edp = c.gpus / (c.etp * c.ep * c.pp);
    int n = (c.tp > 1) + (c.cp > 1) + (c.dp * c.cp > 1) + (c.pp > 1) + (c.dp_replicas > 1 ? 2 : 0);
    if (moe) n += (c.ep > 1) + (c.etp > 1 && c.etp != c.tp) + (edp > 1 && edp != c.dp * c.cp);
    if (c.pp > 1 && in.model.tied_embeddings) n += 1;
    return n;
  }

  Result<Estimate> memory(const Candidate& c);
  Result<Estimate> evaluate(const Candidate& c, double fit_bound, double reject_bound);
};

}  // namespace megascope::planner
