// Attention: forward against an explicit softmax(scale Q K^T + mask) V,
// GQA against repeated KV heads, context-parallel position chunks and ring
// merges against the full sequence, backward against finite differences in
// double (normwise relative error < 1e-6).
#include "kernels/attention.hpp"

#include <catch2/catch.hpp>
#include <limits>

#include "kernel_test_support.hpp"

using namespace megascope::kernels;
using namespace megascope::kernels::test;

namespace {

using Vec = std::vector<double>;
using Pos = std::vector<std::int32_t>;

struct Shape {
  std::int64_t B, Tq, Tk, Hq, Hkv, D;
};

struct Result {
  Vec out, lse;
};

// The textbook definition, one score at a time.
Result naive_attention(const Vec& q, const Vec& k, const Vec& v, const Pos& qp, const Pos& kp, Shape s, bool causal) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.D));
  Result r{Vec(s.B * s.Tq * s.Hq * s.D, 0.0), Vec(s.B * s.Hq * s.Tq, 0.0)};
  for (std::int64_t b = 0; b < s.B; ++b)
    for (std::int64_t h = 0; h < s.Hq; ++h) {
      const std::int64_t hk = h / (s.Hq / s.Hkv);
      for (std::int64_t i = 0; i < s.Tq; ++i) {
        Vec w(s.Tk, 0.0);
        double mx = -INFINITY;
        for (std::int64_t j = 0; j < s.Tk; ++j) {
          if (causal && kp[j] > qp[i]) continue;
          double dotp = 0.0;
          for (std::int64_t d = 0; d < s.D; ++d)
            dotp += q[((b * s.Tq + i) * s.Hq + h) * s.D + d] * k[((b * s.Tk + j) * s.Hkv + hk) * s.D + d];
          w[j] = scale * dotp;
          mx = std::max(mx, w[j]);
        }
        double sum = 0.0;
        for (std::int64_t j = 0; j < s.Tk; ++j) {
          w[j] = (causal && kp[j] > qp[i]) ? 0.0 : std::exp(w[j] - mx);
          sum += w[j];
        }
        r.lse[(b * s.Hq + h) * s.Tq + i] = sum > 0.0 ? mx + std::log(sum) : -INFINITY;
        for (std::int64_t j = 0; j < s.Tk && sum > 0.0; ++j)
          for (std::int64_t d = 0; d < s.D; ++d)
            r.out[((b * s.Tq + i) * s.Hq + h) * s.D + d] += w[j] / sum * v[((b * s.Tk + j) * s.Hkv + hk) * s.D + d];
      }
    }
  return r;
}

Pos iota(std::int64_t n, std::int32_t start = 0) {
  Pos p(n);
  for (std::int64_t i = 0; i < n; ++i) p[i] = start + static_cast<std::int32_t>(i);
  return p;
}

// Rows `ts` (positions along T) of a (B, T, H, D) tensor.
Vec take_rows(const Vec& x, const Pos& ts, std::int64_t B, std::int64_t T, std::int64_t HD) {
  Vec out;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int32_t t : ts) out.insert(out.end(), x.begin() + (b * T + t) * HD, x.begin() + (b * T + t + 1) * HD);
  return out;
}

// Entries `ts` of an lse (B, H, T).
Vec take_lse(const Vec& lse, const Pos& ts, std::int64_t B, std::int64_t H, std::int64_t T) {
  Vec out;
  for (std::int64_t bh = 0; bh < B * H; ++bh)
    for (std::int32_t t : ts) out.push_back(lse[bh * T + t]);
  return out;
}

Result run_forward(const Vec& q, const Vec& k, const Vec& v, const Pos* qp, const Pos* kp, Shape s,
                   bool causal = true) {
  Result r{Vec(s.B * s.Tq * s.Hq * s.D), Vec(s.B * s.Hq * s.Tq)};
  attention_forward(r.out.data(), r.lse.data(), q.data(), k.data(), v.data(), qp ? qp->data() : nullptr,
                    kp ? kp->data() : nullptr, s.B, s.Tq, s.Tk, s.Hq, s.Hkv, s.D, causal);
  return r;
}

struct Grads {
  Vec dq, dk, dv;
};

Grads run_backward(const Vec& dout, const Vec& q, const Vec& k, const Vec& v, const Result& f, const Pos* qp,
                   const Pos* kp, Shape s, bool causal = true) {
  Grads g{Vec(q.size(), 7.0), Vec(k.size(), 7.0), Vec(v.size(), 7.0)};  // 7.0: overwritten
  attention_backward(g.dq.data(), g.dk.data(), g.dv.data(), dout.data(), q.data(), k.data(), v.data(), f.out.data(),
                     f.lse.data(), qp ? qp->data() : nullptr, kp ? kp->data() : nullptr, s.B, s.Tq, s.Tk, s.Hq, s.Hkv,
                     s.D, causal);
  return g;
}

}  // namespace

