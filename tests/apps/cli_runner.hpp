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

// Whether a command printed its result: exit 0, or 4 (printed, but the plan
// does not fit in memory), for tests about something other than the fit.
inline bool printed(const Run& r) { return r.code == 0 || r.code == cli::kExitDoesNotFit; }

inline Run run(std::vector<std::string> args) {
  args.insert(args.begin(), "megascope");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  const int code = cli::run_cli(static_cast<int>(argv.size()), argv.data(), out, err);
  return {code, out.str(), err.str()};
}

}  // namespace megascope::test
