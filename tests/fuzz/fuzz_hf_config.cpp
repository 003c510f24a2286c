// libFuzzer target: a Hugging Face config.json (--model config.json).
#include "harness.hpp"

using namespace megascope;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto o = fuzz::small_scenario();
  o.model = fuzz::write_input(data, size, "config.json");
  fuzz::load_and_check(o);
  return 0;
}
