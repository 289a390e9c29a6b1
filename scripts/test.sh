#!/usr/bin/env bash
# Set up, build and run the whole test suite with CTest. Extra arguments go to ctest (e.g. -L unit).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cd build
ctest --output-on-failure --timeout 900 "$@"
