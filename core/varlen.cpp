#include "core/varlen.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <string_view>
#include <system_error>

namespace megascope {

// --- Distributions ----------------------------------------------------------

Result<void> validate_lengths(const LengthDistribution& d, std::int64_t seq_length) {
  if (seq_length < 1) return fail("training.seq_length", fmt::format("must be >= 1, found {}", seq_length));
  switch (d.kind) {
    case LengthDistribution::Kind::fixed:
      if (d.max < 1 || d.max > seq_length)
        return fail("training.lengths.max", fmt::format("a fixed length must be in [1, seq_length {}], found {}",
                                                        seq_length, d.max));
      return {};
    case LengthDistribution::Kind::lognormal:
      if (d.min < 1 || d.min > seq_length)
        return fail("training.lengths.min", fmt::format("must be in [1, seq_length {}], found {}", seq_length, d.min));
      if (d.max < d.min || d.max > seq_length)
        return fail("training.lengths.max",
                    fmt::format("must be in [min {}, seq_length {}], found {}", d.min, seq_length, d.max));
      if (!std::isfinite(d.mean) || d.mean < static_cast<double>(d.min) || d.mean > static_cast<double>(d.max))
        return fail("training.lengths.mean", fmt::format("the lognormal's mean must be in [min {}, max {}], found {}",
                                                         d.min, d.max, d.mean));
      if (!(d.sigma > 0 && d.sigma <= 10))
        return fail("training.lengths.sigma",
                    fmt::format("the lognormal's sigma (of ln length) must be in (0, 10], found {}", d.sigma));
      return {};
    case LengthDistribution::Kind::histogram: {
      if (d.histogram.empty() || d.histogram.size() > kMaxLengthHistogramRows)
        return fail("training.lengths.histogram", fmt::format("must have 1 to {} rows, found {}",
                                                              kMaxLengthHistogramRows, d.histogram.size()));
      double sum = 0;
      for (std::size_t i = 0; i < d.histogram.size(); ++i) {
        const auto& [length, weight] = d.histogram[i];
        if (length < 1 || length > seq_length)
          return fail("training.lengths.histogram", fmt::format("row {}: the length must be in [1, seq_length {}], "
                                                                "found {}", i + 1, seq_length, length));
        if (!std::isfinite(weight) || weight <= 0)
          return fail("training.lengths.histogram",
                      fmt::format("row {}: the weight must be finite and > 0, found {}", i + 1, weight));
        sum += weight;
      }
      if (!std::isfinite(sum)) return fail("training.lengths.histogram", "the weights' sum overflows");
      return {};
    }
  }
  return fail("training.lengths", "unknown distribution kind");
}

namespace {

std::string_view trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

}  // namespace

Result<LengthDistribution> read_length_histogram(const std::string& path) {
  namespace fs = std::filesystem;
  const auto at = [&path](std::optional<int> line, std::string message) {
    return tl::unexpected<Error>(
        Error{std::move(message), "training.lengths.file", SourceLocation{path, line, std::nullopt}});
  };
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) return at(std::nullopt, "cannot open the length histogram: no such file");
  if (fs::is_directory(st)) return at(std::nullopt, "is a directory, not a length histogram file");
  if (!fs::is_regular_file(st))
    return at(std::nullopt, "not a regular file (a device, pipe or socket); give a length histogram file");
  const std::uintmax_t size = fs::file_size(path, ec);
  if (!ec && size > kMaxLengthHistogramBytes)
    return at(std::nullopt, fmt::format("{} bytes; a length histogram of at most {} bytes (1 GiB) is read", size,
                                        kMaxLengthHistogramBytes));
  std::ifstream in(path);
  if (!in) return at(std::nullopt, "cannot open the length histogram");

