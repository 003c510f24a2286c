// Sections of docs/validation.md built outside validation_report.cpp.
#pragma once

#include <string>

namespace megascope {

// The Megatron-Bridge / NeMo dense rows: a table and each class's error (markdown).
std::string bridge_nemo_section(const std::string& ref_dir);
// The sustained clock fitted per GPU generation, with leave-one-model-out (markdown).
std::string sustained_clock_section(const std::string& ref_dir);

}  // namespace megascope
