// Variable-length training, the data side: how long the sequences of a
// training set are (a distribution and a deterministic sampler), what their
// causal attention costs, and how Megatron-LM packs them into micro-batches:
// the static dp_balanced scheduler and dynamic context parallelism's
// default_dynamic_cp scheduler (megatron/core/datasets/data_schedule.py and
// data_schedule_utils.py). What a packed micro-batch costs is the Program's
// and the cost model's business (core/program/work.hpp AttentionShape::packed).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/result.hpp"

namespace megascope {

// Sequence lengths of a training set, in tokens.
struct LengthDistribution {
  enum class Kind : std::uint8_t { fixed, lognormal, histogram };
  Kind kind = Kind::fixed;
  // lognormal: Megatron-LM's mock variable-length data
  // (--sft-mock-dataset-config-json {"type": "lognormal", "min_seq_len",
  // "max_seq_len", "mean_seq_len", "lognormal_sigma"}, MockSFTLowLevelDataset):
  // X = exp(mu + sigma N(0, 1)) with mu = ln(mean) - sigma^2 / 2, so that
  // `mean` is the mean of the unclipped distribution; each length is X
  // clipped to [min, max] and truncated to an integer, as Megatron-LM's
  // np.clip(samples, min, max).astype(int64) does.
  double mean = 0, sigma = 0;
  std::int64_t min = 1, max = 0;     // fixed: every sequence has length max
  // histogram: (length, weight) rows, weights > 0; a length is drawn with
  // probability weight / sum of weights (rows of one length add up).
  std::vector<std::pair<std::int64_t, double>> histogram;
};

inline constexpr std::size_t kMaxLengthHistogramRows = 1'000'000;
inline constexpr std::uintmax_t kMaxLengthHistogramBytes = std::uintmax_t{1} << 30;   // 1 GiB

// The rules a distribution must meet for a run of seq_length tokens: every
// length it can give lies in [1, seq_length] (fixed: max; lognormal:
// 1 <= min <= max <= seq_length; histogram: each row's length); lognormal:
// mean finite in [min, max], sigma in (0, 10]; histogram: 1 to 1,000,000
// rows, weights finite and > 0 with a finite sum. Errors name the field
// ("training.lengths.max", ".min", ".mean", ".sigma", ".histogram") and the rule.
Result<void> validate_lengths(const LengthDistribution& d, std::int64_t seq_length);

// Reads a length histogram: a text file of at most 1 GiB, one row per line,
// "length count" or "length,count" (an integer length >= 1, a finite count
// > 0, which may be fractional: a frequency), '#' starting a comment, blank
// lines skipped; at most 1,000,000 rows. Returns a Kind::histogram
// distribution; validate_lengths checks the lengths against seq_length.
// Errors carry the file and, for a bad row, its 1-based line (Error::where),
// field "training.lengths.file".
Result<LengthDistribution> read_length_histogram(const std::string& path);

// The random numbers behind sample_lengths, exposed for their tests:
// splitmix64 (Steele, Lea & Flood 2014; Vigna's reference splitmix64.c) to
// seed, and xoshiro256** (Blackman & Vigna 2018, xoshiro256starstar.c) for
// the stream. Plain 64-bit integer arithmetic: the same on every platform.
std::uint64_t splitmix64_next(std::uint64_t& state);
struct Xoshiro256 {
  std::uint64_t s[4] = {0, 0, 0, 0};
  // The four words of state from splitmix64 started at `seed`, as Vigna recommends.
  static Xoshiro256 seeded(std::uint64_t seed);
  std::uint64_t next();
  // A double in [0, 1): the top 53 bits of next() over 2^53.
  double uniform();
};

// `count` lengths of the global batch of `step` from stream `seed`: the same
// (d, seed, step, count) gives the same lengths on every platform, and the
// first k of count draws are the draws of count k. The stream is xoshiro256**
// seeded with splitmix64 from the seed and the step. No std:: distributions
// (their output differs between standard libraries): histogram lengths come
// from an inverse CDF on the cumulative weights (a binary search; IEEE
// arithmetic only, bit-identical everywhere); lognormal ones from Box-Muller
// normals, both of each pair used (cos then sin), which go through log, cos,
// sin and exp: their last bit may differ between math libraries, which moves
// a length by one token only where a draw lies within an ulp of an integer.
std::vector<std::int64_t> sample_lengths(const LengthDistribution& d, std::uint64_t seed, std::uint64_t step,
                                         std::size_t count);

// The expected length. fixed: max; histogram: the weighted mean;
// lognormal: the exact mean of the clipped, truncated length (not a sample):
// E[floor(clip(X, min, max))] = min + sum over k in (min, max] of P(X >= k),
// each term 1/2 erfc((ln k - mu) / (sigma sqrt 2)), summed over the k where
// the term is neither 0 nor 1 to double precision (within 9 sigma of mu in
// log space; the 1s beyond are counted, the 0s dropped); at most max - min
// erfc calls.
double mean_length(const LengthDistribution& d);

// Causal query-key pairs of one document of d tokens: d^2 / 2, the
// convention of attention_pairs (core/program/work.hpp) for seq_q == seq_kv.
double causal_pairs(std::int64_t d);
// Pairs a block-tiled fused attention kernel (FlashAttention, cuDNN) computes
// for one causal document: B x B tiles, n = ceil(d / B) per side, of which the
// n (n + 1) / 2 on and below the diagonal run in full: n (n + 1) / 2 B^2.
// A short document pays a whole tile (d = 1: B^2). 0 for d <= 0.
double causal_block_pairs(std::int64_t d, std::int64_t block = 128);

// Megatron-LM's static packing scheduler (DpBalancedScheduler,
// --sequence-packing-scheduler dp_balanced): the sequences, in the given
// order, are packed while a pack's tokens stay <= pack_budget
// (max_seqlen_per_dp_cp_rank * cp; a pack is split over its replica's cp
// ranks); a sequence longer than the budget is a pack of its own. Then,
// while the pack count is not a multiple of `multiple` (dp, or dp *
// microbatch_group_size_per_vp_stage with interleaving), the last sequence
// of the last pack (walking back from the end) that holds more than one is
// moved to a new pack of its own at the end. Micro-batch i of DP replica j
// gets pack i * dp + j. Errors: no sequences, a length < 1, pack_budget < 1,
// dp < 1, `multiple` not a positive multiple of dp, or too few sequences to
// make the count a multiple (Megatron-LM's "Not enough samples to move").
// Megatron-LM opens an empty pack when the very first sequence is over the
// budget; here no pack is ever empty.
struct StaticSchedule {
  int microbatches = 0;                                         // per DP replica
  std::vector<std::vector<std::vector<std::int64_t>>> packs;    // [dp replica][micro-batch] -> document lengths
};
Result<StaticSchedule> schedule_static(const std::vector<std::int64_t>& lengths, std::int64_t pack_budget, int dp,
                                       int multiple);

// Dynamic context parallelism's group size for a sequence of `length`
// tokens (dcp_gpus_needed): the fewest ranks, a power of two, that hold it at
// per_rank_budget tokens each, at least min_cp: max(min_cp, 2^ceil(log2(length
// / per_rank_budget))), at least 1. Computed on integers (Megatron-LM takes a
// floating-point log2; the same wherever that is exact).
std::int64_t dcp_ranks_needed(std::int64_t length, std::int64_t per_rank_budget, int min_cp = 1);
// The scheduler's estimate of a sequence's work per rank
// (dcp_get_total_workload): length^2 / ranks, causal attention's pairs split
// over its CP group.
double dcp_workload(std::int64_t length, std::int64_t ranks);

// Megatron-LM's dynamic context parallelism scheduler
// (DefaultDynamicCPScheduler, next_hdp_group, dcp_make_buckets_equal,
// align_sample_id_groups; --dynamic-context-parallel
// --sequence-packing-scheduler default_dynamic_cp). The sequences, longest
// first, are cut into buckets of about equal estimated work (as many as
// there are distinct group sizes g(L) = dcp_ranks_needed), and micro-batches
// are formed one at a time over all dp_cp_ranks ranks, which each forms
// into CP groups of its own:
//  - each step takes the head of the first bucket whose head has a group of
//    its size g in the micro-batch or g free ranks, and puts it on a new
//    group of the lowest free ranks when there are g of them, else on the
//    least loaded group of size g whose tokens per rank stay within
//    per_rank_budget; when neither, the micro-batch closes;
//  - it also closes once a sequence of a smaller g than the micro-batch's
//    first has been placed and the ranks' loads (sum of w(L) = L^2 / g) are
//    within 5% of each other (free ranks count as 0), with sequences left;
//  - ranks left free are filled by doubling the first group of the smallest
//    size (its sequences then spread over twice the ranks), again until none
//    is free. The sequences not placed are bucketed afresh for the next one.
// Then, with multiple > 1 (microbatch_group_size_per_vp_stage with
// interleaving), micro-batches are split until their count is a multiple:
// walking back from the last (and round again), a micro-batch of two or more
// groups is cut at the first group boundary at or past half the ranks; its
// second part replaces it, its first part is appended, and each part fills
// its free ranks by doubling as above. Errors: no sequences, a length < 1,
// per_rank_budget < 1, dp_cp_ranks < 1, min_cp < 1, multiple < 1, a sequence
// needing more ranks than dp_cp_ranks (training.lengths: "a sequence of N
// tokens needs G ranks at P tokens per rank; the plan has R"), or no
// micro-batch left to split. Where this differs from Megatron-LM:
//  - a doubling that would need more free ranks than are left (dp * cp not a
//    power of two) grows the group by the free ranks instead; Megatron-LM
//    indexes past its rank list there (and loops forever in align's fill);
//  - a group's tokens per rank are compared on integers (tokens <= budget *
//    g); Megatron-LM sums floating-point tokens / g, the same while exact.
struct DynamicRankWork {
  std::vector<std::int64_t> docs;   // lengths of the sequences this rank shares, each split over the group's cp ranks
  int cp = 1;                       // the group size
  int group = 0;                    // the group's id, unique within the micro-batch (0, 1, ... in rank order)
};
struct DynamicSchedule {
  int microbatches = 0;
  std::vector<std::vector<DynamicRankWork>> work;   // [micro-batch][rank in dp*cp]
};
Result<DynamicSchedule> schedule_dynamic_cp(const std::vector<std::int64_t>& lengths, std::int64_t per_rank_budget,
                                            int dp_cp_ranks, int min_cp, int multiple);

}  // namespace megascope
