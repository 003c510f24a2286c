// Variable-length training in the CPU executor (docs/executor.md, "Packed
// variable-length training"):
//  - the packed attention kernel over documents [a, b, c] and padding equals
//    the reference kernel run on each document alone (positions from 0), rows
//    concatenated, forward and backward, also on context-parallel query rows;
//  - varlen_batch places every document of the step once, within seq_length;
//  - tiny-gpt (learned positions, dropout) and tiny-llama (RoPE, GQA) train
//    the same losses and gradient norms on one rank and on dp=2, tp=2 and
//    cp=2 (the equivalence tests' tolerances), and packed equals padded
//    (the same documents, one per slot): the document mask and the positions
//    restarting per document are what makes them equal;
//  - a training TOML without [training.lengths] trains bit-identically to
//    --global-batch (fixed lengths are unchanged).
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <sys/wait.h>
#include <vector>

#include "exec/data.hpp"
#include "kernels/attention.hpp"
#include "run_support.hpp"
#include "subprocess.hpp"
#include "support.hpp"

namespace {

namespace k = megascope::kernels;
using Vec = std::vector<double>;
using Ids = std::vector<std::int32_t>;

Vec random(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  Vec v(n);
  for (double& x : v) x = u(rng);
  return v;
}

double max_abs_diff(const Vec& a, const Vec& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

// Rows [r0, r0 + n) of a (T, H, D) tensor of one sequence.
Vec rows_of(const Vec& x, std::int64_t r0, std::int64_t n, std::int64_t HD) {
  return Vec(x.begin() + r0 * HD, x.begin() + (r0 + n) * HD);
}

struct Attn {
  Vec out, lse, dq, dk, dv;
};

// The reference kernel on one document alone: positions 0..L-1.
Attn alone(const Vec& q, const Vec& kk, const Vec& v, const Vec& dout, std::int64_t L, std::int64_t Hq,
           std::int64_t Hkv, std::int64_t D) {
  Attn a{Vec(static_cast<std::size_t>(L * Hq * D)), Vec(static_cast<std::size_t>(Hq * L)),
         Vec(static_cast<std::size_t>(L * Hq * D)), Vec(static_cast<std::size_t>(L * Hkv * D)),
         Vec(static_cast<std::size_t>(L * Hkv * D))};
  k::attention_forward<double>(a.out.data(), a.lse.data(), q.data(), kk.data(), v.data(), nullptr, nullptr, 1, L, L,
                               Hq, Hkv, D);
  k::attention_backward<double>(a.dq.data(), a.dk.data(), a.dv.data(), dout.data(), q.data(), kk.data(), v.data(),
                                a.out.data(), a.lse.data(), nullptr, nullptr, 1, L, L, Hq, Hkv, D);
  return a;
}

using megascope::test::Step;

std::vector<Step> train(const std::string& model, int np, const std::string& plan, const std::string& args) {
  return megascope::test::run_steps(model, np, plan, "--steps 3 " + args);
}

// The equivalence tests' tolerances (fp32: summation orders differ).
void check_same(const std::vector<Step>& got, const std::vector<Step>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i].loss == Approx(want[i].loss).epsilon(2e-6));
    CHECK(got[i].grad_norm == Approx(want[i].grad_norm).epsilon(2e-5));
  }
}

// A training TOML in the temporary directory; returns its path.
std::string training_toml(const std::string& name, const std::string& lengths) {
  const auto path = std::filesystem::temp_directory_path() / ("megascope-test-varlen-" + name + ".toml");
  std::ofstream(path) << "[training]\nglobal_batch_size = 8\n" << lengths;
  return path.string();
}

const char* kLognormal =
    "[training.lengths]\ndistribution = \"lognormal\"\nmean = 20\nsigma = 0.8\nmin = 2\nseed = 3\npacking = \"{}\"\n";

}  // namespace

