#!/usr/bin/env bash
# lbbsp predict-eval end to end: traces of every format in a directory (gzip and plain), json/md/csv output,
# telemetry.h5 input, and clear errors (unreadable file named with its line, bad specs, bad options).
source "$(dirname "$0")/common.sh"
PY=/usr/bin/python3; [[ -x $PY ]] || PY=python3

T=$SCRATCH/traces
mkdir -p "$T/planetlab/day" "$T/alibaba" "$T/own"
echo "# readme is skipped" >"$T/README.md"
printf 'x\ty\n' >"$T/planetlab/MANIFEST.tsv"
for vm in a b c; do
  for i in $(seq 1 60); do echo $(((i * 37 + ${#vm} * 11) % 90)); done >"$T/planetlab/day/$vm"
done
for i in $(seq 1 80); do
  echo "m_1,$((i * 60)),$(((i * 13) % 100)),80,,,1,2,3"
  echo "m_2,$((i * 60)),$(((i * 7) % 100)),70,,,4,5,6"
done | gzip -n >"$T/alibaba/machine_usage.csv.gz"
{ echo "time_s,capacity,mem"; for i in $(seq 0 49); do echo "$i,0.$((50 + i % 40)),0.$((i % 9))"; done; } >"$T/own/mine.csv"

out=$("$LBBSP" predict-eval --traces "$T" --format json --predictors narx,arima:1,0,1,ema,last)
"$PY" - "$out" <<'PYEOF' || fail "json output: $out"
import json, math, sys
j = json.loads(sys.argv[1])
assert j["series"] == 6, j["series"]  # 3 planetlab + 2 alibaba machines + 1 csv
assert j["steps"] == 3 * 59 + 2 * 79 + 49, j["steps"]
names = [r["predictor"] for r in j["results"]]
assert names == ["narx", "arima:1,0,1", "ema", "last"], names
for r in j["results"]:
    for k in ("rmse", "mae", "mape", "rmse_vs_ema"):
        assert isinstance(r[k], float) and math.isfinite(r[k]) and r[k] >= 0, (r, k)
ema = [r for r in j["results"] if r["predictor"] == "ema"][0]
assert abs(ema["rmse_vs_ema"] - 1) < 1e-12
assert set(j["families"]) == {"planetlab", "alibaba", "csv"}, j["families"].keys()
PYEOF
echo "ok: json"

md=$("$LBBSP" predict-eval --traces "$T" --max-series 4 --max-steps 20)
# Sorted path order: alibaba (2 machines), own/mine.csv, then the first planetlab file.
for heading in "## All series (4 series" "## alibaba (2 series)" "## csv (1 series)" "## planetlab (1 series)" "| narx |"; do
  grep -qF -- "$heading" <<<"$md" || fail "md output lacks '$heading': $md"
done
echo "ok: md"
csv=$("$LBBSP" predict-eval --traces "$T/own/mine.csv" --format csv --predictors last,ema:0.5)
[[ $(head -1 <<<"$csv") == "family,predictor,steps,rmse,mae,mape,rmse_vs_ema" ]] || fail "csv header: $csv"
grep -q "^all,ema:0.5,49," <<<"$csv" || fail "csv rows: $csv"
echo "ok: csv"

# Telemetry written with h5py (python3-h5py, scripts/setup.sh): 2 ranks x 50 iterations.
RUN=$SCRATCH/run
mkdir -p "$RUN"
"$PY" - "$RUN/telemetry.h5" <<'PYEOF' || fail "could not write telemetry.h5 with h5py"
import sys, h5py, numpy as np
n, ranks = 50, 2
it = np.repeat(np.arange(n, dtype=np.int64), ranks)
rk = np.tile(np.arange(ranks, dtype=np.int32), n)
load = ((it % 5) == 0).astype(np.float64) * (rk == 1)
with h5py.File(sys.argv[1], "w") as f:
    g = f.create_group("records")
    g["iteration"], g["rank"], g["batch"] = it, rk, np.full(n * ranks, 32, np.int64)
    for c in ("compute_s", "wait_s", "allreduce_s", "balancer_s", "predicted_speed", "capacity"):
        g[c] = np.zeros(n * ranks)
    g["actual_speed"] = 100.0 - 40.0 * load
    g["cpu_avail"], g["mem_avail"], g["load"] = 1.0 - 0.4 * load, np.full(n * ranks, 0.7), load
PYEOF
tel=$("$LBBSP" predict-eval --telemetry "$RUN" --format json --predictors narx,ema,last)
"$PY" -c 'import json,sys; j=json.loads(sys.argv[1]); assert j["series"]==2 and j["steps"]==98, j' "$tel" ||
  fail "telemetry json: $tel"
echo "ok: telemetry"

# Errors: unreadable file named with its line; nothing skipped silently.
printf '10\n20\nnot-a-number\n' >"$T/planetlab/day/broken"
expect_fail "broken:3" "$LBBSP" predict-eval --traces "$T"
rm "$T/planetlab/day/broken"
echo garbage | gzip -n | head -c 10 >"$T/own/truncated.csv.gz"
expect_fail "truncated.csv.gz" "$LBBSP" predict-eval --traces "$T"
rm "$T/own/truncated.csv.gz"
expect_fail "predictor: unknown predictor 'lstm'.*valid:" "$LBBSP" predict-eval --traces "$T" --predictors narx,lstm
expect_fail "needs --traces DIR or --telemetry RUN_DIR" "$LBBSP" predict-eval
expect_fail "excludes" "$LBBSP" predict-eval --traces "$T" --telemetry "$RUN"
expect_fail "telemetry.h5" "$LBBSP" predict-eval --telemetry "$SCRATCH/nope"
expect_fail "format" "$LBBSP" predict-eval --traces "$T" --format xml
echo "PASS"
