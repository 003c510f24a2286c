#include "apps/expected_error.hpp"

namespace megascope::cli {

nlohmann::json expected_error_json(const ExpectedError& e) {
  nlohmann::json j;
  j["class"] = describe(e.regime);
  j["validated"] = e.stats.has_value();
  if (e.stats) {
    j["published_runs"] = e.stats->rows;
    j["mean_abs_error"] = e.stats->mean_abs_error;
    j["signed_mean_error"] = e.stats->signed_mean_error;
    j["worst_abs_error"] = e.stats->worst_abs_error;
    j["max_published_mfu"] = e.stats->max_published_mfu;
    j["mfu_above_published"] = e.above_published();
    j["tables"] = e.stats->tables;
  }
  return j;
}

}  // namespace megascope::cli
