// Runs a shell command for a test and captures its status and output
// (stdout and stderr together).
#pragma once

#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

namespace megascope::test {

struct Launch {
  int status = 0;         // as pclose returns it (use WEXITSTATUS)
  std::string output;
};

inline Launch shell(const std::string& cmd) {
  Launch l;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) l.output.append(buf, n);
  l.status = pclose(p);
  return l;
}

}  // namespace megascope::test
