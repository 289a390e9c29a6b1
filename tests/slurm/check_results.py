#!/usr/bin/env python3
"""Checks for the Slurm and multi-host tests: is a summary JSON sane, and do two runs agree.

  check_results.py summary FILE.json [--ranks N] [--iterations K] [--model M] [--global-batch X]
  check_results.py compare A.json B.json [--params A.h5 B.h5] [--rtol 1e-5] [--acc-atol 0.005]

Exit 0 when every check holds, 1 with one line per failed check otherwise. The parameter comparison needs h5py
(Debian: python3-h5py); the summary checks need only the standard library.
"""
import argparse
import json
import math
import sys

FIELDS = ("model", "ranks", "global_batch", "iterations", "epochs", "wall_s", "samples_per_s", "train_loss",
          "test_accuracy", "balancer", "wait_fraction")


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"FAIL: cannot read summary JSON {path}: {e}")


def finite(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_summary(args):
    s = load(args.file)
    bad = [f"missing field '{k}'" for k in FIELDS if k not in s]
    if bad:
        return bad
    want = {"ranks": args.ranks, "iterations": args.iterations, "model": args.model,
            "global_batch": args.global_batch}
    bad += [f"{k} = {s[k]!r}, expected {v!r}" for k, v in want.items() if v is not None and s[k] != v]
    for k in ("wall_s", "samples_per_s", "train_loss"):
        if not (finite(s[k]) and s[k] > 0):
            bad.append(f"{k} = {s[k]!r}, expected a finite number > 0")
    for k in ("test_accuracy", "wait_fraction"):
        if not (finite(s[k]) and 0 <= s[k] <= 1):
            bad.append(f"{k} = {s[k]!r}, expected a number in [0, 1]")
    if not (isinstance(s["iterations"], int) and s["iterations"] > 0):
        bad.append(f"iterations = {s['iterations']!r}, expected a positive integer")
    if not bad:
        print(f"ok: {args.file}: " + ", ".join(f"{k}={s[k]}" for k in FIELDS))
    return bad


def rel_close(a, b, rtol):
    return abs(a - b) <= rtol * max(abs(a), abs(b), 1e-12)


def h5_arrays(path):
    import h5py
    import numpy as np
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, np.asarray(obj[()], dtype=np.float64))
                     if isinstance(obj, h5py.Dataset) else None)
    if not out:
        sys.exit(f"FAIL: {path} holds no datasets")
    return out


def compare(args):
    a, b = load(args.a), load(args.b)
    bad = []
    for k in ("iterations", "global_batch", "model"):
        if a.get(k) != b.get(k):
            bad.append(f"{k}: {a.get(k)!r} vs {b.get(k)!r} (runs are not comparable)")
    if not rel_close(a["train_loss"], b["train_loss"], args.rtol):
        bad.append(f"train_loss {a['train_loss']!r} vs {b['train_loss']!r}: beyond rtol {args.rtol}")
    # Accuracy counts whole samples: a logit that ties within float rounding may flip one, hence an absolute bound.
    if abs(a["test_accuracy"] - b["test_accuracy"]) > args.acc_atol:
        bad.append(f"test_accuracy {a['test_accuracy']!r} vs {b['test_accuracy']!r}: beyond {args.acc_atol}")
    if args.params:
        import numpy as np
        pa, pb = h5_arrays(args.params[0]), h5_arrays(args.params[1])
        if sorted(pa) != sorted(pb):
            bad.append(f"parameter tensors differ: {sorted(pa)} vs {sorted(pb)}")
        worst = 0.0
        for name in sorted(set(pa) & set(pb)):
            x, y = pa[name], pb[name]
            if x.shape != y.shape:
                bad.append(f"{name}: shape {x.shape} vs {y.shape}")
                continue
            # Relative to the tensor's scale, so that entries near zero do not demand absolute agreement.
            scale = max(float(np.max(np.abs(x))) if x.size else 0.0, 1e-12)
            err = float(np.max(np.abs(x - y))) / scale if x.size else 0.0
            worst = max(worst, err)
            if not np.all(np.isfinite(x)) or not np.all(np.isfinite(y)):
                bad.append(f"{name}: non-finite parameters")
            elif err > args.rtol:
                bad.append(f"{name}: max |a-b| / max|a| = {err:.3g} > rtol {args.rtol}")
        print(f"params: {len(pa)} tensors, {sum(v.size for v in pa.values())} values, worst relative difference "
              f"{worst:.3g}")
    if not bad:
        print(f"ok: {args.a} ~ {args.b}: train_loss {a['train_loss']} vs {b['train_loss']}, "
              f"test_accuracy {a['test_accuracy']} vs {b['test_accuracy']}")
    return bad


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summary")
    s.add_argument("file")
    s.add_argument("--ranks", type=int)
    s.add_argument("--iterations", type=int)
    s.add_argument("--model")
    s.add_argument("--global-batch", type=int)
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--params", nargs=2, metavar=("A.h5", "B.h5"))
    c.add_argument("--rtol", type=float, default=1e-5)
    c.add_argument("--acc-atol", type=float, default=0.005)
    args = p.parse_args()
    bad = check_summary(args) if args.cmd == "summary" else compare(args)
    for b in bad:
        print(f"FAIL: {b}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
