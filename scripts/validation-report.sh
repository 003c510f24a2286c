#!/usr/bin/env bash
# Regenerates docs/validation.md: predicted vs published throughput.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --build build --target validation_report
./build/bench/validation_report tests/reference > docs/validation.md
echo "wrote docs/validation.md"
