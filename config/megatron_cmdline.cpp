// Megatron-LM command lines -> flags, and the --moe-layer-freq syntax.
//
// Does: tokenize a launch line like a shell, parse the --flags against the
// flag table, read flag values with range checks, and parse and format
// --moe-layer-freq patterns.
// Does not: know what any flag means for the model, training or plan
// (megatron_args.cpp) or which flags exist (megatron_flags.cpp).
#include "config/megatron_cmdline.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config/megatron_flags.hpp"

namespace megascope::megatron_detail {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

}  // namespace

// ---------------------------------------------------------------------------
// Shell-style tokenizer.

Result<std::vector<std::string>> tokenize(std::string_view s) {
  std::vector<std::string> out;
  std::string cur;
  bool in_token = false;
  auto finish = [&] {
    if (in_token) out.push_back(cur);
    cur.clear();
    in_token = false;
  };
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (is_space(c)) {
      finish();
      continue;
    }
    if (c == '#' && !in_token) {  // comment to the end of the line
      while (i < s.size() && s[i] != '\n') ++i;
      continue;
    }
    if (c == '\\') {
      if (i + 1 < s.size() && s[i + 1] == '\n') {  // line continuation
        ++i;
        continue;
      }
      if (i + 2 < s.size() && s[i + 1] == '\r' && s[i + 2] == '\n') {
        i += 2;
        continue;
      }
      in_token = true;
      if (i + 1 < s.size()) cur += s[++i];
      else cur += '\\';
      continue;
    }
    if (c == '\'') {
      const std::size_t close = s.find('\'', i + 1);
      if (close == std::string_view::npos)
        return fail("megatron", "unterminated single quote in the command line");
      cur.append(s.substr(i + 1, close - i - 1));
      in_token = true;
      i = close;
      continue;
    }
    if (c == '"') {
      in_token = true;
      std::size_t j = i + 1;
      for (;; ++j) {
        if (j >= s.size()) return fail("megatron", "unterminated double quote in the command line");
        const char d = s[j];
        if (d == '"') break;
        if (d == '\\' && j + 1 < s.size()) {
          const char e = s[j + 1];
          if (e == '\n') {
            ++j;
            continue;
          }
          if (e == '"' || e == '\\' || e == '$' || e == '`') {
            cur += e;
            ++j;
            continue;
          }
        }
        cur += d;
      }
      i = j;
      continue;
    }
    cur += c;
    in_token = true;
  }
  finish();
  return out;
}

bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}
bool is_flag(std::string_view tok) { return tok.size() > 2 && starts_with(tok, "--"); }

// ---------------------------------------------------------------------------
// Parsed flags.

std::string field_of(std::string_view flag) { return "megatron." + std::string(flag); }

Result<Args> parse_flags(const std::vector<std::string>& tokens, std::size_t start) {
  Args args;
  const auto& table = flag_table();
  std::size_t i = start;
  while (i < tokens.size()) {
    const std::string& tok = tokens[i++];
    if (!is_flag(tok))
      return fail("megatron", fmt::format("unexpected argument '{}': expected a --flag", tok));
    std::string name = tok;
    std::optional<std::string> inline_value;
    if (const auto eq = tok.find('='); eq != std::string::npos) {
      name = tok.substr(0, eq);
      inline_value = tok.substr(eq + 1);
    }
    const auto it = table.find(name);
    if (it == table.end())
      return fail(field_of(name), fmt::format("unknown Megatron-LM flag {}{}", name, suggestion_for(name)));
    const FlagInfo& info = it->second;
    if (info.role == Role::unmodelled)
      return fail(field_of(name), fmt::format("{} is not supported: {}", name, info.why));

    std::vector<std::string> vals;
    switch (info.arity) {
      case Arity::none:
        if (inline_value)
          return fail(field_of(name), fmt::format("{} is a switch and takes no value, found '{}'", name, *inline_value));
        break;
      case Arity::one:
        if (inline_value) {
          vals.push_back(*inline_value);
        } else if (i < tokens.size() && !is_flag(tokens[i])) {
          vals.push_back(tokens[i++]);
        } else {
          return fail(field_of(name), fmt::format("{} needs a value", name));
        }
        break;
      case Arity::any:
      case Arity::some:
        if (inline_value) vals.push_back(*inline_value);
        while (i < tokens.size() && !is_flag(tokens[i])) vals.push_back(tokens[i++]);
        if (info.arity == Arity::some && vals.empty())
          return fail(field_of(name), fmt::format("{} needs at least one value", name));
        break;
    }
    args.values[name] = std::move(vals);
    if (info.role == Role::ignored) args.note_ignored(name);
  }
  return args;
}

