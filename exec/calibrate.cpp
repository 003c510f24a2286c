// Calibration measurements (exec/calibrate.hpp): each case runs the
// executor's kernel or MPI call in a loop on buffers it owns, the same size
// as in a run, and keeps the median of `repeats` samples.
#include "exec/calibrate.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fmt/format.h>
#include <memory>
#include <numeric>

#include "core/result.hpp"
#include "exec/comm.hpp"
#include "exec/mpi_env.hpp"
#include "kernels/activation.hpp"
#include "kernels/adamw.hpp"
#include "kernels/attention.hpp"
#include "kernels/cross_entropy.hpp"
#include "kernels/dropout.hpp"
#include "kernels/embedding.hpp"
#include "kernels/matmul.hpp"
#include "kernels/norm.hpp"
#include "kernels/rope.hpp"

namespace megascope::exec {

namespace k = megascope::kernels;
using Vec = std::vector<float>;
using Clock = std::chrono::steady_clock;

const char* to_string(GemmPass p) {
  switch (p) {
    case GemmPass::forward: return "forward";
    case GemmPass::backward_input: return "backward_input";
    case GemmPass::backward_weight: return "backward_weight";
  }
  return "?";
}

const char* to_string(MemoryKernel m) {
  static constexpr const char* kNames[kMemoryKernelCount] = {
      "layernorm_fwd", "layernorm_bwd", "rmsnorm_fwd",   "rmsnorm_bwd",       "gelu_fwd",
      "gelu_bwd",      "swiglu_fwd",    "swiglu_bwd",    "bias_dropout_add_fwd", "bias_dropout_add_bwd",
      "embedding_fwd", "embedding_bwd", "cross_entropy_fwd", "cross_entropy_bwd", "adamw"};
  return kNames[static_cast<int>(m)];
}

MemoryOp memory_op_of(MemoryKernel m) {
  switch (m) {
    case MemoryKernel::layernorm_fwd:
    case MemoryKernel::layernorm_bwd:
    case MemoryKernel::rmsnorm_fwd:
    case MemoryKernel::rmsnorm_bwd: return MemoryOp::norm;
    case MemoryKernel::gelu_fwd:
    case MemoryKernel::gelu_bwd:
    case MemoryKernel::swiglu_fwd:
    case MemoryKernel::swiglu_bwd: return MemoryOp::activation;
    case MemoryKernel::bias_dropout_add_fwd:
    case MemoryKernel::bias_dropout_add_bwd: return MemoryOp::dropout_residual;
    case MemoryKernel::embedding_fwd:
    case MemoryKernel::embedding_bwd: return MemoryOp::embedding;
    case MemoryKernel::cross_entropy_fwd:
    case MemoryKernel::cross_entropy_bwd: return MemoryOp::cross_entropy;
    case MemoryKernel::adamw: return MemoryOp::optimizer;
  }
  return MemoryOp::other;
}

bool is_backward(MemoryKernel m) {
  switch (m) {
    case MemoryKernel::layernorm_bwd:
    case MemoryKernel::rmsnorm_bwd:
    case MemoryKernel::gelu_bwd:
    case MemoryKernel::swiglu_bwd:
    case MemoryKernel::bias_dropout_add_bwd:
    case MemoryKernel::embedding_bwd:
    case MemoryKernel::cross_entropy_bwd: return true;
    default: return false;
  }
}

double program_bytes(MemoryKernel m, std::int64_t rows, std::int64_t width) {
  const double e = static_cast<double>(rows) * static_cast<double>(width);
  switch (m) {   // bytes per element, as core/program/layer_ops.cpp and builder.cpp count them
    case MemoryKernel::layernorm_fwd:
    case MemoryKernel::rmsnorm_fwd: return 4 * e;
    case MemoryKernel::layernorm_bwd:
    case MemoryKernel::rmsnorm_bwd: return 6 * e;
    case MemoryKernel::gelu_fwd: return 4 * e;       // 2 T f (up + 1), up = 1
    case MemoryKernel::gelu_bwd: return 6 * e;       // 2 T f (2 up + 1)
    case MemoryKernel::swiglu_fwd: return 6 * e;     // up = 2
    case MemoryKernel::swiglu_bwd: return 10 * e;
    case MemoryKernel::bias_dropout_add_fwd: return 6 * e;
    case MemoryKernel::bias_dropout_add_bwd: return 4 * e;
    case MemoryKernel::embedding_fwd: return 4 * e;
    case MemoryKernel::embedding_bwd: return 6 * e;
    case MemoryKernel::cross_entropy_fwd: return kCrossEntropyFwdBytesPerLogit * e;
    case MemoryKernel::cross_entropy_bwd: return kCrossEntropyBwdBytesPerLogit * e;
    case MemoryKernel::adamw: return 30 * e;
  }
  return e;
}

const char* to_string(CommOp c) {
  switch (c) {
    case CommOp::all_reduce: return "all_reduce";
    case CommOp::reduce_scatter: return "reduce_scatter";
    case CommOp::all_gather: return "all_gather";
    case CommOp::all_to_all: return "all_to_all";
    case CommOp::send_recv: return "send_recv";
  }
  return "?";
}

namespace {

Vec filled(std::int64_t n, float base = 0.01f) {
  Vec v(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = base * static_cast<float>(static_cast<int>(i % 97) - 48) / 48.0f;
  return v;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The median per-call time of `call` over `repeats` samples; each sample
// loops it for at least min_sample_s (the loop count is fixed after the
// warm-up, so that every sample runs the same calls).
double sample(const std::function<void()>& call, const CalibrationSettings& s) {
  auto t0 = Clock::now();
  long calls = 0;
  do {
    call();
    ++calls;
  } while (since(t0) < s.warmup_s);
  const double per = since(t0) / static_cast<double>(calls);
  const long loop = std::max(1L, static_cast<long>(std::ceil(s.min_sample_s / std::max(per, 1e-9))));
  std::vector<double> out;
  for (int r = 0; r < std::max(1, s.repeats); ++r) {
    t0 = Clock::now();
    for (long i = 0; i < loop; ++i) call();
    out.push_back(since(t0) / static_cast<double>(loop));
  }
  return median(out);
}

int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// Every rank's value to a Timing (the same on every rank).
Timing across_ranks(double mine) {
  const int n = world_size();
  std::vector<double> all(static_cast<std::size_t>(n));
  MPI_Allgather(&mine, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
  Timing t;
  t.seconds = median(all);
  const auto [lo, hi] = std::minmax_element(all.begin(), all.end());
  t.spread = t.seconds > 0 ? (*hi - *lo) / t.seconds : 0;
  return t;
}

void report(const Progress& p, const std::string& what) {
  if (p && world_rank() == 0) p(what);
}

// Runs every case on every rank at once: a barrier before each, so that the
// ranks' samples overlap as the ranks of a run do.
template <class Case, class Make>
std::vector<Timing> time_all(const std::vector<Case>& cases, const CalibrationSettings& s, const Progress& progress,
                             Make make, const std::function<std::string(const Case&)>& name) {
  MpiEnv::get();
  std::vector<Timing> out;
  out.reserve(cases.size());
  for (const Case& c : cases) {
    std::function<void()> call = make(c);
    MPI_Barrier(MPI_COMM_WORLD);
    out.push_back(across_ranks(sample(call, s)));
    report(progress, fmt::format("{}: {:.3g} s", name(c), out.back().seconds));
  }
  return out;
}

}  // namespace

std::vector<Timing> time_gemms(const std::vector<GemmCase>& cases, const CalibrationSettings& s,
                               const Progress& progress) {
  auto make = [](const GemmCase& c) -> std::function<void()> {
    const std::int64_t m = c.shape.m, n = c.shape.n, kk = c.shape.k;
    auto a = std::make_shared<Vec>(filled(m * kk)), b = std::make_shared<Vec>(filled(kk * n));
    auto out = std::make_shared<Vec>(filled(m * n)), bias = std::make_shared<Vec>(filled(std::max(m, n)));
    switch (c.pass) {
      case GemmPass::forward:   // out (m, n) = a (m, k) . b (n, k)^T
        return [=] { k::matmul_forward(out->data(), a->data(), b->data(), c.bias ? bias->data() : nullptr, m, kk, n); };
      case GemmPass::backward_input:   // dinp (m, n) = dout (m, k) . w (k, n)
        return [=] { k::matmul_backward_input(out->data(), a->data(), b->data(), m, n, kk); };
      case GemmPass::backward_weight:   // dw (n, m) += dout (k, n)^T . inp (k, m)
        return [=] {
          k::matmul_backward_weight(out->data(), c.bias ? bias->data() : static_cast<float*>(nullptr), b->data(),
                                    a->data(), kk, m, n);
        };
    }
    return [] {};
  };
  return time_all<GemmCase>(cases, s, progress, make, [](const GemmCase& c) {
    return fmt::format("gemm {}x{}x{} {}", c.shape.m, c.shape.n, c.shape.k, to_string(c.pass));
  });
}

std::vector<Timing> time_memory(const std::vector<MemoryCase>& cases, const CalibrationSettings& s,
                                const Progress& progress) {
  auto make = [](const MemoryCase& c) -> std::function<void()> {
    const std::int64_t N = c.rows, C = c.width, e = N * C;
    auto x = std::make_shared<Vec>(filled(e, 1.0f)), y = std::make_shared<Vec>(filled(e, 0.5f));
    auto z = std::make_shared<Vec>(filled(2 * e)), w = std::make_shared<Vec>(filled(C, 1.0f));
    auto wb = std::make_shared<Vec>(filled(C)), stats = std::make_shared<Vec>(filled(N, 1.0f));
    auto stats2 = std::make_shared<Vec>(filled(N, 1.0f));
    auto tokens = std::make_shared<std::vector<std::int32_t>>(static_cast<std::size_t>(std::max<std::int64_t>(N, 1)));
    for (std::size_t i = 0; i < tokens->size(); ++i) (*tokens)[i] = static_cast<std::int32_t>((i * 7919) % 256);
    constexpr float kEps = 1e-5f;
    const float kDrop = c.dropout;
    switch (c.kernel) {
      case MemoryKernel::layernorm_fwd:
        return [=] { k::layernorm_forward(y->data(), stats->data(), stats2->data(), x->data(), w->data(), wb->data(), N, C, kEps); };
      case MemoryKernel::layernorm_bwd:
        return [=] {
          k::layernorm_backward(z->data(), wb->data(), wb->data(), y->data(), x->data(), w->data(), stats->data(),
                                stats2->data(), N, C);
        };
      case MemoryKernel::rmsnorm_fwd:
        return [=] { k::rmsnorm_forward(y->data(), stats->data(), x->data(), w->data(), N, C, kEps); };
      case MemoryKernel::rmsnorm_bwd:
        return [=] { k::rmsnorm_backward(z->data(), wb->data(), y->data(), x->data(), w->data(), stats->data(), N, C); };
      case MemoryKernel::gelu_fwd: return [=] { k::gelu_forward(y->data(), x->data(), e); };
      case MemoryKernel::gelu_bwd: return [=] { k::gelu_backward(z->data(), x->data(), y->data(), e); };
      case MemoryKernel::swiglu_fwd:   // (N, 2C) -> (N, C)
        return [=] { k::swiglu_forward(y->data(), z->data(), N, C); };
      case MemoryKernel::swiglu_bwd: {
        auto d = std::make_shared<Vec>(filled(2 * e));
        return [=] { k::swiglu_backward(d->data(), z->data(), y->data(), N, C); };
      }
      case MemoryKernel::bias_dropout_add_fwd:
        return [=] { k::bias_dropout_add_forward(z->data(), x->data(), wb->data(), y->data(), N, C, kDrop, 17, 0); };
      case MemoryKernel::bias_dropout_add_bwd:
        return [=] { k::bias_dropout_add_backward(z->data(), wb->data(), y->data(), N, C, kDrop, 17, 0); };
      case MemoryKernel::embedding_fwd: {
        auto table = std::make_shared<Vec>(filled(256 * C));
        return [=] {
          k::embedding_forward(y->data(), tokens->data(), table->data(), static_cast<const float*>(nullptr),
                               static_cast<const std::int32_t*>(nullptr), N, C, 0, 256);
        };
      }
      case MemoryKernel::embedding_bwd: {
        auto table = std::make_shared<Vec>(filled(256 * C));
        return [=] {
          k::embedding_backward(table->data(), static_cast<float*>(nullptr), y->data(), tokens->data(),
                                static_cast<const std::int32_t*>(nullptr), N, C, 0, 256);
        };
      }
      case MemoryKernel::cross_entropy_fwd: {   // (N, V = C) logits: the local max, sum of exps, target, loss
        auto sums = std::make_shared<Vec>(filled(2 * N)), loss = std::make_shared<Vec>(filled(N));
        return [=] {
          k::cross_entropy_local_max(stats->data(), x->data(), N, C);
          k::cross_entropy_local_sumexp(sums->data(), x->data(), stats->data(), N, C);
          k::cross_entropy_local_target(sums->data() + N, x->data(), tokens->data(), N, C, 0);
          k::cross_entropy_loss(loss->data(), stats->data(), sums->data(), sums->data() + N, N);
        };
      }
      case MemoryKernel::cross_entropy_bwd: {
        auto dloss = std::make_shared<Vec>(static_cast<std::size_t>(std::max<std::int64_t>(N, 1)), 1e-4f);
        for (float& v : *stats2) v = 100.0f;   // sum of exps
        return [=] {
          k::cross_entropy_backward(y->data(), x->data(), stats->data(), stats2->data(), tokens->data(), dloss->data(),
                                    N, C, 0);
        };
      }
      case MemoryKernel::adamw: {
        auto m = std::make_shared<Vec>(filled(e)), v = std::make_shared<Vec>(filled(e, 0.001f));
        for (float& q : *v) q = std::abs(q);
        return [=] {
          k::adamw_update(x->data(), y->data(), m->data(), v->data(), e, 1e-9f, 0.9f, 0.95f, 1e-8f, 0.01f, 10, 1.0f);
        };
      }
    }
    return [] {};
  };
  return time_all<MemoryCase>(cases, s, progress, make, [](const MemoryCase& c) {
    return fmt::format("{} {}x{} p={}", to_string(c.kernel), c.rows, c.width, c.dropout);
  });
}

std::vector<Timing> time_attention(const std::vector<AttentionCase>& cases, const CalibrationSettings& s,
                                   const Progress& progress) {
  auto make = [](const AttentionCase& c) -> std::function<void()> {
    const AttentionShape& a = c.shape;
    const std::int64_t B = a.batch, S = a.seq_q, Hq = a.heads, Hkv = a.kv_heads > 0 ? a.kv_heads : a.heads,
                       D = a.head_dim;
    constexpr float kTheta = 10000.0f;
    auto q = std::make_shared<Vec>(filled(B * S * Hq * D, 1.0f)), kk = std::make_shared<Vec>(filled(B * S * Hkv * D, 1.0f));
    auto v = std::make_shared<Vec>(filled(B * S * Hkv * D, 1.0f)), o = std::make_shared<Vec>(filled(B * S * Hq * D));
    auto lse = std::make_shared<Vec>(filled(B * Hq * S));
    const bool rope = c.rope;
    if (!c.backward)
      return [=] {
        if (rope) {
          k::rope_forward(q->data(), q->data(), nullptr, B, S, Hq, D, kTheta);
          k::rope_forward(kk->data(), kk->data(), nullptr, B, S, Hkv, D, kTheta);
        }
        k::attention_forward(o->data(), lse->data(), q->data(), kk->data(), v->data(), nullptr, nullptr, B, S, S, Hq,
                             Hkv, D);
      };
    k::attention_forward(o->data(), lse->data(), q->data(), kk->data(), v->data(), nullptr, nullptr, B, S, S, Hq, Hkv, D);
    auto dq = std::make_shared<Vec>(filled(B * S * Hq * D)), dk = std::make_shared<Vec>(filled(B * S * Hkv * D));
    auto dv = std::make_shared<Vec>(filled(B * S * Hkv * D)), dout = std::make_shared<Vec>(filled(B * S * Hq * D));
    return [=] {
      k::attention_backward(dq->data(), dk->data(), dv->data(), dout->data(), q->data(), kk->data(), v->data(),
                            o->data(), lse->data(), nullptr, nullptr, B, S, S, Hq, Hkv, D);
      if (rope) {
        k::rope_backward(dq->data(), dq->data(), nullptr, B, S, Hq, D, kTheta);
        k::rope_backward(dk->data(), dk->data(), nullptr, B, S, Hkv, D, kTheta);
      }
    };
  };
  return time_all<AttentionCase>(cases, s, progress, make, [](const AttentionCase& c) {
    return fmt::format("attention {} b{} s{} h{}/{} d{}{}", c.backward ? "bwd" : "fwd", c.shape.batch, c.shape.seq_q,
                       c.shape.heads, c.shape.kv_heads, c.shape.head_dim, c.rope ? " rope" : "");
  });
}

std::vector<Timing> time_comms(const std::vector<CommCase>& cases, const CalibrationSettings& s,
                               const Progress& progress) {
  MpiEnv::get();
  const int world = world_size(), me = world_rank();
  std::vector<Timing> out;
  for (const CommCase& c : cases) {
    const int group = c.op == CommOp::send_recv ? 2 : c.group;
    if (group > world || group < 1) {
      out.push_back({});
      continue;
    }
    // The first `group` ranks form the group; the others wait at the barrier.
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, me < group ? 0 : MPI_UNDEFINED, me, &comm);
    double mine = 0;
    if (comm != MPI_COMM_NULL) {
      auto communicator = std::make_unique<MpiCommunicator>(comm);   // owns and frees comm
      MpiCommunicator& g = *communicator;
      const std::int64_t n = std::max<std::int64_t>(1, static_cast<std::int64_t>(c.bytes / sizeof(float)));
      const std::int64_t part = std::max<std::int64_t>(1, n / group);
      Vec a = filled(n + group * part), b = filled(n + group * part);
      std::function<void()> call;
      PointToPoint p2p;
      switch (c.op) {
        case CommOp::all_reduce: call = [&] { g.all_reduce(a.data(), n); }; break;
        case CommOp::reduce_scatter: call = [&] { g.reduce_scatter(b.data(), a.data(), part); }; break;
        case CommOp::all_gather: call = [&] { g.all_gather(b.data(), a.data(), part); }; break;
        case CommOp::all_to_all: call = [&] { g.all_to_all(b.data(), a.data(), part); }; break;
        case CommOp::send_recv:   // a round trip; halved below
          call = [&] {
            if (g.rank() == 0) {
              auto r = p2p.send(a.data(), n, 1, 11);
              auto back = p2p.recv(b.data(), n, 1, 12);
              p2p.wait(back, 600);
              p2p.wait(r, 600);
            } else {
              auto r = p2p.recv(b.data(), n, 0, 11);
              p2p.wait(r, 600);
              auto back = p2p.send(a.data(), n, 0, 12);
              p2p.wait(back, 600);
            }
          };
          break;
      }
      // Every member makes the same calls (collectives must match): three
      // warm-up calls, then rank 0's time per call sets the loop count.
      g.barrier();
      for (int i = 0; i < 3; ++i) call();
      auto t0 = Clock::now();
      call();
      double per = since(t0);
      MPI_Bcast(&per, 1, MPI_DOUBLE, 0, comm);
      const long loop = std::max(1L, static_cast<long>(std::ceil(s.min_sample_s / std::max(per, 1e-9))));
      std::vector<double> samples;
      for (int r = 0; r < std::max(1, s.repeats); ++r) {
        g.barrier();
        t0 = Clock::now();
        for (long i = 0; i < loop; ++i) call();
        double t = since(t0) / static_cast<double>(loop), slowest = 0;
        MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
        samples.push_back(slowest);
      }
      mine = median(samples) / (c.op == CommOp::send_recv ? 2.0 : 1.0);
    }
    double root = mine;
    MPI_Bcast(&root, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    out.push_back({root, 0});
    report(progress, fmt::format("{} x{} {:.0f} B: {:.3g} s", to_string(c.op), group, c.bytes, root));
  }
  return out;
}

Timing time_empty_op(const CalibrationSettings& s) {
  MpiEnv::get();
  struct Span {
    std::int32_t rank;
    std::uint32_t op;
    double start, end;
  };
  std::vector<Span> spans;
  spans.reserve(1 << 16);
  volatile int sink = 0;
  const auto t0 = Clock::now();
  auto now = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  const double t = sample(
      [&] {
        if (spans.size() == spans.capacity()) spans.clear();
        const double start = now();
        sink = sink + 1;
        spans.push_back({0, static_cast<std::uint32_t>(spans.size()), start, now()});
      },
      s);
  return across_ranks(t);
}

}  // namespace megascope::exec
