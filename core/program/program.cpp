#include "core/program/program.hpp"

#include <fmt/format.h>

#include <map>
#include <tuple>

namespace megascope {

std::size_t Program::op_count() const {
  std::size_t n = 0;
  for (const StageProgram& s : stages) n += s.ops.size();
  return n;
}

Result<void> validate_program(const Program& p) {
  using Key = std::tuple<int, int, std::uint64_t>;   // (from stage, to stage, tag)
  std::map<Key, int> sends, recvs;
  std::map<int, std::vector<std::pair<OpKind, double>>> embedding_seq;
  for (const StageProgram& s : p.stages) {
    for (std::size_t i = 0; i < s.ops.size(); ++i) {
      const Op& op = s.ops[i];
      const auto where = [&] { return fmt::format("stage {} op {} ({} {})", s.stage, i, to_string(op.kind), to_string(op.label)); };
      if (op.kernel_begin + op.kernel_count > s.kernels.size())
        return fail("program", where() + ": kernels out of range");
      if (op.dep_begin + op.dep_count > s.deps.size()) return fail("program", where() + ": dependencies out of range");
      for (std::uint32_t d = op.dep_begin; d < op.dep_begin + op.dep_count; ++d)
        if (s.deps[d] >= i) return fail("program", where() + ": depends on a later op");
      if (op.kind == OpKind::send) {
        if (++sends[{s.stage, op.peer_stage, op.tag}] > 1) return fail("program", where() + ": duplicate send tag");
      } else if (op.kind == OpKind::recv) {
        if (++recvs[{op.peer_stage, s.stage, op.tag}] > 1) return fail("program", where() + ": duplicate receive tag");
      } else if (op.kind != OpKind::compute && op.group == CommGroup::embedding) {
        embedding_seq[s.stage].push_back({op.kind, op.bytes});
      }
      if ((op.kind == OpKind::send || op.kind == OpKind::recv) &&
          (op.peer_stage < 0 || op.peer_stage >= static_cast<int>(p.stages.size()) || op.peer_stage == s.stage))
        return fail("program", where() + ": bad peer stage");
    }
  }
  for (const auto& [key, n] : sends)
    if (!recvs.count(key))
      return fail("program", fmt::format("send from stage {} to stage {} (tag {:#x}) has no matching receive",
                                         std::get<0>(key), std::get<1>(key), std::get<2>(key)));
  for (const auto& [key, n] : recvs)
    if (!sends.count(key))
      return fail("program", fmt::format("receive on stage {} from stage {} (tag {:#x}) has no matching send",
                                         std::get<1>(key), std::get<0>(key), std::get<2>(key)));
  if (!embedding_seq.empty() && p.stages.size() > 1) {
    const auto& first = embedding_seq[0];
    const auto& last = embedding_seq[static_cast<int>(p.stages.size()) - 1];
    if (first != last) return fail("program", "the first and last stage run different embedding-group collectives");
  }
  return {};
}

const char* to_string(Stream s) {
  switch (s) {
    case Stream::compute: return "compute";
    case Stream::tp: return "tp";
    case Stream::cp: return "cp";
    case Stream::ep: return "ep";
    case Stream::dp: return "dp";
    case Stream::pp_send: return "pp-send";
    case Stream::pp_recv: return "pp-recv";
  }
  return "?";
}

const char* to_string(OpKind k) {
  switch (k) {
    case OpKind::compute: return "compute";
    case OpKind::all_reduce: return "all-reduce";
    case OpKind::reduce_scatter: return "reduce-scatter";
    case OpKind::all_gather: return "all-gather";
    case OpKind::all_to_all: return "all-to-all";
    case OpKind::send: return "send";
    case OpKind::recv: return "recv";
  }
  return "?";
}

const char* to_string(Phase p) {
  switch (p) {
    case Phase::forward: return "F";
    case Phase::backward_input: return "B";
    case Phase::backward_weight: return "W";
    case Phase::recompute: return "R";
    case Phase::optimizer: return "optimizer";
    case Phase::gradient_sync: return "grad-sync";
    case Phase::param_sync: return "param-sync";
  }
  return "?";
}

const char* to_string(OpLabel l) {
  switch (l) {
    case OpLabel::embedding: return "embedding";
    case OpLabel::attention: return "attention";
    case OpLabel::mlp: return "mlp";
    case OpLabel::moe: return "moe";
    case OpLabel::output_loss: return "output+loss";
    case OpLabel::optimizer: return "optimizer";
    case OpLabel::tp_comm: return "tp";
    case OpLabel::cp_comm: return "cp";
    case OpLabel::ep_comm: return "ep";
    case OpLabel::dp_grad: return "dp-grad";
    case OpLabel::dp_param: return "dp-param";
    case OpLabel::embedding_grad: return "embedding-grad";
    case OpLabel::pp_activation: return "pp-activation";
    case OpLabel::pp_gradient: return "pp-gradient";
  }
  return "?";
}

}  // namespace megascope
