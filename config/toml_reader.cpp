#include "config/toml_reader.hpp"

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string_view>
#include <utility>

#include "config/input_file.hpp"

namespace megascope {

namespace {
const char* type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    default: return "nothing";
  }
}
}  // namespace

SourceLocation location_of(const toml::node& node, const std::string& file) {
  SourceLocation loc{file, std::nullopt, std::nullopt};
  const auto& src = node.source();
  if (src.begin.line > 0) {
    loc.line = static_cast<int>(src.begin.line);
    loc.column = static_cast<int>(src.begin.column);
  }
  return loc;
}

TomlReader::TomlReader(const toml::table& table, std::string prefix, std::string file,
                       std::shared_ptr<std::optional<Error>> first_error)
    : table_(table), prefix_(std::move(prefix)), file_(std::move(file)),
      first_error_(first_error ? std::move(first_error) : std::make_shared<std::optional<Error>>()) {}

std::string TomlReader::field(std::string_view key) const {
  return prefix_.empty() ? std::string(key) : prefix_ + "." + std::string(key);
}

void TomlReader::fail_at_node(const toml::node& node, std::string_view key, const std::string& message) {
  if (first_error_->has_value()) return;
  *first_error_ = Error{message, field(key), location_of(node, file_)};
}

void TomlReader::fail_at(std::string_view key, const std::string& message) {
  if (first_error_->has_value()) return;
  if (const toml::node* n = table_.get(key)) return fail_at_node(*n, key, message);
  *first_error_ = Error{message, field(key), location_of(table_, file_)};
}

void TomlReader::wrong_type(std::string_view key, const toml::node& node, const char* expected) {
  fail_at_node(node, key, fmt::format("expected {}, found {}", expected, type_name(node)));
}

const toml::node* TomlReader::lookup(std::string_view key, bool required) {
  read_.insert(std::string(key));
  const toml::node* n = table_.get(key);
  if (!n && required) {
    if (!first_error_->has_value())
      *first_error_ = Error{fmt::format("required key is missing from [{}]", prefix_), field(key),
                            location_of(table_, file_)};
  }
  return n;
}

std::optional<std::int64_t> TomlReader::opt_integer(std::string_view key) {
  const toml::node* n = lookup(key, false);
  if (!n) return std::nullopt;
  if (auto v = n->value_exact<std::int64_t>()) return *v;
  wrong_type(key, *n, "an integer");
  return std::nullopt;
}

std::int64_t TomlReader::integer(std::string_view key) {
  if (!lookup(key, true)) return 0;
  return opt_integer(key).value_or(0);
}

std::optional<double> TomlReader::opt_number(std::string_view key) {
  const toml::node* n = lookup(key, false);
  if (!n) return std::nullopt;
  if (auto v = n->value_exact<double>()) return *v;
  if (auto i = n->value_exact<std::int64_t>()) return static_cast<double>(*i);
  wrong_type(key, *n, "a number");
  return std::nullopt;
}

double TomlReader::number(std::string_view key) {
  if (!lookup(key, true)) return 0;
  return opt_number(key).value_or(0);
}

std::optional<bool> TomlReader::opt_boolean(std::string_view key) {
  const toml::node* n = lookup(key, false);
  if (!n) return std::nullopt;
  if (auto v = n->value_exact<bool>()) return *v;
  wrong_type(key, *n, "a boolean (true or false)");
  return std::nullopt;
}

bool TomlReader::boolean(std::string_view key) {
  if (!lookup(key, true)) return false;
  return opt_boolean(key).value_or(false);
}

std::optional<std::string> TomlReader::opt_string(std::string_view key) {
  const toml::node* n = lookup(key, false);
  if (!n) return std::nullopt;
  if (auto v = n->value_exact<std::string>()) return *v;
  wrong_type(key, *n, "a string");
  return std::nullopt;
}

std::string TomlReader::string(std::string_view key) {
  if (!lookup(key, true)) return {};
  return opt_string(key).value_or(std::string{});
}

const toml::array* TomlReader::opt_array(std::string_view key) {
  const toml::node* n = lookup(key, false);
  if (!n) return nullptr;
  if (const toml::array* a = n->as_array()) return a;
  wrong_type(key, *n, "an array");
  return nullptr;
}

const toml::node* TomlReader::opt_node(std::string_view key) { return lookup(key, false); }