TEST_CASE("attention_forward equals explicit softmax(scale Q K^T + mask) V and its log-sum-exp", "[kernels]") {
  for (bool causal : {true, false}) {
    // Tq = 70 spans two 64-row score tiles.
    const Shape s{2, 70, 70, 2, 2, 4};
    const auto q = uniform(s.B * s.Tq * s.Hq * s.D, 1), k = uniform(s.B * s.Tk * s.Hkv * s.D, 2),
               v = uniform(s.B * s.Tk * s.Hkv * s.D, 3);
    const auto got = run_forward(q, k, v, nullptr, nullptr, s, causal);
    const auto want = naive_attention(q, k, v, iota(s.Tq), iota(s.Tk), s, causal);
    CHECK(rel_error(got.out, want.out) < 1e-12);
    CHECK(rel_error(got.lse, want.lse) < 1e-12);
    // float agrees with the double result.
    {
      const auto qf = cast<float>(q), kf = cast<float>(k), vf = cast<float>(v);
      std::vector<float> outf(got.out.size()), lsef(got.lse.size());
      attention_forward(outf.data(), lsef.data(), qf.data(), kf.data(), vf.data(), nullptr, nullptr, s.B, s.Tq, s.Tk,
                        s.Hq, s.Hkv, s.D, causal);
      CHECK(rel_error(outf, want.out) < 1e-5);
      CHECK(rel_error(lsef, want.lse) < 1e-5);
    }
  }
}

TEST_CASE("GQA equals MHA with each KV head repeated, forward and backward", "[kernels]") {
  const Shape gqa{2, 6, 6, 4, 2, 3}, mha{2, 6, 6, 4, 4, 3};
  const auto q = uniform(gqa.B * gqa.Tq * gqa.Hq * gqa.D, 4), k = uniform(gqa.B * gqa.Tk * gqa.Hkv * gqa.D, 5),
             v = uniform(gqa.B * gqa.Tk * gqa.Hkv * gqa.D, 6), dout = uniform(q.size(), 7);
  // Query heads 0,1 read KV head 0; heads 2,3 read KV head 1.
  Vec kr, vr;
  for (std::int64_t bt = 0; bt < gqa.B * gqa.Tk; ++bt)
    for (std::int64_t h = 0; h < 4; ++h)
      for (std::int64_t d = 0; d < 3; ++d) {
        kr.push_back(k[(bt * 2 + h / 2) * 3 + d]);
        vr.push_back(v[(bt * 2 + h / 2) * 3 + d]);
      }
  const auto fg = run_forward(q, k, v, nullptr, nullptr, gqa), fm = run_forward(q, kr, vr, nullptr, nullptr, mha);
  CHECK(rel_error(fg.out, fm.out) < 1e-14);
  CHECK(rel_error(fg.lse, fm.lse) < 1e-14);
  const auto gg = run_backward(dout, q, k, v, fg, nullptr, nullptr, gqa);
  const auto gm = run_backward(dout, q, kr, vr, fm, nullptr, nullptr, mha);
  CHECK(rel_error(gg.dq, gm.dq) < 1e-12);
  Vec dk_sum(k.size(), 0.0), dv_sum(v.size(), 0.0);
  for (std::int64_t bt = 0; bt < gqa.B * gqa.Tk; ++bt)
    for (std::int64_t h = 0; h < 4; ++h)
      for (std::int64_t d = 0; d < 3; ++d) {
        dk_sum[(bt * 2 + h / 2) * 3 + d] += gm.dk[(bt * 4 + h) * 3 + d];
        dv_sum[(bt * 2 + h / 2) * 3 + d] += gm.dv[(bt * 4 + h) * 3 + d];
      }
  CHECK(rel_error(gg.dk, dk_sum) < 1e-12);
  CHECK(rel_error(gg.dv, dv_sum) < 1e-12);
}

TEST_CASE("attention_backward matches finite differences for q, k and v (GQA, positions, causal and not)",
          "[kernels]") {
  for (bool causal : {true, false}) {
    // Queries at positions 3..7 against keys 0..5: the first query sees 4 keys.
    const Shape s{1, 5, 6, 4, 2, 3};
    const Pos qp = iota(5, 3), kp = iota(6);
    auto q = uniform(s.B * s.Tq * s.Hq * s.D, 8), k = uniform(s.B * s.Tk * s.Hkv * s.D, 9),
         v = uniform(s.B * s.Tk * s.Hkv * s.D, 10);
    const auto dout = uniform(q.size(), 11);
    const auto loss = [&] { return dot(run_forward(q, k, v, &qp, &kp, s, causal).out, dout); };
    const auto g = run_backward(dout, q, k, v, run_forward(q, k, v, &qp, &kp, s, causal), &qp, &kp, s, causal);
    CHECK(rel_error(g.dq, numeric_grad(q, loss)) < 1e-6);
    CHECK(rel_error(g.dk, numeric_grad(k, loss)) < 1e-6);
    CHECK(rel_error(g.dv, numeric_grad(v, loss)) < 1e-6);
  }
}

