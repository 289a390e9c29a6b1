# Real interference: a stress-ng co-tenant on rank 1's core shows up in rank 1's measured CPU availability and
# speed, and is gone when the job ends.
source "$(dirname "$0")/../cli/common.sh"
command -v stress-ng >/dev/null || fail "stress-ng is missing; run scripts/setup.sh"
DATA=$SCRATCH/synth.h5
"$LBBSP" data synth --samples 4000 --features 256 --classes 4 --seed 2 --out "$DATA" >/dev/null
load=$((80 + RANDOM % 10))  # a load value of this run's own, so that its co-tenant can be told apart
# Watch for the co-tenant while the job runs.
( for _ in $(seq 300); do pgrep -f "stress-ng --cpu 1 --cpu-load $load " >/dev/null && { touch "$SCRATCH/seen"; break; }; sleep 0.1; done ) &
watcher=$!
mpirun_n 2 "$LBBSP" train --data "$DATA" --model mlp --hidden 256,256 --global-batch 128 --max-iterations 60 \
  --bind core --straggle "stress:1=$load" --log-dir "$SCRATCH/run" --test-subset 100 --quiet
wait $watcher || true
[[ -f $SCRATCH/seen ]] || fail "no stress-ng co-tenant ran next to rank 1"
/usr/bin/python3 - "$SCRATCH/run/telemetry.h5" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    r = {k: f["records"][k][:] for k in f["records"].keys()}
late = r["iteration"] >= 10
cpu = [r["cpu_avail"][late & (r["rank"] == k)].mean() for k in (0, 1)]
speed = [np.median(r["actual_speed"][late & (r["rank"] == k)]) for k in (0, 1)]
print("mean cpu_avail per rank:", [round(c, 3) for c in cpu], " median speed:", [round(s) for s in speed])
# Rank 1 shares its core with a co-tenant busy most of the time: its measured availability must show it.
# (Rank 0's depends on whatever else runs on this machine, so it is only printed.)
assert cpu[1] < 0.9, "rank 1's co-tenant should show in its measured CPU availability"
PY
sleep 0.5
if pgrep -f "stress-ng --cpu 1 --cpu-load $load " >/dev/null; then fail "the stress-ng co-tenant outlived the job"; fi
echo "stress co-tenant ok"