// ---------------------------------------------------------------------------
// Reading values.

std::optional<std::int64_t> Reader::integer(std::string_view flag, std::int64_t min, std::int64_t max) {
  const std::string* v = args_.value(flag);
  if (!v) return std::nullopt;
  std::int64_t out = 0;
  const char* first = v->data();
  const char* last = v->data() + v->size();
  if (!v->empty() && *first == '+') ++first;  // Python's int() accepts a leading '+'
  const auto [ptr, ec] = std::from_chars(first, last, out);
  if (v->empty() || ec != std::errc() || ptr != last) {
    set(flag, fmt::format("{} expects an integer, found '{}'", flag, *v));
    return std::nullopt;
  }
  if (out < min) {
    set(flag, min == 1 ? fmt::format("{} must be a positive integer, found {}", flag, out)
                       : fmt::format("{} must be >= {}, found {}", flag, min, out));
    return std::nullopt;
  }
  if (out > max) {
    set(flag, fmt::format("{} must be <= {}, found {}", flag, max, out));
    return std::nullopt;
  }
  return out;
}

std::optional<int> Reader::count(std::string_view flag, int min) {
  auto v = integer(flag, min, INT_MAX);
  if (!v) return std::nullopt;
  return static_cast<int>(*v);
}

std::optional<double> Reader::real(std::string_view flag) {
  const std::string* v = args_.value(flag);
  if (!v) return std::nullopt;
  double out = 0;
  const auto [ptr, ec] = std::from_chars(v->data(), v->data() + v->size(), out);
  if (v->empty() || ec != std::errc() || ptr != v->data() + v->size()) {
    set(flag, fmt::format("{} expects a number, found '{}'", flag, *v));
    return std::nullopt;
  }
  return out;
}

std::optional<std::string> Reader::choice(std::string_view flag, std::initializer_list<std::string_view> accepted) {
  const std::string* v = args_.value(flag);
  if (!v) return std::nullopt;
  for (std::string_view a : accepted)
    if (*v == a) return *v;
  std::string list;
  for (std::string_view a : accepted) {
    if (!list.empty()) list += ", ";
    list += a;
  }
  set(flag, fmt::format("{} must be one of {}, found '{}'", flag, list, *v));
  return std::nullopt;
}

void Reader::set(std::string_view flag, std::string message) {
  if (!error) error = Error{std::move(message), field_of(flag), std::nullopt};
}

// ---------------------------------------------------------------------------
// --moe-layer-freq: an int n (layer i is MoE when i % n == 0) or a Python list
// expression of 0/1 such as "([0]*3+[1]*58)" or "[1,0,1,0]".

namespace {

struct PatternValue {
  bool is_list = false;
  std::int64_t number = 0;
  std::vector<std::int64_t> list;
};

class PatternParser {
 public:
  explicit PatternParser(std::string_view text) : s_(text) {}

  Result<PatternValue> parse() {
    auto v = expr();
    if (!v) return v;
    skip_spaces();
    if (pos_ != s_.size()) return error("unexpected '" + std::string(1, s_[pos_]) + "'");
    return v;
  }

 private:
  static constexpr std::size_t kMaxLength = 1'000'000;

