#!/usr/bin/env python3
"""Experiment (not the product): does gloo's worker wait for the GIL when it drops a collective whose input only it
still holds (a Python-made tensor, whose release then needs the GIL) while Python runs small torch ops?

    python3 dev/experiments/gloo_dropped_input.py [--iterations 400]

Two gloo ranks pinned one per core, one torch thread each. Each iteration: an asynchronous all-gather launched, its
input dropped by Python (or kept until the iteration ends), 200 small torch ops in Python, the wait, a blocking
reduce-scatter; the two variants alternate. Prints rank 0's mean wall and CPU an iteration of each (the first 50 of
each left out). 2026-12-07, 2-core Intel Xeon guest, PyTorch 2.15.0: 3818 us dropped against 3882 kept (no wait to
measure; docs/results/fsdp.md).
"""
import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

N = 1 << 16
WARMUP = 50


def iteration(keep, x):
    """One iteration; returns the all-gather's input where Python keeps it (else gloo's worker drops it last)."""
    out = torch.empty(2 * N)
    inp = torch.ones(N)
    work = dist.all_gather_into_tensor(out, inp, async_op=True)
    held = inp if keep else None
    del inp
    y = x
    for _ in range(200):  # Python between small ops, as a forward's module code
        y = y * 1.0001 + 0.5
    work.wait()
    dist.reduce_scatter_tensor(torch.empty(N // 2), torch.ones(N))
    return held


def rank_main(rank, port, iterations):
    os.sched_setaffinity(0, {rank})
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    x, spent = torch.ones(64), {True: [], False: []}
    for i in range(iterations):
        for keep in ((True, False) if i % 2 else (False, True)):
            dist.barrier()
            t, c = time.perf_counter(), time.process_time()
            iteration(keep, x)
            spent[keep].append((time.perf_counter() - t, time.process_time() - c))
    if rank == 0:
        for keep in (False, True):
            v = torch.tensor(spent[keep][WARMUP:])
            print(f"input {'kept by Python' if keep else 'dropped'}: wall {1e6 * v[:, 0].mean():.0f} us, "
                  f"CPU {1e6 * v[:, 1].mean():.0f} us an iteration")
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=400)
    a = ap.parse_args()
    if a.iterations <= WARMUP:
        ap.error(f"--iterations must exceed the {WARMUP} left out, got {a.iterations}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(port, a.iterations), nprocs=2)


if __name__ == "__main__":
    main()
