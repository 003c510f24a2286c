// The megascope command line: subcommands and their options. run_cli()
// returns the process exit code: 0 success, 1 bad input (one message on
// stderr), 2 usage error.
#pragma once

#include <iosfwd>

namespace megascope::cli {

int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace megascope::cli
