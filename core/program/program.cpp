#include "core/program/program.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace megascope {

std::size_t Program::op_count() const {
  std::size_t n = 0;
  for (const StageProgram& s : stages) n += s.ops.size();
  return n;
}

Result<void> validate_program(const Program& p) {
  // Transfers as (from stage, to stage, tag) with the place of their op, in
  // scan order. Sorted afterwards: a duplicate is the second op of a key (the
  // earliest one in scan order is reported), an unmatched transfer is reported
  // in key order. No per-op hashing or allocation.
  struct Transfer {
    std::uint64_t stages;   // (from, to) packed so that the order is that of the signed pair
    std::uint64_t tag;
    std::uint64_t at;       // (index in p.stages) << 32 | op index: scan order
    Transfer(int from, int to, std::uint64_t t, std::uint64_t a)
        : stages((static_cast<std::uint64_t>(static_cast<std::uint32_t>(from) ^ 0x80000000u) << 32) |
                 (static_cast<std::uint32_t>(to) ^ 0x80000000u)),
          tag(t), at(a) {}
    [[nodiscard]] int from() const { return static_cast<int>(static_cast<std::uint32_t>(stages >> 32) ^ 0x80000000u); }
    [[nodiscard]] int to() const { return static_cast<int>(static_cast<std::uint32_t>(stages) ^ 0x80000000u); }
    bool operator<(const Transfer& o) const {
      return stages != o.stages ? stages < o.stages : tag != o.tag ? tag < o.tag : at < o.at;
    }
    [[nodiscard]] bool same_key(const Transfer& o) const { return stages == o.stages && tag == o.tag; }
  };
  const auto where = [&](std::uint64_t at) {
    const StageProgram& s = p.stages[static_cast<std::size_t>(at >> 32)];
    const std::size_t i = static_cast<std::uint32_t>(at);
    const Op& op = s.ops[i];
    return fmt::format("stage {} op {} ({} {})", s.stage, i, to_string(op.kind), to_string(op.label));
  };
  std::vector<Transfer> sends, recvs;
  // Collectives of the groups that span stages, per stage: their members
  // must run the same sequence (kind and size).
  std::map<int, std::vector<std::pair<OpKind, double>>> embedding_seq, pp_seq;
  std::optional<std::pair<std::uint64_t, std::string>> op_error;   // the first error of a single op
  for (std::size_t si = 0; si < p.stages.size() && !op_error; ++si) {
    const StageProgram& s = p.stages[si];
    for (std::size_t i = 0; i < s.ops.size(); ++i) {
      const Op& op = s.ops[i];
      const std::uint64_t at = (static_cast<std::uint64_t>(si) << 32) | i;
      const char* error = nullptr;
      if (op.kernel_begin + op.kernel_count > s.kernels.size()) error = ": kernels out of range";
      else if (op.dep_begin + op.dep_count > s.deps.size()) error = ": dependencies out of range";
      else
        for (std::uint32_t d = op.dep_begin; d < op.dep_begin + op.dep_count && !error; ++d)
          if (s.deps[d] >= i) error = ": depends on a later op";
      if (error) {  // checked before the op's transfer is matched
        op_error.emplace(at, where(at) + error);
        break;
      }
      if (op.kind == OpKind::send) {
        sends.emplace_back(s.stage, op.peer_stage, op.tag, at);
      } else if (op.kind == OpKind::recv) {
        recvs.emplace_back(op.peer_stage, s.stage, op.tag, at);
      } else if (op.kind != OpKind::compute && op.group == CommGroup::embedding) {
        embedding_seq[s.stage].push_back({op.kind, op.bytes});
      } else if (op.kind != OpKind::compute && op.group == CommGroup::pp) {
        pp_seq[s.stage].push_back({op.kind, op.bytes});
      }
      if ((op.kind == OpKind::send || op.kind == OpKind::recv) &&
          (op.peer_stage < 0 || op.peer_stage >= static_cast<int>(p.stages.size()) || op.peer_stage == s.stage)) {
        op_error.emplace(at, where(at) + ": bad peer stage");   // after its duplicate check
        break;
      }
    }
  }
  // Fast path for the common case: per channel (from, to), the sends in scan
  // order carry the tags of the receives in scan order, with no tag twice;
  // then nothing is unmatched or duplicated. Anything else (or an op error)
  // takes the sort below, which finds and names the first problem.
  const auto channels_agree = [&] {
    const std::size_t n = p.stages.size();
    for (std::size_t si = 0; si < n; ++si)
      if (p.stages[si].stage != static_cast<int>(si)) return false;
    if (sends.size() != recvs.size()) return false;
    const auto bucket = [&](const std::vector<Transfer>& list, std::vector<std::uint32_t>& begin, std::vector<std::uint64_t>& tags) {
      begin.assign(n * n + 1, 0);
      const auto channel = [&](const Transfer& t) { return static_cast<std::size_t>(t.from()) * n + static_cast<std::size_t>(t.to()); };
      for (const Transfer& t : list) ++begin[channel(t) + 1];
      for (std::size_t c = 0; c < n * n; ++c) begin[c + 1] += begin[c];
      std::vector<std::uint32_t> fill(begin.begin(), begin.end() - 1);
      tags.resize(list.size());
      for (const Transfer& t : list) tags[fill[channel(t)]++] = t.tag;
    };
    std::vector<std::uint32_t> sb, rb;
    std::vector<std::uint64_t> st, rt;
    bucket(sends, sb, st);
    bucket(recvs, rb, rt);
    if (sb != rb || st != rt) return false;
    for (std::size_t c = 0; c < n * n; ++c) {   // no tag twice in a channel
      const auto first = st.begin() + sb[c], last = st.begin() + sb[c + 1];
      std::sort(first, last);
      if (std::adjacent_find(first, last) != last) return false;
    }
    return true;
  };
  if (!op_error && channels_agree()) {
    sends.clear();
    recvs.clear();
  }
  std::sort(sends.begin(), sends.end());
  std::sort(recvs.begin(), recvs.end());
  std::optional<std::pair<std::uint64_t, const char*>> duplicate;
  for (const auto& [list, what] : {std::pair{&sends, ": duplicate send tag"}, std::pair{&recvs, ": duplicate receive tag"}})
    for (std::size_t k = 1; k < list->size(); ++k)
      if ((*list)[k].same_key((*list)[k - 1]) && (!duplicate || (*list)[k].at < duplicate->first))
        duplicate.emplace((*list)[k].at, what);
  if (duplicate && (!op_error || duplicate->first <= op_error->first))
    return fail("program", where(duplicate->first) + duplicate->second);
  if (op_error) return fail("program", op_error->second);
  const auto matched = [](const std::vector<Transfer>& in, const Transfer& t) {
    Transfer key = t;
    key.at = 0;
    auto it = std::lower_bound(in.begin(), in.end(), key);
    return it != in.end() && it->same_key(t);
  };
  for (const Transfer& t : sends)
    if (!matched(recvs, t))
      return fail("program", fmt::format("send from stage {} to stage {} (tag {:#x}) has no matching receive", t.from(),
                                         t.to(), t.tag));
  for (const Transfer& t : recvs)
    if (!matched(sends, t))
      return fail("program", fmt::format("receive on stage {} from stage {} (tag {:#x}) has no matching send", t.to(),
                                         t.from(), t.tag));
  if (!embedding_seq.empty() && p.stages.size() > 1) {
    const auto& first = embedding_seq[0];
    const auto& last = embedding_seq[static_cast<int>(p.stages.size()) - 1];
    if (first != last) return fail("program", "the first and last stage run different embedding-group collectives");
  }
  if (!pp_seq.empty())
    for (std::size_t si = 1; si < p.stages.size(); ++si)
      if (pp_seq[p.stages[si].stage] != pp_seq[p.stages[0].stage])
        return fail("program", fmt::format("stages {} and {} run different pipeline-group collectives (kind or size)",
                                           p.stages[0].stage, p.stages[si].stage));
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
    case Stream::dp_param: return "dp-param";
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
