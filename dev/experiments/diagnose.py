#!/usr/bin/python3
"""Where does a balancer's iteration time go? Reads the telemetry.h5 of runs written by dev/experiment.py.

usage: dev/experiments/diagnose.py RUN_DIR [RUN_DIR...]   (e.g. results/experiment-*/runs/trace/*-r0)
Per run (iterations >= --skip): mean iteration time (rank 0: compute + wait + allreduce + balancer), its parts
(slowest rank's compute, allreduce, coordination), the compute imbalance (slowest / mean rank compute), the
prediction error of the speed predictor (mean |predicted - actual| / actual over ranks and iterations, and the
error of the slowest rank), how often a rank sat at the smallest batch, and the capacity spread.
"""
import argparse
import os

import h5py
import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--skip", type=int, default=10, help="warm-up iterations left out")
    a = ap.parse_args()
    print("| run | iteration ms | slowest compute ms | allreduce ms | coord. ms | imbalance | pred. error | "
          "slowest rank's pred. error | at min batch | capacity min/max |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for d in a.runs:
        with h5py.File(os.path.join(d, "telemetry.h5"), "r") as f:
            r = {k: f["records"][k][:] for k in f["records"].keys()}
        its = np.unique(r["iteration"])
        its = its[its >= a.skip]
        idx = {int(i): np.where(r["iteration"] == i)[0] for i in its}
        comp = np.array([r["compute_s"][idx[i]] for i in its])  # [iter, rank]
        bat = np.array([r["batch"][idx[i]] for i in its])
        pred = np.array([r["predicted_speed"][idx[i]] for i in its])
        act = np.array([r["actual_speed"][idx[i]] for i in its])
        cap = np.array([r["capacity"][idx[i]] for i in its])
        ar = np.array([r["allreduce_s"][idx[i]][0] for i in its])
        co = np.array([r["balancer_s"][idx[i]][0] for i in its])
        slow = comp.max(1)
        it_s = slow + ar + co
        imb = slow / np.maximum(comp.mean(1), 1e-9)
        ok = (pred > 0) & (act > 0)
        err = np.abs(pred - act)[ok] / act[ok] if ok.any() else np.array([np.nan])
        k = comp.argmax(1)
        rows = np.arange(len(its))
        okk = ok[rows, k]
        serr = (np.abs(pred[rows, k] - act[rows, k])[okk] / act[rows, k][okk]) if okk.any() else np.array([np.nan])
        mn = bat.min()
        print(f"| {os.path.relpath(d)} | {1000*it_s.mean():.1f} | {1000*slow.mean():.1f} | {1000*ar.mean():.1f} | "
              f"{1000*co.mean():.2f} | {imb.mean():.3f} | {100*np.nanmean(err):.1f}% | {100*np.nanmean(serr):.1f}% | "
              f"{100*np.mean(bat == mn):.1f}% (b={mn}) | {cap.min():.2f}/{cap.max():.2f} |")


if __name__ == "__main__":
    main()
