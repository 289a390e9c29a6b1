#!/usr/bin/env bash
# `lbbsp simulate` on self-made plain-CSV traces: markdown and JSON output, trace CSV, and clear errors.
source "$(dirname "$0")/common.sh"

mkdir -p "$SCRATCH/traces"
for k in 0 1 2; do
  {
    echo "time_s,capacity"
    for t in $(seq 0 79); do echo "$((t * 60)),0.$(( (t * (k + 3) + k * 17) % 8 + 2 ))"; done
  } >"$SCRATCH/traces/t$k.csv"
done

out=$("$LBBSP" simulate --workers 6 --traces "$SCRATCH/traces" --balancers bsp,static,lbbsp-cpu:last,oracle \
  --iterations 40 --profile cpu --seed 3)
grep -q "| lbbsp-cpu:last | last |" <<<"$out" || fail "markdown row for lbbsp-cpu:last missing: $out"
grep -q "| oracle | - |" <<<"$out" || fail "oracle row missing: $out"

"$LBBSP" simulate --workers 6 --traces "$SCRATCH/traces" --balancers lbbsp-gpu,lbbsp-gpu-model \
  --iterations 30 --profile gpu --format json --trace-out "$SCRATCH/batches.csv" >"$SCRATCH/out.json"
python3 - "$SCRATCH/out.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["workers"] == 6 and j["iterations"] == 30, j
names = [r["balancer"] for r in j["results"]]
assert names == ["lbbsp-gpu", "lbbsp-gpu-model", "bsp", "oracle"], names
for r in j["results"]:
    for k in ("mean_iteration_s", "efficiency_vs_oracle", "speedup_vs_bsp", "wait_fraction", "decision_ms_per_iteration"):
        assert isinstance(r[k], (int, float)), (k, r)
    assert r["efficiency_vs_oracle"] <= 1 + 1e-9, r
PY
[[ $(wc -l <"$SCRATCH/batches.csv") -eq $((1 + 4 * 30)) ]] || fail "trace-out has the wrong number of rows"
head -1 "$SCRATCH/batches.csv" | grep -q "^balancer,iteration,iteration_s,compute_s,b0,b1,b2,b3,b4,b5$" \
  || fail "trace-out header: $(head -1 "$SCRATCH/batches.csv")"

# The same run from a --config file ([simulate] section); the command line wins over it; a wrong key is an error.
printf '[simulate]\nworkers = 6\niterations = 40\nbalancers = "bsp,oracle"\nprofile = "cpu"\nseed = 3\n' \
  >"$SCRATCH/sim.toml"
cfg_out=$("$LBBSP" simulate --config "$SCRATCH/sim.toml" --traces "$SCRATCH/traces" --format json)
flag_out=$("$LBBSP" simulate --workers 6 --iterations 40 --balancers bsp,oracle --profile cpu --seed 3 \
  --traces "$SCRATCH/traces" --format json)
python3 - "$cfg_out" "$flag_out" <<'PY'
import json, sys
a, b = (json.loads(x) for x in sys.argv[1:3])
assert a["workers"] == 6 and a["iterations"] == 40, a
strip = lambda j: [{k: v for k, v in r.items() if k != "decision_ms_per_iteration"} for r in j["results"]]
assert strip(a) == strip(b), (a, b)
print("ok: simulate --config gives the run its flags give")
PY
[[ $("$LBBSP" simulate --config "$SCRATCH/sim.toml" --workers 3 --traces "$SCRATCH/traces" --format json |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["workers"])') == 3 ]] || fail "--workers did not win over --config"
printf '[simulate]\nworker = 6\n' >"$SCRATCH/typo.toml"
expect_fail "config: unknown key 'simulate.worker'" "$LBBSP" simulate --config "$SCRATCH/typo.toml" --traces "$SCRATCH/traces"

expect_fail "unknown balancer 'nope'" "$LBBSP" simulate --workers 2 --traces "$SCRATCH/traces" --balancers bsp,nope
expect_fail "no such trace" "$LBBSP" simulate --workers 2 --traces "$SCRATCH/missing" --balancers bsp
mkdir -p "$SCRATCH/empty"
expect_fail "no trace files" "$LBBSP" simulate --workers 2 --traces "$SCRATCH/empty" --balancers bsp
expect_fail "workers" "$LBBSP" simulate --workers 0 --traces "$SCRATCH/traces"
expect_fail "iterations" "$LBBSP" simulate --workers 2 --iterations abc --traces "$SCRATCH/traces"
expect_fail "profile" "$LBBSP" simulate --workers 2 --profile tpu --traces "$SCRATCH/traces"
expect_fail "predictor" "$LBBSP" simulate --workers 2 --traces "$SCRATCH/traces" --balancers lbbsp-cpu:bogus
echo "ok: simulate"
