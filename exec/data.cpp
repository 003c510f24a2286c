#include "exec/data.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iterator>

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

}  // namespace megascope::exec
