# Sets PYTHON to a Python 3 that imports numpy and h5py ($PYTHON if given, else python3, else /usr/bin/python3:
# a pyenv or venv python3 earlier on PATH often lacks Debian's python3-h5py). Fails with what to install.
# shellcheck shell=bash
pick_python() {
  local p
  for p in ${PYTHON:-} python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null && "$p" -c 'import numpy, h5py' 2>/dev/null; then
      PYTHON=$(command -v "$p")
      return 0
    fi
  done
  echo "FAIL: no Python 3 with numpy and h5py (tried ${PYTHON:-} python3 /usr/bin/python3): install the Debian" \
    "packages python3-numpy python3-h5py (scripts/setup.sh does) or set PYTHON=/path/to/python3" >&2
  exit 1
}
pick_python
