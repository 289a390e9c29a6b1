#!/usr/bin/env bash
# dev/experiment.py --smoke: 3 balancers, static stragglers, a few iterations on synthetic data; checks that
# results.md, results.csv and the PNG plots are written and the numbers are sane.
source "$(dirname "$0")/common.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3
$PY -c "import numpy, h5py, matplotlib" 2>/dev/null || { echo "SKIP: needs numpy, h5py, matplotlib for $PY"; exit 0; }

"$LBBSP" data synth --samples 6000 --features 784 --classes 10 --seed 1 --out "$SCRATCH/synth.h5" >/dev/null
timeout 500 $PY "$ROOT/dev/experiment.py" --smoke --lbbsp "$LBBSP" --data "$SCRATCH/synth.h5" \
  --out "$SCRATCH/out" >"$SCRATCH/log.txt" 2>&1 || { cat "$SCRATCH/log.txt"; fail "experiment.py --smoke failed"; }

for f in results.md results.csv batch_sizes_static.png iteration_time_static.png speed_static.png \
  accuracy_static.png speedup.png; do
  [[ -s $SCRATCH/out/$f ]] || fail "missing $f in $SCRATCH/out"
done
grep -q "| static | oracle |" "$SCRATCH/out/results.md" || fail "no oracle row in results.md"

$PY - "$SCRATCH/out/results.csv" <<'PY'
import csv, sys
rows = {r["balancer"]: r for r in csv.DictReader(open(sys.argv[1]))}
assert set(rows) == {"bsp", "lbbsp-cpu/last", "oracle"}, rows.keys()
f = lambda b, k: float(rows[b][k])
assert abs(f("oracle", "efficiency_vs_oracle") - 1) < 1e-9, rows["oracle"]
assert abs(f("bsp", "speedup_vs_bsp") - 1) < 1e-9, rows["bsp"]
for b in rows:
    assert 0 < f(b, "mean_iteration_s") < 5, rows[b]
    assert 0 <= f(b, "wait_fraction") < 1, rows[b]
    assert 0 <= f(b, "test_accuracy") <= 1, rows[b]
# Speed comparisons between balancers are wall-clock measurements: they belong to the experiment's report, not to
# this test (a loaded machine can reorder them).
print("ok: smoke experiment numbers are sane")
PY

# A run that ended at chance accuracy is flagged as collapsed (its accuracy columns are not comparable): edit one
# run's summary to chance accuracy and rebuild the tables from the runs.
grep -q "collapsed)" "$SCRATCH/out/results.md" && fail "a smoke run was flagged as collapsed before the edit"
$PY - "$SCRATCH/out/runs/static/bsp-r0/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["test_accuracy"] = 0.1
json.dump(s, open(sys.argv[1], "w"))
PY
timeout 500 $PY "$ROOT/dev/experiment.py" --smoke --rebuild --lbbsp "$LBBSP" --data "$SCRATCH/synth.h5" \
  --out "$SCRATCH/out" >"$SCRATCH/log-rebuild.txt" 2>&1 || { cat "$SCRATCH/log-rebuild.txt"; fail "--rebuild failed"; }
grep -q "| static | bsp | .* | 0.1000 (collapsed) |" "$SCRATCH/out/results.md" ||
  { cat "$SCRATCH/out/results.md"; fail "the collapsed bsp run is not flagged in results.md"; }
[[ $(grep -c "(collapsed)" "$SCRATCH/out/results.md") -eq 1 ]] || fail "runs other than bsp flagged as collapsed"
$PY - "$SCRATCH/out/results.csv" <<'PY'
import csv, sys
rows = {r["balancer"]: r for r in csv.DictReader(open(sys.argv[1]))}
assert rows["bsp"]["collapsed"] == "1" and rows["oracle"]["collapsed"] == "0", rows
PY
echo "ok: a run at chance accuracy is flagged as collapsed"

# A run that fails makes the whole experiment fail, naming the run and its error (a wrapper fails oracle's ranks).
cat >"$SCRATCH/lbbsp_failing_oracle" <<EOF
#!/usr/bin/env bash
for arg in "\$@"; do [[ \$arg == oracle ]] && { echo "lbbsp: rank 0: error: injected by the test" >&2; exit 3; }; done
exec "$LBBSP" "\$@"
EOF
chmod +x "$SCRATCH/lbbsp_failing_oracle"
rc=0
timeout 500 $PY "$ROOT/dev/experiment.py" --smoke --balancers bsp,oracle --lbbsp "$SCRATCH/lbbsp_failing_oracle" \
  --data "$SCRATCH/synth.h5" --out "$SCRATCH/out-fail" >"$SCRATCH/log-fail.txt" 2>&1 || rc=$?
