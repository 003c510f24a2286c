#include "config/input_file.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <system_error>

namespace megascope {

Result<void> check_input_file(const std::string& path, const std::string& field, std::string_view what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) return {};
  const SourceLocation where{path, std::nullopt, std::nullopt};
  if (fs::is_directory(st))
    return tl::unexpected(Error{fmt::format("is a directory, not a {} file", what), field, where});
  if (!fs::is_regular_file(st))
    return tl::unexpected(
        Error{fmt::format("not a regular file (a device, pipe or socket); give a {} file", what), field, where});
  const std::uintmax_t size = fs::file_size(path, ec);
  if (!ec && size > kMaxInputFileBytes)
    return tl::unexpected(Error{fmt::format("{} bytes; a {} file of at most {} bytes (1 GiB) is read", size, what,
                                            kMaxInputFileBytes),
                                field, where});
  return {};
}

}  // namespace megascope
