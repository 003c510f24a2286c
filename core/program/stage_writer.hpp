// StageWriter: appends ops, kernels and dependencies to one StageProgram.
// Internal to the builder (builder.cpp, layer_ops.cpp).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/program/program.hpp"
#include "core/setup.hpp"

namespace megascope::detail {

// Gradient accumulation outside the GEMMs, in bytes per parameter. A weight
// gradient is written in the weights' dtype (at least 16 bits); Megatron-LM's
// DDP hook adds it to the main gradient (param.main_grad.add_(param.grad)):
// read it, read and write the main gradient in its dtype. fp32 main
// gradients (the default): 2 + 8 = 10 bytes; fp16 ones (--fp16 without
// --accumulate-allreduce-grads-in-fp32): 6.
inline double grad_write_bytes(const Setup& s) { return std::max(2.0, bytes_of(s.training.params_dtype)); }
inline double grad_add_bytes(const Setup& s) { return grad_write_bytes(s) + 2.0 * bytes_of(s.training.grad_dtype); }

struct OpContext {
  Phase phase = Phase::forward;
  std::optional<std::int32_t> layer;
  std::optional<std::int32_t> microbatch;   // absent for gradient/parameter sync and the optimizer
  std::optional<std::int32_t> chunk;
  bool host_paced = false;                  // compute ops: Op::host_paced
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

// The ops one call of an emitter appended, for appending the same ops again
// in another context (StageWriter::replay): every op as recorded (kernel
// ranges are the stage's, so a template is only replayed into the stage that
// recorded it), and per op its dependencies, as offsets from the first op or
// kInput (the call's input dependency).
struct OpTemplate {
  static constexpr std::uint32_t kInput = 0xffffffffu;
  std::vector<Op> ops;
  std::vector<std::uint32_t> deps;              // all ops' dependencies, in order (ops[k].dep_count each)
  std::optional<std::uint32_t> last_compute;    // offset of its last compute op
  std::uint32_t result = 0;                     // offset of the op the call returned
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
                           double bytes, Deps deps = {}, CommSpan span = CommSpan::whole);
  std::uint32_t p2p(OpKind kind, OpLabel label, const OpContext& ctx, int peer_stage, std::uint64_t tag, double bytes,
                    Deps deps = {});
  void add_dep(std::uint32_t op, std::uint32_t dep);
  // The ops [first, size()) as a template returning `result`, if every one of
  // them carries the context `ctx` and depends only on ops among them or on
  // `input`; nothing otherwise.
  [[nodiscard]] std::optional<OpTemplate> record(std::uint32_t first, const OpContext& ctx,
                                                 std::optional<std::uint32_t> input, std::uint32_t result) const;
  // Appends the template's ops with the context `ctx` and the input
  // dependency `input` (present if the recorded call had one); returns the
  // id of its result op. The same ops, deps and kernels as the recorded call
  // would append with these arguments.
  std::uint32_t replay(const OpTemplate& t, const OpContext& ctx, std::optional<std::uint32_t> input);
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
  std::vector<Kernel> marked_;   // a backward op's kernels with Kernel::backward set on its memory kernels
};

// DualPipe's overlapped forward and backward of two micro-batches (a paired
// F&B unit, core/schedule/schedule.hpp): the ops [begin, mid) of the forward
// and [mid, end) of the backward (with its paired W), interleaved so that
// each one's communication runs while the other computes, as DualPipe
// arranges the two chunks by hand (DeepSeek-V3 report, Figure 4: the
// forward's attention beside the backward's combine, its dispatch beside the
// backward's MLP, and so on). Each chain keeps its own order and starts with
// the forward; the chain being written hands over when its next compute op
// would wait for a collective or transfer it posted since it took over (the
// compute stream runs in program order, so writing it there would stall
// both), and takes over again when the other one reaches the same point.
// Without communication the forward is written whole, then the backward.
struct FbUnit {
  std::uint32_t begin = 0, mid = 0, end = 0;
};
// Applies every unit's order to `sp` (units ascending, disjoint): ops move
// within their unit, every dependency is renumbered. Returns the new index
// of each old op.
std::vector<std::uint32_t> interleave_fb(StageProgram& sp, std::span<const FbUnit> units);

// Kernel constructors.
Kernel gemm(std::int64_t m, std::int64_t n, std::int64_t k, Precision p);
Kernel memory(MemoryOp op, double bytes);
Kernel attention(KernelKind kind, const AttentionShape& a);
double kernel_flops(const Kernel& k);
// FP8 training: appends the quantisation of `elements` 16-bit values for an
// FP8 GEMM (kFp8CastBytesPerElement, or the current-scaling figure with the
// tensorwise recipe) to `k`; nothing in BF16.
void push_fp8_cast(std::vector<Kernel>& k, const Setup& s, double elements);

// Emits one transformer layer's forward (or recompute), backward-input and
// backward-weight ops (layer_ops.cpp). `input_dep` is the op the layer's first
// compute waits for (a receive or the previous layer); returns the last op.
//
// The ops of a call depend only on the pass, on whether the layer is an MoE
// layer, on `selective` (the plan's selective recomputation applies) and on whether there is an input dependency (the
// shapes are the same for every layer); the context (phase, layer,
// micro-batch, chunk) is copied into every op. So each distinct call is
// emitted once per stage and replayed afterwards (StageWriter::replay).
class LayerEmitter {
 public:
  LayerEmitter(const Setup& setup, StageWriter& writer, const std::vector<MicrobatchLoad>* loads = nullptr)
      : setup_(setup), w(writer), loads_(loads) {}
  std::uint32_t forward(int layer, const OpContext& ctx, std::optional<std::uint32_t> input_dep);
  std::uint32_t backward_input(int layer, const OpContext& ctx, std::optional<std::uint32_t> input_dep,
                               bool selective);
  std::uint32_t backward_weight(int layer, const OpContext& ctx, std::optional<std::uint32_t> input_dep);
  // The Setup the ops of ctx's micro-batch are built from: the builder's, or
  // with a load of tokens of its own (MicrobatchLoad::tokens), a copy at that
  // sequence length, kept while the emitter lives.
  const Setup& setup_for(const OpContext& ctx);

