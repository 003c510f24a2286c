// Megatron-LM launch lines <-> ModelSpec + TrainingSpec + PlanSpec.
//
// The flag tables follow megatron/training/arguments.py (argparse): each flag
// is a switch (store_true/store_false), takes one value, or takes a list
// (nargs='*' / nargs='+'). Defaults mirror validate_args(): ffn 4h (SwiGLU:
// int(8h/3/64)*64), kv_channels h/a, one query group with GQA, dropout 0.1,
// vocab padded to a multiple of 128 x TP, top-k 2, every layer MoE.
#include "config/megatron_args.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <initializer_list>
#include <limits>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace megascope {

namespace {

// ---------------------------------------------------------------------------
// Flag tables.

enum class Arity { none, one, any, some };  // switch, one value, nargs='*', nargs='+'
enum class Role { used, ignored, unmodelled };

struct FlagInfo {
  Arity arity = Arity::none;
  Role role = Role::used;
  std::string_view why;  // unmodelled: why Megascope cannot take it
};

struct Entry {
  std::string_view name;
  Arity arity;
};

// Flags that shape the model, the batch or the plan (read by interpret()).
constexpr Entry kUsed[] = {
    // model shape
    {"--num-layers", Arity::one},
    {"--encoder-num-layers", Arity::one},
    {"--hidden-size", Arity::one},
    {"--ffn-hidden-size", Arity::one},
    {"--num-attention-heads", Arity::one},
    {"--group-query-attention", Arity::none},
    {"--num-query-groups", Arity::one},
    {"--kv-channels", Arity::one},
    {"--swiglu", Arity::none},
    {"--normalization", Arity::one},
    {"--untie-embeddings-and-output-weights", Arity::none},
    {"--disable-bias-linear", Arity::none},
    {"--add-qkv-bias", Arity::none},
    {"--qk-layernorm", Arity::none},
    {"--seq-length", Arity::one},
    {"--encoder-seq-length", Arity::one},
    {"--max-position-embeddings", Arity::one},
    {"--position-embedding-type", Arity::one},
    {"--use-rotary-position-embeddings", Arity::none},
    {"--no-position-embedding", Arity::none},
    {"--vocab-size", Arity::one},
    {"--make-vocab-size-divisible-by", Arity::one},
    {"--hidden-dropout", Arity::one},
    {"--attention-dropout", Arity::one},
    {"--mtp-num-layers", Arity::one},
    // MoE
    {"--num-experts", Arity::one},
    {"--moe-router-topk", Arity::one},
    {"--moe-ffn-hidden-size", Arity::one},
    {"--moe-shared-expert-intermediate-size", Arity::one},
    {"--moe-layer-freq", Arity::one},
    // MLA
    {"--multi-latent-attention", Arity::none},
    {"--q-lora-rank", Arity::one},
    {"--kv-lora-rank", Arity::one},
    {"--qk-head-dim", Arity::one},
    {"--qk-pos-emb-head-dim", Arity::one},
    {"--v-head-dim", Arity::one},
    // batch and precision
    {"--micro-batch-size", Arity::one},
    {"--global-batch-size", Arity::one},
    {"--bf16", Arity::none},
    {"--fp16", Arity::none},
    {"--fp8-format", Arity::one},
    {"--fp8-param-gather", Arity::none},
    {"--grad-reduce-in-bf16", Arity::none},
    {"--accumulate-allreduce-grads-in-fp32", Arity::none},
    {"--main-grads-dtype", Arity::one},
    {"--main-params-dtype", Arity::one},
    {"--exp-avg-dtype", Arity::one},
    {"--exp-avg-sq-dtype", Arity::one},
    {"--optimizer", Arity::one},
    {"--num-distributed-optimizer-instances", Arity::one},
    {"--cpu-offloading-num-layers", Arity::one},
    // parallelism
    {"--tensor-model-parallel-size", Arity::one},
    {"--pipeline-model-parallel-size", Arity::one},
    {"--num-layers-per-virtual-pipeline-stage", Arity::one},
    {"--num-virtual-stages-per-pipeline-rank", Arity::one},
    {"--decoder-first-pipeline-num-layers", Arity::one},
    {"--decoder-last-pipeline-num-layers", Arity::one},
    {"--context-parallel-size", Arity::one},
    {"--cp-comm-type", Arity::some},
    {"--expert-model-parallel-size", Arity::one},
    {"--expert-tensor-parallel-size", Arity::one},
    {"--sequence-parallel", Arity::none},
    {"--use-distributed-optimizer", Arity::none},
    {"--recompute-activations", Arity::none},
    {"--recompute-granularity", Arity::one},
    {"--recompute-method", Arity::one},
    {"--recompute-num-layers", Arity::one},
    {"--recompute-modules", Arity::any},
    {"--checkpoint-activations", Arity::none},  // pre-2023 spelling of full recompute
    {"--checkpoint-num-layers", Arity::one},
    {"--activations-checkpoint-method", Arity::one},
    {"--activations-checkpoint-num-layers", Arity::one},
    {"--overlap-grad-reduce", Arity::none},
    {"--overlap-param-gather", Arity::none},
    {"--tp-comm-overlap", Arity::none},
    {"--use-flash-attn", Arity::none},
    {"--attention-backend", Arity::one},
};

// Accepted flags that do not change the model shape, the batch or the plan.
constexpr Entry kIgnored[] = {
    // tokenizer
    {"--tokenizer-type", Arity::one},
    {"--vocab-file", Arity::one},
    {"--merge-file", Arity::one},
    {"--tokenizer-model", Arity::one},
    {"--tokenizer-metadata", Arity::one},
    {"--tiktoken-pattern", Arity::one},
    {"--tiktoken-num-special-tokens", Arity::one},
    {"--tiktoken-special-tokens", Arity::some},
    {"--vocab-extra-ids", Arity::one},
    {"--legacy-tokenizer", Arity::none},
    {"--trust-remote-code", Arity::none},
    // learning rate and optimizer hyperparameters
    {"--lr", Arity::one},
    {"--min-lr", Arity::one},
    {"--lr-decay-style", Arity::one},
    {"--lr-wsd-decay-style", Arity::one},
    {"--lr-decay-iters", Arity::one},
    {"--lr-decay-samples", Arity::one},
    {"--lr-wsd-decay-iters", Arity::one},
    {"--lr-wsd-decay-samples", Arity::one},
    {"--lr-warmup-fraction", Arity::one},
    {"--lr-warmup-iters", Arity::one},
    {"--lr-warmup-samples", Arity::one},
    {"--lr-warmup-init", Arity::one},
    {"--warmup", Arity::one},
    {"--decoupled-lr", Arity::one},
    {"--decoupled-min-lr", Arity::one},
    {"--override-opt_param-scheduler", Arity::none},
    {"--override-opt-param-scheduler", Arity::none},
    {"--use-checkpoint-opt_param-scheduler", Arity::none},
    {"--use-checkpoint-opt-param-scheduler", Arity::none},
    {"--override-lr-scheduler", Arity::none},
    {"--use-checkpoint-lr-scheduler", Arity::none},
    {"--weight-decay", Arity::one},
    {"--start-weight-decay", Arity::one},
    {"--end-weight-decay", Arity::one},
    {"--weight-decay-incr-style", Arity::one},
    {"--clip-grad", Arity::one},
    {"--adam-beta1", Arity::one},
    {"--adam-beta2", Arity::one},
    {"--adam-eps", Arity::one},
    {"--sgd-momentum", Arity::one},
    {"--init-method-std", Arity::one},
    {"--embedding-init-method-std", Arity::one},
    {"--init-method-xavier-uniform", Arity::none},
    {"--data-parallel-random-init", Arity::none},
    {"--loss-scale", Arity::one},
    {"--initial-loss-scale", Arity::one},
    {"--min-loss-scale", Arity::one},
    {"--loss-scale-window", Arity::one},
    {"--hysteresis", Arity::one},
    {"--use-precision-aware-optimizer", Arity::none},
    // iterations and samples
    {"--train-iters", Arity::one},
    {"--train-samples", Arity::one},
    {"--exit-interval", Arity::one},
    {"--exit-duration-in-mins", Arity::one},
    {"--exit-signal-handler", Arity::none},
    {"--eval-iters", Arity::one},
    {"--eval-interval", Arity::one},
    {"--full-validation", Arity::none},
    {"--multiple-validation-sets", Arity::none},
    {"--skip-train", Arity::none},
    {"--test-mode", Arity::none},
    {"--rampup-batch-size", Arity::any},
    {"--decrease-batch-size-if-needed", Arity::none},
    {"--iterations-to-skip", Arity::some},
    // data
    {"--data-path", Arity::any},
    {"--train-data-path", Arity::any},
    {"--valid-data-path", Arity::any},
    {"--test-data-path", Arity::any},
    {"--data-args-path", Arity::one},
    {"--per-split-data-args-path", Arity::one},
    {"--split", Arity::one},
    {"--data-cache-path", Arity::one},
    {"--mock-data", Arity::none},
    {"--num-workers", Arity::one},
    {"--num-dataset-builder-threads", Arity::one},
    {"--dataloader-type", Arity::one},
    {"--object-storage-cache-path", Arity::one},
    {"--mid-level-dataset-surplus", Arity::one},
    {"--no-mmap-bin-files", Arity::none},
    {"--reset-position-ids", Arity::none},
    {"--reset-attention-mask", Arity::none},
    {"--eod-mask-loss", Arity::none},
    {"--no-create-attention-mask-in-dataloader", Arity::none},
    {"--allow-ambiguous-pad-tokens", Arity::none},
    {"--sample-rate", Arity::one},
    {"--mask-prob", Arity::one},
    {"--short-seq-prob", Arity::one},
    {"--retriever-seq-length", Arity::one},
    {"--sft", Arity::none},
    // checkpointing
    {"--save", Arity::one},
    {"--load", Arity::one},
    {"--save-interval", Arity::one},
    {"--persistent-save-interval", Arity::one},
    {"--save-retain-interval", Arity::one},
    {"--no-save-optim", Arity::none},
    {"--no-save-rng", Arity::none},
    {"--no-load-optim", Arity::none},
    {"--no-load-rng", Arity::none},
    {"--load-main-params-from-ckpt", Arity::none},
    {"--no-strict-fsdp-dtensor-load", Arity::none},
    {"--non-persistent-save-interval", Arity::one},
    {"--non-persistent-ckpt-type", Arity::one},
    {"--non-persistent-global-ckpt-dir", Arity::one},
    {"--non-persistent-local-ckpt-dir", Arity::one},
    {"--non-persistent-local-ckpt-algo", Arity::one},
    {"--finetune", Arity::none},
    {"--pretrained-checkpoint", Arity::one},
    {"--ckpt-step", Arity::one},
    {"--no-initialization", Arity::none},
    {"--use-checkpoint-args", Arity::none},
    {"--use-mp-args-from-checkpoint-args", Arity::none},
    {"--no-use-tokenizer-model-from-checkpoint-args", Arity::none},
    {"--exit-on-missing-checkpoint", Arity::none},
    {"--use-dist-ckpt", Arity::none},
    {"--use-persistent-ckpt-worker", Arity::none},
    {"--auto-detect-ckpt-format", Arity::none},
    {"--dist-ckpt-format", Arity::one},
    {"--ckpt-format", Arity::one},
    {"--ckpt-convert-format", Arity::one},
    {"--ckpt-convert-save", Arity::one},
    {"--ckpt-convert-update-legacy-dist-opt-format", Arity::none},
    {"--ckpt-fully-parallel-save", Arity::none},
    {"--no-ckpt-fully-parallel-save", Arity::none},
    {"--async-save", Arity::none},
    {"--ckpt-fully-parallel-load", Arity::none},
    {"--ckpt-assume-constant-structure", Arity::none},
    {"--dist-ckpt-strictness", Arity::one},
    {"--dist-ckpt-save-pre-mcore-014", Arity::none},
    {"--dist-ckpt-optim-fully-reshardable", Arity::none},
    {"--distrib-optim-fully-reshardable-mem-efficient", Arity::none},
    {"--adlr-autoresume", Arity::none},
    {"--adlr-autoresume-interval", Arity::one},
    // logging and profiling
    {"--log-interval", Arity::one},
    {"--log-params-norm", Arity::none},
    {"--log-num-zeros-in-grad", Arity::none},
    {"--log-throughput", Arity::none},
    {"--log-progress", Arity::none},
    {"--log-energy", Arity::none},
    {"--log-timers-to-tensorboard", Arity::none},
    {"--log-validation-ppl-to-tensorboard", Arity::none},
    {"--log-memory-to-tensorboard", Arity::none},
    {"--log-world-size-to-tensorboard", Arity::none},
    {"--log-batch-size-to-tensorboard", Arity::none},
    {"--log-loss-scale-to-tensorboard", Arity::none},
    {"--no-log-loss-scale-to-tensorboard", Arity::none},
    {"--no-log-learning-rate-to-tensorboard", Arity::none},
    {"--log-straggler", Arity::none},
    {"--disable-straggler-on-startup", Arity::none},
    {"--straggler-ctrlr-port", Arity::one},
    {"--straggler-minmax-count", Arity::one},
    {"--timing-log-level", Arity::one},
    {"--timing-log-option", Arity::one},
    {"--no-barrier-with-level-1-timing", Arity::none},
    {"--tensorboard-dir", Arity::one},
    {"--tensorboard-log-interval", Arity::one},
    {"--tensorboard-queue-size", Arity::one},
    {"--logging-level", Arity::one},
    {"--wandb-project", Arity::one},
    {"--wandb-entity", Arity::one},
    {"--wandb-exp-name", Arity::one},
    {"--wandb-save-dir", Arity::one},
    {"--no-one-logger", Arity::none},
    {"--one-logger-project", Arity::one},
    {"--one-logger-run-name", Arity::one},
    {"--one-logger-async", Arity::none},
    {"--app-tag-run-name", Arity::one},
    {"--app-tag-run-version", Arity::one},
    {"--config-logger-dir", Arity::one},
    {"--enable-ft-package", Arity::none},
    {"--calc-ft-timeouts", Arity::none},
    {"--run-workload-inspector-server", Arity::none},
    {"--profile", Arity::none},
    {"--use-pytorch-profiler", Arity::none},
    {"--profile-step-start", Arity::one},
    {"--profile-step-end", Arity::one},
    {"--profile-ranks", Arity::some},
    {"--record-memory-history", Arity::none},
    {"--memory-snapshot-path", Arity::one},
    {"--result-rejected-tracker-filename", Arity::one},
    {"--error-injection-rate", Arity::one},
    {"--error-injection-type", Arity::one},
    {"--rerun-mode", Arity::one},
    {"--check-for-spiky-loss", Arity::none},
    {"--check-for-large-grads", Arity::none},
    {"--no-check-for-nan-in-loss-and-grad", Arity::none},
    {"--check-weight-hash-across-dp-replicas-interval", Arity::one},
    // runtime, fusions and kernels (same tensors, same schedule)
    {"--seed", Arity::one},
    {"--distributed-backend", Arity::one},
    {"--distributed-timeout-minutes", Arity::one},
    {"--distributed-timeout-seconds-after-init", Arity::one},
    {"--local-rank", Arity::one},
    {"--lazy-mpu-init", Arity::one},
    {"--transformer-impl", Arity::one},
    {"--spec", Arity::any},
    {"--use-mcore-models", Arity::none},
    {"--use-legacy-models", Arity::none},
    {"--enable-experimental", Arity::none},
    {"--no-masked-softmax-fusion", Arity::none},
    {"--no-bias-gelu-fusion", Arity::none},
    {"--no-bias-swiglu-fusion", Arity::none},
    {"--no-bias-dropout-fusion", Arity::none},
    {"--no-rope-fusion", Arity::none},
    {"--cross-entropy-loss-fusion", Arity::none},
    {"--cross-entropy-fusion-impl", Arity::one},
    {"--no-persist-layer-norm", Arity::none},
    {"--no-gradient-accumulation-fusion", Arity::none},
    {"--no-async-tensor-model-parallel-allreduce", Arity::none},
    {"--use-te-activation-func", Arity::none},
    {"--use-fused-weighted-squared-relu", Arity::none},
    {"--no-clone-scatter-output-in-embedding", Arity::none},
    {"--manual-gc", Arity::none},
    {"--manual-gc-interval", Arity::one},
    {"--no-manual-gc-eval", Arity::none},
    {"--use-cpu-initialization", Arity::none},
    {"--init-model-with-meta-device", Arity::none},
    {"--deterministic-mode", Arity::none},
    {"--calculate-per-token-loss", Arity::none},
    {"--empty-unused-memory-level", Arity::one},
    {"--train-sync-interval", Arity::one},
    {"--disable-gloo-process-groups", Arity::none},
    {"--distribute-saved-activations", Arity::none},
    {"--distribute-checkpointed-activations", Arity::none},
    {"--enable-cuda-graph", Arity::none},
    {"--external-cuda-graph", Arity::none},
    {"--cuda-graph-impl", Arity::one},
    {"--cuda-graph-scope", Arity::one},
    {"--cuda-graph-warmup-steps", Arity::one},
    {"--te-rng-tracker", Arity::none},
    {"--onnx-safe", Arity::one},
    {"--DDP-impl", Arity::one},
    {"--use-contiguous-buffers-in-local-ddp", Arity::none},
    {"--no-contiguous-buffers-in-local-ddp", Arity::none},
    {"--use-torch-optimizer-for-cpu-offload", Arity::none},
    {"--overlap-cpu-optimizer-d2h-h2d", Arity::none},
    {"--no-pin-cpu-grads", Arity::none},
    {"--no-pin-cpu-params", Arity::none},
    // communication tuning
    {"--overlap-p2p-communication", Arity::none},
    {"--no-overlap-p2p-communication", Arity::none},
    {"--overlap-p2p-communication-warmup-flush", Arity::none},
    {"--microbatch-group-size-per-virtual-pipeline-stage", Arity::one},
    {"--defer-embedding-wgrad-compute", Arity::none},
    {"--wgrad-deferral-limit", Arity::one},
    {"--no-align-grad-reduce", Arity::none},
    {"--no-align-param-gather", Arity::none},
    {"--ddp-num-buckets", Arity::one},
    {"--ddp-bucket-size", Arity::one},
    {"--ddp-pad-buckets-for-high-nccl-busbw", Arity::none},
    {"--ddp-reduce-scatter-with-fp32-accumulation", Arity::none},
    {"--ddp-average-in-collective", Arity::none},
    {"--overlap-param-gather-with-optimizer-step", Arity::none},
    {"--scatter-gather-tensors-in-pipeline", Arity::none},
    {"--no-scatter-gather-tensors-in-pipeline", Arity::none},
    {"--use-ring-exchange-p2p", Arity::none},
    {"--use-nccl-ub", Arity::none},
    {"--disable-symmetric-registration", Arity::none},
    {"--use-sharp", Arity::none},
    {"--sharp-enabled-group", Arity::one},
    {"--no-gradient-reduce-div-fusion", Arity::none},
    {"--use-tp-pp-dp-mapping", Arity::none},
    {"--nccl-communicator-config-path", Arity::one},
    {"--high-priority-stream-groups", Arity::any},
    {"--pipeline-model-parallel-comm-backend", Arity::one},
    {"--replication", Arity::none},
    {"--replication-jump", Arity::one},
    {"--replication-factor", Arity::one},
    {"--tp-comm-overlap-cfg", Arity::one},
    {"--tp-comm-bootstrap-backend", Arity::one},
    {"--disable-tp-comm-overlap-ag", Arity::none},
    {"--disable-tp-comm-overlap-rs", Arity::none},
    {"--tp-comm-overlap-rs-dgrad", Arity::none},
    {"--disable-tp-comm-bulk-dgrad", Arity::none},
    {"--disable-tp-comm-bulk-wgrad", Arity::none},
    {"--disable-tp-comm-split-ag", Arity::none},
    {"--disable-tp-comm-split-rs", Arity::none},
    // mixed precision details
    {"--fp32-residual-connection", Arity::none},
    {"--apply-query-key-layer-scaling", Arity::none},
    {"--no-query-key-layer-scaling", Arity::none},
    {"--attention-softmax-in-fp32", Arity::none},
    {"--fp16-lm-cross-entropy", Arity::none},
    {"--disable-bf16-reduced-precision-matmul", Arity::none},
    {"--reuse-grad-buf-for-mxfp8-param-ag", Arity::none},
    {"--fp8-recipe", Arity::one},
    {"--fp8-margin", Arity::one},
    {"--fp8-interval", Arity::one},
    {"--fp8-amax-history-len", Arity::one},
    {"--fp8-amax-compute-algo", Arity::one},
    {"--no-fp8-wgrad", Arity::none},
    {"--first-last-layers-bf16", Arity::none},
    {"--num-layers-at-start-in-bf16", Arity::one},
    {"--num-layers-at-end-in-bf16", Arity::one},
    // model details that leave the tensor shapes alone
    {"--norm-epsilon", Arity::one},
    {"--apply-layernorm-1p", Arity::none},
    {"--apply-residual-connection-post-layernorm", Arity::none},
    {"--openai-gelu", Arity::none},
    {"--bert-no-binary-head", Arity::none},
    {"--rotary-base", Arity::one},
    {"--rotary-percent", Arity::one},
    {"--rotary-interleaved", Arity::none},
    {"--rotary-seq-len-interpolation-factor", Arity::one},
    {"--use-rope-scaling", Arity::none},
    {"--rope-scaling-factor", Arity::one},
    {"--rope-type", Arity::one},
    {"--no-rope-freq", Arity::one},
    {"--mrope-section", Arity::some},
    {"--relative-attention-num-buckets", Arity::one},
    {"--relative-attention-max-distance", Arity::one},
    {"--rotary-scaling-factor", Arity::one},
    {"--mscale", Arity::one},
    {"--mscale-all-dim", Arity::one},
    {"--cache-mla-latents", Arity::none},
    {"--qk-l2-norm", Arity::none},
    {"--softmax-type", Arity::one},
    {"--glu-linear-offset", Arity::one},
    {"--activation-func-clamp-value", Arity::one},
    {"--mtp-loss-scaling-factor", Arity::one},
    // MoE routing and dispatch
    {"--moe-router-load-balancing-type", Arity::some},
    {"--moe-aux-loss-coeff", Arity::some},
    {"--moe-z-loss-coeff", Arity::one},
    {"--moe-input-jitter-eps", Arity::one},
    {"--moe-router-dtype", Arity::one},
    {"--moe-router-score-function", Arity::one},
    {"--moe-router-num-groups", Arity::one},
    {"--moe-router-group-topk", Arity::one},
    {"--moe-router-topk-scaling-factor", Arity::one},
    {"--moe-router-bias-update-rate", Arity::one},
    {"--moe-router-pre-softmax", Arity::none},
    {"--moe-router-enable-expert-bias", Arity::none},
    {"--moe-router-fusion", Arity::none},
    {"--moe-router-force-load-balancing", Arity::none},
    {"--moe-router-padding-for-fp8", Arity::none},
    {"--moe-token-dispatcher-type", Arity::one},
    {"--moe-enable-deepep", Arity::none},
    {"--moe-deepep-num-sms", Arity::one},
    {"--moe-permute-fusion", Arity::none},
    {"--moe-grouped-gemm", Arity::none},
    {"--moe-use-legacy-grouped-gemm", Arity::none},
    {"--moe-shared-expert-overlap", Arity::none},
    {"--moe-layer-recompute", Arity::none},
    {"--moe-use-upcycling", Arity::none},
    {"--moe-upcycling-granularity", Arity::one},
    {"--moe-per-layer-logging", Arity::none},
    {"--moe-expert-capacity-factor", Arity::one},
    {"--moe-pad-expert-input-to-capacity", Arity::none},
    {"--moe-token-drop-policy", Arity::one},
    {"--moe-apply-probs-on-input", Arity::none},
    {"--moe-pad-experts-for-cuda-graph-inference", Arity::none},
    {"--overlap-moe-expert-parallel-comm", Arity::none},
    {"--delay-wgrad-compute", Arity::none},
};

struct Unmodelled {
  std::string_view name;
  Arity arity;
  std::string_view why;
};

// Megatron-LM flags whose effect Megascope does not model: importing them
// would silently give a wrong estimate, so they are errors.
constexpr Unmodelled kUnmodelled[] = {
    {"--pipeline-model-parallel-layout", Arity::one,
     "custom pipeline layouts are not modelled; use --decoder-first-pipeline-num-layers / "
     "--decoder-last-pipeline-num-layers"},
    {"--account-for-embedding-in-pipeline-split", Arity::none,
     "counting the embedding as a layer in the pipeline split is not modelled"},
    {"--account-for-loss-in-pipeline-split", Arity::none,
     "counting the loss as a layer in the pipeline split is not modelled"},
    {"--hierarchical-context-parallel-sizes", Arity::some, "hierarchical context parallelism is not modelled"},
    {"--use-megatron-fsdp", Arity::none, "Megatron FSDP is not modelled; use --use-distributed-optimizer"},
    {"--use-torch-fsdp2", Arity::none, "PyTorch FSDP2 is not modelled; use --use-distributed-optimizer"},
    {"--data-parallel-sharding-strategy", Arity::one, "FSDP sharding is not modelled"},
    {"--torch-fsdp2-no-reshard-after-forward", Arity::none, "PyTorch FSDP2 is not modelled"},
    {"--enable-full-sharding-in-hsdp", Arity::none, "FSDP sharding is not modelled"},
    {"--fsdp-double-buffer", Arity::none, "FSDP is not modelled"},
    {"--suggested-communication-unit-size", Arity::one, "FSDP is not modelled"},
    {"--keep-fp8-transpose-cache", Arity::none, "FSDP is not modelled"},
    {"--optimizer-cpu-offload", Arity::none, "optimizer CPU offload is not modelled"},
    {"--optimizer-offload-fraction", Arity::one, "optimizer CPU offload is not modelled"},
    {"--squared-relu", Arity::none, "only GeLU and SwiGLU MLPs are modelled"},
    {"--quick-geglu", Arity::none, "only GeLU and SwiGLU MLPs are modelled"},
    {"--window-size", Arity::one, "sliding-window attention is not modelled"},
    {"--window-attn-skip-freq", Arity::one, "sliding-window attention is not modelled"},
    {"--padded-vocab-size", Arity::one,
     "give the unpadded --vocab-size (and --make-vocab-size-divisible-by) instead"},
    {"--decoder-num-layers", Arity::one, "encoder-decoder models are not modelled"},
    {"--decoder-seq-length", Arity::one, "encoder-decoder models are not modelled"},
    {"--heterogeneous-layers-config-path", Arity::one, "heterogeneous layer configurations are not modelled"},
    {"--heterogeneous-layers-config-encoded-json", Arity::one,
     "heterogeneous layer configurations are not modelled"},
    {"--is-hybrid-model", Arity::none, "hybrid Mamba models are not modelled"},
    {"--hybrid-attention-ratio", Arity::one, "hybrid Mamba models are not modelled"},
    {"--hybrid-mlp-ratio", Arity::one, "hybrid Mamba models are not modelled"},
    {"--hybrid-override-pattern", Arity::one, "hybrid Mamba models are not modelled"},
    {"--retro-add-retriever", Arity::none, "Retro models are not modelled"},
    {"--fp4-format", Arity::one, "FP4 training is not modelled"},
    {"--fp4-param-gather", Arity::none, "FP4 training is not modelled"},
    {"--yaml-cfg", Arity::one, "arguments from a YAML file are not read; give the flags on the command line"},
    {"--model-parallel-size", Arity::one,
     "this flag is no longer valid in Megatron-LM; use --tensor-model-parallel-size"},
    {"--batch-size", Arity::one, "this flag is no longer valid in Megatron-LM; use --micro-batch-size"},
    {"--moe-extended-tp", Arity::none,
     "this flag is deprecated in Megatron-LM; use --expert-tensor-parallel-size"},
};

const std::unordered_map<std::string_view, FlagInfo>& flag_table() {
  static const std::unordered_map<std::string_view, FlagInfo> table = [] {
    std::unordered_map<std::string_view, FlagInfo> t;
    auto add = [&t](std::string_view name, FlagInfo info) {
      const bool inserted = t.emplace(name, info).second;
      MEGASCOPE_CHECK(inserted, fmt::format("Megatron flag {} is listed twice", name));
    };
    for (const Entry& e : kUsed) add(e.name, FlagInfo{e.arity, Role::used, {}});
    for (const Entry& e : kIgnored) add(e.name, FlagInfo{e.arity, Role::ignored, {}});
    for (const Unmodelled& e : kUnmodelled) add(e.name, FlagInfo{e.arity, Role::unmodelled, e.why});
    return t;
  }();
  return table;
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string suggestion_for(std::string_view name) {
  std::string dashed(name);
  std::replace(dashed.begin(), dashed.end(), '_', '-');
  const auto& table = flag_table();
  if (dashed != name && table.count(dashed) != 0) return fmt::format("; did you mean {}?", dashed);
  std::string_view best;
  std::size_t best_d = 3;  // suggest only close matches
  for (const auto& [known, info] : table) {
    if (info.role == Role::unmodelled) continue;
    const std::size_t d = edit_distance(name, known);
    if (d < best_d || (d == best_d && !best.empty() && known < best)) {
      best = known;
      best_d = d;
    }
  }
  if (!best.empty()) return fmt::format("; did you mean {}?", best);
  if (name.find('_') != std::string_view::npos)
    return " (a launcher flag? put the script name ending in .py before the Megatron-LM flags)";
  return "";
}

// ---------------------------------------------------------------------------
// Shell-style tokenizer.

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

Result<std::vector<std::string>> tokenize(std::string_view s) {
  std::vector<std::string> out;
  std::string cur;
  bool in_token = false;
  auto finish = [&] {
    if (in_token) out.push_back(cur);
    cur.clear();
    in_token = false;
  };
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (is_space(c)) {
      finish();
      continue;
    }
    if (c == '#' && !in_token) {  // comment to the end of the line
      while (i < s.size() && s[i] != '\n') ++i;
      continue;
    }
    if (c == '\\') {
      if (i + 1 < s.size() && s[i + 1] == '\n') {  // line continuation
        ++i;
        continue;
      }
      if (i + 2 < s.size() && s[i + 1] == '\r' && s[i + 2] == '\n') {
        i += 2;
        continue;
      }
      in_token = true;
      if (i + 1 < s.size()) cur += s[++i];
      else cur += '\\';
      continue;
    }
    if (c == '\'') {
      const std::size_t close = s.find('\'', i + 1);
      if (close == std::string_view::npos)
        return fail("megatron", "unterminated single quote in the command line");
      cur.append(s.substr(i + 1, close - i - 1));
      in_token = true;
      i = close;
      continue;
    }
    if (c == '"') {
      in_token = true;
      std::size_t j = i + 1;
      for (;; ++j) {
        if (j >= s.size()) return fail("megatron", "unterminated double quote in the command line");
        const char d = s[j];
        if (d == '"') break;
        if (d == '\\' && j + 1 < s.size()) {
          const char e = s[j + 1];
          if (e == '\n') {
            ++j;
            continue;
          }
          if (e == '"' || e == '\\' || e == '$' || e == '`') {
            cur += e;
            ++j;
            continue;
          }
        }
        cur += d;
      }
      i = j;
      continue;
    }
    cur += c;
    in_token = true;
  }
  finish();
  return out;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}
bool is_flag(std::string_view tok) { return tok.size() > 2 && starts_with(tok, "--"); }

// ---------------------------------------------------------------------------
// Parsed flags.

struct Args {
  std::map<std::string, std::vector<std::string>, std::less<>> values;  // last occurrence wins
  std::vector<std::string> ignored;                                      // in order of appearance

