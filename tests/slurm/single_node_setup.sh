# Shared start of the single-node Slurm tests; source it from tests/slurm/test_*.sh (which set `here` to their
# folder). Gives what tests/slurm/preamble.sh gives (common helpers, SRC, absolute LBBSP, PYTHON), a private Slurm
# running (stopped on exit, its logs kept in $SCRATCH/daemon-logs; PASS or FAILED printed), and a small dataset
# $SCRATCH/data.h5.
# shellcheck shell=bash
# shellcheck source=tests/slurm/preamble.sh
source "$here/preamble.sh"

minicluster_check
# Sockets have a ~100-byte path limit and build folders can be deep: the daemons live in a short /tmp folder.
MC=$(mktemp -d /tmp/lbbsp-slurm.XXXXXX)
cleanup() {
  local rc=$?
  minicluster_teardown "$MC"
  ((rc == 0)) && echo "PASS ($SECONDS s)" || echo "FAILED (exit $rc) after $SECONDS s; logs in $SCRATCH" >&2
}
trap cleanup EXIT
trap 'exit 143' TERM HUP
trap 'exit 130' INT
minicluster_start "$MC"

timeout 60 "$LBBSP" data synth --samples 2048 --features 16 --classes 4 --seed 5 --out "$SCRATCH/data.h5" >/dev/null ||
  fail "lbbsp data synth failed"
