// Variable-length training's data side (core/varlen.hpp): the random
// numbers against their published outputs, the sampler's determinism and
// distributions against closed forms, the histogram file reader, the
// causal tile count by hand, and Megatron-LM's two packing schedulers
// against hand-worked schedules (traced through data_schedule.py and
// data_schedule_utils.py) and the invariants every schedule must keep.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <string>

#include "core/program/work.hpp"
#include "core/varlen.hpp"

using namespace megascope;

namespace {

LengthDistribution lognormal(double mean, double sigma, std::int64_t min, std::int64_t max) {
  LengthDistribution d;
  d.kind = LengthDistribution::Kind::lognormal;
  d.mean = mean;
  d.sigma = sigma;
  d.min = min;
  d.max = max;
  return d;
}

LengthDistribution histogram(std::vector<std::pair<std::int64_t, double>> rows) {
  LengthDistribution d;
  d.kind = LengthDistribution::Kind::histogram;
  d.histogram = std::move(rows);
  return d;
}

double phi(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

// E[clip(X, a, b)] for X lognormal(mu, s): a P(X < a) + the partial
// expectation exp(mu + s^2/2) [Phi(beta - s) - Phi(alpha - s)] + b P(X > b).
double clipped_lognormal_mean(double mu, double s, double a, double b) {
  const double alpha = (std::log(a) - mu) / s, beta = (std::log(b) - mu) / s;
  return a * phi(alpha) + std::exp(mu + s * s / 2) * (phi(beta - s) - phi(alpha - s)) + b * (1 - phi(beta));
}

std::filesystem::path write_file(const std::string& name, const std::string& text) {
  const auto dir = std::filesystem::temp_directory_path() / "megascope-test-varlen";
  std::filesystem::create_directories(dir);
  const auto path = dir / name;
  std::ofstream(path) << text;
  return path;
}

// The group size by its definition: the smallest power of two p with p
// ranks of `budget` tokens holding the sequence, at least min_cp.
std::int64_t group_size(std::int64_t length, std::int64_t budget, std::int64_t min_cp = 1) {
  std::int64_t p = 1;
  while (p * budget < length) p *= 2;
  return std::max(p, min_cp);
}

std::vector<std::int64_t> sorted(std::vector<std::int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// Every sequence once, every pack within the budget unless it is one
// sequence, the pack count a multiple of `multiple`, the same count per replica.
void check_static(const StaticSchedule& s, const std::vector<std::int64_t>& lengths, std::int64_t budget, int dp,
                  int multiple) {
  REQUIRE(s.packs.size() == static_cast<std::size_t>(dp));
  std::vector<std::int64_t> all;
  for (const auto& replica : s.packs) {
    REQUIRE(replica.size() == static_cast<std::size_t>(s.microbatches));
    for (const auto& pack : replica) {
      REQUIRE(!pack.empty());
      const std::int64_t tokens = std::accumulate(pack.begin(), pack.end(), std::int64_t{0});
      CHECK((tokens <= budget || pack.size() == 1));
      all.insert(all.end(), pack.begin(), pack.end());
    }
  }
  CHECK((s.microbatches * dp) % multiple == 0);
  CHECK(sorted(all) == sorted(lengths));
}

// Every micro-batch covers all ranks, none empty; a group holds contiguous
// ranks, as many as its cp, all with the same sequences; group ids count up
// in rank order; a group's sequences share one g(L) and its size is g(L)
// doubled zero or more times; its tokens per rank stay within the budget;
// and every sequence is in exactly one group of one micro-batch.
void check_dynamic(const DynamicSchedule& s, const std::vector<std::int64_t>& lengths, std::int64_t budget, int ranks,
                   int min_cp, int multiple) {
  REQUIRE(s.work.size() == static_cast<std::size_t>(s.microbatches));
  CHECK(s.microbatches % multiple == 0);
  std::vector<std::int64_t> all;
  for (const auto& mb : s.work) {
    REQUIRE(mb.size() == static_cast<std::size_t>(ranks));
    int expect_group = 0;
    for (std::size_t r = 0; r < mb.size();) {
      const DynamicRankWork& w = mb[r];
      REQUIRE(!w.docs.empty());
      CHECK(w.group == expect_group++);
      REQUIRE(w.cp >= 1);
      REQUIRE(r + static_cast<std::size_t>(w.cp) <= mb.size());
      for (int k = 1; k < w.cp; ++k) {
        CHECK(mb[r + k].group == w.group);
        CHECK(mb[r + k].cp == w.cp);
        CHECK(mb[r + k].docs == w.docs);
      }
      const std::int64_t g = group_size(w.docs.front(), budget, min_cp);
      for (const std::int64_t d : w.docs) CHECK(group_size(d, budget, min_cp) == g);
      CHECK(w.cp % g == 0);
      const std::int64_t doublings = w.cp / g;
      CHECK((doublings & (doublings - 1)) == 0);
      const std::int64_t tokens = std::accumulate(w.docs.begin(), w.docs.end(), std::int64_t{0});
      CHECK(tokens <= budget * w.cp);
      all.insert(all.end(), w.docs.begin(), w.docs.end());
      r += static_cast<std::size_t>(w.cp);
    }
  }
  CHECK(sorted(all) == sorted(lengths));
}

// The slowest rank's causal work summed over the micro-batches: each
// sequence's L^2 split over the ranks that share it.
double static_cost(const StaticSchedule& s, int cp) {
  double total = 0;
  for (int i = 0; i < s.microbatches; ++i) {
    double worst = 0;
    for (const auto& replica : s.packs) {
      double w = 0;
      for (const std::int64_t d : replica[static_cast<std::size_t>(i)])
        w += static_cast<double>(d) * static_cast<double>(d) / cp;
      worst = std::max(worst, w);
    }
    total += worst;
  }
  return total;
}

double dynamic_cost(const DynamicSchedule& s) {
  double total = 0;
  for (const auto& mb : s.work) {
    double worst = 0;
    for (const DynamicRankWork& r : mb) {
      double w = 0;
      for (const std::int64_t d : r.docs) w += static_cast<double>(d) * static_cast<double>(d) / r.cp;
      worst = std::max(worst, w);
    }
    total += worst;
  }
  return total;
}

std::vector<std::int64_t> docs_of(const DynamicSchedule& s, std::size_t mb) {
  std::vector<std::int64_t> out;
  for (const auto& r : s.work[mb]) out.insert(out.end(), r.docs.begin(), r.docs.end());
  return out;
}

}  // namespace

TEST_CASE("splitmix64 and xoshiro256** reproduce their published outputs", "[varlen]") {
  // Vigna's reference splitmix64.c from state 1234567, and from 0.
  std::uint64_t state = 1234567;
  CHECK(splitmix64_next(state) == 6457827717110365317ULL);
  CHECK(splitmix64_next(state) == 3203168211198807973ULL);
  state = 0;
  CHECK(splitmix64_next(state) == 0xe220a8397b1dcdafULL);
  // xoshiro256starstar.c from the state {1, 2, 3, 4}.
  Xoshiro256 g;
  g.s[0] = 1, g.s[1] = 2, g.s[2] = 3, g.s[3] = 4;
  CHECK(g.next() == 11520ULL);
  CHECK(g.next() == 0ULL);
  CHECK(g.next() == 1509978240ULL);
  CHECK(g.next() == 1215971899390074240ULL);
  // uniform: the top 53 bits over 2^53, in [0, 1).
  Xoshiro256 h = Xoshiro256::seeded(99);
  Xoshiro256 h2 = h;
  CHECK(h.uniform() == static_cast<double>(h2.next() >> 11) / 9007199254740992.0);
}

TEST_CASE("sample_lengths is deterministic and depends on seed and step", "[varlen]") {
  const LengthDistribution ln = lognormal(2000, 1.0, 16, 32768);
  const auto a = sample_lengths(ln, 7, 3, 1000);
  CHECK(a == sample_lengths(ln, 7, 3, 1000));
  CHECK(a != sample_lengths(ln, 8, 3, 1000));
  CHECK(a != sample_lengths(ln, 7, 4, 1000));
  // The first draws do not depend on how many are drawn (odd counts cut a
  // Box-Muller pair).
  const auto b = sample_lengths(ln, 7, 3, 333);
  CHECK(std::equal(b.begin(), b.end(), a.begin()));
  // Histogram draws use integer and IEEE arithmetic only: these are the
  // lengths on every platform (splitmix64 of the seed, xor the step,
  // xoshiro256** seeded by splitmix64 from that, inverse CDF; computed
  // independently from the published algorithms).
  CHECK(sample_lengths(histogram({{100, 1}, {200, 2}, {300, 7}}), 42, 7, 12) ==
        std::vector<std::int64_t>{200, 300, 300, 300, 300, 300, 300, 300, 200, 300, 300, 300});
  CHECK(sample_lengths(histogram({{1, 1}, {2, 1}, {3, 1}, {4, 1}}), 0, 0, 12) ==
        std::vector<std::int64_t>{4, 2, 1, 2, 1, 1, 3, 2, 1, 4, 2, 2});
  LengthDistribution fixed;
  fixed.max = 4096;
  CHECK(sample_lengths(fixed, 1, 2, 5) == std::vector<std::int64_t>(5, 4096));
  CHECK(sample_lengths(ln, 1, 2, 0).empty());
}

TEST_CASE("lognormal lengths have the configured mean and sigma when clipping is negligible", "[varlen]") {
  // mean 2000, sigma 0.5: mu = ln 2000 - 0.125; P(X > 1e6) and P(X < 2) are ~1e-30.
  const LengthDistribution d = lognormal(2000, 0.5, 1, 1'000'000);
  const auto v = sample_lengths(d, 11, 0, 200'000);
  double sum = 0, log_sum = 0, log_sq = 0;
  for (const std::int64_t x : v) {
    sum += static_cast<double>(x);
    log_sum += std::log(static_cast<double>(x));
  }
  const double n = static_cast<double>(v.size()), mean = sum / n, log_mean = log_sum / n;
  for (const std::int64_t x : v) log_sq += std::pow(std::log(static_cast<double>(x)) - log_mean, 2);
  CHECK(std::abs(mean - 2000) / 2000 < 0.03);
  // Standard error of the mean: 2000 sqrt(e^0.25 - 1) / sqrt(2e5) ~ 2.4 tokens.
  CHECK(std::abs(mean - 2000) < 4 * 2.4 + 0.5);
  CHECK(std::abs(log_mean - (std::log(2000.0) - 0.125)) < 0.005);
  CHECK(std::abs(std::sqrt(log_sq / n) - 0.5) < 0.005);
  // The exact expectation of the truncated length: the mean less the 1/2
  // token truncation takes off on average.
  CHECK(mean_length(d) == Approx(2000 - 0.5).margin(0.01));
  CHECK(std::abs(mean - mean_length(d)) < 4 * 2.4);
}

TEST_CASE("lognormal lengths respect the clip bounds", "[varlen]") {
  const LengthDistribution d = lognormal(2000, 1.5, 500, 4000);
  const double mu = std::log(2000.0) - 1.5 * 1.5 / 2;
  const auto v = sample_lengths(d, 5, 9, 200'000);
  const double n = static_cast<double>(v.size());
  double sum = 0;
  std::size_t at_min = 0, at_max = 0;
  for (const std::int64_t x : v) {
    REQUIRE(x >= 500);
    REQUIRE(x <= 4000);
    at_min += x == 500;
    at_max += x == 4000;
    sum += static_cast<double>(x);
  }
  // A length is min when X < min + 1 (clip, then truncate), max when X >= max.
  CHECK(static_cast<double>(at_min) / n == Approx(phi((std::log(501.0) - mu) / 1.5)).margin(0.005));
  CHECK(static_cast<double>(at_max) / n == Approx(1 - phi((std::log(4000.0) - mu) / 1.5)).margin(0.005));
  // mean_length against the closed form of the clipped mean, less 1/2 token
  // of truncation on the draws between the bounds; and against the sample
  // (its standard deviation is below 1500 tokens: 4 standard errors ~ 13).
  const double inside = phi((std::log(4000.0) - mu) / 1.5) - phi((std::log(500.0) - mu) / 1.5);
  CHECK(mean_length(d) == Approx(clipped_lognormal_mean(mu, 1.5, 500, 4000) - 0.5 * inside).margin(0.01));
  CHECK(std::abs(sum / n - mean_length(d)) < 13);
}

TEST_CASE("histogram lengths follow the weights", "[varlen]") {
  const LengthDistribution d = histogram({{100, 1}, {200, 2}, {300, 7}});
  const auto v = sample_lengths(d, 3, 1, 100'000);
  std::map<std::int64_t, double> freq;
  for (const std::int64_t x : v) freq[x] += 1.0 / static_cast<double>(v.size());
  REQUIRE(freq.size() == 3);
  // Standard deviation of a frequency: sqrt(p (1 - p) / 1e5) < 0.0016.
  CHECK(freq[100] == Approx(0.1).margin(0.008));
  CHECK(freq[200] == Approx(0.2).margin(0.008));
  CHECK(freq[300] == Approx(0.7).margin(0.008));
  CHECK(mean_length(d) == Approx((100 * 1 + 200 * 2 + 300 * 7) / 10.0));
  LengthDistribution fixed;
  fixed.max = 777;
  CHECK(mean_length(fixed) == 777);
}

TEST_CASE("validate_lengths names the field and the rule", "[varlen]") {
  const auto error_of = [](const LengthDistribution& d, std::int64_t s) {
    auto r = validate_lengths(d, s);
    REQUIRE(!r);
    return r.error();
  };
  LengthDistribution fixed;
  fixed.max = 4096;
  CHECK(validate_lengths(fixed, 4096));
  CHECK(error_of(fixed, 2048).field == "training.lengths.max");
  fixed.max = 0;
  CHECK(error_of(fixed, 4096).field == "training.lengths.max");

  CHECK(validate_lengths(lognormal(1000, 1, 1, 4096), 4096));
  CHECK(error_of(lognormal(5000, 1, 1, 4096), 4096).field == "training.lengths.mean");
  CHECK(error_of(lognormal(50, 1, 100, 4096), 4096).field == "training.lengths.mean");
  CHECK(error_of(lognormal(1000, 0, 1, 4096), 4096).field == "training.lengths.sigma");
  CHECK(error_of(lognormal(1000, 10.5, 1, 4096), 4096).field == "training.lengths.sigma");
  CHECK(error_of(lognormal(1000, 1, 0, 4096), 4096).field == "training.lengths.min");
  CHECK(error_of(lognormal(1000, 1, 1, 8192), 4096).field == "training.lengths.max");
  CHECK(error_of(lognormal(1000, 1, 2000, 1500), 4096).field == "training.lengths.max");
  CHECK(error_of(lognormal(NAN, 1, 1, 4096), 4096).field == "training.lengths.mean");

  CHECK(validate_lengths(histogram({{1, 0.5}, {4096, 3}}), 4096));
  const Error too_long = error_of(histogram({{1, 0.5}, {4097, 3}}), 4096);
  CHECK(too_long.field == "training.lengths.histogram");
  CHECK_THAT(too_long.message, Catch::Contains("row 2") && Catch::Contains("4097"));
  CHECK(error_of(histogram({{0, 1}}), 4096).field == "training.lengths.histogram");
  CHECK_THAT(error_of(histogram({{10, 0}}), 4096).message, Catch::Contains("> 0"));
  CHECK(error_of(histogram({{10, INFINITY}}), 4096).field == "training.lengths.histogram");
  CHECK(error_of(histogram({}), 4096).field == "training.lengths.histogram");
}

TEST_CASE("read_length_histogram reads rows, comments and both separators", "[varlen]") {
  const auto path = write_file("ok.txt",
                               "# lengths of a chat set\n"
                               "\n"
                               "128 10\n"
                               "  256,\t2.5   # a trailing comment\n"
                               "512 , 1\n"
                               "\t1024\t0.25\r\n");
  auto d = read_length_histogram(path.string());
  REQUIRE(d);
  CHECK(d->kind == LengthDistribution::Kind::histogram);
  CHECK(d->histogram == std::vector<std::pair<std::int64_t, double>>{{128, 10}, {256, 2.5}, {512, 1}, {1024, 0.25}});
  CHECK(validate_lengths(*d, 1024));
}

TEST_CASE("read_length_histogram reports the file and line of a bad row", "[varlen]") {
  const auto line_of = [](const std::string& name, const std::string& text, const std::string& words) {
    const auto path = write_file(name, text);
    auto d = read_length_histogram(path.string());
    REQUIRE(!d);
    CHECK(d.error().field == "training.lengths.file");
    REQUIRE(d.error().where);
    CHECK(d.error().where->file == path.string());
    CHECK_THAT(d.error().message, Catch::Contains(words));
    return d.error().where->line.value_or(-1);
  };
  CHECK(line_of("count.txt", "# header\n128 1\n256 x\n", "the count 'x'") == 3);
  CHECK(line_of("zero.txt", "128 1\n\n256 0\n", "> 0") == 3);
  CHECK(line_of("negative.txt", "128 -1\n", "> 0") == 1);
  CHECK(line_of("nan.txt", "128 nan\n", "finite") == 1);
  CHECK(line_of("length.txt", "1.5 3\n", "the length '1.5'") == 1);
  CHECK(line_of("length0.txt", "64 1\n0 3\n", "the length '0'") == 2);
  CHECK(line_of("alone.txt", "64 1\n128\n", "no count") == 2);
  CHECK(line_of("three.txt", "64 1 2\n", "more than two fields") == 1);
  CHECK(line_of("commas.txt", "64,1,2\n", "\"length,count\"") == 1);
  CHECK(line_of("empty.txt", "# nothing\n\n", "no rows") == -1);
  auto missing = read_length_histogram("/nonexistent/megascope/lengths.txt");
  REQUIRE(!missing);
  CHECK(missing.error().where->file == "/nonexistent/megascope/lengths.txt");
  CHECK_THAT(missing.error().message, Catch::Contains("no such file"));
  auto dir = read_length_histogram(std::filesystem::temp_directory_path().string());
  REQUIRE(!dir);
  CHECK_THAT(dir.error().message, Catch::Contains("directory"));
}

TEST_CASE("causal_block_pairs counts whole tiles on and below the diagonal", "[varlen]") {
  CHECK(causal_block_pairs(128) == 16384);
  CHECK(causal_block_pairs(256) == 3 * 16384);
  CHECK(causal_block_pairs(1) == 16384);
  CHECK(causal_block_pairs(129) == 3 * 16384);
  CHECK(causal_block_pairs(1024) == 8 * 9 / 2 * 16384.0);
  CHECK(causal_block_pairs(100, 64) == 3 * 64 * 64);
  CHECK(causal_block_pairs(0) == 0);
  CHECK(causal_pairs(1000) == 500000);
  CHECK(causal_pairs(0) == 0);
  // The same count as a full causal attention call of one document.
  AttentionShape a;
  a.seq_q = a.seq_kv = 3000;
  CHECK(causal_pairs(3000) == attention_pairs(a));
  // Tiles cover at least the pairs, and at most those of the document
  // rounded up to a whole tile, d' < d + B, plus the diagonal tiles' upper
  // halves, d' B / 2.
  for (const std::int64_t d : {1, 77, 128, 300, 4096, 5000}) {
    CHECK(causal_block_pairs(d) >= causal_pairs(d));
    CHECK(causal_block_pairs(d) <= causal_pairs(d + 128) + static_cast<double>(d + 128) * 64);
  }
}

TEST_CASE("static schedule matches hand-worked dp_balanced packs", "[varlen]") {
  // Budget 8, in order: [3,5] is full, 2 starts a pack that 7 cannot join,
  // [7,1], [4] (6 would make 10), [6,2]: five packs. dp 2: the last pack
  // gives up its last sequence, [6] [2]. Replica 0 takes packs 0, 2, 4;
  // replica 1 packs 1, 3, 5.
  auto s = schedule_static({3, 5, 2, 7, 1, 4, 6, 2}, 8, 2, 2);
  REQUIRE(s);
  CHECK(s->microbatches == 3);
  using Packs = std::vector<std::vector<std::int64_t>>;
  CHECK(s->packs[0] == Packs{{3, 5}, {7, 1}, {6}});
  CHECK(s->packs[1] == Packs{{2}, {4}, {2}});
  // Multiple 4 with dp 2 (a micro-batch group of 2): five packs need three
  // more. Walking back from the last: [6,2] gives 2, then [6] and [4] are
  // single, [7,1] gives 1, then [7] and [2] are single, [3,5] gives 5:
  // [3] [2] [7] [4] [6] [2] [1] [5].
  s = schedule_static({3, 5, 2, 7, 1, 4, 6, 2}, 8, 2, 4);
  REQUIRE(s);
  CHECK(s->microbatches == 4);
  CHECK(s->packs[0] == Packs{{3}, {7}, {6}, {1}});
  CHECK(s->packs[1] == Packs{{2}, {4}, {2}, {5}});
  // A sequence over the budget is a pack of its own (no empty pack before it).
  s = schedule_static({10, 3}, 8, 1, 1);
  REQUIRE(s);
  CHECK(s->packs[0] == Packs{{10}, {3}});
}

TEST_CASE("static schedule keeps every sequence once within the budget", "[varlen]") {
  const LengthDistribution d = lognormal(1500, 1.2, 16, 16384);
  for (std::uint64_t step = 0; step < 6; ++step)
    for (const auto& [dp, multiple] : std::vector<std::pair<int, int>>{{1, 1}, {4, 4}, {8, 16}, {3, 6}}) {
      const auto lengths = sample_lengths(d, 17, step, 256);
      auto s = schedule_static(lengths, 8192, dp, multiple);
      REQUIRE(s);
      check_static(*s, lengths, 8192, dp, multiple);
    }
  // Adversarial inputs: every sequence at the budget, every one 1 token,
  // every one over the budget, one huge among tiny ones.
  const std::vector<std::vector<std::int64_t>> cases = {
      std::vector<std::int64_t>(64, 4096), std::vector<std::int64_t>(1000, 1), std::vector<std::int64_t>(24, 5000)};
  for (const auto& lengths : cases) {
    auto s = schedule_static(lengths, 4096, 4, 8);
    REQUIRE(s);
    check_static(*s, lengths, 4096, 4, 8);
  }
  std::vector<std::int64_t> huge(500, 3);
  huge[250] = 1'000'000;
  auto s = schedule_static(huge, 4096, 8, 8);
  REQUIRE(s);
  check_static(*s, huge, 4096, 8, 8);
}

TEST_CASE("static schedule reports impossible and bad inputs", "[varlen]") {
  // Three single-sequence packs cannot become four.
  auto s = schedule_static({5, 5, 5}, 100, 4, 4);
  REQUIRE(!s);
  CHECK(s.error().field == "training.lengths");
  CHECK_THAT(s.error().message, Catch::Contains("Not enough samples to move"));
  CHECK(!schedule_static({}, 100, 1, 1));
  CHECK(schedule_static({}, 100, 1, 1).error().field == "training.lengths");
  CHECK(!schedule_static({5, 0}, 100, 1, 1));
  CHECK(!schedule_static({5}, 0, 1, 1));
  CHECK(!schedule_static({5}, 100, 0, 1));
  CHECK(schedule_static({5, 5, 5, 5, 5, 5}, 100, 2, 3).error().field == "plan.dp");   // not a multiple of dp
  // Nine sequences over the budget are nine packs of one: not sixteen.
  CHECK(!schedule_static(std::vector<std::int64_t>(9, 5000), 4096, 4, 16));
  CHECK(schedule_static(std::vector<std::int64_t>(16, 5000), 4096, 4, 16));
}

TEST_CASE("dynamic CP schedule matches hand-worked next_hdp_group micro-batches", "[varlen]") {
  using Docs = std::vector<std::int64_t>;
  // Budget 4 tokens per rank, 4 ranks. g: 16 -> 4, 8 -> 2, 4 and 2 -> 1;
  // w = L^2 / g: 64, 32, 16, 16, 4, 4. Three sizes; target 136 / 3, buckets
  // [16] [8,4] [4,2,2]. Micro-batch 0: 16 takes all ranks; the heads 8 and
  // 4 find neither free ranks nor a group of their size. Micro-batch 1
  // (buckets [8] [4,4,2] [2]): 8 on ranks 0-1, 4 on 2, 4 on 3 (a new group
  // while ranks are free); 2 fits no group of size 1 (4 + 2 > 4). Micro-batch
  // 2 (buckets [2] [2]): one group each on ranks 0 and 1, then the free
  // ranks double the first smallest group, then the next.
  auto s = schedule_dynamic_cp({16, 8, 4, 4, 2, 2}, 4, 4, 1, 1);
  REQUIRE(s);
  REQUIRE(s->microbatches == 3);
  for (const auto& r : s->work[0]) {
    CHECK(r.docs == Docs{16});
    CHECK(r.cp == 4);
    CHECK(r.group == 0);
  }
  const auto& mb1 = s->work[1];
  CHECK((mb1[0].docs == Docs{8} && mb1[1].docs == Docs{8} && mb1[0].cp == 2 && mb1[1].cp == 2));
  CHECK((mb1[2].docs == Docs{4} && mb1[2].cp == 1 && mb1[2].group == 1));
  CHECK((mb1[3].docs == Docs{4} && mb1[3].cp == 1 && mb1[3].group == 2));
  const auto& mb2 = s->work[2];
  for (std::size_t r = 0; r < 4; ++r) {
    CHECK(mb2[r].docs == Docs{2});
    CHECK(mb2[r].cp == 2);
    CHECK(mb2[r].group == static_cast<int>(r / 2));
  }
  check_dynamic(*s, {16, 8, 4, 4, 2, 2}, 4, 4, 1, 1);

  // With a minimum group of 2: 4 and 2 need 2 ranks too. Micro-batch 1:
  // 8 on ranks 0-1, 4 on 2-3, the second 4 joins the group of 2-3 (4 + 4
  // <= 2 x 4 tokens) as no ranks are free.
  s = schedule_dynamic_cp({2, 4, 16, 2, 8, 4}, 4, 4, 2, 1);
  REQUIRE(s);
  REQUIRE(s->microbatches == 3);
  CHECK(s->work[1][0].docs == Docs{8});
  CHECK(s->work[1][2].docs == Docs{4, 4});
  CHECK(s->work[1][3].cp == 2);
  // The two 2s: a new group of 2 ranks each, as ranks are free.
  CHECK(docs_of(*s, 2) == Docs{2, 2, 2, 2});
  CHECK((s->work[2][0].cp == 2 && s->work[2][2].cp == 2 && s->work[2][2].group == 1));
  check_dynamic(*s, {2, 4, 16, 2, 8, 4}, 4, 4, 2, 1);

  // Packing into existing groups: 2 ranks, budget 4. New groups for the 3s
  // while ranks are free; then each 1 joins the least loaded group with
  // room (the first of equals, then the other).
  s = schedule_dynamic_cp({3, 3, 1, 1}, 4, 2, 1, 1);
  REQUIRE(s);
  REQUIRE(s->microbatches == 1);
  CHECK(s->work[0][0].docs == Docs{3, 1});
  CHECK(s->work[0][1].docs == Docs{3, 1});
  CHECK(s->work[0][1].group == 1);

  // The early close: 1061 needs 2 ranks (budget 1000), the 750s one each;
  // once a smaller group has appeared, the ranks' loads (1061^2 / 2 against
  // 750^2) are within 5% and sequences are left, so the micro-batch closes
  // although a 100 would fit beside a 750. The 100s make the next one.
  s = schedule_dynamic_cp({100, 750, 1061, 100, 750, 100, 100}, 1000, 4, 1, 1);
  REQUIRE(s);
  REQUIRE(s->microbatches == 2);
  CHECK(docs_of(*s, 0) == Docs{1061, 1061, 750, 750});
  CHECK(docs_of(*s, 1) == Docs{100, 100, 100, 100});
  CHECK(s->work[1][3].group == 3);
}

TEST_CASE("dynamic CP schedule aligns the micro-batch count as align_sample_id_groups does", "[varlen]") {
  using Docs = std::vector<std::int64_t>;
  // The example above with a multiple of 2: three micro-batches, so the
  // last (two groups of 2 ranks) is cut at half the ranks; its second part
  // takes its place and its first is appended, each doubled to 4 ranks.
  auto s = schedule_dynamic_cp({16, 8, 4, 4, 2, 2}, 4, 4, 1, 2);
  REQUIRE(s);
  REQUIRE(s->microbatches == 4);
  for (std::size_t mb : {2u, 3u})
    for (const auto& r : s->work[mb]) {
      CHECK(r.docs == Docs{2});
      CHECK(r.cp == 4);
    }
  check_dynamic(*s, {16, 8, 4, 4, 2, 2}, 4, 4, 1, 2);
  // One sequence is one group: nothing to split.
  auto one = schedule_dynamic_cp({5}, 4, 4, 1, 2);
  REQUIRE(!one);
  CHECK(one.error().field == "training.lengths");
  CHECK_THAT(one.error().message, Catch::Contains("align_sample_id_groups"));
}

TEST_CASE("dynamic CP schedule keeps its invariants on sampled and adversarial lengths", "[varlen]") {
  const LengthDistribution d = lognormal(3000, 1.0, 64, 32768);
  for (std::uint64_t step = 0; step < 4; ++step)
    for (const int min_cp : {1, 2})
      for (const int multiple : {1, 4}) {
        const auto lengths = sample_lengths(d, 23, step, 512);
        auto s = schedule_dynamic_cp(lengths, 4096, 16, min_cp, multiple);
        REQUIRE(s);
        check_dynamic(*s, lengths, 4096, 16, min_cp, multiple);
      }
  std::vector<std::int64_t> huge(300, 1);
  huge[150] = 8 * 512;   // all 8 ranks at 512 tokens each
  const std::vector<std::vector<std::int64_t>> cases = {std::vector<std::int64_t>(100, 512),
                                                        std::vector<std::int64_t>(1000, 1), huge};
  for (const auto& lengths : cases)
    for (const int multiple : {1, 2}) {
      auto s = schedule_dynamic_cp(lengths, 512, 8, 1, multiple);
      REQUIRE(s);
      check_dynamic(*s, lengths, 512, 8, 1, multiple);
    }
  // dp x cp not a power of two: the doubling takes the free ranks it finds.
  auto s = schedule_dynamic_cp(huge, 512, 12, 1, 1);
  REQUIRE(s);
  for (const auto& mb : s->work) CHECK(mb.size() == 12);
}

TEST_CASE("dynamic CP beats static packing on a long-tailed batch", "[varlen]") {
  // dp 4 x cp 8, 4096 tokens per rank. 2000 sequences of 1k tokens and four
  // of 64k (16 ranks' worth). Static packing runs every 64k sequence on its
  // replica's 8 ranks (65536^2 / 8 per rank); dynamic CP gives each 16 ranks
  // and two of them share a micro-batch.
  std::vector<std::int64_t> lengths(2000, 1024);
  for (const std::size_t i : {100u, 700u, 1300u, 1900u}) lengths[i] = 65536;
  const int dp = 4, cp = 8;
  auto st = schedule_static(lengths, 4096 * cp, dp, dp);
  auto dy = schedule_dynamic_cp(lengths, 4096, dp * cp, 1, 1);
  REQUIRE(st);
  REQUIRE(dy);
  check_static(*st, lengths, 4096 * cp, dp, dp);
  check_dynamic(*dy, lengths, 4096, dp * cp, 1, 1);
  const double static_work = static_cost(*st, cp), dynamic_work = dynamic_cost(*dy);
  CHECK(dynamic_work < static_work);
  // The long sequences alone: four micro-batches at 65536^2 / 8 against two at 65536^2 / 16.
  CHECK(static_work >= 4 * 65536.0 * 65536 / 8);
  CHECK(dynamic_work < 0.5 * static_work);
}

TEST_CASE("dynamic CP schedule reports a sequence too long for the ranks", "[varlen]") {
  auto s = schedule_dynamic_cp({30, 100, 7}, 10, 8, 1, 1);
  REQUIRE(!s);
  CHECK(s.error().field == "training.lengths");
  CHECK_THAT(s.error().message,
             Catch::Contains("a sequence of 100 tokens needs 16 ranks at 10 tokens per rank; the plan has 8"));
  auto min_cp = schedule_dynamic_cp({3}, 10, 4, 8, 1);
  REQUIRE(!min_cp);
  CHECK_THAT(min_cp.error().message, Catch::Contains("needs 8 ranks"));
  CHECK(!schedule_dynamic_cp({}, 10, 4, 1, 1));
  CHECK(!schedule_dynamic_cp({0}, 10, 4, 1, 1));
  CHECK(!schedule_dynamic_cp({3}, 0, 4, 1, 1));
  CHECK(!schedule_dynamic_cp({3}, 10, 0, 1, 1));
  CHECK(!schedule_dynamic_cp({3}, 10, 4, 0, 1));
  CHECK(!schedule_dynamic_cp({3}, 10, 4, 1, 0));
  CHECK(dcp_ranks_needed(4096, 4096) == 1);
  CHECK(dcp_ranks_needed(4097, 4096) == 2);
  CHECK(dcp_ranks_needed(65536, 4096) == 16);
  CHECK(dcp_ranks_needed(65537, 4096) == 32);
  CHECK(dcp_ranks_needed(100, 4096, 4) == 4);
  CHECK(dcp_workload(1000, 4) == 250000);
}
