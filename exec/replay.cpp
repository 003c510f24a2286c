// The device-independent part of the replay (exec/replay.hpp): which kernel
// replays each Program kernel, and each op's lane, waits and buffer size.
#include "exec/replay.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

namespace megascope::exec {

namespace {

GemmPass pass_of(Phase phase) {
  switch (phase) {
    case Phase::backward_input: return GemmPass::backward_input;
    case Phase::backward_weight: return GemmPass::backward_weight;
    default: return GemmPass::forward;
  }
}

int lane_of(Stream s) {
  switch (s) {
    case Stream::compute: return 0;
    case Stream::tp: return 1;
    case Stream::cp: return 2;
    case Stream::ep: return 3;
    case Stream::dp:
    case Stream::dp_param: return 4;   // one NCCL communicator per group: the gathers queue with the reductions
    case Stream::pp_send:
    case Stream::pp_recv: break;
  }
  return -1;   // a channel's lane, set by the caller
}

std::vector<std::uint64_t> tags(const StageProgram& sp, OpKind kind, int peer, OpLabel label) {
  std::vector<std::uint64_t> out;
  for (const Op& op : sp.ops)
    if (op.kind == kind && op.peer_stage == peer && op.label == label) out.push_back(op.tag);
  return out;
}

// The k-th send of stage a to stage b must be the k-th receive of b from a (per label).
Result<void> check_in_order(const Program& p, int a, int b, OpLabel label) {
  const std::vector<std::uint64_t> sent = tags(p.stages.at(static_cast<std::size_t>(a)), OpKind::send, b, label);
  const std::vector<std::uint64_t> got = tags(p.stages.at(static_cast<std::size_t>(b)), OpKind::recv, a, label);
  const char* what = label == OpLabel::pp_activation ? "activations" : "gradients";
  if (sent.size() != got.size())
    return fail("plan", fmt::format("pipeline stage {} sends {} {} to stage {}, which receives {}", a, sent.size(), what,
                                    b, got.size()));
  for (std::size_t k = 0; k < sent.size(); ++k)
    if (sent[k] != got[k])
      return fail("plan", fmt::format("pipeline stage {} sends {} to stage {} in an order that stage doesn't receive "
                                      "them in (message {}: tag {} sent, tag {} received); the replay pairs each "
                                      "channel's transfers in order",
                                      a, what, b, k, sent[k], got[k]));
  return {};
}

}  // namespace

Stream stream_of(CommGroup g) {
  switch (g) {
    case CommGroup::tp:
    case CommGroup::etp: return Stream::tp;
    case CommGroup::cp: return Stream::cp;
    case CommGroup::ep: return Stream::ep;
    case CommGroup::dp:
    case CommGroup::dp_cp:
    case CommGroup::edp:
    case CommGroup::dp_shard:
    case CommGroup::dp_replica:
    case CommGroup::embedding: return Stream::dp;
    case CommGroup::pp: return Stream::pp_send;
  }
  return Stream::dp;
}

std::string ReplayKernel::name() const {
  switch (type) {
    case Type::gemm:
      return fmt::format("gemm {}x{}x{} {} {}", gemm.shape.m, gemm.shape.n, gemm.shape.k, to_string(gemm.pass),
                         to_string(precision));
    case Type::memory: return fmt::format("{} {}x{}", to_string(memory.kernel), memory.rows, memory.width);
    case Type::copy: return fmt::format("copy {:.0f} B", bytes / 2);
    case Type::attention: {
      const AttentionShape& a = attention.shape;
      std::string why;
      if (a.head_dim > 256) why = " (no kernel: head dim above 256)";
      else if (a.head_dim_v != 0 && a.head_dim_v != a.head_dim) why = " (no kernel: value head dim differs)";
      return fmt::format("attention {} b{} s{}/{} h{}/{} d{}{}{}", attention.backward ? "bwd" : "fwd", a.batch, a.seq_q,
                         a.seq_kv, a.heads, a.kv_heads, a.head_dim, attention.rope ? " rope" : "", why);
    }
  }
  return "?";
}

bool ReplayKernel::operator==(const ReplayKernel& o) const {
  if (type != o.type) return false;
  switch (type) {
    case Type::gemm:
      return gemm.shape == o.gemm.shape && gemm.pass == o.gemm.pass && gemm.bias == o.gemm.bias &&
             precision == o.precision;
    case Type::memory:
      return memory.kernel == o.memory.kernel && memory.rows == o.memory.rows && memory.width == o.memory.width &&
             memory.dropout == o.memory.dropout;
    case Type::copy: return bytes == o.bytes;
    case Type::attention: {
      const AttentionShape &a = attention.shape, &b = o.attention.shape;
      return std::tie(a.batch, a.heads, a.kv_heads, a.seq_q, a.seq_kv, a.head_dim, a.head_dim_v, a.causal, a.dropout) ==
                 std::tie(b.batch, b.heads, b.kv_heads, b.seq_q, b.seq_kv, b.head_dim, b.head_dim_v, b.causal, b.dropout) &&
             attention.backward == o.attention.backward && attention.rope == o.attention.rope;
    }
  }
  return false;
}

ReplayKernel replay_kernel(const Setup& s, const Kernel& k, Phase phase) {
  ReplayKernel r;
  switch (k.kind) {
    case KernelKind::gemm:
      r.type = ReplayKernel::Type::gemm;
      r.gemm.shape = k.gemm;
      r.gemm.pass = pass_of(phase);
      r.precision = k.precision;
      return r;
    case KernelKind::attention_fwd:
    case KernelKind::attention_bwd:
      r.type = ReplayKernel::Type::attention;
      r.attention.shape = k.attention;
      r.attention.backward = k.kind == KernelKind::attention_bwd;
      r.attention.rope = s.model.position_embedding == PositionEmbedding::rope;
      return r;
    case KernelKind::memory: break;
  }
  r.bytes = k.bytes;
  const bool bwd = k.backward;   // the Program marks the memory kernels of backward ops
  const std::int64_t h = s.model.hidden_size;
  MemoryKernel m = MemoryKernel::layernorm_fwd;
  std::int64_t width = h;
  switch (k.memory) {
    case MemoryOp::norm:
      if (s.model.norm == Norm::layernorm) m = bwd ? MemoryKernel::layernorm_bwd : MemoryKernel::layernorm_fwd;
      else m = bwd ? MemoryKernel::rmsnorm_bwd : MemoryKernel::rmsnorm_fwd;
      break;
    case MemoryOp::activation:
      if (s.model.activation == Activation::swiglu) m = bwd ? MemoryKernel::swiglu_bwd : MemoryKernel::swiglu_fwd;
      else m = bwd ? MemoryKernel::gelu_bwd : MemoryKernel::gelu_fwd;
      break;
    case MemoryOp::dropout_residual:
      m = bwd ? MemoryKernel::bias_dropout_add_bwd : MemoryKernel::bias_dropout_add_fwd;
      break;
    case MemoryOp::embedding: m = bwd ? MemoryKernel::embedding_bwd : MemoryKernel::embedding_fwd; break;
    case MemoryOp::cross_entropy:
      m = bwd ? MemoryKernel::cross_entropy_bwd : MemoryKernel::cross_entropy_fwd;
      width = std::max<std::int64_t>(1, s.padded_vocab / std::max(1, s.plan.tp));
      break;
    case MemoryOp::optimizer:
      m = MemoryKernel::adamw;
      width = 1024;
      break;
    case MemoryOp::other:
      r.type = ReplayKernel::Type::copy;
      return r;
  }
  r.type = ReplayKernel::Type::memory;
  r.memory.kernel = m;
  r.memory.width = width;
  r.memory.rows = std::max<std::int64_t>(1, std::llround(k.bytes / program_bytes(m, 1, width)));
  r.memory.dropout = static_cast<float>(s.model.hidden_dropout);
  return r;
}

std::vector<ReplayRoute> replay_channels(const Program& p) {
  std::set<ReplayRoute> routes;
  for (const StageProgram& sp : p.stages)
    for (const Op& op : sp.ops)
      if (op.kind == OpKind::send) routes.insert({sp.stage, op.peer_stage, op.label});
  return {routes.begin(), routes.end()};
}

Result<ReplayPlan> plan_replay(const Setup& s, const Program& p, int stage, bool shard) {
  if (s.training.varlen)
    return fail("training.lengths", "variable-length training (packed or padded sequences of sampled lengths) is not "
                                    "supported by the executor yet");
  if (s.model.moe && s.plan.moe_dispatcher == MoeDispatcher::flex)
    return fail("plan.moe_dispatcher", "the flex dispatcher (DeepEP's two-hop exchange) is not supported by the "
                                       "executor yet");
  if (recompute_modules(s.plan.recompute) & ~kRecomputeCoreAttn)
    return fail("plan.recompute_modules", "recomputing modules other than core_attn is not supported by the executor yet");
  if (s.model.activation == Activation::squared_relu)
    return fail("model.activation", "the squared-ReLU MLP is not supported by the executor yet");
  if (stage < 0 || stage >= static_cast<int>(p.stages.size()))
    return fail("--shard", fmt::format("stage {} is not a pipeline stage of the plan (0-{})", stage, p.stages.size() - 1));
  const StageProgram& sp = p.stages[static_cast<std::size_t>(stage)];
  ReplayPlan r;
  r.stage = stage;
  r.shard = shard;
  r.ops.resize(sp.ops.size());

  std::map<std::tuple<bool, int, OpLabel>, int> channel_of;
  for (const Op& op : sp.ops) {
    if (op.kind != OpKind::send && op.kind != OpKind::recv) continue;
    const bool send = op.kind == OpKind::send;
    if (channel_of.count({send, op.peer_stage, op.label})) continue;
    if (auto ok = send ? check_in_order(p, stage, op.peer_stage, op.label)
                       : check_in_order(p, op.peer_stage, stage, op.label);
        !ok)
      return tl::unexpected(ok.error());
    channel_of[{send, op.peer_stage, op.label}] = static_cast<int>(r.channels.size());
    r.channels.push_back({send, op.peer_stage, op.label, kReplayProgramLanes + static_cast<int>(r.channels.size())});
  }
  r.lanes = kReplayProgramLanes + static_cast<int>(r.channels.size());

  // Ops with the same kernel range and pass share their kernel list.
  std::map<std::tuple<std::uint32_t, std::uint32_t, GemmPass>, std::vector<std::uint32_t>> lists;
  auto kernel_index = [&](const ReplayKernel& k) {
    for (std::size_t i = 0; i < r.kernels.size(); ++i)
      if (r.kernels[i] == k) return static_cast<std::uint32_t>(i);
    r.kernels.push_back(k);
    return static_cast<std::uint32_t>(r.kernels.size() - 1);
  };
  for (std::size_t i = 0; i < sp.ops.size(); ++i) {
    const Op& op = sp.ops[i];
    ReplayOp& ro = r.ops[i];
    if (op.kind == OpKind::send || op.kind == OpKind::recv) {
      ro.channel = channel_of.at({op.kind == OpKind::send, op.peer_stage, op.label});
      ro.lane = r.channels[static_cast<std::size_t>(ro.channel)].lane;
    } else {
      ro.lane = lane_of(op.stream);
    }
    if (op.kind == OpKind::compute) {
      const auto key = std::make_tuple(op.kernel_begin, op.kernel_count, pass_of(op.phase));
      auto it = lists.find(key);
      if (it == lists.end()) {
        std::vector<std::uint32_t> list;
        for (std::uint32_t k = op.kernel_begin; k < op.kernel_begin + op.kernel_count; ++k) {
          const std::uint32_t index = kernel_index(replay_kernel(s, sp.kernels[k], op.phase));
          // A grouped GEMM: its one shape once per group, as GroupedLinear launches them.
          for (std::uint32_t g = 0; g < std::max<std::uint32_t>(1, sp.kernels[k].groups); ++g) list.push_back(index);
        }
        it = lists.emplace(key, std::move(list)).first;
      }
      ro.kernels = it->second;
    } else {
      ro.run = !shard;
      ro.elements = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(op.bytes / 2.0)));
    }
    // Waits: per other lane, the latest dependency (the lane's order covers the earlier ones).
    std::map<int, std::uint32_t> latest;
    for (std::uint32_t d = op.dep_begin; d < op.dep_begin + op.dep_count; ++d) {
      const std::uint32_t dep = sp.deps[d];
      const ReplayOp& rd = r.ops[dep];
      if (!rd.run || rd.lane == ro.lane) continue;
      auto [at, fresh] = latest.try_emplace(rd.lane, dep);
      if (!fresh) at->second = std::max(at->second, dep);
    }
    if (ro.run)
      for (const auto& [lane, dep] : latest) ro.waits.push_back(dep);
  }
  for (const ReplayOp& ro : r.ops)
    for (std::uint32_t k : ro.kernels) {
      const ReplayKernel& rk = r.kernels[k];
      if (rk.type == ReplayKernel::Type::attention &&
          (rk.attention.shape.head_dim > 256 ||
           (rk.attention.shape.head_dim_v != 0 && rk.attention.shape.head_dim_v != rk.attention.shape.head_dim)))
        ++r.skipped_kernels;
    }
  return r;
}

}  // namespace megascope::exec
