#include "core/program/stage_writer.hpp"

#include <algorithm>
#include <bit>

namespace megascope::detail {

namespace {

bool same(const Kernel& a, const Kernel& b) {
  const AttentionShape &x = a.attention, &y = b.attention;
  return a.kind == b.kind && a.gemm == b.gemm && a.memory == b.memory && a.bytes == b.bytes &&
         a.unfused_attention == b.unfused_attention && a.backward == b.backward && a.precision == b.precision &&
         x.batch == y.batch &&
         x.heads == y.heads && x.kv_heads == y.kv_heads && x.seq_q == y.seq_q && x.seq_kv == y.seq_kv && x.head_dim == y.head_dim && x.head_dim_v == y.head_dim_v &&
         x.causal == y.causal && x.dropout == y.dropout && x.window == y.window && x.packed == y.packed &&
         x.packed_tiles == y.packed_tiles && a.groups == b.groups;
}

std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdULL;
}

std::uint64_t hash_of(std::span<const Kernel> kernels) {
  std::uint64_t h = kernels.size();
  for (const Kernel& k : kernels) {
    const AttentionShape& a = k.attention;
    h = mix(h, static_cast<std::uint64_t>(k.kind) | (static_cast<std::uint64_t>(k.memory) << 8) |
                   (static_cast<std::uint64_t>(k.precision) << 16) | (static_cast<std::uint64_t>(a.causal) << 24) |
                   (static_cast<std::uint64_t>(k.backward) << 26) | (static_cast<std::uint64_t>(a.dropout) << 27) |
                   (static_cast<std::uint64_t>(k.unfused_attention) << 25));
    h = mix(h, static_cast<std::uint64_t>(k.gemm.m));
    h = mix(h, static_cast<std::uint64_t>(k.gemm.n));
    h = mix(h, static_cast<std::uint64_t>(k.gemm.k));
    h = mix(h, std::bit_cast<std::uint64_t>(k.bytes));
    h = mix(h, static_cast<std::uint64_t>(a.batch ^ (a.heads << 16) ^ (a.kv_heads << 32)));
    h = mix(h, static_cast<std::uint64_t>(a.seq_q ^ (a.seq_kv << 24) ^ (a.head_dim << 48) ^ (a.head_dim_v << 56)));
    h = mix(h, static_cast<std::uint64_t>(a.window) ^ (static_cast<std::uint64_t>(k.groups) << 40));
    if (a.packed != 1.0 || a.packed_tiles != 1.0)
      h = mix(mix(h, std::bit_cast<std::uint64_t>(a.packed)), std::bit_cast<std::uint64_t>(a.packed_tiles));
  }
  return h;
}

}  // namespace

std::uint32_t StageWriter::push(Op op, const Deps& deps) {
  op.dep_begin = static_cast<std::uint32_t>(out_.deps.size());
  op.dep_count = deps.count;
  for (std::uint8_t i = 0; i < deps.count; ++i) {
    MEGASCOPE_CHECK(deps.ids[i] < out_.ops.size(), "a dependency must point at an earlier op");
    out_.deps.push_back(deps.ids[i]);
  }
  out_.ops.push_back(op);
  return static_cast<std::uint32_t>(out_.ops.size() - 1);
}

std::uint32_t StageWriter::compute(OpLabel label, const OpContext& ctx, std::span<const Kernel> kernels, Deps deps) {
  // The memory kernels of a backward op (input or weight gradient) say so:
  // a calibrated profile may price backward kernels of a kind apart.
  if (ctx.phase == Phase::backward_input || ctx.phase == Phase::backward_weight) {
    marked_.assign(kernels.begin(), kernels.end());
    for (Kernel& k : marked_) k.backward = k.kind == KernelKind::memory;
    kernels = marked_;
  }
  Op op;
  op.kind = OpKind::compute;
  op.stream = Stream::compute;
  op.phase = ctx.phase;
  op.label = label;
  op.layer = ctx.layer;
  op.microbatch = ctx.microbatch;
  op.chunk = ctx.chunk;
  op.host_paced = ctx.host_paced;
  op.kernel_begin = static_cast<std::uint32_t>(out_.kernels.size());
  op.kernel_count = static_cast<std::uint32_t>(kernels.size());
  const std::uint64_t h = hash_of(kernels);
  const auto it = ranges_.find(h);
  if (it != ranges_.end() && it->second.count == kernels.size() &&
      it->second.begin + it->second.count <= out_.kernels.size() &&
      std::equal(kernels.begin(), kernels.end(), out_.kernels.begin() + it->second.begin, same)) {
    op.kernel_begin = it->second.begin;
    op.flops = it->second.flops;   // the same sum, in the same order, as below
  } else {
    for (const Kernel& k : kernels) {
      out_.kernels.push_back(k);
      op.flops += kernel_flops(k);
    }
    if (it == ranges_.end()) ranges_.emplace(h, KernelRange{op.kernel_begin, op.kernel_count, op.flops});
  }
  const std::uint32_t id = push(op, deps);
  last_compute_ = id;
  return id;
}

