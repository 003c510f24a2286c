// Result<T> and Error: how expected failures travel (bad input, impossible
// plans, missing files). Broken invariants throw InternalError instead.
//
// An Error carries one human message plus, where known, where the problem is
// (file, line, column) and which field it concerns, so that tests can check
// the parts and the CLI can print one clear line.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <tl/expected.hpp>
#include <utility>

namespace megascope {

struct SourceLocation {
  std::string file;                 // path as given by the user
  std::optional<int> line;          // 1-based
  std::optional<int> column;        // 1-based
};

struct Error {
  std::string message;              // what is wrong and the rule it breaks
  std::string field;                // dotted key, e.g. "plan.tp" (may be empty)
  std::optional<SourceLocation> where;

  // One line: "file:line:col: field: message" with the parts that are known.
  [[nodiscard]] std::string str() const;
};

template <class T>
using Result = tl::expected<T, Error>;

inline tl::unexpected<Error> fail(std::string field, std::string message) {
  return tl::unexpected<Error>(Error{std::move(message), std::move(field), std::nullopt});
}

// A broken invariant (a bug), never bad input. Carries file:line.
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

[[noreturn]] void internal_error(const char* file, int line, const std::string& what);

#define MEGASCOPE_CHECK(cond, what)                                   \
  do {                                                                \
    if (!(cond)) ::megascope::internal_error(__FILE__, __LINE__, what); \
  } while (0)

}  // namespace megascope
