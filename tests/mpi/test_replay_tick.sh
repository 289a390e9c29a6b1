# tick=S: the emulation's clock advances S seconds per iteration, so balancers of different speeds meet the same
# capacity sequence (with the wall clock a slower balancer replays more of the trace). Runs bsp and oracle on 2
# ranks and compares the capacities recorded in their telemetry, iteration by iteration.
source "$(dirname "$0")/../cli/common.sh"
DATA=$SCRATCH/d.h5 TRACE=$SCRATCH/trace.csv
"$LBBSP" data synth --samples 2048 --features 32 --classes 4 --seed 2 --out "$DATA" >/dev/null
{
  echo "time_s,capacity"
  for i in $(seq 0 39); do echo "$i,0.$(((i * 37) % 9 + 1))"; done
} >"$TRACE"
for b in bsp oracle; do
  mpirun_n 2 "$LBBSP" train --data "$DATA" --model logreg --global-batch 256 --epochs 10 --max-iterations 40 --balancer $b \
    --straggle "trace:$TRACE;scale=0.1;offset=0,5;tick=0.03;gpu=0:0:0.00005:100000" --log-dir "$SCRATCH/$b" \
    --quiet || fail "training with $b failed"
done
/usr/bin/python3 - "$SCRATCH/bsp/telemetry.h5" "$SCRATCH/oracle/telemetry.h5" <<'PY' || fail "capacity sequences differ"
import sys, h5py, numpy as np
seqs = []
for f in sys.argv[1:]:
    with h5py.File(f) as h:
        r = h["records"]
        it, rank, cap = r["iteration"][:], r["rank"][:], r["capacity"][:]
    order = np.lexsort((rank, it))
    seqs.append(np.stack([it[order], rank[order], cap[order]]))
a, b = seqs
assert a.shape == b.shape == (3, 80), (a.shape, b.shape)
assert np.array_equal(a, b), "capacities per (iteration, rank) differ between bsp and oracle"
assert len(np.unique(a[2])) > 3, "the trace should show several capacities"
print("same capacity sequence for bsp and oracle:", np.round(a[2][:8], 2), "...")
PY
echo "replay tick passed"