std::optional<TomlReader> TomlReader::table(std::string_view key, bool required) {
  const toml::node* n = lookup(key, required);
  if (!n) return std::nullopt;
  const toml::table* t = n->as_table();
  if (!t) {
    wrong_type(key, *n, "a table");
    return std::nullopt;
  }
  return TomlReader(*t, field(key), file_, first_error_);
}

std::optional<Error> TomlReader::finish() {
  if (first_error_->has_value()) return *first_error_;
  for (auto&& [k, node] : table_) {
    if (!read_.count(k.str())) {
      SourceLocation loc{file_, std::nullopt, std::nullopt};
      if (k.source().begin.line > 0) {
        loc.line = static_cast<int>(k.source().begin.line);
        loc.column = static_cast<int>(k.source().begin.column);
      }
      *first_error_ = Error{fmt::format("unknown key in [{}]", prefix_), field(k.str()), loc};
      break;
    }
  }
  return *first_error_;
}

namespace {

// The most dotted parts one TOML key may have. toml++ builds a dotted key's
// tables recursively, so a key of tens of thousands of parts overflows the
// stack; no configuration nests this deep.
constexpr int kMaxKeyDots = 64;

// The first key with more than kMaxKeyDots dots: its line and column. A
// chain of bare or quoted key parts joined by dots counts its dots; strings
// (one-line and multi-line), comments and anything else between chains
// (=, commas, brackets, braces, line ends) end a chain. A float has one dot.
std::optional<std::pair<int, int>> over_deep_key(std::string_view text) {
  int line = 1, column = 0, dots = 0;
  enum class State { normal, basic, literal, ml_basic, ml_literal, comment } st = State::normal;
  // A multi-line string may end in up to two quotes of its own kind before
  // its closing three ("""a"""" is a"): after the closing three, the
  // string's last quotes are the ones that follow.
  std::size_t i = 0;
  const auto close_extra = [&](char q) {
    for (int k = 0; k < 2 && i + 1 < text.size() && text[i + 1] == q; ++k) ++i, ++column;
  };
  for (; i < text.size(); ++i) {
    const char c = text[i];
    ++column;
    if (c == '\n') {
      ++line;
      column = 0;
      if (st == State::comment || st == State::basic || st == State::literal) st = State::normal;
      if (st == State::normal) dots = 0;
      continue;
    }
    switch (st) {
      case State::comment: break;
      case State::basic:
        if (c == '\\' && i + 1 < text.size() && text[i + 1] != '\n') ++i, ++column;
        else if (c == '"') st = State::normal;
        break;
      case State::literal:
        if (c == '\'') st = State::normal;
        break;
      case State::ml_basic:
        if (c == '\\' && i + 1 < text.size() && text[i + 1] != '\n') ++i, ++column;
        else if (text.substr(i, 3) == "\"\"\"") st = State::normal, i += 2, column += 2, close_extra('"');
        break;
      case State::ml_literal:
        if (text.substr(i, 3) == "'''") st = State::normal, i += 2, column += 2, close_extra('\'');
        break;
      case State::normal:
        if (c == '#') {
          st = State::comment;
        } else if (c == '"') {
          if (text.substr(i, 3) == "\"\"\"") st = State::ml_basic, i += 2, column += 2;
          else st = State::basic;
        } else if (c == '\'') {
          if (text.substr(i, 3) == "'''") st = State::ml_literal, i += 2, column += 2;
          else st = State::literal;
        } else if (c == '.') {
          if (++dots > kMaxKeyDots) return std::pair{line, column};
        } else if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == ' ' || c == '\t' ||
                     c == '+' || c == '\r')) {
          dots = 0;
        }
        break;
    }
  }
  return std::nullopt;
}

}  // namespace

Result<toml::table> parse_toml_file(const std::string& path) {
  if (auto ok = check_input_file(path, "", "TOML"); !ok) return tl::unexpected(ok.error());
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return tl::unexpected(Error{fmt::format("cannot read file: {}", std::strerror(errno)), "",
                                SourceLocation{path, std::nullopt, std::nullopt}});
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string text = buf.str();
  if (const auto at = over_deep_key(text))
    return tl::unexpected(Error{fmt::format("a key of more than {} dotted parts (TOML nested this deep is refused)", kMaxKeyDots + 1),
                                "", SourceLocation{path, at->first, at->second}});
  try {
    return toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    SourceLocation loc{path, static_cast<int>(e.source().begin.line), static_cast<int>(e.source().begin.column)};
    return tl::unexpected(Error{fmt::format("TOML syntax error: {}", e.description()), "", loc});
  }
}

}  // namespace megascope
