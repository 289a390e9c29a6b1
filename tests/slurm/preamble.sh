# The start every Slurm test shares (tests/slurm/ and tests/multihost/test_slurm_*.sh); source it first. Gives the
# helpers of tests/cli/common.sh (LBBSP, SCRATCH, fail, ...) and tests/slurm/minicluster.sh, SRC (the source
# tree), LBBSP as an absolute path (the jobs run elsewhere) and PYTHON (tests/slurm/pick_python.sh).
# shellcheck shell=bash
slurm_tests=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/cli/common.sh
source "$slurm_tests/../cli/common.sh"
# shellcheck source=tests/slurm/minicluster.sh
source "$slurm_tests/minicluster.sh"
# shellcheck disable=SC2034 # read by the tests that source this
SRC=${LBBSP_SOURCE_DIR:-$(cd "$slurm_tests/../.." && pwd)}
LBBSP=$(cd "$(dirname "$LBBSP")" && pwd)/$(basename "$LBBSP")
[[ -x $LBBSP ]] || fail "lbbsp binary '$LBBSP' missing: build it first (cmake --build build)"
# shellcheck source=tests/slurm/pick_python.sh
source "$slurm_tests/pick_python.sh"
