#!/usr/bin/env bash
# `cmake --install` ships what `lbbsp report --png` runs: the installed binary draws the figures with the installed
# report_figures.py (PREFIX/share/lbbsp/), never the source tree's; without it, the error names the path it looked at.
# Installs the component "runtime" of the build tree the tested binary lives in (build/lbbsp -> build/).
source "$(dirname "$0")/common.sh"
BUILD=$(dirname "$LBBSP")
PREFIX=$SCRATCH/prefix
[[ -f $BUILD/cmake_install.cmake ]] || fail "no cmake_install.cmake beside $LBBSP: not a binary of a CMake build tree"
cmake --install "$BUILD" --prefix "$PREFIX" --component runtime >"$SCRATCH/install.log" 2>&1 ||
  { cat "$SCRATCH/install.log"; fail "cmake --install $BUILD --component runtime failed"; }
BIN=$PREFIX/bin/lbbsp
SCRIPT=$PREFIX/share/lbbsp/report_figures.py
[[ -x $BIN ]] || fail "cmake --install put no bin/lbbsp into $PREFIX: $(cat "$SCRATCH/install.log")"
[[ -f $SCRIPT ]] ||
  fail "cmake --install put no share/lbbsp/report_figures.py into $PREFIX: $(cat "$SCRATCH/install.log")"

"$BIN" data synth --samples 1024 --features 16 --classes 4 --seed 1 --out "$SCRATCH/d.h5" >/dev/null
mpirun_n 2 "$BIN" train --data "$SCRATCH/d.h5" --model logreg --global-batch 64 --epochs 1 --max-iterations 20 \
  --balancer lbbsp-cpu --predictor ema --straggle "static:1,0.5" --log-dir "$SCRATCH/run" --quiet
"$BIN" report "$SCRATCH/run" --png "$SCRATCH/png" >"$SCRATCH/report.md" 2>"$SCRATCH/report.err" ||
  fail "installed lbbsp report --png failed: $(cat "$SCRATCH/report.err")"
for f in iteration_time batch_split wait; do
  [[ -s $SCRATCH/png/$f.png ]] || fail "installed lbbsp report --png wrote no $f.png"
done
echo "ok: the installed lbbsp report --png drew its figures with $SCRIPT"

# Without the installed script the installed binary fails naming that path (the source tree's copy is not used).
rm "$SCRIPT"
expect_fail "report_figures.py, not found at '$SCRIPT'" "$BIN" report "$SCRATCH/run" --png "$SCRATCH/png2"
expect_fail "not found at '$SCRATCH/none.py' \(named by .LBBSP_REPORT_FIGURES\)" \
  env LBBSP_REPORT_FIGURES="$SCRATCH/none.py" "$BIN" report "$SCRATCH/run" --png "$SCRATCH/png3"
echo "test_install_report: ok"
