// What every loader checks before it reads an input file: that it is a
// regular file (a directory fails mid-read, and a device or a pipe such as
// /dev/zero may never end) of a bounded size. The error names the file and
// the field (--model, trace, ...).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/result.hpp"

namespace megascope {

// The largest input file read: 1 GiB (a full-mode trace of thousands of
// ranks is the largest legitimate input).
inline constexpr std::uintmax_t kMaxInputFileBytes = std::uintmax_t{1} << 30;

// An error for a directory, a device, pipe or socket, or a file over
// kMaxInputFileBytes; success otherwise, including a missing file (the
// reader's own "cannot open" error says so). `what` names the file's kind
// ("Hugging Face config").
Result<void> check_input_file(const std::string& path, const std::string& field, std::string_view what);

}  // namespace megascope
