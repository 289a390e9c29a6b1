# --lag L for any L >= 0: with a seeded balancer (random:SEED, whose splits ignore the reports) a run at lag L uses
# the lag-0 run's batch vectors L iterations later, the first L + 1 iterations on the initial split; the
# parameters stay those of one process (the split never changes the summed gradient); a run stopped and resumed
# at lag 3 ends bit-identical to an uninterrupted one.
source "$(dirname "$0")/../cli/common.sh"
PY=/usr/bin/python3
DATA=$SCRATCH/synth.h5
"$LBBSP" data synth --samples 1024 --features 32 --classes 4 --seed 1 --out "$DATA" >/dev/null

# train LAG NAME MAX_IT [extra...]: 3 ranks, random:7, telemetry in $SCRATCH/NAME
train() {
  local lag=$1 name=$2 max=$3; shift 3
  mpirun_n 3 "$LBBSP" train --data "$DATA" --model mlp --hidden 16 --global-batch 48 --lr 0.05 \
    --lr-schedule constant --balancer random:7 --lag "$lag" --max-iterations "$max" --seed 3 --test-subset 128 \
    --quiet --log-dir "$SCRATCH/$name" --save-params "$SCRATCH/$name.h5" "$@"
}
for lag in 0 1 2 5; do train "$lag" "lag$lag" 20; done

$PY - "$SCRATCH" <<'PYEOF'
import sys, h5py, numpy as np
d = sys.argv[1]
def batches(name):
    with h5py.File(f"{d}/{name}/telemetry.h5", "r") as f:
        it, rank, b = (f["records"][k][:] for k in ("iteration", "rank", "batch"))
    return np.array([[b[(it == t) & (rank == r)][0] for r in range(3)] for t in range(20)])
b0 = batches("lag0")
assert len({tuple(v) for v in b0[1:]}) > 5, f"random:7 should change the split: {b0[:6]}"
for lag in (1, 2, 5):
    b = batches(f"lag{lag}")
    assert (b[:lag + 1] == b0[0]).all(), (lag, b[:lag + 1], b0[0])
    assert (b[lag + 1:] == b0[1:20 - lag]).all(), (lag, b[lag + 1:lag + 4], b0[1:4])
    print(f"ok: lag {lag} runs lag 0's batch vectors {lag} iterations later")
PYEOF
for lag in 1 2 5; do "$PY" "$(dirname "$0")/../tools/compare_params.py" "$SCRATCH/lag0.h5" "$SCRATCH/lag$lag.h5" 1e-5; done

# Stopped at 10 (checkpoint every 4: 8 and 10 kept) and resumed at lag 3: the queue of 3 decisions made ahead and
# the balancer's state come back, so the parameters and every later batch vector equal the uninterrupted run's.
train 3 full 20
train 3 part 10 --checkpoint-dir "$SCRATCH/ck" --checkpoint-every 4
train 3 resumed 20 --checkpoint-dir "$SCRATCH/ck" --resume
"$PY" - "$SCRATCH" <<'PYEOF'
import sys, h5py, numpy as np
d = sys.argv[1]
def batches(name):
    with h5py.File(f"{d}/{name}/telemetry.h5", "r") as f:
        it, rank, b = (f["records"][k][:] for k in ("iteration", "rank", "batch"))
    return {(int(t), int(r)): int(x) for t, r, x in zip(it, rank, b)}
with h5py.File(f"{d}/full.h5") as a, h5py.File(f"{d}/resumed.h5") as b:
    for k in a["params"]:
        assert a["params"][k][()].tobytes() == b["params"][k][()].tobytes(), f"lag 3 resumed: {k} differs"
full, resumed = batches("full"), batches("resumed")
later = {k: v for k, v in resumed.items() if k[0] >= 10}
assert later and all(full[k] == v for k, v in later.items()), "lag 3: batch vectors after the resume differ"
print("ok: lag 3 resumed at 10 is bit-identical, with the same batch vectors")
PYEOF
echo "lag tests passed"
