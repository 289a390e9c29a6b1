#!/usr/bin/env bash
# Coordination cost of balancing (gather + decide + broadcast, as a fraction of iteration time) at 2..96 ranks.
# Oversubscribed on a small machine: the fraction is what matters, not the absolute times.
#   bench/coordination/run_coordination.sh [--ranks "2 8 32 96"] [--iterations K] [--lbbsp PATH] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
ranks="2 8 32 96" iterations=60 lbbsp=build/lbbsp out=results/coordination
# shellcheck source=bench/coordination/options.sh
source bench/coordination/options.sh run_coordination.sh "$@"
echo "| ranks | balancer | lag | mean iteration | coordination fraction |"
echo "|---|---|---|---|---|"
for n in $ranks; do
  for lag in 0 1; do
    # Global batch grows with the ranks (64 per rank); the MLP's gradient is ~1 MB, like a small real model.
    mpirun -n "$n" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 "$lbbsp" train --data "$out/data.h5" \
      --model mlp --global-batch $((64 * n)) --max-iterations "$iterations" --balancer lbbsp-cpu --predictor narx \
      --lag "$lag" --straggle "static:1,0.5,0.75,0.25" --test-subset 100 --quiet --summary-json "$out/n$n-lag$lag.json"
    /usr/bin/python3 -c "
import json; s = json.load(open('$out/n$n-lag$lag.json'))
print(f\"| $n | lbbsp-cpu/narx | $lag | {s['mean_iteration_s']*1000:.1f} ms | {100*s['balancer_overhead_fraction']:.3f}% |\")"
  done
done
