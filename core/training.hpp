// TrainingSpec: what one iteration processes and in which number formats,
// plus the runtime memory overheads the accounting adds on top of tensors.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "core/result.hpp"
#include "core/varlen.hpp"

namespace megascope {

enum class Precision { bf16, fp8 };          // GEMM precision of the run
// How FP8 tensors are scaled (Megatron-LM's --fp8-recipe): delayed scaling
// from an amax history (the default), tensorwise current scaling (each
// tensor's amax measured before it is cast), blockwise (1x128 and 128x128
// tiles, Hopper) or MXFP8 (32-element blocks, Blackwell). Only the
// quantisation kernels' traffic depends on it (docs/simulator.md).
enum class Fp8Recipe { delayed, tensorwise, blockwise, mxfp8 };
enum class Dtype { fp32, bf16, fp16, fp8 };

// Memory the runtime takes beyond the model's tensors. Stated assumptions,
// each configurable; see docs/accounting.md for where the defaults come from.
struct RuntimeOverheads {
  double cuda_context_bytes = 0.5 * 1024 * 1024 * 1024;      // CUDA context + cuBLAS workspaces
  double nccl_bytes_per_group = 0.25 * 1024 * 1024 * 1024;   // buffers per communicator of size > 1
  double fragmentation_fraction = 0.05;                      // allocator slack on activations + grads
};

// Megatron-LM's precision-aware optimizer (--use-precision-aware-optimizer:
// TransformerEngine's FusedAdam keeps the master weights and Adam's moments
// itself, in the dtypes below, and reads the main gradients as they are).
// Off: fp32 master weights and moments, and an fp32 copy of non-fp32 main
// gradients. Megatron-LM allows it with Adam and the distributed optimizer only.
struct OptimizerPrecision {
  bool enabled = false;
  Dtype main_params = Dtype::fp32;     // --main-params-dtype: fp32 or fp16
  Dtype exp_avg = Dtype::fp32;         // --exp-avg-dtype: fp32, fp16, bf16 or fp8
  Dtype exp_avg_sq = Dtype::fp32;      // --exp-avg-sq-dtype
  // Megatron-Core's default (TransformerEngine >= 2.1): with bf16 weights and
  // fp32 master weights, only the 16 bits the bf16 weight lacks are stored.
  bool store_param_remainders = true;
};

// Variable-length training (docs/varlen.md): the sequences of a global
// batch have lengths drawn from `lengths` and are either padded to the
// sequence length, one per micro-batch slot (pad: every micro-batch costs what
// a full-length one does, only the tokens counted differ), or packed (pack:
// Megatron-LM's THD packing, --sequence-packing-scheduler dp_balanced, up to
// seq_length tokens per micro-batch, attention causal within each document).
// The simulator samples `steps` global batches from `seed`.
enum class Packing : std::uint8_t { pad, pack };
struct VarlenSpec {
  LengthDistribution lengths;
  Packing packing = Packing::pack;
  std::uint64_t seed = 1;
  int steps = 8;
};

struct TrainingSpec {
  std::int64_t global_batch_size = 0;        // B, sequences per iteration
  std::optional<std::int64_t> seq_length;    // s; absent: the model's seq_length
  Precision precision = Precision::bf16;
  Fp8Recipe fp8_recipe = Fp8Recipe::delayed; // with precision fp8
  Dtype params_dtype = Dtype::bf16;          // dtype of the model weights used by the GEMMs
  Dtype grad_dtype = Dtype::fp32;            // dtype of the main gradients (Megatron: fp32 by default)
  OptimizerPrecision optimizer_precision;
  RuntimeOverheads overheads;
  // Absent: every sequence has seq_length tokens. Shared, as Setups are
  // copied by the thousand in a search and a histogram may be long.
  std::shared_ptr<const VarlenSpec> varlen;
};

Result<TrainingSpec> validate_training(TrainingSpec t);

// The precision-aware optimizer keeps fp32 master weights of bf16 weights as
// 16-bit remainders (store_param_remainders).
bool master_as_remainders(const TrainingSpec& t);

[[nodiscard]] double bytes_of(Dtype d);
const char* to_string(Precision p);
const char* to_string(Packing p);
const char* to_string(LengthDistribution::Kind k);
std::optional<Packing> parse_packing(std::string_view s);
const char* to_string(Fp8Recipe r);
std::optional<Fp8Recipe> parse_fp8_recipe(std::string_view s);
const char* to_string(Dtype d);
// "fp32", "bf16", "fp16" or "fp8"; callers narrow it to what a field takes.
std::optional<Dtype> parse_dtype_name(std::string_view s);

}  // namespace megascope