TEST_CASE("attention_backward_packed matches finite differences (documents, padding, GQA, causal and not)",
          "[kernels]") {
  for (bool causal : {true, false}) {
    // Two sequences of 7 rows: documents [3, 2] + 2 padding, and [1, 6].
    const Shape s{2, 7, 7, 4, 2, 3};
    const std::vector<std::int32_t> doc{0, 0, 0, 1, 1, 2, 2, 0, 1, 1, 1, 1, 1, 1};
    auto q = uniform(s.B * s.Tq * s.Hq * s.D, 30), k = uniform(s.B * s.Tk * s.Hkv * s.D, 31),
         v = uniform(s.B * s.Tk * s.Hkv * s.D, 32);
    const auto dout = uniform(q.size(), 33);
    const auto forward = [&] {
      Result r{Vec(q.size()), Vec(s.B * s.Hq * s.Tq)};
      attention_forward_packed(r.out.data(), r.lse.data(), q.data(), k.data(), v.data(), nullptr, nullptr, doc.data(),
                               doc.data(), s.B, s.Tq, s.Tk, s.Hq, s.Hkv, s.D, causal);
      return r;
    };
    const auto loss = [&] { return dot(forward().out, dout); };
    const Result f = forward();
    Grads g{Vec(q.size(), 7.0), Vec(k.size(), 7.0), Vec(v.size(), 7.0)};
    attention_backward_packed(g.dq.data(), g.dk.data(), g.dv.data(), dout.data(), q.data(), k.data(), v.data(),
                              f.out.data(), f.lse.data(), nullptr, nullptr, doc.data(), doc.data(), s.B, s.Tq, s.Tk,
                              s.Hq, s.Hkv, s.D, causal);
    CHECK(rel_error(g.dq, numeric_grad(q, loss)) < 1e-6);
    CHECK(rel_error(g.dk, numeric_grad(k, loss)) < 1e-6);
    CHECK(rel_error(g.dv, numeric_grad(v, loss)) < 1e-6);
  }
}

TEST_CASE("document_ids numbers the documents of cu_seqlens and their positions, padding last", "[kernels]") {
  const std::vector<std::int32_t> cu{0, 2, 2, 5};   // an empty document in the middle
  std::vector<std::int32_t> doc(7), pos(7);
  document_ids(doc.data(), pos.data(), cu.data(), 3, 7);
  CHECK(doc == std::vector<std::int32_t>{0, 0, 2, 2, 2, 3, 3});
  CHECK(pos == std::vector<std::int32_t>{0, 1, 0, 1, 2, 0, 1});
  const std::vector<std::int32_t> over{0, 8};
  CHECK_THROWS_AS(document_ids(doc.data(), nullptr, over.data(), 1, 7), std::invalid_argument);
}

TEST_CASE("Context-parallel chunks with global positions reproduce the full sequence's rows and gradients",
          "[kernels]") {
  // T = 16, CP = 2, load-balanced: rank 0 holds chunks {0, 3}, rank 1 {1, 2}
  // (4 positions each); both attend to the all-gathered K, V (positions 0..15).
  const Shape full{2, 16, 16, 2, 1, 4};
  const auto q = uniform(full.B * full.Tq * full.Hq * full.D, 12), k = uniform(full.B * full.Tk * full.D, 13),
             v = uniform(full.B * full.Tk * full.D, 14), dout = uniform(q.size(), 15);
  const auto ff = run_forward(q, k, v, nullptr, nullptr, full);
  const auto gf = run_backward(dout, q, k, v, ff, nullptr, nullptr, full);
  const std::int64_t HD = full.Hq * full.D;
  Vec dk_sum(k.size(), 0.0), dv_sum(v.size(), 0.0);
  for (const Pos& rows : {Pos{0, 1, 2, 3, 12, 13, 14, 15}, Pos{4, 5, 6, 7, 8, 9, 10, 11}}) {
    const Shape local{full.B, 8, 16, full.Hq, full.Hkv, full.D};
    const auto ql = take_rows(q, rows, full.B, 16, HD), dl = take_rows(dout, rows, full.B, 16, HD);
    const auto fl = run_forward(ql, k, v, &rows, nullptr, local);
    CHECK(rel_error(fl.out, take_rows(ff.out, rows, full.B, 16, HD)) < 1e-12);
    CHECK(rel_error(fl.lse, take_lse(ff.lse, rows, full.B, full.Hq, 16)) < 1e-12);
    const auto gl = run_backward(dl, ql, k, v, fl, &rows, nullptr, local);
    CHECK(rel_error(gl.dq, take_rows(gf.dq, rows, full.B, 16, HD)) < 1e-12);
    for (std::size_t i = 0; i < k.size(); ++i) {
      dk_sum[i] += gl.dk[i];
      dv_sum[i] += gl.dv[i];
    }
  }
  // The reduce-scatter of CP's KV gradients sums the ranks' partial dk, dv.
  CHECK(rel_error(dk_sum, gf.dk) < 1e-12);
  CHECK(rel_error(dv_sum, gf.dv) < 1e-12);
}

