#!/usr/bin/env bash
# The Python package as a user installs it: `pip wheel` of the source tree (scikit-build-core + nanobind from
# PyPI), the wheel installed into a fresh virtual environment of Debian's python3, and tests/python/test_*.py run
# from outside the source tree so that `import lbbsp` can only find the installed package.
# $1 = lbbsp (the binary the cross-checks run), $2 = scratch folder.
source "$(dirname "$0")/venv_prelude.sh"
"$SCRATCH/venv/bin/pip" wheel -q --no-deps -w "$SCRATCH/wheel" "$SRC"
"$SCRATCH/venv/bin/pip" install -q "$SCRATCH"/wheel/lbbsp-*.whl
"$SCRATCH/venv/bin/python" -c "import pytest" 2>/dev/null || "$SCRATCH/venv/bin/pip" install -q pytest
cd "$SCRATCH"
# One test per core at a time where pytest-xdist is installed (python3-pytest-xdist, scripts/setup.sh).
parallel=()
"$SCRATCH/venv/bin/python" -c "import xdist" 2>/dev/null && parallel=(-n "$(nproc)")
# Every tests/python/test_*.py but Lightning's and Accelerate's (python.torch2 installs those frameworks), by its
# path in the tree: pytest puts tests/python on sys.path, where the test modules find harness.py.
tests=()
for f in "$SRC"/tests/python/test_*.py; do
  case ${f##*/} in test_lightning*.py | test_accelerate*.py) ;; *) tests+=("$f") ;; esac
done
LBBSP_BIN=$LBBSP "$SCRATCH/venv/bin/python" -m pytest -q -p no:cacheprovider "${parallel[@]}" "${tests[@]}"
