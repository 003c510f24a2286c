#include "core/result.hpp"

#include <fmt/format.h>

namespace megascope {

std::string Error::str() const {
  std::string out;
  if (where) {
    out += where->file;
    if (where->line) {
      out += fmt::format(":{}", *where->line);
      if (where->column) out += fmt::format(":{}", *where->column);
    }
    out += ": ";
  }
  if (!field.empty()) out += field + ": ";
  out += message;
  return out;
}

void internal_error(const char* file, int line, const std::string& what) {
  throw InternalError(fmt::format("internal error at {}:{}: {}", file, line, what));
}

}  // namespace megascope
