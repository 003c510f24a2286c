#include "core/training.hpp"

#include <fmt/format.h>

#include <string>
#include <utility>

#include "core/model.hpp"

namespace megascope {

Result<TrainingSpec> validate_training(TrainingSpec t) {
  if (t.global_batch_size < 1)
    return fail("training.global_batch_size", fmt::format("must be >= 1, found {}", t.global_batch_size));
  if (t.seq_length && *t.seq_length < 1)
    return fail("training.seq_length", fmt::format("must be >= 1, found {}", *t.seq_length));
  if (t.seq_length && *t.seq_length > kMaxModelLength)
    return fail("training.seq_length", fmt::format("must be at most {} (the bound on a sequence), found {}",
                                                   kMaxModelLength, *t.seq_length));
  if (t.params_dtype == Dtype::fp8)
    return fail("training.params_dtype", "fp8 is a GEMM precision, not a parameter dtype; use precision = \"fp8\"");
  if (t.grad_dtype == Dtype::fp8)
    return fail("training.grad_dtype", "gradients cannot be fp8; use fp32, bf16 or fp16");
  if (t.fp8_recipe != Fp8Recipe::delayed && t.precision != Precision::fp8)
    return fail("training.fp8_recipe", fmt::format("the {} recipe scales FP8 tensors; it needs precision = \"fp8\"",
                                                   to_string(t.fp8_recipe)));
  const OptimizerPrecision& op = t.optimizer_precision;
  if (!op.enabled) {
    const std::pair<const char*, Dtype> states[] = {
        {"main_params_dtype", op.main_params}, {"exp_avg_dtype", op.exp_avg}, {"exp_avg_sq_dtype", op.exp_avg_sq}};
    for (const auto& [key, d] : states)
      if (d != Dtype::fp32)
        return fail(std::string("training.") + key,
                    fmt::format("{} needs precision_aware_optimizer = true (Megatron-LM: --use-precision-aware-optimizer); "
                                "without it optimizer state is fp32",
                                to_string(d)));
  }
  if (!op.enabled && !op.store_param_remainders)
    return fail("training.store_param_remainders", "needs precision_aware_optimizer = true (it is the precision-aware "
                                                   "optimizer's storage of fp32 master weights)");
  if (op.main_params != Dtype::fp32 && op.main_params != Dtype::fp16)
    return fail("training.main_params_dtype", fmt::format("must be fp32 or fp16 (Megatron-LM's choices), found {}", to_string(op.main_params)));
  if (op.enabled && t.grad_dtype == Dtype::fp16)
    return fail("training.grad_dtype",
                "the precision-aware optimizer reads fp32 or bf16 main gradients (Megatron-LM's --main-grads-dtype), found fp16");
  const RuntimeOverheads& o = t.overheads;
  if (o.cuda_context_bytes < 0)
    return fail("training.overheads.cuda_context_GiB", "must be >= 0");
  if (o.nccl_bytes_per_group < 0)
    return fail("training.overheads.nccl_per_group_GiB", "must be >= 0");
  if (!(o.fragmentation_fraction >= 0 && o.fragmentation_fraction < 1))
    return fail("training.overheads.fragmentation", "must be in [0, 1)");
  return t;
}

std::optional<Dtype> parse_dtype_name(std::string_view s) {
  for (auto d : {Dtype::fp32, Dtype::bf16, Dtype::fp16, Dtype::fp8})
    if (s == to_string(d)) return d;
  return std::nullopt;
}

bool master_as_remainders(const TrainingSpec& t) {
  const OptimizerPrecision& op = t.optimizer_precision;
  return op.enabled && op.store_param_remainders && op.main_params == Dtype::fp32 && t.params_dtype == Dtype::bf16;
}

double bytes_of(Dtype d) {
  switch (d) {
    case Dtype::fp32: return 4;
    case Dtype::bf16: return 2;
    case Dtype::fp16: return 2;
    case Dtype::fp8: return 1;
  }
  return 0;
}

const char* to_string(Precision p) { return p == Precision::bf16 ? "bf16" : "fp8"; }
const char* to_string(Packing p) { return p == Packing::pad ? "pad" : "pack"; }
const char* to_string(LengthDistribution::Kind k) {
  switch (k) {
    case LengthDistribution::Kind::fixed: return "fixed";
    case LengthDistribution::Kind::lognormal: return "lognormal";
    case LengthDistribution::Kind::histogram: return "histogram";
  }
  return "?";
}
std::optional<Packing> parse_packing(std::string_view s) {
  if (s == "pad") return Packing::pad;
  if (s == "pack") return Packing::pack;
  return std::nullopt;
}
const char* to_string(Fp8Recipe r) {
  switch (r) {
    case Fp8Recipe::delayed: return "delayed";
    case Fp8Recipe::tensorwise: return "tensorwise";
    case Fp8Recipe::blockwise: return "blockwise";
    case Fp8Recipe::mxfp8: return "mxfp8";
  }
  return "?";
}
std::optional<Fp8Recipe> parse_fp8_recipe(std::string_view s) {
  for (auto r : {Fp8Recipe::delayed, Fp8Recipe::tensorwise, Fp8Recipe::blockwise, Fp8Recipe::mxfp8})
    if (s == to_string(r)) return r;
  return std::nullopt;
}
const char* to_string(Dtype d) {
  switch (d) {
    case Dtype::fp32: return "fp32";
    case Dtype::bf16: return "bf16";
    case Dtype::fp16: return "fp16";
    case Dtype::fp8: return "fp8";
  }
  return "?";
}

}  // namespace megascope
