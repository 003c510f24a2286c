#!/usr/bin/env bash
# Regenerates docs/validation.md (predicted vs published throughput) and
# topologies/validation/regimes.toml (the errors by class of run that simulate and plan state).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --build build --target validation_report
./build/bench/validation_report tests/reference topologies/validation/regimes.toml > docs/validation.md
echo "wrote docs/validation.md and topologies/validation/regimes.toml"
