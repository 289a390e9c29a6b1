#!/usr/bin/env bash
# ruff over the Python in python/ scripts/ dev/ tests/ examples/ bench/ runtime/, rules from pyproject.toml [tool.ruff].
# ruff is not a Debian package: it is installed from PyPI, pinned, into a virtual environment of its own outside the
# tree (LBBSP_RUFF_VENV, default ~/.cache/lbbsp/venv-ruff), built when missing or of another version and reused.
#   test_ruff.sh [LBBSP (unused)] [SCRATCH (unused)]   LBBSP_RUFF_SPEC=ruff==X.Y.Z overrides the pin
# Fix what it names with `ruff check --fix` (import order, unused imports and noqa) or by hand (the rest).
set -euo pipefail
cd "${LBBSP_SOURCE_DIR:-$(dirname "$0")/../..}"
PY=${LBBSP_TEST_PYTHON:-/usr/bin/python3}
SPEC=${LBBSP_RUFF_SPEC:-ruff==0.17.6}
VENV=${LBBSP_RUFF_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/lbbsp/venv-ruff}
RUFF=$VENV/bin/ruff

if [[ $("$RUFF" --version 2>/dev/null) != "ruff ${SPEC#ruff==}" ]]; then
  echo "test_ruff.sh: installing $SPEC into $VENV"
  rm -rf "$VENV" && mkdir -p "$(dirname "$VENV")"
  "$PY" -m venv "$VENV" || { echo "FAIL: $PY -m venv failed: install python3-venv (scripts/setup.sh does)"; exit 1; }
  "$VENV/bin/pip" install -q "$SPEC" || { rm -rf "$VENV"; echo "FAIL: pip install $SPEC from PyPI failed (network?)"; exit 1; }
fi
if ! findings=$("$RUFF" check --no-cache --output-format concise python scripts dev tests examples bench runtime 2>&1); then
  echo "FAIL: ruff ($("$RUFF" --version)) findings; \`$RUFF check --fix\` fixes those marked [*]:"
  echo "$findings"
  exit 1
fi
echo "ok: $("$RUFF" --version), no findings in $(git ls-files 'python/*.py' 'scripts/*.py' 'dev/*.py' 'tests/*.py' 'examples/*.py' 'bench/*.py' 'runtime/*.py' | wc -l) files"
