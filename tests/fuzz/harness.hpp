// The libFuzzer targets' shared part: each target hands its input to one of
// Megascope's loaders the way the CLI does (a file of the right kind, or a
// command-line string), and whatever the loader accepts is carried on to
// the figures a user would see: parameters, FLOPs, memory per stage and,
// where the step is small enough to simulate quickly, the simulated step.
//
// The oracle: an input is either refused with an error (fine), or every
// figure it yields is finite, non-negative and possible (memory and FLOPs
// >= 0, a positive step time, MFU at most 100%). Anything else aborts, which
// libFuzzer reports as a crash, as it does signals, sanitizer findings,
// timeouts and memory blow-ups.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "apps/scenario.hpp"
#include "config/trace_file.hpp"
#include "core/setup.hpp"

namespace megascope::fuzz {

// Writes the input to a file of this process's scratch directory, named
// `name` (its extension tells the loaders what it is); returns the path.
std::string write_input(const std::uint8_t* data, std::size_t size, std::string_view name);

// The input as a string, as a command line would pass it (stops at a NUL).
std::string as_text(const std::uint8_t* data, std::size_t size);

// The other parts of a scenario when the input is one of them: a small
// shipped model and cluster, a plan on 8 of its GPUs, a batch that divides.
cli::ScenarioOptions small_scenario();

// Loads the scenario; on success checks every figure (aborting with a
// message on an impossible one). `calibration` is a cost-profile file.
void load_and_check(const cli::ScenarioOptions& o, const std::optional<std::string>& calibration = std::nullopt);

// A simulated trace of the small scenario, read back (made once).
const TraceFile& reference_trace();

// Checks the figures of an accepted setup.
void check_setup(const Setup& s, const std::optional<std::string>& calibration = std::nullopt);

}  // namespace megascope::fuzz
