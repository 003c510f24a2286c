// RankGrid: Megatron-LM's placement of ranks on the 5-D grid, as pure
// arithmetic. Dense layers use the order tp-cp-dp-pp (tp fastest):
//   rank = tp_i + TP (cp_i + CP (dp_i + DP pp_i))
// Expert layers fold their own grid etp-ep-edp-pp onto the same ranks:
//   rank = etp_i + ETP (ep_i + EP (edp_i + EDP pp_i))
// so EP lives inside DP x CP of one pipeline stage (MoE parallel folding).
//
// Worked example, TP 2, CP 1, DP 4, PP 2 (16 ranks): rank 13 = tp 1, dp 2,
// pp 1; its TP group is {12, 13}, its DP group {9, 11, 13, 15}, its PP group
// {5, 13}. With EP 2 (ETP 2, EDP 2) its EP group is {13, 15}.
#pragma once

#include <cstdint>
#include <vector>

namespace megascope {

// dp_shard and dp_replica: hybrid sharded data parallelism (HSDP) splits
// the DP x CP group into replicas of `shard` consecutive members each; a
// rank's dp_shard group is its replica, its dp_replica group the members at
// its position in every replica.
enum class CommGroup : std::uint8_t { tp, cp, dp, dp_cp, pp, ep, etp, edp, embedding, dp_shard, dp_replica };
inline constexpr int kCommGroupCount = 11;

struct GridCoord {
  int tp = 0, cp = 0, dp = 0, pp = 0;   // dense grid
  int etp = 0, ep = 0, edp = 0;         // expert grid
};

struct RankGrid {
  int tp = 1, cp = 1, dp = 1, pp = 1;
  int etp = 1, ep = 1, edp = 1;
  int shard = 0;   // HSDP: members of DP x CP per replica (0: all of them)

  [[nodiscard]] int world() const { return tp * cp * dp * pp; }
  [[nodiscard]] GridCoord coord(int rank) const;
  [[nodiscard]] int rank_of(int tp_i, int cp_i, int dp_i, int pp_i) const {
    return tp_i + tp * (cp_i + cp * (dp_i + dp * pp_i));
  }
  // Members of `rank`'s group, in group-rank order. dp_cp is the gradient
  // group (DP x CP); embedding is {first stage, last stage} of the rank's pipeline.
  [[nodiscard]] std::vector<int> group(int rank, CommGroup g) const;
  // A number identifying the group instance (equal for all its members).
  [[nodiscard]] std::int64_t group_id(int rank, CommGroup g) const;
  // The rank holding the same tp/cp/dp position on pipeline stage `pp_i`.
  [[nodiscard]] int on_stage(int rank, int pp_i) const;
};

const char* to_string(CommGroup g);

}  // namespace megascope
