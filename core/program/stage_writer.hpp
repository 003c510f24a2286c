// StageWriter: appends ops, kernels and dependencies to one StageProgram.
// Internal to the builder (builder.cpp, layer_ops.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/program/program.hpp"
#include "core/setup.hpp"

namespace megascope::detail {

struct OpContext {
  Phase phase = Phase::forward;
  std::optional<std::int32_t> layer;
  std::optional<std::int32_t> microbatch;   // absent for gradient/parameter sync and the optimizer
  std::optional<std::int32_t> chunk;
};

// Up to four ops an op waits for; built from {a, b} or from an optional.
struct Deps {
  std::array<std::uint32_t, 4> ids{};
  std::uint8_t count = 0;
  Deps() = default;
  Deps(std::initializer_list<std::uint32_t> l) {
    for (std::uint32_t x : l) push(x);
  }
  Deps(std::optional<std::uint32_t> o) {  // NOLINT: implicit on purpose
    if (o) push(*o);
  }
  void push(std::uint32_t x) {
    MEGASCOPE_CHECK(count < ids.size(), "too many dependencies for one op");
    ids[count++] = x;
  }
};

class StageWriter {
 public:
  explicit StageWriter(StageProgram& out) : out_(out) {}

  // A compute op made of `kernels`, depending on `deps` (besides stream order).
  // Ops with the same kernels share one range of the stage's kernel list
  // (every layer of every micro-batch repeats a handful of kernel lists).
  std::uint32_t compute(OpLabel label, const OpContext& ctx, std::span<const Kernel> kernels,
                        Deps deps = {});
  std::uint32_t compute(OpLabel label, const OpContext& ctx, std::initializer_list<Kernel> kernels,
                        Deps deps = {}) {
    return compute(label, ctx, std::span<const Kernel>(kernels.begin(), kernels.size()), deps);
  }
  // A collective of `bytes` per rank on `stream` over `group`.
  std::uint32_t collective(OpKind kind, Stream stream, CommGroup group, OpLabel label, const OpContext& ctx,
                           double bytes, Deps deps = {});
  std::uint32_t p2p(OpKind kind, OpLabel label, const OpContext& ctx, int peer_stage, std::uint64_t tag, double bytes,
                    Deps deps = {});
  void add_dep(std::uint32_t op, std::uint32_t dep);
  [[nodiscard]] std::uint32_t size() const { return static_cast<std::uint32_t>(out_.ops.size()); }
  [[nodiscard]] std::optional<std::uint32_t> last_compute() const { return last_compute_; }
  StageProgram& program() { return out_; }

 private:
  std::uint32_t push(Op op, const Deps& deps);
  struct KernelRange {
    std::uint32_t begin = 0, count = 0;
    double flops = 0;
  };
  StageProgram& out_;
  std::optional<std::uint32_t> last_compute_;
  std::unordered_map<std::uint64_t, KernelRange> ranges_;   // by hash of the kernel list
};

// Kernel constructors.
Kernel gemm(std::int64_t m, std::int64_t n, std::int64_t k, Precision p);
Kernel memory(MemoryOp op, double bytes);
Kernel attention(KernelKind kind, const AttentionShape& a);
double kernel_flops(const Kernel& k);

// Emits one transformer layer's forward (or recompute), backward-input and
// backward-weight ops (layer_ops.cpp). `input_dep` is the op the layer's first
// compute waits for (a receive or the previous layer); returns the last op.
struct LayerEmitter {
  const Setup& s;
  StageWriter& w;
  std::uint32_t forward(int layer, const OpContext& ctx, std::optional<std::uint32_t> input_dep);
  std::uint32_t backward_input(int layer, const OpContext& ctx, std::optional<std::uint32_t> input_dep,
                               bool recomputed_core);
  std::uint32_t backward_weight(int layer, const OpContext& ctx, std::optional<std::uint32_t> input_dep);
};

}  // namespace megascope::detail
