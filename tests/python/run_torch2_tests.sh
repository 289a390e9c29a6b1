#!/usr/bin/env bash
# tests/python/test_torch_*.py, test_lightning.py, test_accelerate.py and the rest of lbbsp.torch's tests (every
# test_*.py there but the core's) on the PyTorch users run: 2.x from PyPI
# (LBBSP_TORCH2_SPEC, default the pin below) with Lightning and Accelerate (LBBSP_FRAMEWORKS_SPEC) in a virtual
# environment of its own, without Debian's 1.13 (no system site packages). The environment is built
# once per spec (~1.5 min, ~5.5 GB with the CUDA libraries PyPI's torch depends on) in LBBSP_TORCH2_VENV (default
# ~/.cache/lbbsp/) and reused; the lbbsp wheel is python.package's (same build) or built here, and reinstalled
# into it on every run. $1 = lbbsp (the binary), $2 = scratch folder.
set -euo pipefail
SRC=${LBBSP_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
LBBSP=$(realpath "$1")
SCRATCH=$2
PY=${LBBSP_TEST_PYTHON:-/usr/bin/python3}
SPEC=${LBBSP_TORCH2_SPEC:-torch==2.15.0}
FRAMEWORKS=${LBBSP_FRAMEWORKS_SPEC:-lightning==2.6.6 accelerate==1.15.0}
VENV=${LBBSP_TORCH2_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/lbbsp/venv-$(tr -c 'A-Za-z0-9.\n' _ <<<"$SPEC")}
WHEELS=${LBBSP_WHEEL_DIR:-$(dirname "$SCRATCH")/python.package/wheel}
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"

if ! "$VENV/bin/python" -c "import torch, h5py, pytest, numpy" 2>/dev/null; then
  echo "run_torch2_tests.sh: building $VENV ($SPEC from PyPI)"
  rm -rf "$VENV" && mkdir -p "$(dirname "$VENV")"
  "$PY" -m venv "$VENV" || { echo "FAIL: $PY -m venv failed: install python3-venv (scripts/setup.sh does)" >&2; exit 1; }
  "$VENV/bin/pip" install -q "$SPEC" numpy h5py pytest pytest-xdist ||
    { rm -rf "$VENV"; echo "FAIL: pip install $SPEC from PyPI failed (network?)" >&2; exit 1; }
fi
if ! "$VENV/bin/python" -c "import xdist" 2>/dev/null; then  # a venv cached before the tests ran in parallel
  "$VENV/bin/pip" install -q pytest-xdist || { echo "FAIL: pip install pytest-xdist from PyPI failed (network?)" >&2; exit 1; }
fi
if ! "$VENV/bin/python" -c "import lightning, accelerate" 2>/dev/null; then
  # shellcheck disable=SC2086 # FRAMEWORKS is a list of requirement specs
  "$VENV/bin/pip" install -q $FRAMEWORKS || { echo "FAIL: pip install $FRAMEWORKS from PyPI failed (network?)" >&2; exit 1; }
fi
version=$("$VENV/bin/python" -c "import torch; print(torch.__version__)")
[[ $version == 2.* ]] || { echo "FAIL: $VENV has torch $version, not 2.x" >&2; exit 1; }
echo "run_torch2_tests.sh: torch $version in $VENV"

wheel=$(ls "$WHEELS"/lbbsp-*.whl 2>/dev/null | head -1 || true)
if [[ -z $wheel ]]; then
  "$VENV/bin/pip" wheel -q --no-deps -w "$SCRATCH/wheel" "$SRC"
  wheel=$(ls "$SCRATCH"/wheel/lbbsp-*.whl)
fi
"$VENV/bin/pip" install -q --force-reinstall --no-deps "$wheel"
cd "$SCRATCH"
# lbbsp.torch's C++ step path, built here once (~30 s, cached) rather than inside the first test's ranks: the tests
# of the DDP path run on it and check that they did.
LBBSP_TORCH_NATIVE=1 "$VENV/bin/python" -c "from lbbsp.torch import native; native.extension()" ||
  { echo "FAIL: lbbsp.torch's C++ step path did not build (needs g++ and ninja: scripts/setup.sh)" >&2; exit 1; }
# One test per core at a time (pytest-xdist): most of a test's time is its ranks starting and waiting on each
# other, and none races the clock (docs/testing.md).
# Every tests/python/test_*.py but the core's and the benchmarks' (test_package.py, test_replay.py,
# test_bench_oracle.py: python.package runs them), by its path in the tree: pytest puts tests/python on sys.path,
# where the test modules find harness.py.
tests=()
for f in "$SRC"/tests/python/test_*.py; do
  case ${f##*/} in test_package.py | test_replay.py | test_bench_oracle.py) ;; *) tests+=("$f") ;; esac
done
LBBSP_BIN=$LBBSP "$VENV/bin/python" -m pytest -q -p no:cacheprovider -n "$(nproc)" "${tests[@]}"