[[ $rc -ne 0 ]] || { cat "$SCRATCH/log-fail.txt"; fail "experiment.py exited 0 although the oracle run failed"; }
grep -q "1 run(s) failed" "$SCRATCH/log-fail.txt" && grep -q "static/oracle r0: lbbsp: rank 0: error: injected" \
  "$SCRATCH/log-fail.txt" || { cat "$SCRATCH/log-fail.txt"; fail "the failed run is not named"; }
echo "ok: a failed run fails the experiment and is named"

# --trace-ceiling reads every utilisation format it names, on traces with a known answer: capacities 1, 0.5, 0.25, 1
# (PlanetLab) give a perfect split over an equal one 4 / (4 / 2.75) = 2.75x; equal utilisation (Bitbrains, other
# columns varying) 1.00x; capacities 1, 1, 0.5, 0.5 (Alibaba) 1.50x.
CT=$SCRATCH/ceiling
mkdir -p "$CT/planetlab/day" "$CT/bitbrains/month"
for vm_u in 1:0 2:50 3:75 4:0; do
  u=${vm_u#*:}
  seq 288 | sed "s/.*/$u/" >"$CT/planetlab/day/vm${vm_u%%:*}"
done
for vm in 1 2 3 4; do
  {
    printf '%s;\t' "Timestamp [ms]" "CPU cores" "CPU capacity provisioned [MHZ]" "CPU usage [MHZ]" "CPU usage [%]" \
      "Memory capacity provisioned [KB]" "Memory usage [KB]" "Disk read throughput [KB/s]" \
      "Disk write throughput [KB/s]" "Network received throughput [KB/s]"
    echo "Network transmitted throughput [KB/s]"
    for i in $(seq 0 400); do
      echo "$((1372629600 + 300 * i));	4;	11704;	$((i * vm % 97));	50.0;	1000;	$((i * vm % 89));	1;	2;	3;	4"
    done
  } | gzip >"$CT/bitbrains/month/$vm.csv.gz"
done
for m in 1 2 3 4; do
  for i in $(seq 0 600); do echo "m_$m,$((60 * i)),$(((m - 1) / 2 * 50)),40,,,1,1,1"; done
done | gzip >"$CT/alibaba.csv.gz"
check_ceiling() {  # PATH EXPECTED_MEDIAN
  local out
  out=$($PY "$ROOT/dev/experiment.py" --lbbsp "$LBBSP" --trace-ceiling --ceiling-trace "$1" --ceiling-ranks 4 2>&1) ||
    fail "--trace-ceiling on $1 failed: $out"
  grep -q "^| 4 | co-located (align=time) | $2 | $2 |" <<<"$out" || fail "$1: expected median $2, got: $out"
  grep -q "^| 4 | independent (align=random) | $2 | $2 |" <<<"$out" || fail "$1: expected $2 independent: $out"
}
check_ceiling "$CT/planetlab" 2.75x
check_ceiling "$CT/bitbrains" 1.00x
check_ceiling "$CT/alibaba.csv.gz" 1.50x
expect_fail "no trace '/nonexistent/trace'" $PY "$ROOT/dev/experiment.py" --lbbsp "$LBBSP" --trace-ceiling \
  --ceiling-trace /nonexistent/trace
expect_fail "no lbbsp binary at '/nonexistent/lbbsp'" $PY "$ROOT/dev/experiment.py" --lbbsp /nonexistent/lbbsp \
  --trace-ceiling --ceiling-trace "$CT/planetlab"
printf "10\nnot a number\n" >"$CT/planetlab/day/broken"
expect_fail "cannot read utilisation trace .*planetlab/day/broken:2: bad CPU % value 'not a number'" \
  $PY "$ROOT/dev/experiment.py" --lbbsp "$LBBSP" --trace-ceiling --ceiling-trace "$CT/planetlab"
echo "ok: --trace-ceiling on PlanetLab, Bitbrains and Alibaba formats"
