// Megatron-LM flag tables: internal to config/megatron_*.cpp.
//
// Does: say, for each pretrain_gpt.py flag Megascope knows, whether it is a
// switch or takes values, and whether it is read (used), accepted and listed
// as ignored, or refused as not modelled (with the reason); suggest a known
// flag close to an unknown one.
// Does not: tokenize or parse a command line (megatron_cmdline.hpp), nor give
// any flag a meaning (megatron_args.cpp).
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>

namespace megascope::megatron_detail {

enum class Arity { none, one, any, some };  // switch, one value, nargs='*', nargs='+'
enum class Role { used, ignored, unmodelled };

struct FlagInfo {
  Arity arity = Arity::none;
  Role role = Role::used;
  std::string_view why;  // unmodelled: why Megascope cannot take it
};

// Every known flag by name ("--num-layers"); built on first use.
const std::unordered_map<std::string_view, FlagInfo>& flag_table();

// The tail of the unknown-flag message for `name`: "; did you mean --x?" for
// a close known flag, a hint for launcher flags, or "".
std::string suggestion_for(std::string_view name);

}  // namespace megascope::megatron_detail