TEST_CASE("Packed attention over documents equals each document's attention alone", "[varlen]") {
  // Two sequences of S = 24: [7, 9, 5] + 3 padding, and [24]; GQA (4 query
  // heads on 2 KV heads), D = 8.
  const std::int64_t S = 24, B = 2, Hq = 4, Hkv = 2, D = 8;
  const std::vector<std::vector<std::int64_t>> docs = {{7, 9, 5}, {24}};
  const Vec q = random(static_cast<std::size_t>(B * S * Hq * D), 1), kk = random(static_cast<std::size_t>(B * S * Hkv * D), 2),
            v = random(static_cast<std::size_t>(B * S * Hkv * D), 3), dout = random(q.size(), 4);
  Ids doc(static_cast<std::size_t>(B * S)), doc_pos(doc.size());
  for (std::int64_t b = 0; b < B; ++b) {
    Ids cu{0};
    for (std::int64_t L : docs[static_cast<std::size_t>(b)]) cu.push_back(cu.back() + static_cast<std::int32_t>(L));
    k::document_ids(doc.data() + b * S, doc_pos.data() + b * S, cu.data(), static_cast<std::int64_t>(cu.size()) - 1, S);
  }
  CHECK(Ids(doc.begin(), doc.begin() + S) ==
        Ids{0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3});
  CHECK(doc_pos[7] == 0);
  CHECK(doc_pos[15] == 8);
  CHECK(doc_pos[21] == 0);   // padding counts from its start
  Attn packed{Vec(q.size()), Vec(static_cast<std::size_t>(B * Hq * S)), Vec(q.size(), 7.0), Vec(kk.size(), 7.0),
              Vec(v.size(), 7.0)};
  k::attention_forward_packed<double>(packed.out.data(), packed.lse.data(), q.data(), kk.data(), v.data(), nullptr,
                                      nullptr, doc.data(), doc.data(), B, S, S, Hq, Hkv, D);
  k::attention_backward_packed<double>(packed.dq.data(), packed.dk.data(), packed.dv.data(), dout.data(), q.data(),
                                       kk.data(), v.data(), packed.out.data(), packed.lse.data(), nullptr, nullptr,
                                       doc.data(), doc.data(), B, S, S, Hq, Hkv, D);
  for (std::int64_t b = 0; b < B; ++b) {
    std::int64_t at = 0;
    for (std::int64_t L : docs[static_cast<std::size_t>(b)]) {
      INFO("sequence " << b << ", document at " << at << " of " << L << " tokens");
      const std::int64_t r0 = b * S + at;
      const Attn a = alone(rows_of(q, r0, L, Hq * D), rows_of(kk, r0, L, Hkv * D), rows_of(v, r0, L, Hkv * D),
                           rows_of(dout, r0, L, Hq * D), L, Hq, Hkv, D);
      CHECK(max_abs_diff(rows_of(packed.out, r0, L, Hq * D), a.out) < 1e-14);
      CHECK(max_abs_diff(rows_of(packed.dq, r0, L, Hq * D), a.dq) < 1e-14);
      CHECK(max_abs_diff(rows_of(packed.dk, r0, L, Hkv * D), a.dk) < 1e-14);
      CHECK(max_abs_diff(rows_of(packed.dv, r0, L, Hkv * D), a.dv) < 1e-14);
      for (std::int64_t h = 0; h < Hq; ++h)
        for (std::int64_t t = 0; t < L; ++t)
          CHECK(std::abs(packed.lse[static_cast<std::size_t>((b * Hq + h) * S + at + t)] -
                         a.lse[static_cast<std::size_t>(h * L + t)]) < 1e-14);
      at += L;
    }
  }
  // Without documents the kernel is attention_forward's (one causal sequence).
  Vec out(q.size()), lse(packed.lse.size()), out2(q.size()), lse2(lse.size());
  k::attention_forward<double>(out.data(), lse.data(), q.data(), kk.data(), v.data(), nullptr, nullptr, B, S, S, Hq,
                               Hkv, D);
  k::attention_forward_packed<double>(out2.data(), lse2.data(), q.data(), kk.data(), v.data(), nullptr, nullptr,
                                      nullptr, nullptr, B, S, S, Hq, Hkv, D);
  CHECK(out == out2);
  CHECK(lse == lse2);
  CHECK(max_abs_diff(out, packed.out) > 1e-3);   // and the documents' mask does change the first sequence
}