TEST_CASE("Ring attention: merged per-block results equal the full forward, per-block backward adds up", "[kernels]") {
  const Shape full{1, 16, 16, 2, 2, 4}, half{1, 16, 8, 2, 2, 4};
  const auto q = uniform(full.B * full.Tq * full.Hq * full.D, 16), k = uniform(q.size(), 17), v = uniform(q.size(), 18),
             dout = uniform(q.size(), 19);
  const auto ff = run_forward(q, k, v, nullptr, nullptr, full);
  const auto gf = run_backward(dout, q, k, v, ff, nullptr, nullptr, full);
  const std::int64_t HD = full.Hkv * full.D;
  const Pos first = iota(8), second = iota(8, 8);
  const auto k1 = take_rows(k, first, 1, 16, HD), v1 = take_rows(v, first, 1, 16, HD);
  const auto k2 = take_rows(k, second, 1, 16, HD), v2 = take_rows(v, second, 1, 16, HD);
  auto r1 = run_forward(q, k1, v1, nullptr, &first, half);
  const auto r2 = run_forward(q, k2, v2, nullptr, &second, half);
  CHECK(r2.lse[0] == -std::numeric_limits<double>::infinity());  // query 0 sees nothing in block 2
  attention_merge(r1.out.data(), r1.lse.data(), r2.out.data(), r2.lse.data(), 1, 16, 2, 4);
  CHECK(rel_error(r1.out, ff.out) < 1e-12);
  CHECK(rel_error(r1.lse, ff.lse) < 1e-12);
  // Backward per block with the merged out and lse.
  const auto g1 = run_backward(dout, q, k1, v1, r1, nullptr, &first, half);
  const auto g2 = run_backward(dout, q, k2, v2, r1, nullptr, &second, half);
  Vec dq(q.size());
  for (std::size_t i = 0; i < dq.size(); ++i) dq[i] = g1.dq[i] + g2.dq[i];
  CHECK(rel_error(dq, gf.dq) < 1e-12);
  CHECK(rel_error(g1.dk, take_rows(gf.dk, first, 1, 16, HD)) < 1e-12);
  CHECK(rel_error(g2.dv, take_rows(gf.dv, second, 1, 16, HD)) < 1e-12);
}

TEST_CASE("A query with no visible key gives zero output, -inf lse and zero gradients", "[kernels]") {
  const Shape s{1, 2, 3, 1, 1, 2};
  const Pos qp{0, 5}, kp{1, 2, 3};  // query 0 precedes every key
  const auto q = uniform(4, 20), k = uniform(6, 21), v = uniform(6, 22), dout = uniform(4, 23);
  const auto f = run_forward(q, k, v, &qp, &kp, s);
  CHECK(f.out[0] == 0.0);
  CHECK(f.out[1] == 0.0);
  CHECK(f.lse[0] == -std::numeric_limits<double>::infinity());
  CHECK(std::isfinite(f.lse[1]));
  const auto g = run_backward(dout, q, k, v, f, &qp, &kp, s);
  CHECK(g.dq[0] == 0.0);
  CHECK(g.dq[1] == 0.0);
  CHECK(std::all_of(g.dk.begin(), g.dk.end(), [](double x) { return std::isfinite(x); }));
  CHECK(rel_error(f.out, naive_attention(q, k, v, qp, kp, s, true).out) < 1e-14);
}

TEST_CASE("attention rejects Hq that is not a multiple of Hkv", "[kernels]") {
  Vec x(64);
  CHECK_THROWS_AS(
      attention_forward(x.data(), x.data(), x.data(), x.data(), x.data(), nullptr, nullptr, 1, 2, 2, 3, 2, 2),
      std::invalid_argument);
}
