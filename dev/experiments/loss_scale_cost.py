#!/usr/bin/env python3
"""Experiment (not the product): what the loss's scale costs a step against the multiply alone and no scale.

    python3 dev/experiments/loss_scale_cost.py [--steps 400]

One process, a one-rank gloo group, one torch thread pinned to core 0, the CNN and data of bench/torch_cotenant.py
under DDP with a LoadBalancer (the C++ step path where it builds); each variant a fresh process: the loss left as it
is (`none`, what plain DDP does: its C++ hook divides the bucket instead), `loss * 0.5` (`multiply`: the autograd
node alone), the same after a first `loss * 1.0` not timed (`second`: the multiply once the first torch call after
the forward has paid for the cold caches, which plain DDP pays in backward() instead) and `lb.scale(loss)`
(`scale`: the multiply and its checks). Prints the CPU (thread time, us a step)
of the loss's line, of backward() and of lb.step(), means over the steps. docs/results/torch.md, *Per step, on the
CPU*, cites it.
"""
import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def variant(name: str, steps: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
    import torch_cotenant as tc

    from lbbsp.torch import LoadBalancer

    os.sched_setaffinity(0, {0})
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29533"))
    dist.init_process_group("gloo", rank=0, world_size=1)
    x, y = tc.data()
    model = DDP(tc.make_model())
    lb = LoadBalancer(model, dataset_size=len(x), global_batch=tc.X, check_loss=name == "scale")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    spent = {"loss line": 0.0, "backward": 0.0, "lb.step": 0.0}
    for g in range(steps):
        idx = torch.from_numpy(lb.indices(*divmod(g, lb.steps_per_epoch)))
        loss = F.cross_entropy(model(x[idx]), y[idx])
        if name == "second":
            loss = loss * 1.0
        t = time.thread_time()
        if name in ("multiply", "second"):
            loss = loss * 0.5
        elif name == "scale":
            loss = lb.scale(loss)
        spent["loss line"] += time.thread_time() - t
        t = time.thread_time()
        loss.backward()
        spent["backward"] += time.thread_time() - t
        opt.step()
        opt.zero_grad()
        t = time.thread_time()
        lb.step()
        spent["lb.step"] += time.thread_time() - t
    print(f"{name:9s} " + ", ".join(f"{k} {1e6 * v / steps:.1f}" for k, v in spent.items()), flush=True)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--variant", choices=["none", "multiply", "second", "scale"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.variant:
        variant(a.variant, a.steps)
        return
    print("CPU a step, us (thread time):")
    for _ in range(2):
        for name in ("none", "multiply", "second", "scale"):
            subprocess.run([sys.executable, __file__, "--variant", name, "--steps", str(a.steps)], check=True)


if __name__ == "__main__":
    main()
