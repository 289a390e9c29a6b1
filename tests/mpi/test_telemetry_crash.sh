# SIGKILL of the whole job mid-run: telemetry.h5 reads back with h5py and holds every row flushed before the kill
# (whole iterations, every field the same length, nothing zero-filled), and the timeline is valid JSON holding
# only the --timeline-iterations window; before the kill, h5py reads the file while the run holds it open.
# Rank 1 hangs at iteration HANG (--inject-fault), so the kill comes while rank 0 waits in the allreduce: the rows
# of the iterations before HANG are all flushed (every 200) by then.
source "$(dirname "$0")/../cli/common.sh"
DATA=$SCRATCH/synth.h5
"$LBBSP" data synth --samples 2048 --features 64 --classes 4 --seed 1 --out "$DATA" >/dev/null
RANKS=3 HANG=1000 BATCH=48
mpirun_n $RANKS "$LBBSP" train --data "$DATA" --model logreg --epochs 1000 --global-batch $BATCH \
  --max-iterations 5000 --balancer lbbsp-cpu --predictor ema --straggle "static:1,0.5,1" --test-subset 64 \
  --eval-every 1000000 --progress-every 100 --seed 424242 --inject-fault 1:$HANG:hang --iteration-timeout 120 \
  --log-dir "$SCRATCH/run" --timeline "$SCRATCH/timeline.json" --timeline-iterations 900:1100 \
  >"$SCRATCH/run.log" 2>&1 &
job=$!
wait_for_iteration "$SCRATCH/run.log" $HANG 120
sleep 1  # rank 0 is in the allreduce of iteration HANG; the timeline writer wakes every 0.2 s
# While the run goes on, the file (open, without a lock) reads back up to the last flush.
/usr/bin/python3 -c "
import sys, h5py
n = len(h5py.File(sys.argv[1], 'r')['records']['iteration'])
assert n >= $HANG * $RANKS, n
print('ok: read', n, 'rows while the run goes on')" "$SCRATCH/run/telemetry.h5" || fail "cannot read telemetry mid-run"
exe=$(readlink -f "$LBBSP")
pids=$(pgrep -f -- "--seed 424242" | while read -r p; do
  [[ $(readlink /proc/$p/exe 2>/dev/null) == "$exe" ]] && echo "$p"; done || true)
[[ $(wc -w <<<"$pids") -ge $RANKS ]] || fail "expected $RANKS ranks to kill, found: $pids"
kill -9 $pids
rc=0
wait $job || rc=$?
((rc != 0)) || fail "the job exited 0 after its ranks were killed"
echo "ok: killed ranks" $pids "(job exit $rc)"

/usr/bin/python3 - "$SCRATCH" $RANKS $HANG $BATCH <<'PY'
import json, sys
import h5py, numpy as np
d, ranks, hang, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
with h5py.File(d + "/run/telemetry.h5", "r") as f:
    g = f["records"]
    r = {k: g[k][:] for k in g.keys()}
    assert g.attrs["balancer"] == b"lbbsp-cpu" or g.attrs["balancer"] == "lbbsp-cpu", dict(g.attrs)
n = len(r["iteration"])
assert {len(v) for v in r.values()} == {n}, {k: len(v) for k, v in r.items()}
assert n >= hang * ranks and n % ranks == 0, (n, hang, ranks)  # flushed: every 200 iterations up to HANG
its = n // ranks
assert (r["iteration"] == np.repeat(np.arange(its), ranks)).all(), "rows are not whole iterations in order"
assert (r["rank"] == np.tile(np.arange(ranks), its)).all()
assert (r["batch"].reshape(its, ranks).sum(axis=1) == batch).all(), "an iteration's batches do not add up"
assert (r["compute_s"] > 0).all() and (r["capacity"] > 0).all(), "zero-filled rows"
assert np.allclose(r["capacity"][r["rank"] == 1], 0.5)
print(f"ok: {n} rows ({its} iterations x {ranks} ranks) read back after SIGKILL")

t = json.load(open(d + "/timeline.json"))  # valid JSON after the kill
compute = sorted({e["args"]["iteration"] for e in t if e.get("tid") == "compute"})
assert compute and compute[0] == 900 and compute[-1] == hang - 1, (compute[:3], compute[-3:])
assert len(compute) == hang - 900
assert {e["pid"] for e in t if e.get("ph") == "X"} == set(range(ranks))
io = [e for e in t if e.get("tid") == "io"]
assert any(e["name"] == "telemetry flush" for e in io), io[:3]  # the flush after iteration 999
print(f"ok: timeline valid JSON, iterations {compute[0]}..{compute[-1]} of the window, {len(io)} io slice(s)")
PY
echo "telemetry crash test passed"
