// libFuzzer target: a [training] TOML file (--training FILE.toml).
#include "harness.hpp"

using namespace megascope;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto o = fuzz::small_scenario();
  o.training = fuzz::write_input(data, size, "training.toml");
  o.global_batch.reset();
  fuzz::load_and_check(o);
  return 0;
}