  tl::unexpected<Error> error(const std::string& what) const {
    return fail("megatron.--moe-layer-freq",
                fmt::format("--moe-layer-freq: cannot read '{}' ({} at position {}); expected an integer or a "
                            "list expression such as ([0]*3+[1]*58)",
                            s_, what, pos_ + 1));
  }
  void skip_spaces() {
    while (pos_ < s_.size() && is_space(s_[pos_])) ++pos_;
  }
  bool eat(char c) {
    skip_spaces();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  Result<PatternValue> expr() {
    auto lhs = term();
    if (!lhs) return lhs;
    while (eat('+')) {
      auto rhs = term();
      if (!rhs) return rhs;
      if (lhs->is_list != rhs->is_list) return error("cannot add a list and an integer");
      if (lhs->is_list) {
        if (lhs->list.size() + rhs->list.size() > kMaxLength) return error("pattern too long");
        lhs->list.insert(lhs->list.end(), rhs->list.begin(), rhs->list.end());
      } else {
        lhs->number += rhs->number;
      }
    }
    return lhs;
  }

  Result<PatternValue> term() {
    auto lhs = factor();
    if (!lhs) return lhs;
    while (eat('*')) {
      auto rhs = factor();
      if (!rhs) return rhs;
      if (lhs->is_list && rhs->is_list) return error("cannot multiply two lists");
      if (!lhs->is_list && !rhs->is_list) {
        if (lhs->number != 0 && rhs->number > static_cast<std::int64_t>(kMaxLength) / std::max<std::int64_t>(lhs->number, 1))
          return error("number too large");
        lhs->number *= rhs->number;
        continue;
      }
      PatternValue& list = lhs->is_list ? *lhs : *rhs;
      const std::int64_t times = lhs->is_list ? rhs->number : lhs->number;
      if (times < 0) return error("negative repeat count");
      if (!list.list.empty() && static_cast<std::size_t>(times) > kMaxLength / list.list.size())
        return error("pattern too long");
      PatternValue out;
      out.is_list = true;
      for (std::int64_t k = 0; k < times; ++k) out.list.insert(out.list.end(), list.list.begin(), list.list.end());
      *lhs = std::move(out);
    }
    return lhs;
  }

  Result<PatternValue> factor() {
    skip_spaces();
    if (pos_ >= s_.size()) return error("unexpected end");
    const char c = s_[pos_];
    if (c == '(') {
      ++pos_;
      auto v = expr();
      if (!v) return v;
      if (!eat(')')) return error("missing ')'");
      return v;
    }
    if (c == '[') {
      ++pos_;
      PatternValue v;
      v.is_list = true;
      if (eat(']')) return v;
      for (;;) {
        auto n = number();
        if (!n) return n;
        v.list.push_back(n->number);
        if (eat(']')) break;
        if (!eat(',')) return error("expected ',' or ']'");
        if (eat(']')) break;  // trailing comma
      }
      return v;
    }
    return number();
  }

  Result<PatternValue> number() {
    skip_spaces();
    const std::size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    if (start == pos_) return error("expected a number");
    if (pos_ - start > 9) return error("number too large");
    PatternValue v;
    for (std::size_t k = start; k < pos_; ++k) v.number = v.number * 10 + (s_[k] - '0');
    return v;
  }

  std::string_view s_;
  std::size_t pos_ = 0;
};

}  // namespace

Result<std::vector<bool>> moe_layer_pattern(const std::string* text, int num_layers) {
  std::vector<bool> layers(static_cast<std::size_t>(num_layers), true);
  if (!text) return layers;  // Megatron's default: every layer is MoE
  auto v = PatternParser(*text).parse();
  if (!v) return tl::unexpected(v.error());
  if (!v->is_list) {
    if (v->number < 1)
      return fail("megatron.--moe-layer-freq",
                  fmt::format("--moe-layer-freq must be a positive integer, found {}", v->number));
    for (int i = 0; i < num_layers; ++i) layers[static_cast<std::size_t>(i)] = i % v->number == 0;
    return layers;
  }
  if (v->list.size() != static_cast<std::size_t>(num_layers))
    return fail("megatron.--moe-layer-freq",
                fmt::format("--moe-layer-freq lists {} layers but --num-layers is {}", v->list.size(), num_layers));
  for (std::size_t i = 0; i < v->list.size(); ++i) {
    if (v->list[i] != 0 && v->list[i] != 1)
      return fail("megatron.--moe-layer-freq",
                  fmt::format("--moe-layer-freq entries must be 0 (dense) or 1 (MoE), found {} at layer {}",
                              v->list[i], i));
    layers[i] = v->list[i] == 1;
  }
  return layers;
}

// The shortest --moe-layer-freq for a pattern: omitted (""), an integer, or runs.
std::string moe_layer_freq_text(const std::vector<bool>& layers) {
  const int n = static_cast<int>(layers.size());
  for (int freq = 1; freq <= std::max(n, 1); ++freq) {
    bool match = true;
    for (int i = 0; i < n && match; ++i) match = layers[static_cast<std::size_t>(i)] == (i % freq == 0);
    if (match) return freq == 1 ? std::string() : std::to_string(freq);
  }
  std::string out = "(";
  std::size_t i = 0;
  while (i < layers.size()) {
    std::size_t j = i;
    while (j < layers.size() && layers[j] == layers[i]) ++j;
    if (out.size() > 1) out += '+';
    out += fmt::format("[{}]*{}", layers[i] ? 1 : 0, j - i);
    i = j;
  }
  out += ')';
  return out;
}

}  // namespace megascope::megatron_detail
