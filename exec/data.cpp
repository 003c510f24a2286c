#include "exec/data.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <deque>

#include "core/varlen.hpp"

namespace megascope::exec {

Result<ByteCorpus> ByteCorpus::load(const std::string& path, std::int64_t seq) {
  // Only a regular file: a directory fails mid-read, and a device or a pipe
  // (/dev/zero) may never end.
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::is_directory(status))
    return fail("--data", fmt::format("{}: is a directory, not a training text file", path));
  if (!ec && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status))
    return fail("--data", fmt::format("{}: not a regular file (a device, pipe or socket); give a text file", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail("--data", fmt::format("{}: cannot open the training text", path));
  ByteCorpus c;
  c.bytes_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  c.seq_ = seq;
  if (static_cast<std::int64_t>(c.bytes_.size()) < seq + 2)
    return fail("--data", fmt::format("{}: {} bytes, need at least seq_length + 2 = {}", path, c.bytes_.size(), seq + 2));
  return c;
}

void ByteCorpus::sample(std::int64_t step, std::int64_t global_batch, std::int64_t sample, std::int32_t* tokens,
                        std::int32_t* targets) const {
  const auto span = static_cast<std::int64_t>(bytes_.size()) - seq_ - 1;
  const std::int64_t start = ((step * global_batch + sample) * seq_) % span;
  for (std::int64_t i = 0; i < seq_; ++i) {
    tokens[i] = bytes_[static_cast<std::size_t>(start + i)];
    targets[i] = bytes_[static_cast<std::size_t>(start + i + 1)];
  }
}

void ByteCorpus::document(std::int64_t offset, std::int64_t length, std::int32_t* tokens, std::int32_t* targets) const {
  // As sample(): a start below length - seq - 1, so that the document and
  // the byte after it lie in the text.
  const auto span = static_cast<std::int64_t>(bytes_.size()) - seq_ - 1;
  const std::int64_t start = offset % span;
  for (std::int64_t i = 0; i < length; ++i) {
    tokens[i] = bytes_[static_cast<std::size_t>(start + i)];
    targets[i] = i + 1 < length ? bytes_[static_cast<std::size_t>(start + i + 1)] : 0;
  }
}

Result<VarlenBatch> varlen_batch(const Setup& s, std::int64_t step) {
  const VarlenSpec& v = *s.training.varlen;
  const std::int64_t B = s.training.global_batch_size, S = s.seq_length;
  const std::vector<std::int64_t> lengths =
      sample_lengths(v.lengths, v.seed, static_cast<std::uint64_t>(step), static_cast<std::size_t>(B));
  VarlenBatch out;
  out.stream_base = step * B * S;
  std::vector<std::int64_t> offsets(lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    offsets[i] = out.stream_base + out.stream_tokens;
    out.stream_tokens += lengths[i];
    out.loss_tokens += lengths[i] - 1;
  }
  out.slots.resize(static_cast<std::size_t>(s.dp));
  if (v.packing == Packing::pad) {
    out.microbatches = s.num_microbatches;
    const std::int64_t per_dp = B / s.dp;
    for (std::int64_t g = 0; g < B; ++g)
      out.slots[static_cast<std::size_t>(g / per_dp)].push_back(
          {{lengths[static_cast<std::size_t>(g)]}, {offsets[static_cast<std::size_t>(g)]}});
    return out;
  }
  const int group = s.plan.schedule == Schedule::interleaved && s.microbatch_group > 0 ? s.microbatch_group : 1;
  auto sched = schedule_static(lengths, S, s.dp, s.dp * group);
  if (!sched) return tl::unexpected(sched.error());
  out.microbatches = sched->microbatches;
  // The documents of each length, in order, for the packs to take.
  std::map<std::int64_t, std::deque<std::size_t>> unplaced;
  for (std::size_t i = 0; i < lengths.size(); ++i) unplaced[lengths[i]].push_back(i);
  for (int i = 0; i < sched->microbatches; ++i)   // pack i dp + j: in the order the scheduler made them
    for (int j = 0; j < s.dp; ++j) {
      SlotDocs slot;
      for (const std::int64_t length : sched->packs[static_cast<std::size_t>(j)][static_cast<std::size_t>(i)]) {
        std::deque<std::size_t>& q = unplaced.at(length);
        slot.lengths.push_back(length);
        slot.offsets.push_back(offsets[q.front()]);
        q.pop_front();
      }
      out.slots[static_cast<std::size_t>(j)].push_back(std::move(slot));
    }
  return out;
}

}  // namespace megascope::exec
