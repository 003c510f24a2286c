// kernels_bench: achieved bandwidth of the memory-bound CUDA kernels against
// the device's own copy bandwidth, and the FLOP rate of attention. Prints a
// table (header row, units row, one row per kernel) and, with --json FILE,
// the same rows as JSON. Not a test: nothing here asserts a speed.
//
//   ./build/bench/kernels_bench [--quick] [--json FILE]
//
// Derived metrics (each defined once, here):
//   copy GB/s  = 2 * S / t for cudaMemcpyAsync device-to-device of S bytes
//                (S read + S written), the best of the repetitions; 1 GB = 1e9 B.
//   GB/s       = the bytes an ideal kernel must move / t: every input tensor
//                read once, every output written once (read-modify-write
//                tensors twice); small per-row or per-column vectors ignored.
//   % copy     = GB/s / copy GB/s.
//   TFLOP/s    = FLOPs / t, FLOPs as FlashAttention's benchmark counts them:
//                forward 4 B Hq Tq Tk D (two GEMMs), halved when causal;
//                backward 2.5 x forward.
//   t          = mean over the timed repetitions (after one warm-up), from
//                CUDA events on one stream.
//   ok         = every output's sum of squares is finite (no NaN or Inf);
//                correctness against the CPU twins is kernels_gpu_tests' job.
// Without a CUDA device it prints "skipped: no CUDA device" and exits 0.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/kernels.hpp"

namespace cu = megascope::kernels::cuda;
using bf16 = __nv_bfloat16;

namespace {

struct Row {
  std::string kernel, dtype, shape;
  double bytes = 0.0, flops = 0.0, seconds = 0.0;
  bool ok = true;
};

// Device memory that lives until the end of main; filled with small values.
class Arena {
 public:
  ~Arena() {
    for (void* p : blocks_) (void)cudaFree(p);
  }
  template <typename E>
  E* alloc(std::int64_t n, float lo = -1.0f, float hi = 1.0f) {
    void* p = nullptr;
    MEGASCOPE_CUDA_CHECK(cudaMalloc(&p, static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * sizeof(E)));
    blocks_.push_back(p);
    std::vector<E> host(static_cast<std::size_t>(n));
    std::uint64_t x = 0x9E3779B97F4A7C15ull ^ static_cast<std::uint64_t>(n);
    for (auto& e : host) {  // xorshift: cheap, deterministic
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      const float u = static_cast<float>(x >> 40) / 16777216.0f;
      e = static_cast<E>(lo + (hi - lo) * u);
    }
    MEGASCOPE_CUDA_CHECK(cudaMemcpy(p, host.data(), host.size() * sizeof(E), cudaMemcpyHostToDevice));
    return static_cast<E*>(p);
  }

