// Training data for the executor: byte-level tokens (vocabulary 256) from a
// text file. Sample g of step k is the s+1 bytes starting at
// ((k B + g) s) mod (length - s - 1): the same for every plan, so that every
// plan sees the same batches. Targets are the inputs shifted by one.
//
// Variable-length training (TrainingSpec::varlen, docs/executor.md): step k's
// global batch is B documents of lengths sample_lengths(lengths, seed, k, B),
// taken one after the other from the text: document i is the L_i bytes from
// offset k B s + (L_0 + ... + L_(i-1)) (mod length - s - 1), its targets the
// next bytes within it; its last token has no target (loss mask 0).
// varlen_batch places them in sequence slots, the same on every rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/result.hpp"
#include "core/setup.hpp"

namespace megascope::exec {

// The corpus used when no --data is given: the GNU GPL text every Debian
// system ships (base-files), about 35 KB of English.
inline constexpr const char* kDefaultCorpus = "/usr/share/common-licenses/GPL-3";

class ByteCorpus {
 public:
  // Fails (naming the file) when it cannot be read or is shorter than seq + 2 bytes.
  static Result<ByteCorpus> load(const std::string& path, std::int64_t seq);
  // tokens and targets (seq each) of global sample `sample` of step `step`.
  void sample(std::int64_t step, std::int64_t global_batch, std::int64_t sample, std::int32_t* tokens,
              std::int32_t* targets) const;
  // A document of `length` (1..seq) tokens at stream offset `offset`: its
  // tokens, and targets the next tokens within it, the last one's 0 (it has
  // none: the caller masks it out of the loss).
  void document(std::int64_t offset, std::int64_t length, std::int32_t* tokens, std::int32_t* targets) const;
  [[nodiscard]] std::size_t size() const { return bytes_.size(); }

 private:
  std::vector<unsigned char> bytes_;
  std::int64_t seq_ = 0;
};

// One sequence slot of a micro-batch in variable-length training: its
// documents, placed one after the other from position 0, and the padding
// after them up to seq_length.
struct SlotDocs {
  std::vector<std::int64_t> lengths;
  std::vector<std::int64_t> offsets;   // each document's stream offset (ByteCorpus::document)
};

// A step's global batch of variable-length documents in the executor's slots.
struct VarlenBatch {
  // Micro-batches per DP replica: the packing scheduler's count (pack), or
  // the Setup's (pad).
  int microbatches = 0;
  // [DP replica][micro-batch * mbs + i]: slot i of a micro-batch.
  std::vector<std::vector<SlotDocs>> slots;
  // Tokens with a target in the whole global batch, sum of (L - 1): the
  // loss is the mean over them (Megatron-LM's --calculate-per-token-loss).
  std::int64_t loss_tokens = 0;
  // Where the step's documents start in the text (k B s), and their tokens
  // in all, for the dropout streams' element indices (CpuRank::for_runs).
  std::int64_t stream_base = 0, stream_tokens = 0;
};

// Step `step` (0-based) of a variable-length training (s.training.varlen):
// B = global_batch_size lengths from the distribution, then
//   pack: schedule_static(lengths, seq_length, dp, dp g) (Megatron-LM's
//         dp_balanced; g the interleaved schedule's micro-batch group, else
//         1): micro-batch i of replica j is pack i dp + j, one slot (mbs 1);
//   pad:  document g in slot g of the global batch, as a fixed-length sample
//         (replica g / (B / dp), micro-batch and slot in order).
// schedule_static reports lengths only: each pack's lengths are matched to
// the documents in pack order, each taking the first document of its length
// not yet placed (documents of one length are interchangeable: the set of
// tokens of the step, and so its loss and gradient, does not change).
// Errors are the scheduler's (too few sequences for the multiple).
Result<VarlenBatch> varlen_batch(const Setup& s, std::int64_t step);

}  // namespace megascope::exec
