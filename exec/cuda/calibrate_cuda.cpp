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
#include "exec/cuda/launch.hpp"
#include "exec/cuda/nccl_comm.hpp"
#include "exec/mpi_env.hpp"
#include "kernels/cuda/kernels.hpp"

namespace megascope::exec::cuda {

namespace {


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
class Bench final : public Buffers {
 public:
  Bench() { MEGASCOPE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Bench() override {
    blocks_.clear();
    (void)cudaStreamDestroy(stream_);
  }
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;
  [[nodiscard]] cudaStream_t stream() const override { return stream_; }
  void reset() {
    MEGASCOPE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    blocks_.clear();
  }
  std::int32_t* ids(std::int64_t n, std::int64_t modulo) override {
    std::vector<std::int32_t> host(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)));
    for (std::size_t i = 0; i < host.size(); ++i)
      host[i] = static_cast<std::int32_t>((static_cast<std::int64_t>(i) * 7919) % std::max<std::int64_t>(modulo, 1));
    blocks_.emplace_back(host.size() * sizeof(std::int32_t));
    auto* p = static_cast<std::int32_t*>(blocks_.back().get());
    MEGASCOPE_CUDA_CHECK(cudaMemcpy(p, host.data(), host.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
    return p;
  }

 protected:
  void* block(std::size_t bytes, bool& fresh) override {
    blocks_.emplace_back(bytes);
    fresh = true;
    return blocks_.back().get();
  }

 private:
  cudaStream_t stream_ = nullptr;
  std::vector<DeviceMemory> blocks_;
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

}  // namespace

std::vector<Timing> time_gemms(const std::vector<GemmCase>& cases, const CalibrationSettings& s,
                               const Progress& progress, GemmDtype dtype) {
  ensure_device();
  Gemm gemm;
  auto make = [&](const GemmCase& c, Bench& b) { return gemm_call(c, dtype, gemm, b); };
  return time_all(cases, s, progress, make, [&](const GemmCase& c) {
    return fmt::format("gemm {}x{}x{} {} {}", c.shape.m, c.shape.n, c.shape.k, to_string(c.pass), to_string(dtype));
  });
}

std::vector<Timing> time_memory(const std::vector<MemoryCase>& cases, const CalibrationSettings& s,
                                const Progress& progress) {
  auto make = [](const MemoryCase& c, Bench& b) { return memory_call(c, b); };
  return time_all(cases, s, progress, make, [](const MemoryCase& c) {
    return fmt::format("{} {}x{} bf16", to_string(c.kernel), c.rows, c.width);
  });
}

std::vector<Timing> time_attention(const std::vector<AttentionCase>& cases, const CalibrationSettings& s,
                                   const Progress& progress) {
  auto make = [](const AttentionCase& c, Bench& b) { return attention_call(c, b); };
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