  [[nodiscard]] bool has(std::string_view name) const { return values.find(name) != values.end(); }
  [[nodiscard]] const std::string* value(std::string_view name) const {
    auto it = values.find(name);
    if (it == values.end() || it->second.empty()) return nullptr;
    return &it->second.back();
  }
  void note_ignored(std::string_view name) {
    if (std::find(ignored.begin(), ignored.end(), name) == ignored.end()) ignored.emplace_back(name);
  }
};

std::string field_of(std::string_view flag) { return "megatron." + std::string(flag); }

Result<Args> parse_flags(const std::vector<std::string>& tokens, std::size_t start) {
  Args args;
  const auto& table = flag_table();
  std::size_t i = start;
  while (i < tokens.size()) {
    const std::string& tok = tokens[i++];
    if (!is_flag(tok))
      return fail("megatron", fmt::format("unexpected argument '{}': expected a --flag", tok));
    std::string name = tok;
    std::optional<std::string> inline_value;
    if (const auto eq = tok.find('='); eq != std::string::npos) {
      name = tok.substr(0, eq);
      inline_value = tok.substr(eq + 1);
    }
    const auto it = table.find(name);
    if (it == table.end())
      return fail(field_of(name), fmt::format("unknown Megatron-LM flag {}{}", name, suggestion_for(name)));
    const FlagInfo& info = it->second;
    if (info.role == Role::unmodelled)
      return fail(field_of(name), fmt::format("{} is not supported: {}", name, info.why));

    std::vector<std::string> vals;
    switch (info.arity) {
      case Arity::none:
        if (inline_value)
          return fail(field_of(name), fmt::format("{} is a switch and takes no value, found '{}'", name, *inline_value));
        break;
      case Arity::one:
        if (inline_value) {
          vals.push_back(*inline_value);
        } else if (i < tokens.size() && !is_flag(tokens[i])) {
          vals.push_back(tokens[i++]);
        } else {
          return fail(field_of(name), fmt::format("{} needs a value", name));
        }
        break;
      case Arity::any:
      case Arity::some:
        if (inline_value) vals.push_back(*inline_value);
        while (i < tokens.size() && !is_flag(tokens[i])) vals.push_back(tokens[i++]);
        if (info.arity == Arity::some && vals.empty())
          return fail(field_of(name), fmt::format("{} needs at least one value", name));
        break;
    }
    args.values[name] = std::move(vals);
    if (info.role == Role::ignored) args.note_ignored(name);
  }
  return args;
}

// ---------------------------------------------------------------------------
// Reading values. The first error sticks; callers check `error` once after
// reading a group of values.

class Reader {
 public:
  explicit Reader(const Args& a) : args_(a) {}
  std::optional<Error> error;

