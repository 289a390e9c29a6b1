#!/usr/bin/env bash
# Gradient reduction with several ranks per node, side by side in one run: --allreduce mpi (MPI_Allreduce between
# processes, then SGD on every rank) against --allreduce node (shared-memory sums, one parameter copy, SGD by
# shares). Same model, data, seed and batch split; prints per rank count the mean iteration and the mean time from
# the slowest rank's compute to the end of the iteration (reduction + SGD + balancer), and the ratios mpi / node of
# both. The modelled compute counts from the node's release in node mode (README, straggler emulation) and from each
# rank's own start with mpi, so the second column also holds the ranks' start skew under mpi; the mean iteration is
# the end-to-end comparison.
#   bench/coordination/run_allreduce.sh [--ranks "4 8 16"] [--iterations K] [--lbbsp PATH] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
ranks="4 8 16" iterations=80 lbbsp=build/lbbsp out=results/allreduce
# shellcheck source=bench/coordination/options.sh
source bench/coordination/options.sh run_allreduce.sh "$@"
echo "| ranks | allreduce | mean iteration | after the slowest compute | iteration mpi / node | after, mpi / node |"
echo "|---|---|---|---|---|---|"
for n in $ranks; do
  for mode in mpi node; do
    # A modelled compute (gpu= cost curve, 0.1 ms per sample) keeps the ranks' compute equal and the
    # comparison about the reduction; the MLP's gradient is ~1 MB, like a small real model.
    rm -rf "$out/n$n-$mode"
    mpirun -n "$n" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 "$lbbsp" train --data "$out/data.h5" \
      --model mlp --global-batch $((64 * n)) --max-iterations "$iterations" --balancer bsp --allreduce "$mode" \
      --straggle "static:1;gpu=0:0:0.0001:1000000" --test-subset 100 --eval-every 100000 --quiet \
      --log-dir "$out/n$n-$mode" --summary-json "$out/n$n-$mode/summary.json"
  done
  /usr/bin/python3 - "$out" "$n" <<'PYEOF'
import json, sys
import h5py, numpy as np
out, n = sys.argv[1], int(sys.argv[2])
after, iteration = {}, {}
for mode in ("mpi", "node"):
    s = json.load(open(f"{out}/n{n}-{mode}/summary.json"))
    g = h5py.File(f"{out}/n{n}-{mode}/telemetry.h5")["records"]
    compute = np.array(g["compute_s"]).reshape(-1, n).max(axis=1)  # every iteration, as mean_iteration_s
    assert s["step_mode"] == ("host" if mode == "mpi" else "host/node-shared"), s["step_mode"]
    iteration[mode] = s["mean_iteration_s"]
    after[mode] = s["mean_iteration_s"] - compute.mean()
    ratios = " |  |  |" if mode == "mpi" else \
        f" | {iteration['mpi'] / iteration['node']:.2f}x | {after['mpi'] / after['node']:.2f}x |"
    print(f"| {n} | {mode} | {1e3 * iteration[mode]:.1f} ms | {1e3 * after[mode]:.2f} ms{ratios}")
PYEOF
done
