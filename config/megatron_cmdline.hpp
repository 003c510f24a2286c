// Megatron-LM command lines -> flags: internal to config/megatron_*.cpp.
//
// Does: split a launch line as a shell would (quotes, backslash-newline,
// comments), collect the --flags after a given token against the flag table
// (arity checks; unknown and unmodelled flags are errors), read values as
// checked integers, reals and choices, and parse/format --moe-layer-freq.
// Does not: decide which tokens are the launcher, nor what a flag means for
// the model, training or plan (both in megatron_args.cpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.hpp"

namespace megascope::megatron_detail {

// Shell-style tokenizer.
Result<std::vector<std::string>> tokenize(std::string_view s);

bool ends_with(std::string_view s, std::string_view p);
bool is_flag(std::string_view tok);

// ---------------------------------------------------------------------------
// Parsed flags.

struct Args {
  std::map<std::string, std::vector<std::string>, std::less<>> values;  // last occurrence wins
  std::vector<std::string> ignored;                                      // in order of appearance

  [[nodiscard]] bool has(std::string_view name) const { return values.find(name) != values.end(); }
  [[nodiscard]] const std::string* value(std::string_view name) const {
    auto it = values.find(name);
    if (it == values.end() || it->second.empty()) return nullptr;
    return &it->second.back();
  }
  void note_ignored(std::string_view name) {
    if (std::find(ignored.begin(), ignored.end(), name) == ignored.end()) ignored.emplace_back(name);
  }
};

// The error field for a flag: "megatron.--flag".
std::string field_of(std::string_view flag);

// Reads tokens[start..] as Megatron-LM flags.
Result<Args> parse_flags(const std::vector<std::string>& tokens, std::size_t start);

// ---------------------------------------------------------------------------
// Reading values. The first error sticks; callers check `error` once after
// reading a group of values.

class Reader {
 public:
  explicit Reader(const Args& a) : args_(a) {}
  std::optional<Error> error;

  // An integer >= min, or nullopt when the flag is absent (or on error).
  std::optional<std::int64_t> integer(std::string_view flag, std::int64_t min = 1,
                                      std::int64_t max = std::numeric_limits<std::int64_t>::max());

  // An int-sized integer (layer counts, parallel sizes, ...).
  std::optional<int> count(std::string_view flag, int min = 1);

  std::optional<double> real(std::string_view flag);

  // One of `accepted` (a comma-separated list for the message), or nullopt.
  std::optional<std::string> choice(std::string_view flag, std::initializer_list<std::string_view> accepted);

  void set(std::string_view flag, std::string message);

 private:
  const Args& args_;
};

// --moe-layer-freq: an int n (layer i is MoE when i % n == 0) or a Python list
// expression of 0/1 such as "([0]*3+[1]*58)" or "[1,0,1,0]". No text (null):
// every layer is MoE, Megatron's default.
Result<std::vector<bool>> moe_layer_pattern(const std::string* text, int num_layers);

// The shortest --moe-layer-freq for a pattern: omitted (""), an integer, or runs.
std::string moe_layer_freq_text(const std::vector<bool>& layers);

}  // namespace megascope::megatron_detail