  LengthDistribution d;
  d.kind = LengthDistribution::Kind::histogram;
  std::string raw;
  int n = 0;
  while (std::getline(in, raw)) {
    ++n;
    std::string_view line(raw);
    if (const auto hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    line = trim(line);
    if (line.empty()) continue;
    // Two fields: split at the one comma, or else at the whitespace.
    std::string_view a, b;
    if (const auto comma = line.find(','); comma != std::string_view::npos) {
      a = trim(line.substr(0, comma));
      b = trim(line.substr(comma + 1));
      if (b.find(',') != std::string_view::npos || b.find_first_of(" \t") != std::string_view::npos || a.empty() ||
          b.empty() || a.find_first_of(" \t") != std::string_view::npos)
        return at(n, fmt::format("'{}': a row is \"length count\" or \"length,count\"", line));
    } else {
      const auto gap = line.find_first_of(" \t");
      if (gap == std::string_view::npos)
        return at(n, fmt::format("'{}': a row is \"length count\" or \"length,count\" (no count)", line));
      a = line.substr(0, gap);
      b = trim(line.substr(gap));
      if (b.find_first_of(" \t") != std::string_view::npos)
        return at(n, fmt::format("'{}': a row is \"length count\" or \"length,count\" (more than two fields)", line));
    }
    std::int64_t length = 0;
    const auto [pa, ea] = std::from_chars(a.data(), a.data() + a.size(), length);
    if (ea != std::errc{} || pa != a.data() + a.size() || length < 1)
      return at(n, fmt::format("the length '{}' must be an integer >= 1 (tokens)", a));
    double count = 0;
    const auto [pb, eb] = std::from_chars(b.data(), b.data() + b.size(), count);
    if (eb != std::errc{} || pb != b.data() + b.size() || !std::isfinite(count) || count <= 0)
      return at(n, fmt::format("the count '{}' must be a finite number > 0", b));
    if (d.histogram.size() == kMaxLengthHistogramRows)
      return at(n, fmt::format("more than {} rows: merge rows of one length or coarsen the lengths",
                               kMaxLengthHistogramRows));
    d.histogram.emplace_back(length, count);
  }
  if (in.bad()) return at(std::nullopt, "cannot read the length histogram");
  if (d.histogram.empty()) return at(std::nullopt, "no rows: one \"length count\" per line");
  return d;
}

// --- Random numbers ---------------------------------------------------------

std::uint64_t splitmix64_next(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

Xoshiro256 Xoshiro256::seeded(std::uint64_t seed) {
  Xoshiro256 g;
  for (std::uint64_t& w : g.s) w = splitmix64_next(seed);
  return g;
}

std::uint64_t Xoshiro256::next() {
  const auto rotl = [](std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
  const std::uint64_t result = rotl(s[1] * 5, 7) * 9;
  const std::uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double Xoshiro256::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

namespace {

constexpr double kPi = 3.14159265358979323846;

// mu of the lognormal whose mean (of the unclipped distribution) is d.mean.
double lognormal_mu(const LengthDistribution& d) { return std::log(d.mean) - d.sigma * d.sigma / 2; }

// floor(clip(x, min, max)); NaN gives min.
std::int64_t clip_truncate(double x, std::int64_t lo, std::int64_t hi) {
  if (!(x > static_cast<double>(lo))) return lo;
  if (x >= static_cast<double>(hi)) return hi;
  return static_cast<std::int64_t>(x);   // toward zero: floor for x > lo >= 1
}

}  // namespace

std::vector<std::int64_t> sample_lengths(const LengthDistribution& d, std::uint64_t seed, std::uint64_t step,
                                         std::size_t count) {
  std::vector<std::int64_t> out;
  out.reserve(count);
  // The stream of (seed, step): splitmix64 mixes the seed, the step is folded
  // in, and splitmix64 from there seeds xoshiro256**.
  std::uint64_t mix = seed;
  Xoshiro256 rng = Xoshiro256::seeded(splitmix64_next(mix) ^ step);
  switch (d.kind) {
    case LengthDistribution::Kind::fixed:
      out.assign(count, d.max);
      break;
    case LengthDistribution::Kind::histogram: {
      MEGASCOPE_CHECK(!d.histogram.empty(), "sample_lengths: an empty histogram (validate_lengths first)");
      std::vector<double> cum;
      cum.reserve(d.histogram.size());
      double total = 0;
      for (const auto& row : d.histogram) cum.push_back(total += row.second);
      for (std::size_t i = 0; i < count; ++i) {
        const double r = rng.uniform() * total;
        const auto it = std::upper_bound(cum.begin(), cum.end(), r);   // the first row whose cumulative weight passes r
        const std::size_t k = std::min<std::size_t>(static_cast<std::size_t>(it - cum.begin()), cum.size() - 1);
        out.push_back(d.histogram[k].first);
      }
      break;
    }
    case LengthDistribution::Kind::lognormal: {
      const double mu = lognormal_mu(d);
      while (out.size() < count) {
        // Box-Muller: two independent standard normals from two uniforms
        // (the first in (0, 1] so that its log is finite).
        const double u1 = 1.0 - rng.uniform(), u2 = rng.uniform();
        const double radius = std::sqrt(-2.0 * std::log(u1)), angle = 2.0 * kPi * u2;
        out.push_back(clip_truncate(std::exp(mu + d.sigma * radius * std::cos(angle)), d.min, d.max));
        if (out.size() < count)
          out.push_back(clip_truncate(std::exp(mu + d.sigma * radius * std::sin(angle)), d.min, d.max));
      }
      break;
    }
  }
  return out;
}

double mean_length(const LengthDistribution& d) {
  switch (d.kind) {
    case LengthDistribution::Kind::fixed:
      return static_cast<double>(d.max);
    case LengthDistribution::Kind::histogram: {
      double w = 0, lw = 0;
      for (const auto& [length, weight] : d.histogram) {
        w += weight;
        lw += static_cast<double>(length) * weight;
      }
      return w > 0 ? lw / w : 0.0;
    }
    case LengthDistribution::Kind::lognormal: {
      if (d.max <= d.min) return static_cast<double>(d.min);
      if (!(d.sigma > 0) || !(d.mean > 0)) return static_cast<double>(clip_truncate(d.mean, d.min, d.max));
      const double mu = lognormal_mu(d), s = d.sigma;
      // P(X >= k) is 1 to double precision below exp(mu - 9 sigma) (Phi(-9)
      // ~ 1e-19) and 0 above exp(mu + 9 sigma).
      const double lo = std::exp(mu - 9 * s), hi = std::exp(mu + 9 * s);
      const auto clamp_k = [&d](double x) {
        if (!(x > static_cast<double>(d.min))) return d.min;
        if (x >= static_cast<double>(d.max)) return d.max;
        return static_cast<std::int64_t>(x);
      };
      const std::int64_t ones_to = clamp_k(std::floor(lo)), last = clamp_k(std::ceil(hi));
      double sum = static_cast<double>(d.min) + static_cast<double>(ones_to - d.min);
      for (std::int64_t k = ones_to + 1; k <= last; ++k)
        sum += 0.5 * std::erfc((std::log(static_cast<double>(k)) - mu) / (s * std::sqrt(2.0)));
      return sum;
    }
  }
  return 0.0;
}

// --- Attention work ---------------------------------------------------------

double causal_pairs(std::int64_t d) {
  const double x = static_cast<double>(d);
  return d > 0 ? x * x / 2 : 0.0;
}

double causal_block_pairs(std::int64_t d, std::int64_t block) {
  MEGASCOPE_CHECK(block > 0, "causal_block_pairs: the tile size must be > 0");
  if (d <= 0) return 0.0;
  const double n = static_cast<double>(d / block + (d % block != 0));
  const double b = static_cast<double>(block);
  return n * (n + 1) / 2 * b * b;
}

// --- Static packing (dp_balanced) -------------------------------------------

namespace {

Result<void> check_sequences(const std::vector<std::int64_t>& lengths) {
  if (lengths.empty()) return fail("training.lengths", "no sequences to schedule");
  for (std::size_t i = 0; i < lengths.size(); ++i)
    if (lengths[i] < 1)
      return fail("training.lengths",
                  fmt::format("sequence {} has {} tokens; a sequence has at least 1", i, lengths[i]));
  return {};
}

}  // namespace

Result<StaticSchedule> schedule_static(const std::vector<std::int64_t>& lengths, std::int64_t pack_budget, int dp,
                                       int multiple) {
  if (auto ok = check_sequences(lengths); !ok) return tl::unexpected(ok.error());
  if (pack_budget < 1)
    return fail("training.seq_length", fmt::format("the pack budget must be >= 1 token, found {}", pack_budget));
  if (dp < 1) return fail("plan.dp", fmt::format("must be >= 1, found {}", dp));
  if (multiple < 1 || multiple % dp != 0)
    return fail("plan.dp", fmt::format("the pack count's multiple must be a positive multiple of dp {}, found {}", dp,
                                       multiple));

  // Pack in order while the pack's tokens stay within the budget. A sequence
  // over the budget starts a pack that the next sequence closes (written as
  // `length > budget - sum` so that nothing overflows).
  std::vector<std::vector<std::int64_t>> packs;
  std::vector<std::int64_t> cur;
  std::int64_t sum = 0;
  for (const std::int64_t length : lengths) {
    if (!cur.empty() && length > pack_budget - sum) {
      packs.push_back(std::move(cur));
      cur.clear();
      sum = 0;
    }
    cur.push_back(length);
    sum += length;
  }
  packs.push_back(std::move(cur));

  // Make the count a multiple: walking back from the last pack, split off
  // the last sequence of a pack holding more than one into a pack of its own.
  const auto m = static_cast<std::size_t>(multiple);
  if (packs.size() % m != 0) {
    std::size_t to_move = m - packs.size() % m;
    std::ptrdiff_t i = static_cast<std::ptrdiff_t>(packs.size()) - 1;
    while (to_move > 0) {
      if (i < 0)
        return fail("training.lengths",
                    fmt::format("{} sequences cannot make a multiple of {} packs (dp {} times the micro-batch group): "
                                "no pack of two or more sequences is left to split (Megatron-LM: \"Not enough samples "
                                "to move\")", lengths.size(), multiple, dp));
      auto& pack = packs[static_cast<std::size_t>(i)];
      if (pack.size() > 1) {
        const std::int64_t last = pack.back();
        pack.pop_back();
        packs.push_back({last});
        --to_move;
      } else {
        --i;
      }
    }
  }

  StaticSchedule s;
  const auto replicas = static_cast<std::size_t>(dp);
  s.microbatches = static_cast<int>(packs.size() / replicas);
  s.packs.assign(replicas, {});
  for (std::size_t i = 0; i < packs.size(); ++i) s.packs[i % replicas].push_back(std::move(packs[i]));
  return s;
}

// --- Dynamic context parallelism (default_dynamic_cp) -----------------------

std::int64_t dcp_ranks_needed(std::int64_t length, std::int64_t per_rank_budget, int min_cp) {
  MEGASCOPE_CHECK(per_rank_budget > 0, "dcp_ranks_needed: the per-rank budget must be > 0");
  const std::int64_t need = length <= 0 ? 1 : length / per_rank_budget + (length % per_rank_budget != 0);
  std::int64_t p = 1;
  while (p < need) {
    if (p > std::numeric_limits<std::int64_t>::max() / 2) return std::numeric_limits<std::int64_t>::max();
    p *= 2;
  }
  return std::max<std::int64_t>(p, min_cp);
}

double dcp_workload(std::int64_t length, std::int64_t ranks) {
  // length^2 rounded once (exact in int64 up to 3e9 tokens), as Python's
  // integer product then true division.
  const double x = static_cast<double>(length);
  const double sq = std::abs(length) <= 3'037'000'499 ? static_cast<double>(length * length) : x * x;
  return sq / static_cast<double>(ranks);
}

namespace {

// One CP group of a micro-batch being formed: its ranks follow the previous
// group's (groups hold contiguous ranks, in creation order).
struct DcpGroup {
  std::int64_t size = 0;              // ranks
  std::vector<std::int64_t> docs;     // lengths, in the order placed
  std::int64_t tokens = 0;            // sum of docs
  double load = 0;                    // sum of dcp_workload(L, g(L)): every member rank's
};
using DcpMicrobatch = std::vector<DcpGroup>;

struct DcpSeq {
  std::int64_t length = 0;
  std::int64_t ranks = 0;             // g(length)
  double work = 0;                    // w(length)
};

// dcp_make_buckets_equal: cut the (longest first) sequences into as many
// buckets as there are distinct group sizes, a bucket closing before the
// sequence that would take it past 1.1 times the mean bucket work, or
// before the sequence whose count of sequences left (itself included) is no
// more than k - 2 * (buckets closed): Megatron-LM's `len - i <= remaining_k -
// len(buckets)`, where both terms move at each close, kept as it is.
std::vector<std::vector<DcpSeq>> make_buckets(const std::vector<DcpSeq>& seqs) {
  std::set<std::int64_t> sizes;
  double total = 0;
  for (const DcpSeq& s : seqs) {
    sizes.insert(s.ranks);
    total += s.work;
  }
  const auto k = static_cast<std::int64_t>(sizes.size());
  const double target = total / static_cast<double>(k);
  std::vector<std::vector<DcpSeq>> buckets;
  std::vector<DcpSeq> cur;
  double cur_work = 0;
  std::int64_t remaining_k = k;
  const auto n = static_cast<std::int64_t>(seqs.size());
  for (std::int64_t i = 0; i < n; ++i) {
    const DcpSeq& s = seqs[static_cast<std::size_t>(i)];
    const double projected = cur_work + s.work;
    if (!cur.empty() &&
        (projected > target * 1.1 || n - i <= remaining_k - static_cast<std::int64_t>(buckets.size()))) {
      buckets.push_back(std::move(cur));
      cur.clear();
      cur_work = 0;
      --remaining_k;
    }
    cur.push_back(s);
    cur_work += s.work;
  }
  if (!cur.empty()) buckets.push_back(std::move(cur));
  return buckets;
}

// Fill the free ranks after the groups (used of total in use): double the
// first group of the smallest size, again until none is free. A doubling
// that needs more ranks than are free takes the free ones (see the header).
void fill_free_ranks(DcpMicrobatch& mb, std::int64_t used, std::int64_t total) {
  MEGASCOPE_CHECK(!mb.empty(), "dynamic CP: a micro-batch without a group");
  while (used < total) {
    auto smallest = std::min_element(mb.begin(), mb.end(),
                                     [](const DcpGroup& a, const DcpGroup& b) { return a.size < b.size; });
    const std::int64_t m = smallest->size;
    const std::int64_t grow = std::min(std::min(2 * m, total) - m, total - used);
    MEGASCOPE_CHECK(grow > 0, "dynamic CP: no group can grow into the free ranks");
    smallest->size += grow;
    used += grow;
  }
}

// next_hdp_group: form one micro-batch from `remaining` (longest first) and
// leave the sequences it did not place in `remaining`, longest first.
DcpMicrobatch next_microbatch(std::vector<DcpSeq>& remaining, std::int64_t budget, std::int64_t total) {
  constexpr double kDelta = 0.05;   // the balance within which a micro-batch may close early
  std::vector<std::vector<DcpSeq>> buckets = make_buckets(remaining);
  std::vector<std::size_t> head(buckets.size(), 0);
  std::size_t first = 0;            // buckets before `first` are used up
  DcpMicrobatch mb;
  std::int64_t used = 0;            // ranks in groups: [0, used)
  std::int64_t first_ranks = 0;     // the first placed sequence's group size
  bool check_balance = false;
  while (first < buckets.size()) {
    // The first bucket whose head has a group of its size or enough free ranks.
    std::size_t chosen = buckets.size();
    for (std::size_t b = first; b < buckets.size() && chosen == buckets.size(); ++b) {
      if (head[b] == buckets[b].size()) continue;
      const std::int64_t need = buckets[b][head[b]].ranks;
      const bool has_group =
          std::any_of(mb.begin(), mb.end(), [need](const DcpGroup& g) { return g.size == need; });
      if (has_group || total - used >= need) chosen = b;
    }
    if (chosen == buckets.size()) break;
    const DcpSeq s = buckets[chosen][head[chosen]];
    if (first_ranks == 0) first_ranks = s.ranks;

    // The least loaded group of its size with room (the first of equals), or
    // a new group on the lowest free ranks, whose load (0) is lower still.
    std::optional<std::size_t> best;
    double best_load = std::numeric_limits<double>::infinity();
    for (std::size_t g = 0; g < mb.size(); ++g)
      if (mb[g].size == s.ranks && mb[g].tokens + s.length <= budget * s.ranks && mb[g].load < best_load) {
        best = g;
        best_load = mb[g].load;
      }
    if (total - used >= s.ranks) {
      if (0.0 < best_load) {
        mb.push_back(DcpGroup{s.ranks, {}, 0, 0.0});
        used += s.ranks;
        best = mb.size() - 1;
      }
    } else if (!best) {
      break;
    }
    DcpGroup& g = mb[*best];
    g.docs.push_back(s.length);
    g.tokens += s.length;
    g.load += s.work;

    ++head[chosen];
    while (first < buckets.size() && head[first] == buckets[first].size()) ++first;
    if (s.ranks < first_ranks) check_balance = true;
    if (check_balance && first < buckets.size()) {
      double hi = 0, lo = std::numeric_limits<double>::infinity();
      for (const DcpGroup& x : mb) {
        hi = std::max(hi, x.load);
        lo = std::min(lo, x.load);
      }
      if (used < total) lo = 0;   // free ranks have no load
      if (hi - lo <= kDelta * hi) break;
    }
  }
  std::vector<DcpSeq> left;
  for (std::size_t b = first; b < buckets.size(); ++b)
    left.insert(left.end(), buckets[b].begin() + static_cast<std::ptrdiff_t>(head[b]), buckets[b].end());
  remaining = std::move(left);
  fill_free_ranks(mb, used, total);
  return mb;
}

// align_sample_id_groups' split: cut a micro-batch of two or more groups at
// the first group boundary at or past half the ranks (before its last group
// at the latest, so that both parts hold one); returns (second part, first
// part), each filled by doubling.
std::optional<std::pair<DcpMicrobatch, DcpMicrobatch>> split_microbatch(const DcpMicrobatch& mb, std::int64_t total) {
  if (mb.size() < 2) return std::nullopt;
  std::size_t k = 0;
  std::int64_t ranks = 0;
  while (k < mb.size() && ranks < total / 2) ranks += mb[k++].size;
  k = std::clamp<std::size_t>(k, 1, mb.size() - 1);
  DcpMicrobatch head(mb.begin(), mb.begin() + static_cast<std::ptrdiff_t>(k));
  DcpMicrobatch tail(mb.begin() + static_cast<std::ptrdiff_t>(k), mb.end());
  const auto ranks_of = [](const DcpMicrobatch& x) {
    std::int64_t r = 0;
    for (const DcpGroup& g : x) r += g.size;
    return r;
  };
  fill_free_ranks(head, ranks_of(head), total);
  fill_free_ranks(tail, ranks_of(tail), total);
  return std::make_pair(std::move(tail), std::move(head));
}

}  // namespace

Result<DynamicSchedule> schedule_dynamic_cp(const std::vector<std::int64_t>& lengths, std::int64_t per_rank_budget,
                                            int dp_cp_ranks, int min_cp, int multiple) {
  if (auto ok = check_sequences(lengths); !ok) return tl::unexpected(ok.error());
  if (per_rank_budget < 1)
    return fail("training.seq_length",
                fmt::format("the tokens per rank must be >= 1, found {}", per_rank_budget));
  if (dp_cp_ranks < 1) return fail("plan.dp", fmt::format("dp x cp must be >= 1, found {}", dp_cp_ranks));
  if (min_cp < 1) return fail("plan.dynamic_cp", fmt::format("the smallest CP group must be >= 1, found {}", min_cp));
  if (multiple < 1)
    return fail("plan.dp", fmt::format("the micro-batch count's multiple must be >= 1, found {}", multiple));

  const std::int64_t total = dp_cp_ranks;
  std::vector<DcpSeq> remaining;
  remaining.reserve(lengths.size());
  for (const std::int64_t length : lengths)
    remaining.push_back(DcpSeq{length, dcp_ranks_needed(length, per_rank_budget, min_cp), 0.0});
  const DcpSeq& longest = *std::max_element(remaining.begin(), remaining.end(),
                                            [](const DcpSeq& a, const DcpSeq& b) { return a.length < b.length; });
  if (longest.ranks > total)
    return fail("training.lengths",
                fmt::format("a sequence of {} tokens needs {} ranks at {} tokens per rank{}; the plan has {}",
                            longest.length, longest.ranks, per_rank_budget,
                            longest.ranks == min_cp ? fmt::format(" (the smallest group is {})", min_cp) : "", total));
  for (DcpSeq& s : remaining) s.work = dcp_workload(s.length, s.ranks);
  // Longest first; equal lengths keep their order (Python's sort is stable).
  std::stable_sort(remaining.begin(), remaining.end(),
                   [](const DcpSeq& a, const DcpSeq& b) { return a.length > b.length; });

  std::vector<DcpMicrobatch> mbs;
  while (!remaining.empty()) {
    const std::size_t before = remaining.size();
    mbs.push_back(next_microbatch(remaining, per_rank_budget, total));
    // The first bucket's head always fits an empty micro-batch (its group
    // size is at most the ranks), so every micro-batch places one.
    MEGASCOPE_CHECK(remaining.size() < before, "dynamic CP: a micro-batch placed no sequence");
  }

  if (const auto m = static_cast<std::size_t>(multiple); mbs.size() % m != 0) {
    std::size_t splits = m - mbs.size() % m;
    std::ptrdiff_t i = static_cast<std::ptrdiff_t>(mbs.size()) - 1;
    std::size_t failed = 0;   // tries since the last split
    while (splits > 0) {
      if (i < 0) {
        if (failed >= mbs.size())
          return fail("training.lengths",
                      fmt::format("{} micro-batches cannot be split into a multiple of {}: each holds one CP group "
                                  "(Megatron-LM: align_sample_id_groups finds no micro-batch to split)",
                                  mbs.size(), multiple));
        i = static_cast<std::ptrdiff_t>(mbs.size()) - 1;
      }
      if (auto parts = split_microbatch(mbs[static_cast<std::size_t>(i)], total)) {
        mbs[static_cast<std::size_t>(i)] = std::move(parts->first);
        mbs.push_back(std::move(parts->second));
        --splits;
        failed = 0;
      } else {
        ++failed;
      }
      --i;
    }
  }

  DynamicSchedule out;
  out.microbatches = static_cast<int>(mbs.size());
  out.work.reserve(mbs.size());
  for (const DcpMicrobatch& mb : mbs) {
    std::vector<DynamicRankWork> ranks;
    ranks.reserve(static_cast<std::size_t>(total));
    for (std::size_t g = 0; g < mb.size(); ++g)
      for (std::int64_t r = 0; r < mb[g].size; ++r)
        ranks.push_back(DynamicRankWork{mb[g].docs, static_cast<int>(mb[g].size), static_cast<int>(g)});
    MEGASCOPE_CHECK(static_cast<std::int64_t>(ranks.size()) == total, "dynamic CP: a micro-batch's groups miss ranks");
    out.work.push_back(std::move(ranks));
  }
  return out;
}

}  // namespace megascope
