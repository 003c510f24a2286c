// megascope: the command-line entry point. Everything but exit codes lives in
// apps/cli.cpp so that tests can run the commands in-process.
#include <exception>
#include <iostream>

#include "apps/cli.hpp"

int main(int argc, char** argv) {
  try {
    return megascope::cli::run_cli(argc, argv, std::cout, std::cerr);
  } catch (const std::exception& e) {
    std::cerr << "megascope: internal error: " << e.what() << "\n";
    return 3;
  }
}
