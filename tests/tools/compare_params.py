#!/usr/bin/python3
"""Compare two --save-params HDF5 files: relative L2 error of the whole parameter vector must be <= TOLERANCE
and the largest single difference <= 10 x TOLERANCE of the largest parameter.

usage: compare_params.py A.h5 B.h5 TOLERANCE   (exit 1 and a message when they differ by more)
"""
import sys

import h5py
import numpy as np


def load(path):
    with h5py.File(path, "r") as f:
        g = f["params"]
        return {k: np.asarray(g[k], dtype=np.float64) for k in sorted(g.keys())}


def main():
    a_path, b_path, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
    a, b = load(a_path), load(b_path)
    if a.keys() != b.keys():
        print(f"tensor names differ: {sorted(a)} vs {sorted(b)}")
        return 1
    va = np.concatenate([a[k].ravel() for k in a])
    vb = np.concatenate([b[k].ravel() for k in b])
    if va.shape != vb.shape:
        print(f"sizes differ: {va.shape} vs {vb.shape}")
        return 1
    rel = np.linalg.norm(va - vb) / max(np.linalg.norm(va), 1e-30)
    worst = np.max(np.abs(va - vb)) / max(np.max(np.abs(va)), 1e-30)
    print(f"{a_path} vs {b_path}: relative L2 difference {rel:.3e}, max abs difference / max abs {worst:.3e}"
          f" (tolerance {tol:g})")
    if not (rel <= tol and worst <= 10 * tol):
        print("FAIL: parameters differ beyond the tolerance")
        return 1
    if np.all(va == 0):
        print("FAIL: parameters are all zero (nothing was trained)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
