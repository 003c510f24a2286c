// Runs the megascope command in-process and captures its exit code and output.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "apps/cli.hpp"

namespace megascope::test {

struct Run {
  int code;
  std::string out, err;
};

inline Run run(std::vector<std::string> args) {
  args.insert(args.begin(), "megascope");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  const int code = cli::run_cli(static_cast<int>(argv.size()), argv.data(), out, err);
  return {code, out.str(), err.str()};
}

}  // namespace megascope::test
