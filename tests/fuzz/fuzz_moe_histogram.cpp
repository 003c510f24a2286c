// libFuzzer target: a measured per-expert token histogram (--moe-histogram FILE) for a small MoE model.
#include "harness.hpp"

using namespace megascope;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto o = fuzz::small_scenario();
  o.model = "tiny-moe";
  o.moe_histogram = fuzz::write_input(data, size, "histogram.txt");
  fuzz::load_and_check(o);
  return 0;
}