TEST_CASE("Packed attention on context-parallel rows, with global positions and their documents", "[varlen]") {
  // S = 16 of documents [5, 6, 5], cp = 2 load-balanced: rank 0 holds positions
  // {0..3, 12..15}, rank 1 {4..11}; keys all-gathered (positions 0..15).
  const std::int64_t S = 16, Hq = 2, Hkv = 1, D = 4;
  const Vec q = random(static_cast<std::size_t>(S * Hq * D), 5), kk = random(static_cast<std::size_t>(S * Hkv * D), 6),
            v = random(kk.size(), 7), dout = random(q.size(), 8);
  Ids doc(static_cast<std::size_t>(S)), cu{0, 5, 11, 16};
  k::document_ids(doc.data(), nullptr, cu.data(), 3, S);
  Vec out(q.size()), lse(static_cast<std::size_t>(Hq * S)), dq(q.size()), dk(kk.size()), dv(v.size());
  k::attention_forward_packed<double>(out.data(), lse.data(), q.data(), kk.data(), v.data(), nullptr, nullptr,
                                      doc.data(), doc.data(), 1, S, S, Hq, Hkv, D);
  k::attention_backward_packed<double>(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), kk.data(), v.data(),
                                       out.data(), lse.data(), nullptr, nullptr, doc.data(), doc.data(), 1, S, S, Hq,
                                       Hkv, D);
  Vec dk_sum(dk.size(), 0.0), dv_sum(dv.size(), 0.0);
  for (const Ids& rows : {Ids{0, 1, 2, 3, 12, 13, 14, 15}, Ids{4, 5, 6, 7, 8, 9, 10, 11}}) {
    const auto n = static_cast<std::int64_t>(rows.size());
    Vec ql, dl, ol(static_cast<std::size_t>(n * Hq * D)), ll(static_cast<std::size_t>(Hq * n)), dql(ol.size()),
        dkl(dk.size()), dvl(dv.size());
    Ids dq_doc;
    for (std::int32_t r : rows) {
      const Vec qr = rows_of(q, r, 1, Hq * D), dr = rows_of(dout, r, 1, Hq * D);
      ql.insert(ql.end(), qr.begin(), qr.end());
      dl.insert(dl.end(), dr.begin(), dr.end());
      dq_doc.push_back(doc[static_cast<std::size_t>(r)]);
    }
    k::attention_forward_packed<double>(ol.data(), ll.data(), ql.data(), kk.data(), v.data(), rows.data(), nullptr,
                                        dq_doc.data(), doc.data(), 1, n, S, Hq, Hkv, D);
    k::attention_backward_packed<double>(dql.data(), dkl.data(), dvl.data(), dl.data(), ql.data(), kk.data(), v.data(),
                                         ol.data(), ll.data(), rows.data(), nullptr, dq_doc.data(), doc.data(), 1, n,
                                         S, Hq, Hkv, D);
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int32_t r = rows[static_cast<std::size_t>(i)];
      CHECK(max_abs_diff(rows_of(ol, i, 1, Hq * D), rows_of(out, r, 1, Hq * D)) < 1e-14);
      CHECK(max_abs_diff(rows_of(dql, i, 1, Hq * D), rows_of(dq, r, 1, Hq * D)) < 1e-14);
    }
    for (std::size_t i = 0; i < dk.size(); ++i) {
      dk_sum[i] += dkl[i];
      dv_sum[i] += dvl[i];
    }
  }
  CHECK(max_abs_diff(dk_sum, dk) < 1e-14);   // CP's reduce-scatter of dk, dv sums the ranks' parts
  CHECK(max_abs_diff(dv_sum, dv) < 1e-14);
}

TEST_CASE("varlen_batch places every document of a step once, within seq_length", "[varlen]") {
  for (const auto packing : {megascope::Packing::pack, megascope::Packing::pad}) {
    for (const int dp : {1, 2, 4}) {
      INFO("dp=" << dp << " " << megascope::to_string(packing));
      megascope::Setup s = megascope::test::make_setup(megascope::test::shipped_model("tiny-gpt"), "dgx-h100",
                                                       fmt::format("dp={}", dp), 16, dp);
      auto v = std::make_shared<megascope::VarlenSpec>();
      v->lengths.kind = megascope::LengthDistribution::Kind::lognormal;
      v->lengths.mean = 20;
      v->lengths.sigma = 1.0;
      v->lengths.min = 1;
      v->lengths.max = s.seq_length;
      v->packing = packing;
      v->seed = 5;
      s.training.varlen = v;
      for (std::int64_t step = 0; step < 3; ++step) {
        auto b = megascope::exec::varlen_batch(s, step);
        REQUIRE(b);
        REQUIRE(static_cast<int>(b->slots.size()) == s.dp);
        std::vector<std::int64_t> offsets;
        std::int64_t tokens = 0, targets = 0;
        for (const auto& replica : b->slots) {
          CHECK(static_cast<std::int64_t>(replica.size()) == b->microbatches * s.plan.micro_batch_size);
          for (const auto& slot : replica) {
            std::int64_t in_slot = 0;
            for (std::size_t i = 0; i < slot.lengths.size(); ++i) {
              in_slot += slot.lengths[i];
              targets += slot.lengths[i] - 1;
              offsets.push_back(slot.offsets[i]);
            }
            CHECK(in_slot <= s.seq_length);
            CHECK(!slot.lengths.empty());
            tokens += in_slot;
          }
        }
        CHECK(tokens == b->stream_tokens);
        CHECK(targets == b->loss_tokens);
        // The documents lie one after the other from the step's start: each offset once.
        const auto lengths = megascope::sample_lengths(v->lengths, v->seed, static_cast<std::uint64_t>(step), 16);
        std::vector<std::int64_t> want;
        std::int64_t at = step * 16 * s.seq_length;
        for (std::int64_t L : lengths) {
          want.push_back(at);
          at += L;
        }
        std::sort(offsets.begin(), offsets.end());
        CHECK(offsets == want);
        if (packing == megascope::Packing::pad) CHECK(b->microbatches == s.num_microbatches);
      }
    }
  }
}

