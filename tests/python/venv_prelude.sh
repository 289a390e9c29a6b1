# Sourced by the tests that build the wheel themselves (run_package_tests.sh, run_eigen_fallback_test.sh): the
# source tree, the lbbsp binary ($1), a fresh scratch folder ($2) and in it a virtual environment of Debian's
# python3 that sees its system packages (NumPy, PyTorch 1.13).
set -euo pipefail
SRC=${LBBSP_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
LBBSP=$(realpath "$1")
SCRATCH=$2
PY=${LBBSP_TEST_PYTHON:-/usr/bin/python3}
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"
"$PY" -m venv --system-site-packages "$SCRATCH/venv" || {
  echo "FAIL: $PY -m venv failed: install python3-venv (scripts/setup.sh does)" >&2; exit 1; }