std::uint32_t StageWriter::collective(OpKind kind, Stream stream, CommGroup group, OpLabel label, const OpContext& ctx,
                                      double bytes, Deps deps, CommSpan span) {
  Op op;
  op.kind = kind;
  op.stream = stream;
  op.group = group;
  op.span = span;
  op.phase = ctx.phase;
  op.label = label;
  op.layer = ctx.layer;
  op.microbatch = ctx.microbatch;
  op.chunk = ctx.chunk;
  op.bytes = bytes;
  return push(op, deps);
}

std::uint32_t StageWriter::p2p(OpKind kind, OpLabel label, const OpContext& ctx, int peer_stage, std::uint64_t tag,
                               double bytes, Deps deps) {
  Op op;
  op.kind = kind;
  op.stream = kind == OpKind::send ? Stream::pp_send : Stream::pp_recv;
  op.group = CommGroup::pp;
  op.phase = ctx.phase;
  op.label = label;
  op.microbatch = ctx.microbatch;
  op.chunk = ctx.chunk;
  op.peer_stage = peer_stage;
  op.tag = tag;
  op.bytes = bytes;
  return push(op, deps);
}

void StageWriter::add_dep(std::uint32_t op, std::uint32_t dep) {
  // Only valid for the most recent op (deps are stored contiguously).
  MEGASCOPE_CHECK(op + 1 == out_.ops.size(), "add_dep only extends the last op");
  MEGASCOPE_CHECK(dep < op, "a dependency must point at an earlier op");
  out_.deps.push_back(dep);
  out_.ops[op].dep_count += 1;
}

std::optional<OpTemplate> StageWriter::record(std::uint32_t first, const OpContext& ctx,
                                              std::optional<std::uint32_t> input, std::uint32_t result) const {
  if (result < first || result >= out_.ops.size()) return std::nullopt;
  OpTemplate t;
  t.result = result - first;
  for (std::uint32_t i = first; i < out_.ops.size(); ++i) {
    const Op& op = out_.ops[i];
    if (op.phase != ctx.phase || op.layer != ctx.layer || op.microbatch != ctx.microbatch || op.chunk != ctx.chunk)
      return std::nullopt;
    for (std::uint32_t d = op.dep_begin; d < op.dep_begin + op.dep_count; ++d) {
      const std::uint32_t dep = out_.deps[d];
      if (dep >= first) t.deps.push_back(dep - first);
      else if (input && dep == *input) t.deps.push_back(OpTemplate::kInput);
      else return std::nullopt;
    }
    if (op.kind == OpKind::compute) t.last_compute = i - first;
    t.ops.push_back(op);
  }
  return t;
}

std::uint32_t StageWriter::replay(const OpTemplate& t, const OpContext& ctx, std::optional<std::uint32_t> input) {
  const auto base = static_cast<std::uint32_t>(out_.ops.size());
  std::size_t d = 0;
  for (const Op& recorded : t.ops) {
    Op op = recorded;
    op.phase = ctx.phase;
    op.layer = ctx.layer;
    op.microbatch = ctx.microbatch;
    op.chunk = ctx.chunk;
    op.dep_begin = static_cast<std::uint32_t>(out_.deps.size());
    for (std::uint32_t k = 0; k < op.dep_count; ++k, ++d) {
      const std::uint32_t dep = t.deps[d];
      MEGASCOPE_CHECK(dep != OpTemplate::kInput || input, "a replayed op needs the input dependency it was recorded with");
      out_.deps.push_back(dep == OpTemplate::kInput ? *input : base + dep);
    }
    out_.ops.push_back(op);
  }
  if (t.last_compute) last_compute_ = base + *t.last_compute;
  return base + t.result;
}

Kernel gemm(std::int64_t m, std::int64_t n, std::int64_t k, Precision p) {
  Kernel x;
  x.kind = KernelKind::gemm;
  x.gemm = {m, n, k};
  x.precision = p;
  return x;
}

void push_fp8_cast(std::vector<Kernel>& k, const Setup& s, double elements) {
  if (s.training.precision != Precision::fp8) return;
  const double per = s.training.fp8_recipe == Fp8Recipe::tensorwise ? kFp8CurrentScalingCastBytesPerElement
                                                                     : kFp8CastBytesPerElement;
  k.push_back(memory(MemoryOp::other, per * elements));
}

Kernel memory(MemoryOp op, double bytes) {
  Kernel x;
  x.kind = KernelKind::memory;
  x.memory = op;
  x.bytes = bytes;
  return x;
}