 private:
  std::vector<void*> blocks_;
};

template <>
bf16* Arena::alloc<bf16>(std::int64_t n, float lo, float hi) {
  auto* f = alloc<float>(n, lo, hi);
  void* p = nullptr;
  MEGASCOPE_CUDA_CHECK(cudaMalloc(&p, static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * sizeof(bf16)));
  blocks_.push_back(p);
  std::vector<float> host(static_cast<std::size_t>(n));
  MEGASCOPE_CUDA_CHECK(cudaMemcpy(host.data(), f, host.size() * sizeof(float), cudaMemcpyDeviceToHost));
  std::vector<bf16> hb(host.size());
  for (std::size_t i = 0; i < host.size(); ++i) hb[i] = __float2bfloat16(host[i]);
  MEGASCOPE_CUDA_CHECK(cudaMemcpy(p, hb.data(), hb.size() * sizeof(bf16), cudaMemcpyHostToDevice));
  return static_cast<bf16*>(p);
}

// Mean seconds per call of fn over reps calls, after one warm-up call.
double time_it(const std::function<void()>& fn, int reps, cudaStream_t stream) {
  fn();
  cudaEvent_t start, stop;
  MEGASCOPE_CUDA_CHECK(cudaEventCreate(&start));
  MEGASCOPE_CUDA_CHECK(cudaEventCreate(&stop));
  MEGASCOPE_CUDA_CHECK(cudaEventRecord(start, stream));
  for (int r = 0; r < reps; ++r) fn();
  MEGASCOPE_CUDA_CHECK(cudaEventRecord(stop, stream));
  MEGASCOPE_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0.0f;
  MEGASCOPE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  MEGASCOPE_CUDA_CHECK(cudaEventDestroy(start));
  MEGASCOPE_CUDA_CHECK(cudaEventDestroy(stop));
  return static_cast<double>(ms) * 1e-3 / reps;
}

// Whether x (n) holds only finite values: its sum of squares is finite.
template <typename T>
bool finite(const T* x, std::int64_t n, cudaStream_t stream) {
  double* acc = nullptr;
  MEGASCOPE_CUDA_CHECK(cudaMalloc(&acc, sizeof(double)));
  MEGASCOPE_CUDA_CHECK(cudaMemsetAsync(acc, 0, sizeof(double), stream));
  cu::sum_squares(acc, x, n, stream);
  double h = 0.0;
  MEGASCOPE_CUDA_CHECK(cudaMemcpyAsync(&h, acc, sizeof(double), cudaMemcpyDeviceToHost, stream));
  MEGASCOPE_CUDA_CHECK(cudaStreamSynchronize(stream));
  MEGASCOPE_CUDA_CHECK(cudaFree(acc));
  return std::isfinite(h);
}

template <typename T>
const char* dtype_name() {
  return sizeof(T) == 2 ? "bf16" : "fp32";
}

template <typename T>
void memory_bound(std::vector<Row>& rows, Arena& arena, std::int64_t N, std::int64_t C, int reps, cudaStream_t s) {
  const double e = sizeof(T), n = static_cast<double>(N * C);
  const std::string shape = std::to_string(N) + "x" + std::to_string(C);
  T* x = arena.alloc<T>(N * C);
  T* y = arena.alloc<T>(N * C);
  T* z = arena.alloc<T>(N * C);
  T* x2 = arena.alloc<T>(2 * N * C);
  T* dx2 = arena.alloc<T>(2 * N * C);
  T* w = arena.alloc<T>(C);
  float* stat1 = arena.alloc<float>(N);
  float* stat2 = arena.alloc<float>(N);
  float* dw = arena.alloc<float>(C);
  float* db = arena.alloc<float>(C);
  auto add = [&](const char* name, double bytes, const std::function<void()>& fn, const T* out, std::int64_t count,
                 const std::string& sh) {
    Row r{name, dtype_name<T>(), sh, bytes, 0.0, time_it(fn, reps, s), true};
    r.ok = finite(out, count, s);
    rows.push_back(r);
  };
  add(
      "gelu_forward", 2 * n * e, [&] { cu::gelu_forward(y, x, N * C, s); }, y, N * C, shape);
  add(
      "gelu_backward", 3 * n * e, [&] { cu::gelu_backward(z, x, y, N * C, s); }, z, N * C, shape);
  add(
      "swiglu_forward", 3 * n * e, [&] { cu::swiglu_forward(y, x2, N, C, s); }, y, N * C, shape + " (F)");
  add(
      "swiglu_backward", 5 * n * e, [&] { cu::swiglu_backward(dx2, x2, y, N, C, s); }, dx2, 2 * N * C, shape + " (F)");
  add(
      "residual_forward", 3 * n * e, [&] { cu::residual_forward(z, x, y, N * C, s); }, z, N * C, shape);
  add(
      "dropout_forward", 2 * n * e, [&] { cu::dropout_forward(y, x, N * C, 0.1f, 1, 0, s); }, y, N * C, shape);
  add(
      "bias_dropout_add_fwd", 3 * n * e, [&] { cu::bias_dropout_add_forward(z, x, w, y, N, C, 0.1f, 1, 0, s); }, z,
      N * C, shape);
  add(
      "bias_dropout_add_bwd", 3 * n * e, [&] { cu::bias_dropout_add_backward(z, db, y, N, C, 0.1f, 1, 0, s); }, z,
      N * C, shape);
  add(
      "layernorm_forward", 2 * n * e, [&] { cu::layernorm_forward(y, stat1, stat2, x, w, w, N, C, 1e-5f, s); }, y,
      N * C, shape);
  add(
      "layernorm_backward", 3 * n * e, [&] { cu::layernorm_backward(z, dw, db, y, x, w, stat1, stat2, N, C, s); }, z,
      N * C, shape);
  add(
      "rmsnorm_forward", 2 * n * e, [&] { cu::rmsnorm_forward(y, stat2, x, w, N, C, 1e-5f, s); }, y, N * C, shape);
  add(
      "rmsnorm_backward", 3 * n * e, [&] { cu::rmsnorm_backward(z, dw, y, x, w, stat2, N, C, s); }, z, N * C, shape);
  const std::int64_t D = 128, H = C / D;  // rope over (N, H, D): B = 1, S = N
  add(
      "rope_forward", 2 * n * e, [&] { cu::rope_forward(y, x, nullptr, 1, N, H, D, 10000.0f, s); }, y, N * C,
      shape + " (H,D)");
  // Cross-entropy over a vocab shard of C logits per row.
  std::vector<std::int32_t> tgt_host(static_cast<std::size_t>(N));
  for (std::int64_t i = 0; i < N; ++i)
    tgt_host[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 7919) % C);
  std::int32_t* tgt = arena.alloc<std::int32_t>(N, 0.0f, 0.0f);
  MEGASCOPE_CUDA_CHECK(
      cudaMemcpy(tgt, tgt_host.data(), tgt_host.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
  float* dloss = arena.alloc<float>(N, 0.0f, 1.0f);
  add(
      "xent_local_max", n * e, [&] { cu::cross_entropy_local_max(stat1, x, N, C, s); }, x, N * C, shape + " (V)");
  add(
      "xent_local_sumexp", n * e, [&] { cu::cross_entropy_local_sumexp(stat2, x, stat1, N, C, s); }, x, N * C,
      shape + " (V)");
  add(
      "xent_backward", 2 * n * e, [&] { cu::cross_entropy_backward(y, x, stat1, stat2, tgt, dloss, N, C, 0, s); }, y,
      N * C, shape + " (V)");
  // AdamW over N*C parameters: fp32 params, m, v read and written, grads read.
  float* p = arena.alloc<float>(N * C);
  float* m = arena.alloc<float>(N * C, 0.0f, 0.0f);
  float* v = arena.alloc<float>(N * C, 0.0f, 0.0f);
  Row r{"adamw_update",
        dtype_name<T>(),
        std::to_string(N * C) + " params",
        n * (3 * 2 * 4 + e),
        0.0,
        time_it([&] { cu::adamw_update(p, x, m, v, N * C, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f, s); }, reps, s)};
  r.ok = finite(p, N * C, s);
  rows.push_back(r);
}

template <typename T>
void attention(std::vector<Row>& rows, Arena& arena, std::int64_t B, std::int64_t Tn, std::int64_t Hq, std::int64_t Hkv,
               std::int64_t D, int reps, cudaStream_t s) {
  T* q = arena.alloc<T>(B * Tn * Hq * D);
  T* k = arena.alloc<T>(B * Tn * Hkv * D);
  T* v = arena.alloc<T>(B * Tn * Hkv * D);
  T* o = arena.alloc<T>(B * Tn * Hq * D);
  T* dq = arena.alloc<T>(B * Tn * Hq * D);
  T* dk = arena.alloc<T>(B * Tn * Hkv * D);
  T* dv = arena.alloc<T>(B * Tn * Hkv * D);
  float* lse = arena.alloc<float>(B * Hq * Tn);
  const double fwd = 4.0 * B * Hq * static_cast<double>(Tn) * Tn * D / 2.0;  // causal
  const std::string shape = "B" + std::to_string(B) + " T" + std::to_string(Tn) + " H" + std::to_string(Hq) + "/" +
                            std::to_string(Hkv) + " D" + std::to_string(D);
  Row f{"attention_forward",
        dtype_name<T>(),
        shape,
        0.0,
        fwd,
        time_it(
            [&] {
              cu::attention_forward(o, lse, q, k, v, nullptr, nullptr, B, Tn, Tn, Hq, Hkv, D, true, std::nullopt, s);
            },
            reps, s)};
  f.ok = finite(o, B * Tn * Hq * D, s);
  rows.push_back(f);
  Row b{"attention_backward",
        dtype_name<T>(),
        shape,
        0.0,
        2.5 * fwd,
        time_it(
            [&] {
              cu::attention_backward(dq, dk, dv, o, q, k, v, o, lse, nullptr, nullptr, B, Tn, Tn, Hq, Hkv, D, true,
                                     std::nullopt, s);
            },
            reps, s)};
  b.ok = finite(dq, B * Tn * Hq * D, s) && finite(dk, B * Tn * Hkv * D, s);
  rows.push_back(b);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  const char* json = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--json FILE]\n", argv[0]);
      return 2;
    }
  }
  if (!cu::device_available()) {
    std::printf("skipped: no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop{};
  MEGASCOPE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t s = nullptr;
  MEGASCOPE_CUDA_CHECK(cudaStreamCreate(&s));
  const int reps = quick ? 3 : 20;

  // Copy bandwidth: the roofline of the memory-bound kernels.
  const std::size_t copy_bytes = std::size_t{1} << (quick ? 26 : 29);
  void *a = nullptr, *b = nullptr;
  MEGASCOPE_CUDA_CHECK(cudaMalloc(&a, copy_bytes));
  MEGASCOPE_CUDA_CHECK(cudaMalloc(&b, copy_bytes));
  const double copy_s =
      time_it([&] { MEGASCOPE_CUDA_CHECK(cudaMemcpyAsync(b, a, copy_bytes, cudaMemcpyDeviceToDevice, s)); }, reps, s);
  MEGASCOPE_CUDA_CHECK(cudaFree(a));
  MEGASCOPE_CUDA_CHECK(cudaFree(b));
  const double copy_GBps = 2.0 * static_cast<double>(copy_bytes) / copy_s / 1e9;

  std::vector<Row> rows;
  {
    Arena arena;
    const std::int64_t N = quick ? 2048 : 16384, C = quick ? 1024 : 4096;
    memory_bound<bf16>(rows, arena, N, C, reps, s);
    memory_bound<float>(rows, arena, N, C, reps, s);
  }
  {
    Arena arena;
    const std::int64_t B = quick ? 1 : 4, Tn = quick ? 512 : 2048;
    attention<bf16>(rows, arena, B, Tn, 16, 4, 128, quick ? 1 : 3, s);
  }

  std::printf("# kernels_bench on %s; copy bandwidth %.1f GB/s (device-to-device, %zu MiB)\n", prop.name, copy_GBps,
              copy_bytes >> 20);
  std::printf("%-22s %-5s %-26s %12s %10s %9s %7s %9s %3s\n", "kernel", "dtype", "shape", "bytes", "time", "bandwidth",
              "%copy", "rate", "ok");
  std::printf("%-22s %-5s %-26s %12s %10s %9s %7s %9s %3s\n", "", "", "", "MB", "us", "GB/s", "%", "TFLOP/s", "");
  for (const Row& r : rows) {
    const double GBps = r.bytes / r.seconds / 1e9;
    if (r.flops > 0.0) {
      std::printf("%-22s %-5s %-26s %12s %10.1f %9s %7s %9.2f %3s\n", r.kernel.c_str(), r.dtype.c_str(),
                  r.shape.c_str(), "-", r.seconds * 1e6, "-", "-", r.flops / r.seconds / 1e12, r.ok ? "yes" : "NO");
    } else {
      std::printf("%-22s %-5s %-26s %12.1f %10.1f %9.1f %7.1f %9s %3s\n", r.kernel.c_str(), r.dtype.c_str(),
                  r.shape.c_str(), r.bytes / 1e6, r.seconds * 1e6, GBps, 100.0 * GBps / copy_GBps, "-",
                  r.ok ? "yes" : "NO");
    }
  }
  if (json != nullptr) {
    std::FILE* f = std::fopen(json, "w");
    if (f == nullptr) {
      std::fprintf(stderr, "cannot write %s\n", json);
      return 1;
    }
    std::fprintf(f, "{\"device\": \"%s\", \"copy_GBps\": %.3f, \"rows\": [\n", prop.name, copy_GBps);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::fprintf(f,
                   "  {\"kernel\": \"%s\", \"dtype\": \"%s\", \"shape\": \"%s\", \"bytes\": %.0f, \"flops\": %.0f, "
                   "\"seconds\": %.9g, \"GBps\": %.3f, \"TFLOPps\": %.4f, \"ok\": %s}%s\n",
                   r.kernel.c_str(), r.dtype.c_str(), r.shape.c_str(), r.bytes, r.flops, r.seconds,
                   r.bytes / r.seconds / 1e9, r.flops / r.seconds / 1e12, r.ok ? "true" : "false",
                   i + 1 < rows.size() ? "," : "");
    }
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  MEGASCOPE_CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
}
