#include "exec/data.hpp"

#include <fmt/format.h>

#include <fstream>
#include <iterator>

namespace megascope::exec {

Result<ByteCorpus> ByteCorpus::load(const std::string& path, std::int64_t seq) {
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

}  // namespace megascope::exec