Kernel attention(KernelKind kind, const AttentionShape& a) {
  Kernel x;
  x.kind = kind;
  x.attention = a;
  return x;
}

double kernel_flops(const Kernel& k) {
  switch (k.kind) {
    case KernelKind::gemm:
      return 2.0 * static_cast<double>(k.groups) * static_cast<double>(k.gemm.m) * static_cast<double>(k.gemm.n) *
             static_cast<double>(k.gemm.k);
    case KernelKind::attention_fwd:
    case KernelKind::attention_bwd: {
      const AttentionShape& a = k.attention;
      const double dv = static_cast<double>(a.head_dim_v > 0 ? a.head_dim_v : a.head_dim);
      // QK^T and PV over the pairs computed; backward = 2x forward in GEMM FLOPs (dQ, dK, dV, dP).
      const double fwd = 2.0 * static_cast<double>(a.batch * a.heads) * attention_pairs(a) *
                         (static_cast<double>(a.head_dim) + dv);
      return k.kind == KernelKind::attention_fwd ? fwd : 2.0 * fwd;
    }
    case KernelKind::memory:
      return 0;
  }
  return 0;
}

namespace {

// One unit's order (old indices, appended to `order`): see FbUnit.
void fb_order(const StageProgram& sp, const FbUnit& u, std::vector<std::uint32_t>& order,
              std::vector<std::uint32_t>& stamp) {
  const std::uint32_t n = u.end - u.begin;
  // 0: not written yet; kWritten: written (a compute op, or an op of an
  // earlier turn); otherwise the turn that wrote this communication op.
  constexpr std::uint32_t kUnwritten = 0, kWritten = 1;
  stamp.assign(n, kUnwritten);
  std::uint32_t next[2] = {u.begin, u.mid};
  const std::uint32_t stop[2] = {u.mid, u.end};
  int cur = 0;               // the forward first
  std::uint32_t turn = 2;    // stamps of this turn's communication ops
  const auto deps_of = [&](std::uint32_t i) {
    const Op& op = sp.ops[i];
    return std::span<const std::uint32_t>(sp.deps.data() + op.dep_begin, op.dep_count);
  };
  const auto ready = [&](std::uint32_t i) {
    for (std::uint32_t d : deps_of(i))
      if (d >= u.begin && d < u.end && stamp[d - u.begin] == kUnwritten) return false;
    return true;
  };
  // A compute op waiting for a communication op its chain posted this turn.
  const auto stalls = [&](std::uint32_t i) {
    if (sp.ops[i].kind != OpKind::compute) return false;
    for (std::uint32_t d : deps_of(i))
      if (d >= u.begin && d < u.end && stamp[d - u.begin] == turn) return true;
    return false;
  };
  for (std::uint32_t written = 0; written < n;) {
    const int other = 1 - cur;
    if (next[cur] == stop[cur]) {
      cur = other;
      ++turn;
      continue;
    }
    const std::uint32_t i = next[cur];
    const bool other_ready = next[other] < stop[other] && ready(next[other]);
    // The backward may use the forward's ops (never the reverse: the
    // forward was written first): it waits for them.
    if (!ready(i) || (stalls(i) && other_ready)) {
      MEGASCOPE_CHECK(other_ready, "an F&B unit's ops cannot be ordered");
      cur = other;
      ++turn;
      continue;
    }
    stamp[i - u.begin] = sp.ops[i].kind == OpKind::compute ? kWritten : turn;
    order.push_back(i);
    ++next[cur];
    ++written;
  }
}

}  // namespace

std::vector<std::uint32_t> interleave_fb(StageProgram& sp, std::span<const FbUnit> units) {
  const auto n = static_cast<std::uint32_t>(sp.ops.size());
  std::vector<std::uint32_t> order;
  order.reserve(n);
  std::vector<std::uint32_t> stamp;
  std::uint32_t i = 0;
  for (const FbUnit& u : units) {
    MEGASCOPE_CHECK(u.begin >= i && u.begin <= u.mid && u.mid <= u.end && u.end <= n, "F&B units out of order");
    for (; i < u.begin; ++i) order.push_back(i);
    fb_order(sp, u, order, stamp);
    i = u.end;
  }
  for (; i < n; ++i) order.push_back(i);
  std::vector<std::uint32_t> at(n);
  for (std::uint32_t k = 0; k < n; ++k) at[order[k]] = k;
  std::vector<Op> ops(n);
  for (std::uint32_t k = 0; k < n; ++k) ops[k] = sp.ops[order[k]];
  sp.ops = std::move(ops);
  for (std::uint32_t& d : sp.deps) d = at[d];
  return at;
}

}  // namespace megascope::detail
