// Argument checks shared by the CPU kernels and the CUDA launchers: a failed
// check throws std::invalid_argument naming file:line and the condition. Not
// an assert: it stays in release builds. Used once per call, never per element.
#pragma once

#include <stdexcept>
#include <string>

namespace megascope::kernels::detail {

[[noreturn]] inline void fail_argument(const char* file, int line, const char* what) {
  throw std::invalid_argument(std::string(file) + ":" + std::to_string(line) +
                              ": kernel argument check failed: " + what);
}

}  // namespace megascope::kernels::detail

#define MEGASCOPE_KERNEL_REQUIRE(cond)                                                   \
  do {                                                                                   \
    if (!(cond)) ::megascope::kernels::detail::fail_argument(__FILE__, __LINE__, #cond); \
  } while (0)
