// Expected error in the command's JSON (config/validation_regimes.hpp holds
// the classes, the regimes file and the text simulate, plan and the GUI
// print).
#pragma once

#include <nlohmann/json.hpp>

#include "config/validation_regimes.hpp"

namespace megascope::cli {

using megascope::describe;
using megascope::expected_error;
using megascope::expected_error_text;
using megascope::ExpectedError;
using megascope::load_regimes;
using megascope::Regime;
using megascope::regime_of;
using megascope::regimes_path;
using megascope::RegimeStats;
using megascope::shipped_regimes;
using megascope::write_regimes;

nlohmann::json expected_error_json(const ExpectedError& e);

}  // namespace megascope::cli
