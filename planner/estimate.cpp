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

namespace {

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
[[noreturn, gnu::noinline, gnu::cold]] void key_overflow(std::int64_t v, int bits) {
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
};

// Isolated collective time over one group of one topology, by size.
struct CommTable {
  std::vector<int> devices;      // group members (device ids)
  sim::CollectiveCurve curve;
};

}  // namespace

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

  Impl(const SearchInputs& i, const sim::CostModel& c) : in(i), cost(c) {}

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
    [[nodiscard]] double largest() const { return std::max({dense, moe, root}); }
  };
  Units units_of(const Candidate& c, const RankLayout& rl) const {
    Units u;
    const Sharding sh{c.tp, c.etp, c.ep};
    const ModelSpec& m = in.model;
    for (int l = 0; l < m.num_layers && (u.dense == 0 || u.moe == 0); ++l) {
      double& slot = m.is_moe_layer(l) ? u.moe : u.dense;
      if (slot == 0) slot = layer_params(m, l, sh).total();
    }
    u.root = std::max(0.0, rl.params.total() - rl.dense_layers * u.dense - rl.moe_layers * u.moe);
    return u;
  }

  static RankGrid grid_of(const Candidate& c) {
    const int edp = c.gpus / (c.etp * c.ep * c.pp);
    return RankGrid{c.tp, c.cp, c.dp, c.pp, c.etp, c.ep, edp};
  }

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
      // HSDP is not searched: shapes for completeness.
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
  double run_probe(const LayerProbe& p, int n, const RankGrid& grid, bool all = false) {
    const std::vector<double> dur = sim::compute_durations(p.ops, cost);
    std::array<double, kStreamCount> free{};
    std::vector<double> end(p.ops.ops.size(), 0.0);
    for (std::size_t i = 0; i < p.ops.ops.size(); ++i) {
      const Op& op = p.ops.ops[i];
      double start = free[static_cast<std::size_t>(op.stream)];
      for (std::uint32_t d = op.dep_begin; d < op.dep_begin + op.dep_count; ++d)
        start = std::max(start, end[p.ops.deps[d]]);
      const double t = op.kind == OpKind::compute ? dur[i] : comm_s(n, grid, sim::collective_of(op), op.group, op.bytes);
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
      out.f = from ? from->f : run_probe(probe_layer(*s, layer, LayerPass::forward), c.gpus, grid);
      out.b = run_probe(probe_layer(*s, layer, LayerPass::backward_input), c.gpus, grid);
      out.w = from ? from->w : run_probe(probe_layer(*s, layer, LayerPass::backward_weight), c.gpus, grid);
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
    int n = (c.tp > 1) + (c.cp > 1) + (c.dp * c.cp > 1) + (c.pp > 1);
    if (moe) n += (c.ep > 1) + (c.etp > 1 && c.etp != c.tp) + (edp > 1 && edp != c.dp * c.cp);
    if (c.pp > 1 && in.model.tied_embeddings) n += 1;
    return n;
  }

  Result<Estimate> memory(const Candidate& c) {
    auto lay = layout(c);
    if (!lay) return tl::unexpected(lay.error());
    auto acts_of = activations(c);
    if (!acts_of) return tl::unexpected(acts_of.error());
    const Layout& L = **lay;
    const ActEntry& A = **acts_of;
    const RuntimeOverheads& o = in.training.overheads;
    const int edp = c.gpus / (c.etp * c.ep * c.pp);
    const double dense_shard = c.distopt ? c.dp * c.cp : 1.0;
    const double expert_shard = c.distopt ? edp : 1.0;
    const bool full = c.recompute == RecomputeGranularity::full;
    const bool uniform = c.recompute_method == RecomputeMethod::uniform;
    const int m = static_cast<int>(in.training.global_batch_size / (static_cast<std::int64_t>(c.mbs) * c.dp));
    const double fixed_other = o.cuda_context_bytes + o.nccl_bytes_per_group * communicators(c);
    const int mtp = in.model.mtp_num_layers;
    const LayerAct& last = L.last_layer_moe ? A.moe : A.dense;

    Estimate e;
    for (int r = 0; r < c.pp; ++r) {
      const RankLayout& rl = L.ranks[static_cast<std::size_t>(r)];
      // Sharded over DP x CP (dense) and expert-DP (experts): the optimizer
      // state from stage 1, the gradients from 2, the weights at 3 (memory_report).
      const double shard = rl.params.dense / dense_shard + rl.params.expert / expert_shard;
      const double grads = (c.zero >= 2 ? shard : rl.params.total()) * bpp.grads;
      double total = (c.zero >= 3 ? shard : rl.params.total()) * weight_bytes(c) + grads + shard * bpp.optimizer;
      if (c.zero >= 2) {
        // fsdp_working_set: the unsharded gradients of two units, and at stage
        // 3 the unit computing, the one prefetched and the root unit.
        const Units u = units_of(c, rl);
        // The largest layer the rank holds (fsdp_working_set's).
        const double layer = std::max(rl.dense_layers > 0 ? u.dense : 0.0, rl.moe_layers > 0 ? u.moe : 0.0);
        total += 2 * std::max(layer, u.root) * bpp.grads;
        if (c.zero >= 3) total += (2 * layer + u.root) * gather_bytes(c);
      }
      const int nch = static_cast<int>(rl.chunks.size());
      if (inflight.size() < rl.chunks.size()) inflight.resize(rl.chunks.size());   // vpp is not bounded
      rank_inflight(c.schedule, c.pp, c.vpp, m, r, inflight.data(), nch);
      // One micro-batch's full activations of chunk ci (memory_report's terms).
      const auto per_microbatch = [&](const ChunkInfo& ch) {
        const int rec = !full ? 0 : (uniform ? ch.count : std::min<int>(ch.count, c.recompute_layers));
        const int rec_moe = ch.moe_prefix[static_cast<std::size_t>(rec)];
        const int rec_dense = rec - rec_moe;
        const int st_moe = ch.moe_prefix.back() - rec_moe, st_dense = ch.count - rec - st_moe;
        double b = st_dense * A.dense.stored + st_moe * A.moe.stored + rec_dense * A.dense.checkpoint +
                   rec_moe * A.moe.checkpoint;
        if (ch.embedding) b += A.embedding;
        if (ch.loss) b += A.output + (mtp > 0 ? mtp * (last.stored + A.output) : 0.0);
        return b;
      };
      chunk_bytes.assign(static_cast<std::size_t>(nch), 0.0);
      for (int ci = 0; ci < nch; ++ci)
        chunk_bytes[static_cast<std::size_t>(ci)] = per_microbatch(rl.chunks[static_cast<std::size_t>(ci)]);
      // Chunks that keep different bytes: the heaviest step of the order (memory_report does the same).
      if (nch > 1 &&
          std::adjacent_find(chunk_bytes.begin(), chunk_bytes.end(), std::not_equal_to<>()) != chunk_bytes.end()) {
        const std::array<int, 5> key{static_cast<int>(c.schedule), c.pp, c.vpp, m, r};
        if (!last_peaks || last_peaks_key != key) {
          auto it = peaks.find(key);
          if (it == peaks.end()) {
            Peaks pk;
            pk.counts = inflight_candidates(c.schedule, c.pp, c.vpp, m, r);
            for (const std::vector<int>& v : pk.counts) pk.totals.push_back(std::accumulate(v.begin(), v.end(), 0));
            it = peaks.emplace(key, std::move(pk)).first;
          }
          last_peaks = &it->second;
          last_peaks_key = key;
        }
        // heaviest_inflight, with most chunks at one common value a: the sum
        // is a x total plus the other chunks' excess (a rank's embedding or
        // loss chunk), a few terms instead of one per chunk.
        const double a = chunk_bytes[static_cast<std::size_t>(nch / 2)];
        odd_chunks.clear();
        for (int ci = 0; ci < nch; ++ci)
          if (chunk_bytes[static_cast<std::size_t>(ci)] != a) odd_chunks.push_back(ci);
        const std::vector<int>* heaviest = nullptr;
        double most = -1;
        for (std::size_t k = 0; k < last_peaks->counts.size(); ++k) {
          const std::vector<int>& v = last_peaks->counts[k];
          double sum = a * last_peaks->totals[k];
          for (const int ci : odd_chunks)
            sum += (chunk_bytes[static_cast<std::size_t>(ci)] - a) * v[static_cast<std::size_t>(ci)];
          if (sum > most) {
            most = sum;
            heaviest = &v;
          }
        }
        if (heaviest)
          for (int ci = 0; ci < nch && ci < static_cast<int>(heaviest->size()); ++ci)
            inflight[static_cast<std::size_t>(ci)].full = (*heaviest)[static_cast<std::size_t>(ci)];
      }
      double act = 0, working = 0;
      for (int ci = 0; ci < nch; ++ci) {
        const ChunkInfo& ch = rl.chunks[static_cast<std::size_t>(ci)];
        const ChunkInflight in_c = inflight[static_cast<std::size_t>(ci)];
        const int rec = !full ? 0 : (uniform ? ch.count : std::min<int>(ch.count, c.recompute_layers));
        const int rec_moe = ch.moe_prefix[static_cast<std::size_t>(rec)];
        const int rec_dense = rec - rec_moe;
        const int moe_all = ch.moe_prefix.back();
        act += in_c.full * chunk_bytes[static_cast<std::size_t>(ci)];
        if (in_c.weight_grad_only > 0)
          act += in_c.weight_grad_only * ((ch.count - moe_all) * A.dense.wgs + moe_all * A.moe.wgs);
        if (rec_dense > 0) working = std::max(working, A.dense.stored);
        if (rec_moe > 0) working = std::max(working, A.moe.stored);
      }
      act += working;
      total += act + fixed_other + o.fragmentation_fraction * (act + grads);
      if (total > e.peak_bytes) {
        e.peak_bytes = total;
        e.peak_stage = r;
      }
    }
    e.fits = e.peak_bytes + in.constraints.headroom_bytes <= in.cluster.device.memory_bytes;
    return e;
  }

  Result<Estimate> evaluate(const Candidate& c, double fit_bound, double reject_bound) {
    auto mem = memory(c);
    if (!mem) return mem;
    Estimate e = *mem;
    const double bound = e.fits ? fit_bound : reject_bound;
    auto lt = layer_times(c);
    if (!lt) return tl::unexpected(lt.error());
    const TimeEntry& T = **lt;
    const Layout& lay = **layout(c);   // memory() found it: the memo answers
    const int p = c.pp;
    const int m = static_cast<int>(in.training.global_batch_size / (static_cast<std::int64_t>(c.mbs) * c.dp));
    const bool full = c.recompute == RecomputeGranularity::full;
    const bool uniform = c.recompute_method == RecomputeMethod::uniform;
    const bool dualpipe = c.schedule == Schedule::dualpipe;
    const double share = dualpipe ? 0.5 : 1.0;   // DualPipe: a micro-batch runs one of the rank's two chunks
    // DualPipe(V)'s F&B units: a forward and a backward interleaved, about half
    // the rank's layers each, one layer's pair hiding its communication.
    const std::vector<int>* fb_units_of =
        c.schedule == Schedule::dualpipe || c.schedule == Schedule::dualpipev ? &fb_units(c.schedule, p, m) : nullptr;

    double cmax = 0, csum = 0, fsum = 0, bsum = 0, wsum = 0;
    back.assign(static_cast<std::size_t>(p), 0.0);
    // zero 2 and 3: each micro-batch reduce-scatters the rank's gradients unit
    // by unit (and at 3 gathers each unit before its forward and backward, the
    // root unit once), on streams beside the compute: a pass takes the longer
    // of its compute and its communication. The last unit's reduction is
    // left after the last backward (last_unit_rs).
    const int edp_all = c.gpus / (c.etp * c.ep * c.pp);
    const bool sharded = c.zero >= 2 && c.dp * c.cp > 1;
    std::vector<double> last_unit_rs;
    if (sharded) last_unit_rs.assign(static_cast<std::size_t>(p), 0.0);
    const RankGrid zgrid = grid_of(c);
    const auto zero_comm = [&](int r, const RankLayout& rl) {
      const Units u = units_of(c, rl);
      const double grad_b = bytes_of(in.training.grad_dtype), gb = gather_bytes(c);
      const auto unit_time = [&](sim::Collective kind, double params, double bytes_per) {
        if (params <= 0) return 0.0;
        // A MoE unit: its dense part over DP x CP, its experts over expert-DP.
        return time_on(table(c.gpus, zgrid, kind, CommGroup::dp_cp), params * bytes_per);
      };
      const auto moe_split = [&](sim::Collective kind, double bytes_per) {
        if (u.moe <= 0) return 0.0;
        const Sharding sh{c.tp, c.etp, c.ep};
        ParamSplit ps;
        for (int l = 0; l < in.model.num_layers; ++l)
          if (in.model.is_moe_layer(l)) {
            ps = layer_params(in.model, l, sh);
            break;
          }
        double t = time_on(table(c.gpus, zgrid, kind, CommGroup::dp_cp), ps.dense * bytes_per);
        if (edp_all > 1) t += time_on(table(c.gpus, zgrid, kind, CommGroup::edp), ps.expert * bytes_per);
        return t;
      };
      const double rs = rl.dense_layers * unit_time(sim::Collective::reduce_scatter, u.dense, grad_b) +
                        rl.moe_layers * moe_split(sim::Collective::reduce_scatter, grad_b) +
                        unit_time(sim::Collective::reduce_scatter, u.root, grad_b);
      last_unit_rs[static_cast<std::size_t>(r)] = unit_time(sim::Collective::reduce_scatter, rl.embedding ? u.root : u.dense, grad_b);
      double ag = 0;
      if (c.zero >= 3)
        ag = 2 * (rl.dense_layers * unit_time(sim::Collective::all_gather, u.dense, gb) +
                  rl.moe_layers * moe_split(sim::Collective::all_gather, gb)) +
             unit_time(sim::Collective::all_gather, u.root, gb);
      // Gathers and reductions run on streams of their own but share the
      // links: their times add. Each pass of a chunk (forward and backward,
      // once per schedule step) waits for its first unit's gather, which
      // nothing before it prefetched.
      const double first = c.zero >= 3 ? 2.0 * static_cast<double>(rl.chunks.size()) *
                                             unit_time(sim::Collective::all_gather, u.largest(), gb)
                                       : 0.0;
      return std::pair<double, double>{rs + ag, first};
    };
    for (int r = 0; r < p; ++r) {
      const RankLayout& rl = lay.ranks[static_cast<std::size_t>(r)];
      double F = rl.dense_layers * T.dense.f + rl.moe_layers * T.moe.f;
      double B = rl.dense_layers * T.dense.b + rl.moe_layers * T.moe.b;
      double W = rl.dense_layers * T.dense.w + rl.moe_layers * T.moe.w;
      if (rl.embedding) {
        F += T.emb_f;
        W += T.emb_w;
      }
      if (rl.output) {
        F += T.out_f;
        B += T.out_b;
        W += T.out_w;
      }
      if (full) {
        for (const ChunkInfo& ch : rl.chunks) {
          const int rec = uniform ? ch.count : std::min<int>(ch.count, c.recompute_layers);
          const int rec_moe = ch.moe_prefix[static_cast<std::size_t>(rec)];
          B += (rec - rec_moe) * T.dense.f + rec_moe * T.moe.f;
        }
      }
      F *= share;
      B *= share;
      W *= share;
      double cr = F + B + W;
      if (fb_units_of) {
        const double per_unit = 0.5 * (rl.dense_layers * T.dense.fb_saving + rl.moe_layers * T.moe.fb_saving);
        cr = std::max(0.0, cr - per_unit * (*fb_units_of)[static_cast<std::size_t>(r)] / m);
      }
      if (sharded) {
        // The traffic hides behind the compute up to its own length; the
        // first gathers of each pass wait in front of it.
        const auto [traffic, exposed] = zero_comm(r, rl);
        cr = std::max(cr, traffic * share) + exposed * share;
      }
      cmax = std::max(cmax, cr);
      csum += cr;
      fsum += F;
      bsum += B;
      wsum += W;
      back[static_cast<std::size_t>(r)] = B + W;
    }
    const double fm = fsum / p, bm = bsum / p, wm = wsum / p;
    double bubble = 0;
    switch (c.schedule) {
      case Schedule::gpipe:
      case Schedule::one_f_one_b: bubble = csum - cmax; break;
      case Schedule::interleaved: bubble = (csum - cmax) / c.vpp; break;
      // ZB-1p and ZB-2p keep the faster of their heuristic's order and ZB-H1's
      // (ZB-H2's), which fit their limits: the handcrafted forms bound them.
      case Schedule::zb_1p:
      case Schedule::zb_h1: bubble = (p - 1) * std::max(0.0, fm + bm - wm); break;
      // ZB-H2: rank 0's own gap is (p - 1)(F + B - 2W) (Qi et al. Table 2);
      // without post-validation the last rank also starts (p - 1) F late.
      // Fewer than 2p - 1 micro-batches cannot fill the warm-up: about one
      // pass time per missing micro-batch stays idle.
      case Schedule::zb_2p:
      case Schedule::zb_h2:
        bubble = (p - 1) * std::max(c.post_validation ? 0.0 : fm, fm + bm - 2 * wm) +
                 std::max(0, 2 * p - 1 - m) * (fm + bm + wm) / 3;
        break;
      case Schedule::zb_v: bubble = (p - 1) * std::max(0.0, fm + bm - 2 * wm) / 2; break;
      case Schedule::dualpipe: bubble = (p / 2 - 1) * std::max(0.0, fm + 2 * bm - wm); break;
      case Schedule::dualpipev: bubble = (p - 1) * std::max(0.0, fm + 2 * bm - wm) / 2; break;
    }
    const int edp = c.gpus / (c.etp * c.ep * c.pp);
    const bool distopt = c.distopt && c.dp * c.cp > 1;
    const double optimizer_step_bytes = optimizer_step_bytes_per_param(in.training);
    // Parameters whose optimizer state a rank updates.
    const auto owned_of = [&](const RankLayout& rl) {
      return distopt ? rl.params.dense / (c.dp * c.cp) + rl.params.expert / edp : rl.params.total();
    };
    // A lower bound of the step that needs no collective: the pipeline below
    // is m (cmax + waits) + bubble + fill transfers, every term non-negative,
    // and the step is at least the pipeline plus rank 0's tail, whose terms
    // are non-negative and include its optimizer step. In floating point
    // too: adding a non-negative term, or multiplying by m, never rounds below
    // the exact smaller value.
    {
      const double lower = m * cmax + bubble;
      if (const double with_tail = lower + cost.memory_s(MemoryOp::optimizer, optimizer_step_bytes * owned_of(lay.ranks.front()));
          with_tail > bound) {
        e.step_s = with_tail;
        e.pipeline_s = lower;
        e.bubble_s = bubble;
        e.bounded = true;
        return e;
      }
    }
    const RankGrid grid = grid_of(c);
    const double h = static_cast<double>(in.model.hidden_size);
    const double seq = static_cast<double>(in.training.seq_length.value_or(in.model.seq_length));
    // As the Program sends (core/program/builder.cpp): the 1/tp slice with SP,
    // the whole activation from every TP rank without it (Megatron-Core).
    const double p2p_bytes = 2.0 * seq / c.cp * c.mbs * h / (c.sp && c.tp > 1 ? c.tp : 1);
    const double p2p = p > 1 ? comm_s(c.gpus, grid, sim::Collective::send_recv, CommGroup::pp, p2p_bytes) : 0.0;
    // Megatron-LM's gpipe and 1f1b wait for every transfer (the search's plans
    // take their schedule's overlap_p2p_comm): each micro-batch's forward and
    // backward end with one on the critical path.
    const bool sync_p2p = !default_overlap_p2p_comm(c.schedule);
    const double pipeline = m * (cmax + (sync_p2p ? 2.0 * p2p : 0.0)) + bubble + 2.0 * (p - 1) * p2p;

    // Gradient reduction, optimizer, parameter gather: per rank after its last backward.
    const double grad_b = bytes_of(in.training.grad_dtype), param_b = gather_bytes(c);
    const double bucket = std::max(40e6, 1e6 * c.dp * c.cp);
    const sim::Collective reduce = distopt ? sim::Collective::reduce_scatter : sim::Collective::all_reduce;
    const double v_eff = c.schedule == Schedule::interleaved ? c.vpp : 1.0;
    const bool has_dp = c.dp * c.cp > 1;
    CommTable* dense_reduce = has_dp ? table(c.gpus, grid, reduce, CommGroup::dp_cp) : nullptr;
    CommTable* expert_reduce = edp > 1 ? table(c.gpus, grid, reduce, CommGroup::edp) : nullptr;
    CommTable* dense_gather = distopt ? table(c.gpus, grid, sim::Collective::all_gather, CommGroup::dp_cp) : nullptr;
    CommTable* expert_gather = distopt && edp > 1 ? table(c.gpus, grid, sim::Collective::all_gather, CommGroup::edp)
                                                  : nullptr;
    CommTable* embedding = p > 1 && in.model.tied_embeddings
                               ? table(c.gpus, grid, sim::Collective::all_reduce, CommGroup::embedding)
                               : nullptr;
    const double embedding_bytes = static_cast<double>(in.model.padded_vocab(c.tp)) * h / c.tp * grad_b;
    double step = pipeline, dp_worst = 0;
    for (int r = 0; r < p; ++r) {
      const RankLayout& rl = lay.ranks[static_cast<std::size_t>(r)];
      const double nch = static_cast<double>(rl.chunks.size());
      double grad = 0, last_bucket = 0;
      if (rl.params.dense > 0) {
        grad += nch * time_on(dense_reduce, rl.params.dense / nch * grad_b);
        last_bucket += time_on(dense_reduce, std::min(bucket, rl.params.dense) * grad_b);
      }
      if (rl.params.expert > 0) {
        grad += nch * time_on(expert_reduce, rl.params.expert / nch * grad_b);
        last_bucket += time_on(expert_reduce, std::min(bucket, rl.params.expert) * grad_b);
      }
      double exposed = sharded ? last_unit_rs[static_cast<std::size_t>(r)]
                       : c.overlap_grad_reduce ? std::max(last_bucket, grad - back[static_cast<std::size_t>(r)]) : grad;
      if (rl.embedding != rl.output) exposed += time_on(embedding, embedding_bytes);
      exposed += cost.memory_s(MemoryOp::optimizer, optimizer_step_bytes * owned_of(rl));
      if (distopt && c.zero < 3) {
        const double dense_ag = time_on(
            dense_gather, (c.overlap_param_gather ? std::min(bucket, rl.params.dense) : rl.params.dense) * param_b);
        const double expert_ag =
            rl.params.expert > 0
                ? time_on(expert_gather,
                          (c.overlap_param_gather ? std::min(bucket, rl.params.expert) : rl.params.expert) * param_b)
                : 0.0;
        exposed += dense_ag + expert_ag;
      }
      const double offset = r * back[static_cast<std::size_t>(r)] / v_eff;
      step = std::max(step, pipeline - offset + exposed);
      dp_worst = std::max(dp_worst, exposed);
    }
    e.pipeline_s = pipeline;
    e.bubble_s = pipeline - m * cmax;
    e.dp_exposed_s = dp_worst;
    e.step_s = step;
    return e;
  }
};

Estimator::Estimator(const SearchInputs& in, const sim::CostModel& cost) : impl_(std::make_unique<Impl>(in, cost)) {}
Estimator::~Estimator() = default;
Estimator::Estimator(Estimator&&) noexcept = default;
Estimator& Estimator::operator=(Estimator&&) noexcept = default;

Result<Estimate> Estimator::memory(const Candidate& c) { return impl_->memory(c); }

Result<Estimate> Estimator::evaluate(const Candidate& c, double fit_bound, double reject_bound) {
  return impl_->evaluate(c, fit_bound, reject_bound);
}

}  // namespace megascope::planner
