// `megascope estimate`: parameters, FLOPs and memory per pipeline stage of
// one plan, against the device capacity, as text or JSON.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "apps/scenario.hpp"

namespace megascope::cli {

nlohmann::json estimate_json(const Scenario& sc);
std::string estimate_text(const Scenario& sc);

}  // namespace megascope::cli
