# StepEngine's modes (host, device/staged, device/cuda-aware with a host-memory stand-in for the GPU) across 2 and
# 3 ranks: the same trajectory in every mode and the extra floats summed over ranks (tests/unit/test_step_engine.cpp).
source "$(dirname "$0")/../cli/common.sh"
BIN=$(dirname "$LBBSP")/tests/test_step_engine
[[ -x $BIN ]] || fail "$BIN not built (cmake --build BUILD --target test_step_engine)"
for np in 2 3; do
  mpirun_n "$np" "$BIN" --gtest_brief=1 || fail "test_step_engine failed on $np ranks"
done
echo "step engine passed on 2 and 3 ranks"

# When MPI cannot make the node's shared window (here: Open MPI without its shared-memory one-sided component),
# --allreduce auto warns and falls back to MPI_Allreduce, and --allreduce node stops every rank with a message.
"$MPIEXEC" --version 2>&1 | grep -qiE "open ?mpi|openrte|open-mpi" ||
  fail "these checks disable Open MPI's osc/sm; MPIEXEC is not Open MPI"
"$LBBSP" data synth --samples 600 --features 16 --classes 3 --seed 1 --out "$SCRATCH/small.h5" >/dev/null ||
  fail "data synth failed"
train=(train --data "$SCRATCH/small.h5" --model logreg --global-batch 32 --max-iterations 5 --eval-every 1000)
OMPI_MCA_osc="^sm" mpirun_n 2 "$LBBSP" "${train[@]}" --summary-json "$SCRATCH/fallback.json" \
  >"$SCRATCH/fallback.log" 2>&1 ||
  { cat "$SCRATCH/fallback.log"; fail "--allreduce auto without shared memory failed instead of falling back"; }
grep -q "warning: no shared memory for --allreduce node; using MPI_Allreduce" "$SCRATCH/fallback.log" ||
  fail "no fallback warning: $(cat "$SCRATCH/fallback.log")"
grep -q '"step_mode": *"host"' "$SCRATCH/fallback.json" || fail "fallback run's step_mode is not host"
mpirun_n 2 "$LBBSP" "${train[@]}" --summary-json "$SCRATCH/shared.json" >/dev/null 2>&1 || fail "2-rank run failed"
grep -q '"step_mode": *"host/node-shared"' "$SCRATCH/shared.json" || fail "2 ranks on one node did not share memory"
OMPI_MCA_osc="^sm" expect_fail "--allreduce node: MPI could not allocate memory shared by this node's ranks" \
  mpirun_n 2 "$LBBSP" "${train[@]}" --allreduce node
echo "ok: no shared window: auto falls back, node stops"
