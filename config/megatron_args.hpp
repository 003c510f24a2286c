// Megatron-LM launch lines <-> model + training + plan.
//
// import_megatron_args() reads the flags of pretrain_gpt.py
// ("--tensor-model-parallel-size 8 --num-layers 96 ..."), with Megatron's own
// defaults for flags left out. Flags that do not change the model shape, the
// batch or the plan (learning rate, data paths, logging, ...) are accepted and
// listed in `ignored`; a flag Megatron does not have, or one Megatron has but
// whose effect Megatron-specific and not modelled here, is an error naming it.
//
// export_megatron_args() writes the flags back; importing what it writes gives
// the same model, training and plan (round trip).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/model.hpp"
#include "core/plan.hpp"
#include "core/result.hpp"
#include "core/setup.hpp"
#include "core/training.hpp"

namespace megascope {

struct MegatronLaunch {
  ModelSpec model;                    // validated with validate_model
  TrainingSpec training;
  PlanSpec plan;                      // dp left unset: it follows from the device count
  std::vector<std::string> ignored;   // accepted flags that do not affect Megascope
  std::vector<std::string> warnings;  // e.g. vocab size taken from a tokenizer's known size
};

Result<MegatronLaunch> import_megatron_args(std::string_view command_line);

// Fails for plans Megatron-LM cannot express (zero-bubble and DualPipe
// schedules), naming the field.
Result<std::string> export_megatron_args(const Setup& setup);

}  // namespace megascope
