#include "core/rank_grid.hpp"

#include "core/result.hpp"

namespace megascope {

GridCoord RankGrid::coord(int rank) const {
  MEGASCOPE_CHECK(rank >= 0 && rank < world(), "rank out of range");
  GridCoord c;
  int r = rank;
  c.tp = r % tp;
  r /= tp;
  c.cp = r % cp;
  r /= cp;
  c.dp = r % dp;
  c.pp = r / dp;
  int e = rank % (world() / pp);   // position inside the stage
  c.etp = e % etp;
  e /= etp;
  c.ep = e % ep;
  c.edp = e / ep;
  return c;
}

int RankGrid::on_stage(int rank, int pp_i) const {
  const GridCoord c = coord(rank);
  return rank_of(c.tp, c.cp, c.dp, pp_i);
}

std::vector<int> RankGrid::group(int rank, CommGroup g) const {
  const GridCoord c = coord(rank);
  const int stage_base = c.pp * (world() / pp);
  std::vector<int> out;
  switch (g) {
    case CommGroup::tp:
      for (int i = 0; i < tp; ++i) out.push_back(rank_of(i, c.cp, c.dp, c.pp));
      break;
    case CommGroup::cp:
      for (int i = 0; i < cp; ++i) out.push_back(rank_of(c.tp, i, c.dp, c.pp));
      break;
    case CommGroup::dp:
      for (int i = 0; i < dp; ++i) out.push_back(rank_of(c.tp, c.cp, i, c.pp));
      break;
    case CommGroup::dp_cp:
      for (int i = 0; i < dp; ++i)
        for (int j = 0; j < cp; ++j) out.push_back(rank_of(c.tp, j, i, c.pp));
      break;
    case CommGroup::pp:
      for (int i = 0; i < pp; ++i) out.push_back(rank_of(c.tp, c.cp, c.dp, i));
      break;
    case CommGroup::etp:
      for (int i = 0; i < etp; ++i) out.push_back(stage_base + i + etp * (c.ep + ep * c.edp));
      break;
    case CommGroup::ep:
      for (int i = 0; i < ep; ++i) out.push_back(stage_base + c.etp + etp * (i + ep * c.edp));
      break;
    case CommGroup::edp:
      for (int i = 0; i < edp; ++i) out.push_back(stage_base + c.etp + etp * (c.ep + ep * i));
      break;
    case CommGroup::embedding:
      out.push_back(rank_of(c.tp, c.cp, c.dp, 0));
      if (pp > 1) out.push_back(rank_of(c.tp, c.cp, c.dp, pp - 1));
      break;
    case CommGroup::dp_shard:
    case CommGroup::dp_replica: {
      // Positions in the DP x CP group (cp fastest, as dp_cp lists them).
      const int n = dp * cp, s = shard > 0 ? shard : n;
      const int at = c.cp + cp * c.dp;
      const auto member = [&](int pos) { return rank_of(c.tp, pos % cp, pos / cp, c.pp); };
      if (g == CommGroup::dp_shard)
        for (int i = at / s * s; i < at / s * s + s; ++i) out.push_back(member(i));
      else
        for (int i = at % s; i < n; i += s) out.push_back(member(i));
      break;
    }
  }
  return out;
}

std::int64_t RankGrid::group_id(int rank, CommGroup g) const {
  // The smallest member identifies a group of a given kind uniquely. Every
  // member list of group() rises with the varying index, so the smallest is
  // the member at index 0: found without listing the group (which made
  // naming every rank's groups quadratic in the DP size).
  const GridCoord c = coord(rank);
  const int stage_base = c.pp * (world() / pp);
  int lo = rank;
  switch (g) {
    case CommGroup::tp: lo = rank_of(0, c.cp, c.dp, c.pp); break;
    case CommGroup::cp: lo = rank_of(c.tp, 0, c.dp, c.pp); break;
    case CommGroup::dp: lo = rank_of(c.tp, c.cp, 0, c.pp); break;
    case CommGroup::dp_cp: lo = rank_of(c.tp, 0, 0, c.pp); break;
    case CommGroup::pp: lo = rank_of(c.tp, c.cp, c.dp, 0); break;
    case CommGroup::etp: lo = stage_base + etp * (c.ep + ep * c.edp); break;
    case CommGroup::ep: lo = stage_base + c.etp + etp * ep * c.edp; break;
    case CommGroup::edp: lo = stage_base + c.etp + etp * c.ep; break;
    case CommGroup::embedding: lo = rank_of(c.tp, c.cp, c.dp, 0); break;
    case CommGroup::dp_shard:
    case CommGroup::dp_replica: {
      const int n = dp * cp, s = shard > 0 ? shard : n;
      const int at = c.cp + cp * c.dp;
      const int first = g == CommGroup::dp_shard ? at / s * s : at % s;
      lo = rank_of(c.tp, first % cp, first / cp, c.pp);
      break;
    }
  }
  return static_cast<std::int64_t>(g) * world() + lo;
}

const char* to_string(CommGroup g) {
  switch (g) {
    case CommGroup::tp: return "tp";
    case CommGroup::cp: return "cp";
    case CommGroup::dp: return "dp";
    case CommGroup::dp_cp: return "dp";
    case CommGroup::pp: return "pp";
    case CommGroup::ep: return "ep";
    case CommGroup::etp: return "etp";
    case CommGroup::edp: return "edp";
    case CommGroup::embedding: return "embedding";
    case CommGroup::dp_shard: return "dp-shard";
    case CommGroup::dp_replica: return "dp-replica";
  }
  return "?";
}

}  // namespace megascope