  // An integer >= min, or nullopt when the flag is absent (or on error).
  std::optional<std::int64_t> integer(std::string_view flag, std::int64_t min = 1,
                                      std::int64_t max = std::numeric_limits<std::int64_t>::max()) {
    const std::string* v = args_.value(flag);
    if (!v) return std::nullopt;
    std::int64_t out = 0;
    const char* first = v->data();
    const char* last = v->data() + v->size();
    if (!v->empty() && *first == '+') ++first;  // Python's int() accepts a leading '+'
    const auto [ptr, ec] = std::from_chars(first, last, out);
    if (v->empty() || ec != std::errc() || ptr != last) {
      set(flag, fmt::format("{} expects an integer, found '{}'", flag, *v));
      return std::nullopt;
    }
    if (out < min) {
      set(flag, min == 1 ? fmt::format("{} must be a positive integer, found {}", flag, out)
                         : fmt::format("{} must be >= {}, found {}", flag, min, out));
      return std::nullopt;
    }
    if (out > max) {
      set(flag, fmt::format("{} must be <= {}, found {}", flag, max, out));
      return std::nullopt;
    }
    return out;
  }

  // An int-sized integer (layer counts, parallel sizes, ...).
  std::optional<int> count(std::string_view flag, int min = 1) {
    auto v = integer(flag, min, INT_MAX);
    if (!v) return std::nullopt;
    return static_cast<int>(*v);
  }

