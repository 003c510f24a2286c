// Builds the Program of a validated Setup: the schedule's steps turned into
// kernels and communication per pipeline stage. See program.hpp for the
// ordering rules and docs/program.md for what each layer emits.
#pragma once

#include "core/program/program.hpp"
#include "core/setup.hpp"

namespace megascope {

Result<Program> build_program(const Setup& s);

}  // namespace megascope
