// libFuzzer target: a DeepSpeed ds_config.json (--deepspeed-config FILE) over a small plan.
#include "harness.hpp"

using namespace megascope;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto o = fuzz::small_scenario();
  o.deepspeed_config = fuzz::write_input(data, size, "ds_config.json");
  o.global_batch.reset();
  fuzz::load_and_check(o);
  return 0;
}