  std::optional<double> real(std::string_view flag) {
    const std::string* v = args_.value(flag);
    if (!v) return std::nullopt;
    double out = 0;
    const auto [ptr, ec] = std::from_chars(v->data(), v->data() + v->size(), out);
    if (v->empty() || ec != std::errc() || ptr != v->data() + v->size()) {
      set(flag, fmt::format("{} expects a number, found '{}'", flag, *v));
      return std::nullopt;
    }
    return out;
  }

  // One of `accepted` (a comma-separated list for the message), or nullopt.
  std::optional<std::string> choice(std::string_view flag, std::initializer_list<std::string_view> accepted) {
    const std::string* v = args_.value(flag);
    if (!v) return std::nullopt;
    for (std::string_view a : accepted)
      if (*v == a) return *v;
    std::string list;
    for (std::string_view a : accepted) {
      if (!list.empty()) list += ", ";
      list += a;
    }
    set(flag, fmt::format("{} must be one of {}, found '{}'", flag, list, *v));
    return std::nullopt;
  }

  void set(std::string_view flag, std::string message) {
    if (!error) error = Error{std::move(message), field_of(flag), std::nullopt};
  }

 private:
  const Args& args_;
};

// ---------------------------------------------------------------------------
// --moe-layer-freq: an int n (layer i is MoE when i % n == 0) or a Python list
// expression of 0/1 such as "([0]*3+[1]*58)" or "[1,0,1,0]".

struct PatternValue {
  bool is_list = false;
  std::int64_t number = 0;
  std::vector<std::int64_t> list;
};

class PatternParser {
 public:
  explicit PatternParser(std::string_view text) : s_(text) {}

