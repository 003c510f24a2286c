// GPU calibration measurements (exec/cuda/calibrate_cuda.hpp): each case
// runs the GPU runtime's own call (cuBLASLt, a CUDA kernel, NCCL) in a loop
// on device buffers it owns, timed with CUDA events.
#include "exec/cuda/calibrate_cuda.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <functional>
#include <map>
#include <memory>
#include <optional>

#include "exec/cuda/cublaslt.hpp"
#include "exec/cuda/device_kernels.hpp"
#include "exec/cuda/nccl_comm.hpp"
#include "exec/mpi_env.hpp"
#include "kernels/cuda/kernels.hpp"

namespace megascope::exec::cuda {

namespace {

namespace ku = megascope::kernels::cuda;
using Call = std::function<void()>;

// The device of this rank: the first call checks for one (NoCudaDevice),
// starts MPI (a world of 1 without a launcher) and selects the GPU by the
// rank's index on its node.
void ensure_device() {
  static bool ready = false;
  if (ready) return;
  require_device();
  MpiEnv::get();
  select_device(mpi_local_rank());
  ready = true;
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

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

Timing across_ranks(double mine) {
  std::vector<double> all(static_cast<std::size_t>(world_size()));
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

// A stream of our own and the device buffers of one case (freed with it).
class Bench {
 public:
  Bench() { MEGASCOPE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Bench() {
    blocks_.clear();
    (void)cudaStreamDestroy(stream_);
  }
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;
  [[nodiscard]] cudaStream_t stream() const { return stream_; }
  void reset() {
    MEGASCOPE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    blocks_.clear();
  }
  // n elements of E (at least one), uniform in [lo, hi).
  template <typename E>
  E* alloc(std::int64_t n, float lo = -1.0f, float hi = 1.0f) {
    n = std::max<std::int64_t>(n, 1);
    blocks_.emplace_back(static_cast<std::size_t>(n) * sizeof(E));
    E* p = static_cast<E*>(blocks_.back().get());
    fill_uniform(p, n, ++seed_, lo, hi, stream_);
    return p;
  }
  std::int32_t* ids(std::int64_t n, std::int64_t modulo) {
    std::vector<std::int32_t> host(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)));
    for (std::size_t i = 0; i < host.size(); ++i)
      host[i] = static_cast<std::int32_t>((static_cast<std::int64_t>(i) * 7919) % std::max<std::int64_t>(modulo, 1));
    blocks_.emplace_back(host.size() * sizeof(std::int32_t));
    auto* p = static_cast<std::int32_t*>(blocks_.back().get());
    MEGASCOPE_CUDA_CHECK(cudaMemcpy(p, host.data(), host.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
    return p;
  }

 private:
  cudaStream_t stream_ = nullptr;
  std::vector<DeviceMemory> blocks_;
  std::uint64_t seed_ = 0;
};

// GPU seconds of `calls` back-to-back calls on `stream`.
double gpu_seconds(const Call& call, long calls, cudaStream_t stream) {
  Event a, b;
  a.record(stream);
  for (long i = 0; i < calls; ++i) call();
  b.record(stream);
  b.synchronize();
  return b.seconds_since(a);
}

// The number of calls one sample loops: warm-up in doubling batches until a
// batch lasts warmup_s, then enough calls for min_sample_s.
long calls_per_sample(const Call& call, cudaStream_t stream, const CalibrationSettings& s) {
  long batch = 1;
  double t = gpu_seconds(call, batch, stream);
  while (t < s.warmup_s && batch < (1L << 20)) {
    batch *= 2;
    t = gpu_seconds(call, batch, stream);
  }
  const double per = t / static_cast<double>(batch);
  return std::max(1L, static_cast<long>(std::ceil(s.min_sample_s / std::max(per, 1e-9))));
}

// Median seconds per call over the samples.
double sample(const Call& call, cudaStream_t stream, const CalibrationSettings& s) {
  const long loop = calls_per_sample(call, stream, s);
  std::vector<double> out;
  for (int r = 0; r < std::max(1, s.repeats); ++r) out.push_back(gpu_seconds(call, loop, stream) / static_cast<double>(loop));
  return median(out);
}

// Every case on every rank at once; a case whose make() returns no call times 0.
template <class Case, class Make, class Name>
std::vector<Timing> time_all(const std::vector<Case>& cases, const CalibrationSettings& s, const Progress& progress,
                             Make make, Name name) {
  ensure_device();
  Bench bench;
  std::vector<Timing> out;
  out.reserve(cases.size());
  for (const Case& c : cases) {
    std::optional<Call> call = make(c, bench);
    MPI_Barrier(MPI_COMM_WORLD);
    out.push_back(across_ranks(call ? sample(*call, bench.stream(), s) : 0.0));
    bench.reset();
    report(progress, call ? fmt::format("{}: {:.3g} s", name(c), out.back().seconds)
                          : fmt::format("{}: not available, skipped", name(c)));
  }
  return out;
}

constexpr float kEps = 1e-5f, kDrop = 0.1f, kTheta = 10000.0f;

}  // namespace

std::vector<Timing> time_gemms(const std::vector<GemmCase>& cases, const CalibrationSettings& s,
                               const Progress& progress, GemmDtype dtype) {
  ensure_device();
  Gemm gemm;
  auto make = [&](const GemmCase& c, Bench& b) -> std::optional<Call> {
    const std::int64_t m = c.shape.m, n = c.shape.n, k = c.shape.k;
    const cudaStream_t st = b.stream();
    if (dtype == GemmDtype::fp8_e4m3) {   // forward only (gemm.hpp): out (m, n) = a (m, k) . w (n, k)^T
      if (c.pass != GemmPass::forward || !gemm.fp8_supported() || k % 16 != 0 || n % 16 != 0) return std::nullopt;
      auto* a = b.alloc<fp8e4m3>(m * k);
      auto* w = b.alloc<fp8e4m3>(n * k);
      auto* out = b.alloc<bf16>(m * n);
      auto* bias = c.bias ? b.alloc<bf16>(n) : nullptr;
      auto* scales = b.alloc<float>(2, 1.0f, 1.0f);
      return [=, &gemm] { gemm.forward_fp8(out, a, w, bias, scales, scales + 1, m, k, n, st); };
    }
    const bool f32 = dtype == GemmDtype::fp32;
    switch (c.pass) {
      case GemmPass::forward:   // forward(N = m, C = k, OC = n)
        if (f32) {
          auto *a = b.alloc<float>(m * k), *w = b.alloc<float>(n * k), *out = b.alloc<float>(m * n);
          auto* bias = c.bias ? b.alloc<float>(n) : nullptr;
          return [=, &gemm] { gemm.forward<float>(out, a, w, bias, m, k, n, st); };
        } else {
          auto *a = b.alloc<bf16>(m * k), *w = b.alloc<bf16>(n * k), *out = b.alloc<bf16>(m * n);
          auto* bias = c.bias ? b.alloc<bf16>(n) : nullptr;
          return [=, &gemm] { gemm.forward<bf16>(out, a, w, bias, m, k, n, st); };
        }
      case GemmPass::backward_input:   // backward_input(N = m, C = n, OC = k): dinp (m, n) = dout (m, k) . w (k, n)
        if (f32) {
          auto *dout = b.alloc<float>(m * k), *w = b.alloc<float>(k * n), *dinp = b.alloc<float>(m * n);
          return [=, &gemm] { gemm.backward_input<float>(dinp, dout, w, m, n, k, st); };
        } else {
          auto *dout = b.alloc<bf16>(m * k), *w = b.alloc<bf16>(k * n), *dinp = b.alloc<bf16>(m * n);
          return [=, &gemm] { gemm.backward_input<bf16>(dinp, dout, w, m, n, k, st); };
        }
      case GemmPass::backward_weight: {   // backward_weight(N = k, C = m, OC = n): dw (n, m) += dout (k, n)^T . inp (k, m)
        auto* dw = b.alloc<float>(n * m);
        auto* dbias = c.bias ? b.alloc<float>(n) : nullptr;
        if (f32) {
          auto *dout = b.alloc<float>(k * n), *inp = b.alloc<float>(k * m);
          return [=, &gemm] { gemm.backward_weight<float>(dw, dbias, dout, inp, k, m, n, st); };
        }
        auto *dout = b.alloc<bf16>(k * n), *inp = b.alloc<bf16>(k * m);
        return [=, &gemm] { gemm.backward_weight<bf16>(dw, dbias, dout, inp, k, m, n, st); };
      }
    }
    return std::nullopt;
  };
  return time_all(cases, s, progress, make, [&](const GemmCase& c) {
    return fmt::format("gemm {}x{}x{} {} {}", c.shape.m, c.shape.n, c.shape.k, to_string(c.pass), to_string(dtype));
  });
}

std::vector<Timing> time_memory(const std::vector<MemoryCase>& cases, const CalibrationSettings& s,
                                const Progress& progress) {
  auto make = [](const MemoryCase& c, Bench& b) -> std::optional<Call> {
    const std::int64_t N = c.rows, C = c.width, e = N * C;
    const cudaStream_t st = b.stream();
    switch (c.kernel) {
      case MemoryKernel::layernorm_fwd: {
        auto *y = b.alloc<bf16>(e), *x = b.alloc<bf16>(e), *w = b.alloc<bf16>(C), *wb = b.alloc<bf16>(C);
        auto *mean = b.alloc<float>(N), *rstd = b.alloc<float>(N);
        return [=] { ku::layernorm_forward<bf16>(y, mean, rstd, x, w, wb, N, C, kEps, st); };
      }
      case MemoryKernel::layernorm_bwd: {
        auto *dx = b.alloc<bf16>(e), *dy = b.alloc<bf16>(e), *x = b.alloc<bf16>(e), *w = b.alloc<bf16>(C);
        auto *dw = b.alloc<float>(C), *db = b.alloc<float>(C), *mean = b.alloc<float>(N), *rstd = b.alloc<float>(N, 0.5f, 2.0f);
        return [=] { ku::layernorm_backward<bf16>(dx, dw, db, dy, x, w, mean, rstd, N, C, st); };
      }
      case MemoryKernel::rmsnorm_fwd: {
        auto *y = b.alloc<bf16>(e), *x = b.alloc<bf16>(e), *w = b.alloc<bf16>(C);
        auto* rstd = b.alloc<float>(N);
        return [=] { ku::rmsnorm_forward<bf16>(y, rstd, x, w, N, C, kEps, st); };
      }
      case MemoryKernel::rmsnorm_bwd: {
        auto *dx = b.alloc<bf16>(e), *dy = b.alloc<bf16>(e), *x = b.alloc<bf16>(e), *w = b.alloc<bf16>(C);
        auto *dw = b.alloc<float>(C), *rstd = b.alloc<float>(N, 0.5f, 2.0f);
        return [=] { ku::rmsnorm_backward<bf16>(dx, dw, dy, x, w, rstd, N, C, st); };
      }
      case MemoryKernel::gelu_fwd: {
        auto *y = b.alloc<bf16>(e), *x = b.alloc<bf16>(e);
        return [=] { ku::gelu_forward<bf16>(y, x, e, st); };
      }
      case MemoryKernel::gelu_bwd: {
        auto *dx = b.alloc<bf16>(e), *x = b.alloc<bf16>(e), *dy = b.alloc<bf16>(e);
        return [=] { ku::gelu_backward<bf16>(dx, x, dy, e, st); };
      }
      case MemoryKernel::swiglu_fwd: {   // (N, 2C) -> (N, C)
        auto *y = b.alloc<bf16>(e), *x = b.alloc<bf16>(2 * e);
        return [=] { ku::swiglu_forward<bf16>(y, x, N, C, st); };
      }
      case MemoryKernel::swiglu_bwd: {
        auto *dx = b.alloc<bf16>(2 * e), *x = b.alloc<bf16>(2 * e), *dy = b.alloc<bf16>(e);
        return [=] { ku::swiglu_backward<bf16>(dx, x, dy, N, C, st); };
      }
      case MemoryKernel::bias_dropout_add_fwd: {
        auto *y = b.alloc<bf16>(e), *x = b.alloc<bf16>(e), *bias = b.alloc<bf16>(C), *res = b.alloc<bf16>(e);
        return [=] { ku::bias_dropout_add_forward<bf16>(y, x, bias, res, N, C, kDrop, 17, 0, st); };
      }
      case MemoryKernel::bias_dropout_add_bwd: {
        auto *dx = b.alloc<bf16>(e), *dy = b.alloc<bf16>(e);
        auto* dbias = b.alloc<float>(C);
        return [=] { ku::bias_dropout_add_backward<bf16>(dx, dbias, dy, N, C, kDrop, 17, 0, st); };
      }
      case MemoryKernel::embedding_fwd:
      case MemoryKernel::embedding_bwd: {
        // A vocabulary shard of 8192 rows: tokens spread over it (the atomics
        // of the backward see little contention, as with a real vocabulary).
        constexpr std::int64_t kVocab = 8192;
        auto* tokens = b.ids(N, kVocab);
        if (c.kernel == MemoryKernel::embedding_fwd) {
          auto *y = b.alloc<bf16>(e), *wte = b.alloc<bf16>(kVocab * C);
          return [=] { ku::embedding_forward<bf16>(y, tokens, wte, nullptr, nullptr, N, C, 0, kVocab, st); };
        }
        auto* dy = b.alloc<bf16>(e);
        auto* dwte = b.alloc<float>(kVocab * C);
        return [=] { ku::embedding_backward<bf16>(dwte, nullptr, dy, tokens, nullptr, N, C, 0, kVocab, st); };
      }
      case MemoryKernel::cross_entropy_fwd: {   // (N, V = C) logits: local max, sum of exps, target, loss
        auto* logits = b.alloc<bf16>(e);
        auto* targets = b.ids(N, C);
        auto *row_max = b.alloc<float>(N), *sumexp = b.alloc<float>(N), *target = b.alloc<float>(N), *loss = b.alloc<float>(N);
        return [=] {
          ku::cross_entropy_local_max<bf16>(row_max, logits, N, C, st);
          ku::cross_entropy_local_sumexp<bf16>(sumexp, logits, row_max, N, C, st);
          ku::cross_entropy_local_target<bf16>(target, logits, targets, N, C, 0, st);
          ku::cross_entropy_loss(loss, row_max, sumexp, target, N, st);
        };
      }
      case MemoryKernel::cross_entropy_bwd: {
        auto *logits = b.alloc<bf16>(e), *dlogits = b.alloc<bf16>(e);
        auto* targets = b.ids(N, C);
        auto *row_max = b.alloc<float>(N), *sumexp = b.alloc<float>(N), *dloss = b.alloc<float>(N, 1e-4f, 1e-4f);
        ku::cross_entropy_local_max<bf16>(row_max, logits, N, C, st);
        ku::cross_entropy_local_sumexp<bf16>(sumexp, logits, row_max, N, C, st);
        return [=] { ku::cross_entropy_backward<bf16>(dlogits, logits, row_max, sumexp, targets, dloss, N, C, 0, st); };
      }
      case MemoryKernel::adamw: {   // fp32 master weights and moments, bf16 gradients
        auto *p = b.alloc<float>(e), *m = b.alloc<float>(e), *v = b.alloc<float>(e, 0.0f, 1e-3f);
        auto* g = b.alloc<bf16>(e);
        return [=] { ku::adamw_update<bf16>(p, g, m, v, e, 1e-9f, 0.9f, 0.95f, 1e-8f, 0.01f, 10, 1.0f, st); };
      }
    }
    return std::nullopt;
  };
  return time_all(cases, s, progress, make, [](const MemoryCase& c) {
    return fmt::format("{} {}x{} bf16", to_string(c.kernel), c.rows, c.width);
  });
}

std::vector<Timing> time_attention(const std::vector<AttentionCase>& cases, const CalibrationSettings& s,
                                   const Progress& progress) {
  auto make = [](const AttentionCase& c, Bench& b) -> std::optional<Call> {
    const AttentionShape& a = c.shape;
    const std::int64_t B = a.batch, Tq = a.seq_q, Tk = a.seq_kv > 0 ? a.seq_kv : a.seq_q, Hq = a.heads,
                       Hkv = a.kv_heads > 0 ? a.kv_heads : a.heads, D = a.head_dim;
    if (D > 256 || (a.head_dim_v != 0 && a.head_dim_v != a.head_dim)) return std::nullopt;   // not a kernel we have
    const bool causal = a.causal, rope = c.rope;
    const cudaStream_t st = b.stream();
    auto *q = b.alloc<bf16>(B * Tq * Hq * D), *k = b.alloc<bf16>(B * Tk * Hkv * D), *v = b.alloc<bf16>(B * Tk * Hkv * D);
    auto *qr = b.alloc<bf16>(B * Tq * Hq * D), *kr = b.alloc<bf16>(B * Tk * Hkv * D);
    auto* o = b.alloc<bf16>(B * Tq * Hq * D);
    auto* lse = b.alloc<float>(B * Hq * Tq);
    if (!c.backward)
      return [=] {
        if (rope) {
          ku::rope_forward<bf16>(qr, q, nullptr, B, Tq, Hq, D, kTheta, st);
          ku::rope_forward<bf16>(kr, k, nullptr, B, Tk, Hkv, D, kTheta, st);
        }
        ku::attention_forward<bf16>(o, lse, rope ? qr : q, rope ? kr : k, v, nullptr, nullptr, B, Tq, Tk, Hq, Hkv, D,
                                    causal, std::nullopt, st);
      };
    ku::attention_forward<bf16>(o, lse, q, k, v, nullptr, nullptr, B, Tq, Tk, Hq, Hkv, D, causal, std::nullopt, st);
    auto *dq = b.alloc<bf16>(B * Tq * Hq * D), *dk = b.alloc<bf16>(B * Tk * Hkv * D), *dv = b.alloc<bf16>(B * Tk * Hkv * D);
    auto* dout = b.alloc<bf16>(B * Tq * Hq * D);
    return [=] {
      ku::attention_backward<bf16>(dq, dk, dv, dout, q, k, v, o, lse, nullptr, nullptr, B, Tq, Tk, Hq, Hkv, D, causal,
                                   std::nullopt, st);
      if (rope) {
        ku::rope_backward<bf16>(qr, dq, nullptr, B, Tq, Hq, D, kTheta, st);
        ku::rope_backward<bf16>(kr, dk, nullptr, B, Tk, Hkv, D, kTheta, st);
      }
    };
  };
  return time_all(cases, s, progress, make, [](const AttentionCase& c) {
    return fmt::format("attention {} b{} s{} h{}/{} d{}{} bf16", c.backward ? "bwd" : "fwd", c.shape.batch,
                       c.shape.seq_q, c.shape.heads, c.shape.kv_heads, c.shape.head_dim, c.rope ? " rope" : "");
  });
}

std::vector<Timing> time_comms(const std::vector<CommCase>& cases, const CalibrationSettings& s,
                               const Progress& progress) {
  ensure_device();
  const int world = world_size(), me = world_rank();
  // One NCCL communicator per group size (the first `size` world ranks), made on first use.
  struct Group {
    MPI_Comm mpi = MPI_COMM_NULL;
    std::unique_ptr<NcclCommunicator> nccl;
  };
  std::map<int, Group> groups;
  cudaStream_t stream = nullptr;
  MEGASCOPE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<Timing> out;
  for (const CommCase& c : cases) {
    const int size = c.op == CommOp::send_recv ? 2 : c.group;
    if (size > world || size < 1) {
      out.push_back({});
      report(progress, fmt::format("{} x{}: more ranks than the world's {}, skipped", to_string(c.op), size, world));
      continue;
    }
    auto [it, fresh] = groups.try_emplace(size);
    if (fresh) {
      MPI_Comm_split(MPI_COMM_WORLD, me < size ? 0 : MPI_UNDEFINED, me, &it->second.mpi);
      if (it->second.mpi != MPI_COMM_NULL) it->second.nccl = NcclCommunicator::over_mpi(it->second.mpi, stream);
    }
    double mine = 0;
    if (NcclCommunicator* g = it->second.nccl.get()) {
      const std::int64_t n = std::max<std::int64_t>(1, static_cast<std::int64_t>(c.bytes / sizeof(float)));
      const std::int64_t part = std::max<std::int64_t>(1, n / size);
      DeviceBuffer<float> a(static_cast<std::size_t>(n + size * part)), b(static_cast<std::size_t>(n + size * part));
      MEGASCOPE_CUDA_CHECK(cudaMemsetAsync(a.get(), 0, a.bytes(), stream));
      Call call;
      switch (c.op) {
        case CommOp::all_reduce: call = [&] { g->all_reduce(a.get(), n); }; break;
        case CommOp::reduce_scatter: call = [&] { g->reduce_scatter(b.get(), a.get(), part); }; break;
        case CommOp::all_gather: call = [&] { g->all_gather(b.get(), a.get(), part); }; break;
        case CommOp::all_to_all: call = [&] { g->all_to_all(b.get(), a.get(), part); }; break;
        case CommOp::send_recv:   // a round trip, halved below
          call = [&] {
            if (g->rank() == 0) {
              g->send(a.get(), n, ncclFloat32, 1);
              g->recv(b.get(), n, ncclFloat32, 1);
            } else {
              g->recv(b.get(), n, ncclFloat32, 0);
              g->send(a.get(), n, ncclFloat32, 0);
            }
          };
          break;
      }
      // Every member loops the same number of calls (collectives must match): rank 0's count.
      long loop = calls_per_sample(call, stream, s);
      MPI_Bcast(&loop, 1, MPI_LONG, 0, it->second.mpi);
      std::vector<double> samples;
      for (int r = 0; r < std::max(1, s.repeats); ++r) {
        MPI_Barrier(it->second.mpi);
        double t = gpu_seconds(call, loop, stream) / static_cast<double>(loop), slowest = 0;
        MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, it->second.mpi);
        samples.push_back(slowest);
      }
      mine = median(samples) / (c.op == CommOp::send_recv ? 2.0 : 1.0);
    }
    double root = mine;
    MPI_Bcast(&root, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    out.push_back({root, 0});
    report(progress, fmt::format("nccl {} x{} {:.0f} B: {:.3g} s", to_string(c.op), size, c.bytes, root));
  }
  for (auto& [size, g] : groups) {
    g.nccl.reset();
    if (g.mpi != MPI_COMM_NULL) MPI_Comm_free(&g.mpi);
  }
  (void)cudaStreamDestroy(stream);
  return out;
}

Timing time_empty_op(const CalibrationSettings& s) {
  ensure_device();
  Bench b;
  const cudaStream_t st = b.stream();
  return across_ranks(sample([st] { launch_empty(st); }, st, s));
}

Timing time_copy(double bytes, const CalibrationSettings& s) {
  ensure_device();
  Bench b;
  const auto n = static_cast<std::size_t>(std::max(1.0, bytes));
  DeviceMemory src(n), dst(n);
  const cudaStream_t st = b.stream();
  MEGASCOPE_CUDA_CHECK(cudaMemsetAsync(src.get(), 1, n, st));
  void *from = src.get(), *to = dst.get();
  return across_ranks(
      sample([=] { MEGASCOPE_CUDA_CHECK(cudaMemcpyAsync(to, from, n, cudaMemcpyDeviceToDevice, st)); }, st, s));
}

GpuDescription describe_gpu() {
  ensure_device();
  GpuDescription d;
  d.device = device_info();
  const std::size_t v = lt().cublasLtGetVersion();   // major * 10000 + minor * 100 + patch
  d.cublaslt_version = fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
  d.nccl_version = nccl_version();
  d.world = world_size();
  return d;
}

}  // namespace megascope::exec::cuda
