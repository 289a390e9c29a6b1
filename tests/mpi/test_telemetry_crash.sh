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
# Rank 0 is now in the allreduce of iteration HANG. Wait until the timeline writer (a thread) has written the
# window's last iteration before the hang and the flush after iteration 999, and the telemetry file (open,
# without a lock) reads back every row up to that flush, while the run goes on.
flushed() {
  /usr/bin/python3 - "$SCRATCH" $RANKS $HANG 2>/dev/null <<'PY'
import json, sys, h5py
d, ranks, hang = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t = json.load(open(d + "/timeline.json"))
assert any(e.get("tid") == "compute" and e["args"]["iteration"] == hang - 1 for e in t)
assert any(e.get("tid") == "io" and e["name"] == "telemetry flush" for e in t)
assert len(h5py.File(d + "/run/telemetry.h5", "r")["records"]["iteration"]) >= hang * ranks
PY
}
wait_until 60 flushed || fail "the timeline and telemetry did not reach iteration $((HANG - 1)) within 60 s of the hang"
kill -0 $job 2>/dev/null || fail "the run ended before the kill: $(tail -n 5 "$SCRATCH/run.log")"
echo "ok: telemetry and timeline read back up to iteration $((HANG - 1)) while the run goes on"
pids=$(rank_pids "--seed 424242")
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
