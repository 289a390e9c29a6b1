# Real interference: a stress-ng co-tenant on rank 1's core shows up in rank 1's measured CPU availability and
# speed, and is gone when the job ends.
source "$(dirname "$0")/../cli/common.sh"
command -v stress-ng >/dev/null || fail "stress-ng is missing; run scripts/setup.sh"
DATA=$SCRATCH/synth.h5
"$LBBSP" data synth --samples 4000 --features 256 --classes 4 --seed 2 --out "$DATA" >/dev/null
load=$((95 + RANDOM % 5))  # busy nearly all the time; a value of this run's own, so that its co-tenant can be told apart
cotenant() { pgrep -f "stress-ng --cpu 1 --cpu-load $load " >/dev/null; }
# CPU time (clock ticks) the co-tenant's processes have used: it is interfering once this grows, not when it
# merely exists (stress-ng starts its worker some time after its own start, which a fast run can outpace).
cotenant_ticks() {
  local p total=0
  for p in $(pgrep -f "stress-ng --cpu 1 --cpu-load $load " || true); do  # stress-ng and its worker (a child)
    p="$p $(pgrep -P "$p" || true)"
    total=$((total + $(cat $(printf '/proc/%s/stat ' $p) 2>/dev/null | awk '{sub(/^.*\) /, ""); t += $12 + $13} END {print t + 0}')))
  done
  echo "$total"
}
cotenant_busy() { (($(cotenant_ticks) >= 30)); }
# A run that cannot end by itself (100,000 epochs): once its co-tenant is busy and 60 iterations more are done, SIGTERM
# stops it (exit 143) with its telemetry written.
mpirun_n 2 "$LBBSP" train --data "$DATA" --model mlp --hidden 256,256 --global-batch 128 --epochs 100000 \
  --bind core --straggle "stress:1=$load" --log-dir "$SCRATCH/run" --test-subset 100 --progress-every 1 \
  --seed 515151 >"$SCRATCH/run.log" 2>&1 &
job=$!
wait_until 120 cotenant_busy ||
  fail "no stress-ng co-tenant used CPU next to rank 1 within 120 s: $(tail -n 5 "$SCRATCH/run.log")"
# The iterations measured with the co-tenant busy: from the progress seen now on.
busy_from=$(($(progress_at "$SCRATCH/run.log") + 1))
wait_for_iteration "$SCRATCH/run.log" $((busy_from + 60)) 120
kill -TERM "$(find_rank_pid "--seed 515151")"
wait_job $job 60 "the run after SIGTERM"
((JOB_RC == 143)) || fail "the run ended with exit $JOB_RC, expected 143: $(tail -n 5 "$SCRATCH/run.log")"
/usr/bin/python3 - "$SCRATCH/run/telemetry.h5" "$busy_from" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    r = {k: f["records"][k][:] for k in f["records"].keys()}
late = r["iteration"] >= int(sys.argv[2])
cpu = [r["cpu_avail"][late & (r["rank"] == k)].mean() for k in (0, 1)]
speed = [np.median(r["actual_speed"][late & (r["rank"] == k)]) for k in (0, 1)]
print("mean cpu_avail per rank:", [round(c, 3) for c in cpu], " median speed:", [round(s) for s in speed])
# Rank 1 shares its core with a co-tenant busy nearly all the time, which the scheduler gives about half of it
# (0.46-0.47 measured on an idle 2-core VM): its measured availability must show it. (Rank 0's depends on
# whatever else runs on this machine, so it is only printed.)
assert cpu[1] < 0.75, "rank 1's co-tenant should show in its measured CPU availability"
PY
no_cotenant() { ! cotenant; }
wait_until 30 no_cotenant || fail "the stress-ng co-tenant outlived the job by 30 s"
echo "stress co-tenant ok"
