# Shared start of the single-node Slurm tests; source it from tests/slurm/test_*.sh (which set `here` to their
# folder). Gives: the helpers of tests/cli/common.sh and tests/slurm/minicluster.sh, SRC (the source tree), LBBSP
# as an absolute path, the python of pick_python.sh, a private Slurm running (stopped on exit, its logs kept in
# $SCRATCH/daemon-logs; PASS or FAILED printed), and a small dataset $SCRATCH/data.h5.
# shellcheck shell=bash
# shellcheck source=tests/cli/common.sh
source "$here/../cli/common.sh"
# shellcheck source=tests/slurm/minicluster.sh
source "$here/minicluster.sh"
SRC=${LBBSP_SOURCE_DIR:-$(cd "$here/../.." && pwd)}
LBBSP=$(cd "$(dirname "$LBBSP")" && pwd)/$(basename "$LBBSP")
[[ -x $LBBSP ]] || fail "lbbsp binary '$LBBSP' missing: build it first (cmake --build build)"
# shellcheck source=tests/slurm/pick_python.sh
source "$here/pick_python.sh"

minicluster_check
# Sockets have a ~100-byte path limit and build folders can be deep: the daemons live in a short /tmp folder.
MC=$(mktemp -d /tmp/lbbsp-slurm.XXXXXX)
cleanup() {
  local rc=$?
  minicluster_stop || true
  if [[ -d $MC ]]; then
    mkdir -p "$SCRATCH/daemon-logs"
    cp -r "$MC/log/." "$MC/slurm.conf" "$SCRATCH/daemon-logs/" 2>/dev/null || true
    rm -rf "$MC"
  fi
  ((rc == 0)) && echo "PASS ($SECONDS s)" || echo "FAILED (exit $rc) after $SECONDS s; logs in $SCRATCH" >&2
}
trap cleanup EXIT
trap 'exit 143' TERM HUP
trap 'exit 130' INT
minicluster_start "$MC"

timeout 60 "$LBBSP" data synth --samples 2048 --features 16 --classes 4 --seed 5 --out "$SCRATCH/data.h5" >/dev/null ||
  fail "lbbsp data synth failed"
