// The megascope command line: subcommands and their options. run_cli()
// returns the process exit code: 0 success, 1 bad input (one message on
// stderr), 2 usage error, 3 internal error (main.cpp), 4 the result is
// printed but does not fit: estimate and simulate of a plan whose peak
// memory exceeds a GPU's, plan when no plan fits (none legal, or none
// within memory).
#pragma once

#include <iosfwd>

namespace megascope::cli {

inline constexpr int kExitDoesNotFit = 4;

int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace megascope::cli
