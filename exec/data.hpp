// Training data for the executor: byte-level tokens (vocabulary 256) from a
// text file. Sample g of step k is the s+1 bytes starting at
// ((k B + g) s) mod (length - s - 1): the same for every plan, so that every
// plan sees the same batches. Targets are the inputs shifted by one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/result.hpp"

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
  [[nodiscard]] std::size_t size() const { return bytes_.size(); }

 private:
  std::vector<unsigned char> bytes_;
  std::int64_t seq_ = 0;
};

}  // namespace megascope::exec
