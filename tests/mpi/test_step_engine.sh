# StepEngine's modes (host, device/staged, device/cuda-aware with a host-memory stand-in for the GPU) across 2 and
# 3 ranks: the same trajectory in every mode and the extra floats summed over ranks (tests/unit/test_step_engine.cpp).
source "$(dirname "$0")/../cli/common.sh"
BIN=$(dirname "$LBBSP")/tests/test_step_engine
[[ -x $BIN ]] || fail "$BIN not built (cmake --build BUILD --target test_step_engine)"
for np in 2 3; do
  mpirun_n "$np" "$BIN" --gtest_brief=1 || fail "test_step_engine failed on $np ranks"
done
echo "step engine passed on 2 and 3 ranks"
