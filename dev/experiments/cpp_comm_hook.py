#!/usr/bin/env python3
"""Experiment (not the product): what a DDP comm hook written in C++ saves against lbbsp.torch's Python one.

    python3 dev/experiments/cpp_comm_hook.py [--rounds 5] [--steps 300]

lbbsp.torch's per-step cost is many small Python calls (docs/results/torch.md, *Per step, on the CPU*); the step
down would be the hook, the report and the decision in C++ against libtorch. This measures the first part and
de-risks the mechanism: a c10d::CppCommHookInterface that SUMs each bucket (no Python, no GIL), built against the
installed torch with torch.utils.cpp_extension (needs a C++ compiler and the torch headers PyPI's wheel carries)
and registered on the DDP model's reducer from Python. Two gloo ranks pinned one per core, the CNN and data of
bench/torch_cotenant.py, global batch 128, no co-tenant; the same two processes hold three DDP models and step
them in turn, as bench/torch_step_cost.py does, the order rotated each step: plain DDP (its built-in C++ averaging
hook), the Python SUM hook (lbbsp.torch.sum_allreduce_hook: a future callback per bucket) and the C++ SUM hook.
Prints each one's mean step (wall) and CPU a step against plain DDP's, medians over rounds.
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.cpp_extension import load_inline

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import torch_cotenant as tc
from torch_step_cost import print_over_plain

import lbbsp
from lbbsp.torch import sum_allreduce_hook

HOOK_SOURCE = r"""
#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

using Group = c10::intrusive_ptr<c10d::ProcessGroup>;

// Each bucket's gradient SUM over the ranks: the allreduce's own future, no callback.
class SumHook : public c10d::CppCommHookInterface<Group> {
 public:
  using c10d::CppCommHookInterface<Group>::CppCommHookInterface;
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    std::vector<at::Tensor> tensors = {bucket.getBufferRef()};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    return state_->allreduce(tensors, opts)->getFuture();
  }
};

void register_sum_hook(py::object reducer, py::object group) {
  reducer.cast<c10d::Reducer*>()->register_comm_hook(std::make_unique<SumHook>(group.cast<Group>()));
}
"""
RUNNERS = ("plain", "python-sum", "cpp-sum")
WARMUP = 50


def build_extension():
    t = time.perf_counter()
    ext = load_inline("lbbsp_cpp_comm_hook_experiment", cpp_sources=HOOK_SOURCE,
                      functions=["register_sum_hook"], extra_cflags=["-O2"])
    return ext, time.perf_counter() - t


def make_runner(name, ext):
    model = DDP(tc.make_model())
    if name == "python-sum":
        model.register_comm_hook(None, sum_allreduce_hook)
    elif name == "cpp-sum":
        ext.register_sum_hook(model.reducer, dist.group.WORLD)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def rank_main(rank, world, port, steps, out):
    os.sched_setaffinity(0, {rank})
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ext, _ = build_extension()  # cached by the parent's build
    x, y = tc.data()
    runners = {n: make_runner(n, ext) for n in RUNNERS}
    equal = np.full(world, tc.X // world, dtype=np.int64)
    times, perm = {n: [] for n in RUNNERS}, (-1, None)
    for k in range(steps):
        epoch, step = divmod(k, tc.STEPS_PER_EPOCH)
        if perm[0] != epoch:
            perm = (epoch, lbbsp.epoch_permutation(len(x), 1, epoch))
        idx = torch.from_numpy(lbbsp.rank_indices(perm[1], step, equal, rank))
        for name in RUNNERS[k % len(RUNNERS):] + RUNNERS[:k % len(RUNNERS)]:  # rotated: none always runs first
            model, opt = runners[name]
            t, c = time.perf_counter(), time.process_time()
            loss = F.cross_entropy(model(x[idx]), y[idx], reduction="mean" if name == "plain" else "sum")
            if name != "plain":
                loss = loss / tc.X  # summed over ranks: the global batch's mean
            opt.zero_grad()
            loss.backward()
            opt.step()
            times[name].append((time.perf_counter() - t, time.process_time() - c))
    mine = torch.from_numpy(np.array([np.mean(times[n][WARMUP:], axis=0) for n in RUNNERS]))
    both = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(both, mine)
    if rank == 0:
        torch.save(torch.stack(both), out)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=300)
    a = ap.parse_args()
    _, seconds = build_extension()
    print(f"built the C++ hook against torch {torch.__version__} in {seconds:.0f} s (cached after the first build)")
    rounds = []
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.pt")
        for r in range(a.rounds):
            mp.spawn(rank_main, args=(2, tc.free_port(), a.steps, out), nprocs=2)
            got = torch.load(out)  # ranks x runners x (wall, cpu): the slower rank's wall, the ranks' mean CPU
            wall, cpu = got[:, :, 0].max(dim=0).values.tolist(), got[:, :, 1].mean(dim=0).tolist()
            rounds.append({n: {"step_s": wall[i], "cpu_s": cpu[i]} for i, n in enumerate(RUNNERS)})
            print(f"round {r + 1}: " + ", ".join(f"{n} {1e3 * rounds[-1][n]['step_s']:.2f} ms" for n in RUNNERS),
                  flush=True)
    print_over_plain(rounds, RUNNERS)


if __name__ == "__main__":
    main()