TEST_CASE("Packed lognormal documents train the same on one rank, dp=2, tp=2 and cp=2, and as padded", "[varlen][mpi]") {
  const std::string pack = training_toml("pack", fmt::format(fmt::runtime(kLognormal), "pack"));
  const std::string pad = training_toml("pad", fmt::format(fmt::runtime(kLognormal), "pad"));
  for (const char* model : {"tiny-gpt", "tiny-llama"}) {
    SECTION(model) {
      const std::vector<Step> ref = train(model, 1, "tp=1", "--training " + pack);
      REQUIRE(ref.size() == 3);
      CHECK(ref[2].loss < ref[0].loss);   // it learns
      check_same(train(model, 2, "dp=2", "--training " + pack), ref);
      check_same(train(model, 2, "tp=2,sp=on", "--training " + pack), ref);
      check_same(train(model, 2, "cp=2", "--training " + pack), ref);
      // The same documents, one per slot and padded: the same tokens and
      // targets, attention within each document, positions from 0 in each.
      check_same(train(model, 1, "tp=1", "--training " + pad), ref);
    }
  }
}

TEST_CASE("Histogram lengths with one-token documents train the same packed on pp=2,dp=2 as on one rank",
          "[varlen][mpi]") {
  // Lengths 1 (no target), short, and the whole sequence.
  const auto hist = std::filesystem::temp_directory_path() / "megascope-test-varlen-hist.txt";
  std::ofstream(hist) << "# length count\n1 1\n5 3\n17 2\n40 1\n64 1\n";
  const std::string toml = training_toml(
      "hist", fmt::format("[training.lengths]\ndistribution = \"histogram\"\nfile = \"{}\"\nseed = 11\n", hist.string()));
  const std::vector<Step> ref = train("tiny-gpt", 1, "tp=1", "--training " + toml);
  check_same(train("tiny-gpt", 4, "pp=2,dp=2", "--training " + toml), ref);
}

TEST_CASE("A training TOML without lengths trains bit-identically to --global-batch", "[varlen][mpi]") {
  const std::string fixed = training_toml("fixed", "");
  const std::vector<Step> a = train("tiny-gpt", 1, "tp=1", "--training " + fixed);
  const std::vector<Step> b = train("tiny-gpt", 1, "tp=1", "--global-batch 8");
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].loss == b[i].loss);
    CHECK(a[i].grad_norm == b[i].grad_norm);
  }
}

TEST_CASE("run --training refuses --global-batch and --seq-len, and dynamic CP", "[varlen]") {
  const std::string toml = training_toml("refuse", fmt::format(fmt::runtime(kLognormal), "pack"));
  for (const char* extra : {"--global-batch 8", "--seq-len 32"}) {
    const auto l = megascope::test::shell(fmt::format("{} run --model tiny-gpt --training {} {}", MEGASCOPE_BINARY, toml, extra));
    INFO(l.output);
    CHECK(WEXITSTATUS(l.status) == 2);
    CHECK(l.output.find(std::string("--training: ") + std::string(extra).substr(0, std::string(extra).find(' ')) +
                        " given as well") != std::string::npos);
  }
  const auto l = megascope::test::shell(
      fmt::format("{} run --model tiny-gpt --plan dynamic_cp=on --training {}", MEGASCOPE_BINARY, toml));
  INFO(l.output);
  CHECK(WEXITSTATUS(l.status) == 1);
  CHECK(l.output.find("plan.dynamic_cp") != std::string::npos);
}
