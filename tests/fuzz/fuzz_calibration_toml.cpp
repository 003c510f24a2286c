// libFuzzer target: a cost-model profile (--calibration FILE.toml) under which a small step is simulated.
#include "harness.hpp"

using namespace megascope;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = fuzz::write_input(data, size, "calibration.toml");
  fuzz::load_and_check(fuzz::small_scenario(), path);
  return 0;
}