  Result<PatternValue> parse() {
    auto v = expr();
    if (!v) return v;
    skip_spaces();
    if (pos_ != s_.size()) return error("unexpected '" + std::string(1, s_[pos_]) + "'");
    return v;
  }

 private:
  static constexpr std::size_t kMaxLength = 1'000'000;

  tl::unexpected<Error> error(const std::string& what) const {
    return fail("megatron.--moe-layer-freq",
                fmt::format("--moe-layer-freq: cannot read '{}' ({} at position {}); expected an integer or a "
                            "list expression such as ([0]*3+[1]*58)",
                            s_, what, pos_ + 1));
  }
  void skip_spaces() {
    while (pos_ < s_.size() && is_space(s_[pos_])) ++pos_;
  }
  bool eat(char c) {
    skip_spaces();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  Result<PatternValue> expr() {
    auto lhs = term();
    if (!lhs) return lhs;
    while (eat('+')) {
      auto rhs = term();
      if (!rhs) return rhs;
      if (lhs->is_list != rhs->is_list) return error("cannot add a list and an integer");
      if (lhs->is_list) {
        if (lhs->list.size() + rhs->list.size() > kMaxLength) return error("pattern too long");
        lhs->list.insert(lhs->list.end(), rhs->list.begin(), rhs->list.end());
      } else {
        lhs->number += rhs->number;
      }
    }
    return lhs;
  }

  Result<PatternValue> term() {
    auto lhs = factor();
    if (!lhs) return lhs;
    while (eat('*')) {
      auto rhs = factor();
      if (!rhs) return rhs;
      if (lhs->is_list && rhs->is_list) return error("cannot multiply two lists");
      if (!lhs->is_list && !rhs->is_list) {
        if (lhs->number != 0 && rhs->number > static_cast<std::int64_t>(kMaxLength) / std::max<std::int64_t>(lhs->number, 1))
          return error("number too large");
        lhs->number *= rhs->number;
        continue;
      }
      PatternValue& list = lhs->is_list ? *lhs : *rhs;
      const std::int64_t times = lhs->is_list ? rhs->number : lhs->number;
      if (times < 0) return error("negative repeat count");
      if (!list.list.empty() && static_cast<std::size_t>(times) > kMaxLength / list.list.size())
        return error("pattern too long");
      PatternValue out;
      out.is_list = true;
      for (std::int64_t k = 0; k < times; ++k) out.list.insert(out.list.end(), list.list.begin(), list.list.end());
      *lhs = std::move(out);
    }
    return lhs;
  }

  Result<PatternValue> factor() {
    skip_spaces();
    if (pos_ >= s_.size()) return error("unexpected end");
    const char c = s_[pos_];
    if (c == '(') {
      ++pos_;
      auto v = expr();
      if (!v) return v;
      if (!eat(')')) return error("missing ')'");
      return v;
    }
    if (c == '[') {
      ++pos_;
      PatternValue v;
      v.is_list = true;
      if (eat(']')) return v;
      for (;;) {
        auto n = number();
        if (!n) return n;
        v.list.push_back(n->number);
        if (eat(']')) break;
        if (!eat(',')) return error("expected ',' or ']'");
        if (eat(']')) break;  // trailing comma
      }
      return v;
    }
    return number();
  }

  Result<PatternValue> number() {
    skip_spaces();
    const std::size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    if (start == pos_) return error("expected a number");
    if (pos_ - start > 9) return error("number too large");
    PatternValue v;
    for (std::size_t k = start; k < pos_; ++k) v.number = v.number * 10 + (s_[k] - '0');
    return v;
  }

  std::string_view s_;
  std::size_t pos_ = 0;
};

Result<std::vector<bool>> moe_layer_pattern(const std::string* text, int num_layers) {
  std::vector<bool> layers(static_cast<std::size_t>(num_layers), true);
  if (!text) return layers;  // Megatron's default: every layer is MoE
  auto v = PatternParser(*text).parse();
  if (!v) return tl::unexpected(v.error());
  if (!v->is_list) {
    if (v->number < 1)
      return fail("megatron.--moe-layer-freq",
                  fmt::format("--moe-layer-freq must be a positive integer, found {}", v->number));
    for (int i = 0; i < num_layers; ++i) layers[static_cast<std::size_t>(i)] = i % v->number == 0;
    return layers;
  }
  if (v->list.size() != static_cast<std::size_t>(num_layers))
    return fail("megatron.--moe-layer-freq",
                fmt::format("--moe-layer-freq lists {} layers but --num-layers is {}", v->list.size(), num_layers));
  for (std::size_t i = 0; i < v->list.size(); ++i) {
    if (v->list[i] != 0 && v->list[i] != 1)
      return fail("megatron.--moe-layer-freq",
                  fmt::format("--moe-layer-freq entries must be 0 (dense) or 1 (MoE), found {} at layer {}",
                              v->list[i], i));
    layers[i] = v->list[i] == 1;
  }
  return layers;
}

// The shortest --moe-layer-freq for a pattern: omitted (""), an integer, or runs.
std::string moe_layer_freq_text(const std::vector<bool>& layers) {
  const int n = static_cast<int>(layers.size());
  for (int freq = 1; freq <= std::max(n, 1); ++freq) {
    bool match = true;
    for (int i = 0; i < n && match; ++i) match = layers[static_cast<std::size_t>(i)] == (i % freq == 0);
    if (match) return freq == 1 ? std::string() : std::to_string(freq);
  }
  std::string out = "(";
  std::size_t i = 0;
  while (i < layers.size()) {
    std::size_t j = i;
    while (j < layers.size() && layers[j] == layers[i]) ++j;
    if (out.size() > 1) out += '+';
    out += fmt::format("[{}]*{}", layers[i] ? 1 : 0, j - i);
    i = j;
  }
  out += ')';
  return out;
}

// ---------------------------------------------------------------------------
// Flags -> specs.

Result<MegatronLaunch> interpret(Args& args) {
  MegatronLaunch out;
  Reader rd(args);

  // Every numeric value first, so that a bad one is reported before anything
  // that depends on it.
  auto num_layers = rd.count("--num-layers");
  if (!args.has("--num-layers")) num_layers = rd.count("--encoder-num-layers");
  const auto hidden = rd.integer("--hidden-size");
  const auto ffn = rd.integer("--ffn-hidden-size");
  const auto heads = rd.count("--num-attention-heads");
  const auto groups = rd.count("--num-query-groups");
  const auto kv_channels = rd.integer("--kv-channels");
  auto seq = rd.integer("--seq-length");
  if (!args.has("--seq-length")) seq = rd.integer("--encoder-seq-length");
  const auto max_pos = rd.integer("--max-position-embeddings");
  const auto vocab = rd.integer("--vocab-size");
  const auto divisor = rd.count("--make-vocab-size-divisible-by");
  const auto hidden_dropout = rd.real("--hidden-dropout");
  const auto attention_dropout = rd.real("--attention-dropout");
  const auto mtp = rd.count("--mtp-num-layers", 0);
  const auto experts = rd.count("--num-experts", 0);
  const auto topk = rd.count("--moe-router-topk");
  const auto moe_ffn = rd.integer("--moe-ffn-hidden-size");
  const auto shared_ffn = rd.integer("--moe-shared-expert-intermediate-size");
  const auto q_lora = rd.integer("--q-lora-rank");
  const auto kv_lora = rd.integer("--kv-lora-rank");
  const auto qk_head = rd.integer("--qk-head-dim");
  const auto qk_rope = rd.integer("--qk-pos-emb-head-dim");
  const auto v_head = rd.integer("--v-head-dim");
  const auto mbs = rd.count("--micro-batch-size");
  const auto gbs = rd.integer("--global-batch-size");
  const auto tp = rd.count("--tensor-model-parallel-size");
  const auto pp = rd.count("--pipeline-model-parallel-size");
  const auto layers_per_vstage = rd.count("--num-layers-per-virtual-pipeline-stage");
  const auto vstages = rd.count("--num-virtual-stages-per-pipeline-rank");
  const auto first_layers = rd.count("--decoder-first-pipeline-num-layers");
  const auto last_layers = rd.count("--decoder-last-pipeline-num-layers");
  const auto cp = rd.count("--context-parallel-size");
  const auto ep = rd.count("--expert-model-parallel-size");
  const auto etp = rd.count("--expert-tensor-parallel-size");
  auto recompute_layers = rd.count("--recompute-num-layers");
  if (!recompute_layers) recompute_layers = rd.count("--activations-checkpoint-num-layers");
  if (!recompute_layers) recompute_layers = rd.count("--checkpoint-num-layers");
  const auto optimizer_instances = rd.count("--num-distributed-optimizer-instances");
  const auto offload_layers = rd.count("--cpu-offloading-num-layers", 0);

  const auto normalization = rd.choice("--normalization", {"LayerNorm", "RMSNorm"});
  const auto position = rd.choice("--position-embedding-type", {"learned_absolute", "rope", "none", "mrope", "relative"});
  const auto fp8 = rd.choice("--fp8-format", {"e4m3", "hybrid"});
  const auto granularity = rd.choice("--recompute-granularity", {"full", "selective"});
  auto method = rd.choice("--recompute-method", {"uniform", "block"});
  if (!method) method = rd.choice("--activations-checkpoint-method", {"uniform", "block"});
  const auto backend = rd.choice("--attention-backend", {"flash", "fused", "unfused", "local", "auto"});
  const auto optimizer = rd.choice("--optimizer", {"adam", "sgd", "muon", "dist_muon"});
  const auto main_grads = rd.choice("--main-grads-dtype", {"fp32", "bf16"});
  const auto main_params = rd.choice("--main-params-dtype", {"fp32", "fp16"});
  const auto exp_avg = rd.choice("--exp-avg-dtype", {"fp32", "fp16", "bf16", "fp8"});
  const auto exp_avg_sq = rd.choice("--exp-avg-sq-dtype", {"fp32", "fp16", "bf16", "fp8"});
  if (rd.error) return tl::unexpected(*rd.error);

  // Required flags.
  auto required = [&](bool present, std::string_view flag, std::string_view what) -> Result<void> {
    if (present) return {};
    return fail(field_of(flag), fmt::format("{} is required ({})", flag, what));
  };
  if (auto r = required(num_layers.has_value(), "--num-layers", "transformer layers"); !r) return tl::unexpected(r.error());
  if (auto r = required(hidden.has_value(), "--hidden-size", "hidden size"); !r) return tl::unexpected(r.error());
  if (auto r = required(heads.has_value(), "--num-attention-heads", "attention heads"); !r) return tl::unexpected(r.error());
  if (auto r = required(seq.has_value(), "--seq-length", "tokens per sequence"); !r) return tl::unexpected(r.error());
  if (auto r = required(mbs.has_value(), "--micro-batch-size", "sequences per micro-batch"); !r)
    return tl::unexpected(r.error());
  if (!gbs)
    return fail("megatron.--global-batch-size",
                "--global-batch-size is required: without it Megatron-LM uses micro-batch-size x data-parallel "
                "size, which depends on the device count");

  // Flags Megascope models only at their default.
  if (optimizer && *optimizer != "adam")
    return fail("megatron.--optimizer", fmt::format("--optimizer {} is not modelled; only adam is", *optimizer));
  if (optimizer) args.note_ignored("--optimizer");
  auto fp32_only = [](std::string_view flag, const std::optional<std::string>& v) -> Result<void> {
    if (v && *v != "fp32")
      return fail(field_of(flag), fmt::format("{} {} is not modelled: optimizer state is counted in fp32", flag, *v));
    return {};
  };
  if (auto r = fp32_only("--main-params-dtype", main_params); !r) return tl::unexpected(r.error());
  if (auto r = fp32_only("--exp-avg-dtype", exp_avg); !r) return tl::unexpected(r.error());
  if (auto r = fp32_only("--exp-avg-sq-dtype", exp_avg_sq); !r) return tl::unexpected(r.error());
  if (optimizer_instances && *optimizer_instances != 1)
    return fail("megatron.--num-distributed-optimizer-instances",
                "more than one distributed-optimizer instance is not modelled");
  if (offload_layers && *offload_layers != 0)
    return fail("megatron.--cpu-offloading-num-layers", "activation CPU offloading is not modelled");
  if (position && (*position == "mrope" || *position == "relative"))
    return fail("megatron.--position-embedding-type",
                fmt::format("--position-embedding-type {} is not modelled; use learned_absolute, rope or none",
                            *position));
  if (args.has("--num-layers-per-virtual-pipeline-stage") && args.has("--num-virtual-stages-per-pipeline-rank"))
    return fail("megatron.--num-layers-per-virtual-pipeline-stage",
                "give only one of --num-layers-per-virtual-pipeline-stage and "
                "--num-virtual-stages-per-pipeline-rank");
  if (max_pos && *max_pos < *seq)
    return fail("megatron.--max-position-embeddings",
                fmt::format("--max-position-embeddings ({}) must be >= --seq-length ({})", *max_pos, *seq));

  // ---- model
  ModelSpec m;
  m.name = "megatron-lm";
  m.num_layers = *num_layers;
  m.hidden_size = *hidden;
  m.num_attention_heads = *heads;
  const bool swiglu = args.has("--swiglu");
  m.activation = swiglu ? Activation::swiglu : Activation::gelu;
  // Megatron: int((4 * h * 2 / 3) / 64) * 64 for SwiGLU, else 4h.
  m.ffn_hidden_size = ffn ? *ffn : (swiglu ? (8 * m.hidden_size) / 192 * 64 : 4 * m.hidden_size);
  if (kv_channels) {
    m.kv_channels = *kv_channels;
  } else {
    if (m.hidden_size % m.num_attention_heads != 0)
      return fail("megatron.--kv-channels",
                  fmt::format("--hidden-size ({}) is not a multiple of --num-attention-heads ({}); give --kv-channels",
                              m.hidden_size, m.num_attention_heads));
    m.kv_channels = m.hidden_size / m.num_attention_heads;
  }
  if (args.has("--group-query-attention")) {
    m.num_query_groups = groups.value_or(1);
  } else {
    m.num_query_groups = m.num_attention_heads;
    if (groups) {
      out.warnings.push_back("--num-query-groups has no effect without --group-query-attention (Megatron-LM "
                             "ignores it); the model uses one KV head per attention head");
      args.note_ignored("--num-query-groups");
    }
  }
  m.norm = (normalization && *normalization == "RMSNorm") ? Norm::rmsnorm : Norm::layernorm;
  m.position_embedding = PositionEmbedding::learned;
  if (position && *position == "rope") m.position_embedding = PositionEmbedding::rope;
  if (position && *position == "none") m.position_embedding = PositionEmbedding::none;
  if (args.has("--use-rotary-position-embeddings")) m.position_embedding = PositionEmbedding::rope;
  if (args.has("--no-position-embedding") && m.position_embedding != PositionEmbedding::rope)
    m.position_embedding = PositionEmbedding::none;
  m.tied_embeddings = !args.has("--untie-embeddings-and-output-weights");
  m.add_bias_linear = !args.has("--disable-bias-linear");
  m.add_qkv_bias = args.has("--add-qkv-bias");
  m.qk_layernorm = args.has("--qk-layernorm");
  m.hidden_dropout = hidden_dropout.value_or(0.1);
  m.attention_dropout = attention_dropout.value_or(0.1);
  m.mtp_num_layers = mtp.value_or(0);
  m.make_vocab_size_divisible_by = divisor.value_or(128);
  m.seq_length = max_pos.value_or(*seq);

  if (vocab) {
    m.vocab_size = *vocab;
  } else {
    const std::string* tokenizer = args.value("--tokenizer-type");
    const bool gpt2 = (tokenizer && *tokenizer == "GPT2BPETokenizer") || (!tokenizer && args.has("--merge-file"));
    if (!gpt2)
      return fail("megatron.--vocab-size",
                  tokenizer ? fmt::format("--vocab-size is required: the vocabulary size of --tokenizer-type {} is "
                                          "not known without reading its files",
                                          *tokenizer)
                            : std::string("--vocab-size is required (the vocabulary size before padding)"));
    m.vocab_size = 50257;
    out.warnings.push_back(tokenizer ? "no --vocab-size: using 50257, the size of the GPT-2 BPE vocabulary "
                                       "(--tokenizer-type GPT2BPETokenizer)"
                                     : "no --vocab-size or --tokenizer-type: --merge-file implies the GPT-2 BPE "
                                       "tokenizer, so using its 50257 tokens");
  }

  static constexpr std::string_view kMoeFlags[] = {"--moe-router-topk", "--moe-ffn-hidden-size",
                                                   "--moe-shared-expert-intermediate-size", "--moe-layer-freq"};
  if (experts && *experts > 0) {
    MoeSpec e;
    e.num_experts = *experts;
    e.top_k = topk.value_or(2);
    e.expert_ffn_hidden = moe_ffn.value_or(m.ffn_hidden_size);
    e.shared_expert_ffn_hidden = shared_ffn.value_or(0);
    auto layers = moe_layer_pattern(args.value("--moe-layer-freq"), m.num_layers);
    if (!layers) return tl::unexpected(layers.error());
    e.moe_layers = std::move(*layers);
    m.moe = std::move(e);
  } else {
    for (std::string_view f : kMoeFlags)
      if (args.has(f)) args.note_ignored(f);
  }

  static constexpr std::string_view kMlaFlags[] = {"--q-lora-rank", "--kv-lora-rank", "--qk-head-dim",
                                                   "--qk-pos-emb-head-dim", "--v-head-dim"};
  if (args.has("--multi-latent-attention")) {
    MlaSpec a;  // Megatron's defaults: kv_lora_rank 32, qk 128, rope 64, v 128
    a.q_lora_rank = q_lora;
    a.kv_lora_rank = kv_lora.value_or(32);
    a.qk_head_dim = qk_head.value_or(128);
    a.qk_rope_head_dim = qk_rope.value_or(64);
    a.v_head_dim = v_head.value_or(128);
    m.mla = a;
  } else {
    for (std::string_view f : kMlaFlags)
      if (args.has(f)) args.note_ignored(f);
  }

  auto model = validate_model(m);
  if (!model) return tl::unexpected(model.error());
  out.model = std::move(*model);

  // ---- training
  TrainingSpec t;
  t.global_batch_size = *gbs;
  t.seq_length = *seq;
  const bool bf16 = args.has("--bf16");
  const bool fp16 = args.has("--fp16");
  if (bf16 && fp16) return fail("megatron.--fp16", "--fp16 and --bf16 cannot both be given");
  t.params_dtype = bf16 ? Dtype::bf16 : fp16 ? Dtype::fp16 : Dtype::fp32;
  if (!bf16 && !fp16)
    out.warnings.push_back("neither --bf16 nor --fp16: Megatron-LM keeps the weights in fp32 (params_dtype fp32)");
  t.precision = fp8 ? Precision::fp8 : Precision::bf16;
  // Megatron's gradient buffer: fp32 when accumulate_allreduce_grads_in_fp32
  // is set (forced on for bf16 unless --grad-reduce-in-bf16), else the
  // parameter dtype.
  if (bf16) {
    const bool bf16_grads = args.has("--grad-reduce-in-bf16") || (main_grads && *main_grads == "bf16");
    t.grad_dtype = bf16_grads ? Dtype::bf16 : Dtype::fp32;
  } else if (fp16) {
    t.grad_dtype = args.has("--accumulate-allreduce-grads-in-fp32") ? Dtype::fp32 : Dtype::fp16;
  } else {
    t.grad_dtype = Dtype::fp32;
  }
  if (args.has("--fp8-param-gather"))
    out.warnings.push_back("--fp8-param-gather: FP8 weight copies are not modelled; weights are counted at the "
                           "parameter dtype");
  auto training = validate_training(t);
  if (!training) return tl::unexpected(training.error());
  out.training = std::move(*training);

  // ---- plan
  PlanSpec p;
  p.tp = tp.value_or(1);
  p.pp = pp.value_or(1);
  p.cp = cp.value_or(1);
  p.ep = ep.value_or(1);
  p.etp = etp;
  p.micro_batch_size = *mbs;
  p.first_stage_layers = first_layers;
  p.last_stage_layers = last_layers;
  if (p.ep > 1 && !out.model.moe)
    return fail("megatron.--num-experts",
                fmt::format("--expert-model-parallel-size {} needs an MoE model: give --num-experts", p.ep));

  int vpp = 1;
  if (layers_per_vstage) {
    if (first_layers || last_layers)
      return fail("megatron.--num-layers-per-virtual-pipeline-stage",
                  "with --decoder-first/last-pipeline-num-layers, give the virtual stages with "
                  "--num-virtual-stages-per-pipeline-rank");
    if (m.num_layers % p.pp != 0)
      return fail("megatron.--num-layers-per-virtual-pipeline-stage",
                  fmt::format("--num-layers ({}) must be divisible by --pipeline-model-parallel-size ({}) to use "
                              "--num-layers-per-virtual-pipeline-stage",
                              m.num_layers, p.pp));
    const int per_stage = m.num_layers / p.pp;
    if (per_stage % *layers_per_vstage != 0)
      return fail("megatron.--num-layers-per-virtual-pipeline-stage",
                  fmt::format("the {} layers of a pipeline stage must be divisible by "
                              "--num-layers-per-virtual-pipeline-stage ({})",
                              per_stage, *layers_per_vstage));
    vpp = per_stage / *layers_per_vstage;
  } else if (vstages) {
    vpp = *vstages;
  }
  if (vpp > 1) {  // Megatron treats one virtual stage as no interleaving
    p.vpp = vpp;
    p.schedule = Schedule::interleaved;
  } else {
    p.schedule = Schedule::one_f_one_b;
  }

  if (const std::string* c = args.value("--cp-comm-type")) {
    const auto& all = args.values.at("--cp-comm-type");
    if (std::any_of(all.begin(), all.end(), [&](const std::string& x) { return x != *c; }))
      return fail("megatron.--cp-comm-type", "per-layer CP communication types are not modelled; give one type");
    if (*c == "p2p") p.cp_comm = CpCommType::p2p;
    else if (*c == "all_gather" || *c == "allgather") p.cp_comm = CpCommType::all_gather;
    else if (*c == "a2a" || *c == "a2a+p2p")
      return fail("megatron.--cp-comm-type", fmt::format("--cp-comm-type {} (all-to-all context parallelism) is not "
                                                         "modelled; use p2p or all_gather",
                                                         *c));
    else
      return fail("megatron.--cp-comm-type",
                  fmt::format("--cp-comm-type must be one of p2p, all_gather, a2a, a2a+p2p, found '{}'", *c));
  }

  p.sequence_parallel = args.has("--sequence-parallel");
  p.distributed_optimizer = args.has("--use-distributed-optimizer");
  p.overlap_grad_reduce = args.has("--overlap-grad-reduce");
  p.overlap_param_gather = args.has("--overlap-param-gather");
  p.tp_comm_overlap = args.has("--tp-comm-overlap");

  if (granularity == "full") p.recompute.granularity = RecomputeGranularity::full;
  if (granularity == "selective") p.recompute.granularity = RecomputeGranularity::selective;
  if (args.has("--checkpoint-activations") && !granularity) {
    // Pre-2023 Megatron: full recompute of groups of --checkpoint-num-layers (1).
    p.recompute.granularity = RecomputeGranularity::full;
    if (!method) p.recompute.method = RecomputeMethod::uniform;
    if (!recompute_layers) p.recompute.num_layers = 1;
    out.warnings.push_back("--checkpoint-activations is the old spelling of --recompute-granularity full");
  }
  if (args.has("--recompute-activations")) p.recompute.granularity = RecomputeGranularity::selective;
  if (method) p.recompute.method = *method == "block" ? RecomputeMethod::block : RecomputeMethod::uniform;
  if (recompute_layers) p.recompute.num_layers = recompute_layers;
  if (args.has("--recompute-modules")) {
    const auto& mods = args.values.at("--recompute-modules");
    if (std::any_of(mods.begin(), mods.end(), [](const std::string& x) { return x != "core_attn"; }))
      out.warnings.push_back("--recompute-modules: only recomputing core attention (core_attn) is modelled; "
                             "the other modules are counted as stored");
  }

  if (args.has("--use-flash-attn")) p.attention = AttentionKernel::flash;
  if (backend) p.attention = (*backend == "unfused" || *backend == "local") ? AttentionKernel::unfused
                                                                           : AttentionKernel::flash;
  out.plan = p;
  out.ignored = args.ignored;
  return out;
}

}  // namespace

Result<MegatronLaunch> import_megatron_args(std::string_view command_line) {
  auto tokens = tokenize(command_line);
  if (!tokens) return tl::unexpected(tokens.error());
  // Skip the launcher: everything up to the training script (a token ending
  // in .py), or, without one, every token before the first --flag.
  std::size_t start = 0;
  // A .py token that is the value of a Megatron flag (--tokenizer-model x.py)
  // is not the script.
  const auto& table = flag_table();
  auto is_script = [&](std::size_t k) {
    const std::string& tok = (*tokens)[k];
    if (!ends_with(tok, ".py") || is_flag(tok)) return false;
    if (k == 0) return true;
    const auto it = table.find((*tokens)[k - 1]);
    return it == table.end() || it->second.arity == Arity::none;
  };
  std::size_t script = 0;
  while (script < tokens->size() && !is_script(script)) ++script;
  if (script < tokens->size()) {
    start = script + 1;
  } else {
    while (start < tokens->size() && !is_flag((*tokens)[start])) ++start;
  }
  if (start >= tokens->size()) return fail("megatron", "no Megatron-LM flags found in the command line");
  auto args = parse_flags(*tokens, start);
  if (!args) return tl::unexpected(args.error());
  return interpret(*args);
}

Result<std::string> export_megatron_args(const Setup& setup) {
  const ModelSpec& m = setup.model;
  const TrainingSpec& t = setup.training;
  const PlanSpec& p = setup.plan;

  switch (p.schedule) {
    case Schedule::one_f_one_b:
    case Schedule::interleaved:
      break;
    default:
      return fail("plan.schedule",
                  fmt::format("Megatron-LM has no flag for the {} schedule; it runs 1f1b, or interleaved 1f1b "
                              "with --num-virtual-stages-per-pipeline-rank",
                              to_string(p.schedule)));
  }

  std::vector<std::string> a;
  auto sw = [&a](std::string_view flag) { a.emplace_back(flag); };
  auto kv = [&a](std::string_view flag, const auto& value) { a.push_back(fmt::format("{} {}", flag, value)); };

  // ---- model
  kv("--num-layers", m.num_layers);
  kv("--hidden-size", m.hidden_size);
  kv("--ffn-hidden-size", m.ffn_hidden_size);
  kv("--num-attention-heads", m.num_attention_heads);
  if (m.num_query_groups != m.num_attention_heads) {
    sw("--group-query-attention");
    kv("--num-query-groups", m.num_query_groups);
  }
  if (m.hidden_size % m.num_attention_heads != 0 || m.kv_channels != m.hidden_size / m.num_attention_heads)
    kv("--kv-channels", m.kv_channels);
  if (m.activation == Activation::swiglu) sw("--swiglu");
  if (m.norm == Norm::rmsnorm) kv("--normalization", "RMSNorm");
  if (!m.tied_embeddings) sw("--untie-embeddings-and-output-weights");
  if (!m.add_bias_linear) sw("--disable-bias-linear");
  if (!m.add_bias_linear && m.add_qkv_bias) sw("--add-qkv-bias");
  if (m.qk_layernorm) sw("--qk-layernorm");
  if (m.position_embedding == PositionEmbedding::rope) kv("--position-embedding-type", "rope");
  if (m.position_embedding == PositionEmbedding::none) kv("--position-embedding-type", "none");
  kv("--vocab-size", m.vocab_size);
  if (m.make_vocab_size_divisible_by != 128) kv("--make-vocab-size-divisible-by", m.make_vocab_size_divisible_by);
  if (m.hidden_dropout != 0.1) kv("--hidden-dropout", m.hidden_dropout);
  if (m.attention_dropout != 0.1) kv("--attention-dropout", m.attention_dropout);
  const std::int64_t seq = setup.seq_length > 0 ? setup.seq_length : t.seq_length.value_or(m.seq_length);
  kv("--seq-length", seq);
  kv("--max-position-embeddings", std::max(m.seq_length, seq));  // Megatron requires >= seq-length
  if (m.moe) {
    const MoeSpec& e = *m.moe;
    kv("--num-experts", e.num_experts);
    kv("--moe-router-topk", e.top_k);
    kv("--moe-ffn-hidden-size", e.expert_ffn_hidden);
    if (e.shared_expert_ffn_hidden > 0) kv("--moe-shared-expert-intermediate-size", e.shared_expert_ffn_hidden);
    const std::string freq = moe_layer_freq_text(e.moe_layers);
    if (!freq.empty()) kv("--moe-layer-freq", freq.front() == '(' ? "'" + freq + "'" : freq);
  }
  if (m.mla) {
    const MlaSpec& l = *m.mla;
    sw("--multi-latent-attention");
    if (l.q_lora_rank) kv("--q-lora-rank", *l.q_lora_rank);
    kv("--kv-lora-rank", l.kv_lora_rank);
    kv("--qk-head-dim", l.qk_head_dim);
    kv("--qk-pos-emb-head-dim", l.qk_rope_head_dim);
    kv("--v-head-dim", l.v_head_dim);
  }
  if (m.mtp_num_layers > 0) kv("--mtp-num-layers", m.mtp_num_layers);

  // ---- batch and precision
  kv("--micro-batch-size", p.micro_batch_size);
  kv("--global-batch-size", t.global_batch_size);
  switch (t.params_dtype) {
    case Dtype::bf16:
      sw("--bf16");
      if (t.grad_dtype == Dtype::bf16) sw("--grad-reduce-in-bf16");
      else if (t.grad_dtype != Dtype::fp32)
        return fail("training.grad_dtype",
                    fmt::format("Megatron-LM has no flag for {} gradients with bf16 weights (fp32 or bf16)",
                                to_string(t.grad_dtype)));
      break;
    case Dtype::fp16:
      sw("--fp16");
      if (t.grad_dtype == Dtype::fp32) sw("--accumulate-allreduce-grads-in-fp32");
      else if (t.grad_dtype != Dtype::fp16)
        return fail("training.grad_dtype",
                    fmt::format("Megatron-LM has no flag for {} gradients with fp16 weights (fp32 or fp16)",
                                to_string(t.grad_dtype)));
      break;
    case Dtype::fp32:
      if (t.grad_dtype != Dtype::fp32)
        return fail("training.grad_dtype", "Megatron-LM keeps fp32 gradients for fp32 weights");
      break;
    case Dtype::fp8:
      return fail("training.params_dtype", "Megatron-LM has no fp8 parameter dtype; use precision fp8");
  }
  if (t.precision == Precision::fp8) kv("--fp8-format", "hybrid");

  // ---- parallelism
  kv("--tensor-model-parallel-size", p.tp);
  kv("--pipeline-model-parallel-size", p.pp);
  const int vpp = setup.vpp > 0 ? setup.vpp : p.vpp.value_or(1);
  if (vpp > 1) kv("--num-virtual-stages-per-pipeline-rank", vpp);
  if (p.first_stage_layers) kv("--decoder-first-pipeline-num-layers", *p.first_stage_layers);
  if (p.last_stage_layers) kv("--decoder-last-pipeline-num-layers", *p.last_stage_layers);
  if (p.cp > 1) kv("--context-parallel-size", p.cp);
  if (p.cp_comm == CpCommType::all_gather) kv("--cp-comm-type", "all_gather");
  if (p.ep > 1) kv("--expert-model-parallel-size", p.ep);
  const int etp = setup.etp > 0 ? setup.etp : p.etp.value_or(p.tp);
  if (p.etp || etp != p.tp) kv("--expert-tensor-parallel-size", etp);
  if (p.sequence_parallel) sw("--sequence-parallel");
  if (p.distributed_optimizer) sw("--use-distributed-optimizer");
  if (p.recompute.granularity != RecomputeGranularity::none)
    kv("--recompute-granularity", to_string(p.recompute.granularity));
  if (p.recompute.method) kv("--recompute-method", to_string(*p.recompute.method));
  if (p.recompute.num_layers) kv("--recompute-num-layers", *p.recompute.num_layers);
  if (p.overlap_grad_reduce) sw("--overlap-grad-reduce");
  if (p.overlap_param_gather) sw("--overlap-param-gather");
  if (p.tp_comm_overlap) sw("--tp-comm-overlap");
  if (p.attention == AttentionKernel::unfused) kv("--attention-backend", "unfused");

  std::string line;
  for (const auto& item : a) {
    if (!line.empty()) line += ' ';
    line += item;
  }
  return line;
}

}  // namespace megascope
