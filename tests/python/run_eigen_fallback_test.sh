#!/usr/bin/env bash
# `pip install .` on a node without Eigen's headers: the wheel built with the system's Eigen hidden from CMake
# (CMAKE_IGNORE_PREFIX_PATH=/usr) must take them from the cmeel-eigen wheel (PyPI, a build requirement in
# pyproject.toml) and decide exactly as `lbbsp simulate` does (test_package.py's bit-for-bit replays, the state
# round trips). $1 = lbbsp (the binary the replays compare with), $2 = scratch folder.
source "$(dirname "$0")/venv_prelude.sh"
"$SCRATCH/venv/bin/pip" wheel -v --no-deps -w "$SCRATCH/wheel" "$SRC" --config-settings=cmake.define.CMAKE_IGNORE_PREFIX_PATH=/usr \
  --config-settings=build-dir="$SCRATCH/build" >"$SCRATCH/build.log" 2>&1 ||
  { tail -n 30 "$SCRATCH/build.log"; echo "FAIL: pip wheel with the system's Eigen hidden" >&2; exit 1; }
grep -E "lbbsp: Eigen 3\.[0-9.]+ from .*/cmeel\.prefix/" "$SCRATCH/build.log" ||
  { grep -n "lbbsp: Eigen" "$SCRATCH/build.log"; echo "FAIL: the build did not take Eigen from cmeel-eigen" >&2; exit 1; }
"$SCRATCH/venv/bin/pip" install -q "$SCRATCH"/wheel/lbbsp-*.whl
"$SCRATCH/venv/bin/python" -c "import pytest" 2>/dev/null || "$SCRATCH/venv/bin/pip" install -q pytest
cd "$SCRATCH"
LBBSP_BIN=$LBBSP "$SCRATCH/venv/bin/python" -m pytest -q -p no:cacheprovider "$SRC/tests/python/test_package.py" \
  -k "installed_not_source_tree or same_batch_vectors or state_round_trip"
