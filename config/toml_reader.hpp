// TomlReader: typed access to one TOML table that remembers the first error
// (with file, line, column and the dotted key) and, at finish(), reports any
// key that was never read as unknown. Loaders read every field top to bottom
// and check finish() once.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <toml++/toml.h>

#include "core/result.hpp"

namespace megascope {

class TomlReader {
 public:
  // `prefix` is the table's dotted name ("model.moe"); `file` names the file in errors.
  TomlReader(const toml::table& table, std::string prefix, std::string file,
             std::shared_ptr<std::optional<Error>> first_error = nullptr);

  std::int64_t integer(std::string_view key);
  std::optional<std::int64_t> opt_integer(std::string_view key);
  double number(std::string_view key);                   // integer or float
  std::optional<double> opt_number(std::string_view key);
  bool boolean(std::string_view key);
  std::optional<bool> opt_boolean(std::string_view key);
  std::string string(std::string_view key);
  std::optional<std::string> opt_string(std::string_view key);
  const toml::array* opt_array(std::string_view key);
  const toml::node* opt_node(std::string_view key);      // any type; marks the key as read
  // A sub-table; absent -> nullopt (and an error if `required`).
  std::optional<TomlReader> table(std::string_view key, bool required);

  // An enum from a string, with the accepted spellings in the error.
  template <class E>
  E choice(std::string_view key, std::optional<E> (*parse)(std::string_view), const char* accepted, E fallback,
           bool required = true) {
    auto text = required ? std::optional<std::string>(string(key)) : opt_string(key);
    if (!text) return fallback;
    if (auto v = parse(*text)) return *v;
    fail_at(key, "expected one of " + std::string(accepted) + ", found \"" + *text + "\"");
    return fallback;
  }

  // Records an error at `key` (or at the table when the key is absent).
  void fail_at(std::string_view key, const std::string& message);
  void fail_at_node(const toml::node& node, std::string_view key, const std::string& message);

  // The first error of this reader and its sub-readers, including unknown keys.
  [[nodiscard]] std::optional<Error> finish();
  [[nodiscard]] bool ok() const { return !first_error_->has_value(); }
  [[nodiscard]] const std::string& file() const { return file_; }
  [[nodiscard]] std::string field(std::string_view key) const;

 private:
  const toml::node* lookup(std::string_view key, bool required);
  void wrong_type(std::string_view key, const toml::node& node, const char* expected);

  const toml::table& table_;
  std::string prefix_;
  std::string file_;
  std::set<std::string, std::less<>> read_;
  std::shared_ptr<std::optional<Error>> first_error_;
};

// Parses a TOML file; a syntax error names the file, line and column.
Result<toml::table> parse_toml_file(const std::string& path);

// Where a node is in its file.
SourceLocation location_of(const toml::node& node, const std::string& file);

}  // namespace megascope
