#!/usr/bin/env bash
# Set up, build and run the test suite with CTest. Extra arguments go to ctest (e.g. -L unit). Without arguments
# everything runs except the ASan+UBSan rebuild (label asan: ./scripts/test.sh -L asan), which is not clean yet and
# takes ~25 min on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cd build
if (($#)); then
  ctest --output-on-failure --timeout 900 "$@"
else
  ctest --output-on-failure --timeout 900 -LE asan
fi