 private:
  enum class Pass : std::uint8_t { forward, backward_input, backward_weight };
  struct Memo {
    bool tried = false;
    std::optional<OpTemplate> ops;   // absent: the call could not be recorded, it is emitted every time
  };
  template <class Emit>
  std::uint32_t memo(Pass pass, int layer, bool flag, const OpContext& ctx, std::optional<std::uint32_t> input_dep,
                     Emit emit);
  std::uint32_t emit_forward(int layer, const OpContext& ctx, std::optional<std::uint32_t> input_dep);
  std::uint32_t emit_backward_input(int layer, const OpContext& ctx, std::optional<std::uint32_t> input_dep,
                                    bool selective);
  std::uint32_t emit_backward_weight(int layer, const OpContext& ctx, std::optional<std::uint32_t> input_dep);
  // A MoE layer's block after its norm's residual add: router, permutations,
  // dispatch, experts, combine; `recompute`: as the moe recompute module runs
  // it again in backward (without the bias-dropout-adds and the norm, which
  // are outside the checkpoint).
  std::uint32_t emit_moe_forward(const OpContext& ctx, std::optional<std::uint32_t> dep, bool recompute);

  // The load of the micro-batch `ctx` belongs to (variable-length training), or null.
  [[nodiscard]] const MicrobatchLoad* load_of(const OpContext& ctx) const;

  const Setup& setup_;
  std::map<std::int64_t, Setup> mb_setups_;   // by sequence length: the micro-batches' own (setup_for)
  StageWriter& w;
  const std::vector<MicrobatchLoad>* loads_ = nullptr;   // per micro-batch; with it every call is emitted (no memo)
  std::array<Memo, 48> memo_{};   // by (pass, sliding-window layer, MoE layer, flag, has input)
};

}  // namespace megascope::detail
