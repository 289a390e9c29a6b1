#!/usr/bin/env python3
"""lbbsp.torch against a real co-tenant, side by side with plain DDP and the published peers in one run.

Two gloo ranks, rank r pinned to core r, one torch thread each, a small CNN (two 5x5 convolutions, a linear layer)
on 28x28 inputs, global batch 128, SGD. A co-tenant process pinned to core 1 takes rank 1's CPU:

    none     no co-tenant
    steady   a process spinning for the whole run (rank 1 gets about half its core)
    onoff    spinning PERIOD s, idle PERIOD s (--period, default 1.5)
    trace    a real utilisation series replayed: the share u of each tick (--tick s) burnt in 10 ms slices
             (Alibaba 2018 co-located machine m_1937 from sample 6200: mean share 0.56, SD 0.25, from
             ../shared/traces; else a built-in series)
    membw    a STREAM-like copy of two 64 MB arrays (memory bandwidth and the core)

Runners, each a fresh pair of ranks under the same co-tenant, in rotating order over --repeats rounds:

    plain      DDP, equal split, DDP's own averaging hook (the baseline)
    lbbsp      DDP + lbbsp.torch.LoadBalancer (--balancer, --predictor)
    lbbsp-b    the same with --balancer-b (not run unless named in --runners: an A/B of two balancer specs)
    lbbsp-python  lbbsp on lbbsp.torch's Python per-step path (LBBSP_TORCH_NATIVE=0; lbbsp runs the C++ one where
               it builds): not run unless named in --runners
    omnilearn  OmniLearn's controller (TPDS 2025) as its paper gives it: every 20 steps each worker moves its batch
               by -(b/t)(t - mean t), 5% dead band; gradients summed (benchmark code, not the product)
    naive      what a user would write: sizes proportional to the measured speeds (samples/s), smoothed (EMA 0.5),
               re-sized every step
--fsdp: the same runners over FSDP2 (fully_shard on every convolution, the linear layer and the root, a 1-D mesh
of the two ranks) instead of DDP: plain is FSDP2's own averaging reduce-scatter, lbbsp the LoadBalancer on the
sharded model (the plain mean loss left to its reduce-scatter), the peers FSDP2 with SUM reductions.

Every runner notes when each rank's backward reaches the first layer's weight (a gradient hook: the step's compute
ends there; under --fsdp the gradient of the first layer's output, FSDP2's sharded weight having no hook) and the
CPU time its process used. The ideal comes from plain's own steps: each step's oracle split of the two ranks'
speeds measured at the equal split under the co-tenant (X / the sum of the speeds, against the slower rank's
time), plain's other costs kept. It is clairvoyant (it knows each step's noise and each switch
before it happens), so the table's first line also gives what a causal controller could reach on the same speeds:
the best of the last step's speeds and EMAs of them (weights 0.3, 0.5, 0.7), each step split by what the steps
before it measured, and the ideal by phase, as issue #51 words it ("from each rank's measured speed alone and under
its co-tenant"): each step split by the mean speeds of the co-tenant's phase it falls in (on or off; the trace
sample being burnt; one phase for the others), knowing when the phases begin but not a step's noise.

Under onoff only the steps of whole on/off cycles after warm-up count, under trace those of one stretch of the
series, the same for every runner (--trace-window; the co-tenant's phases and series are timed from their start,
on the same clock as the steps): a fixed number of steps ends mid-cycle or mid-series, and a runner fast in one
phase would spend more of its steps in another. --steps must cover it (onoff: a whole cycle, 2 x --period s).

Prints a Markdown table (mean step after warm-up over the rounds: min-max, speed-up over plain, fraction of the
ideal speed-up, how far each runner's slower rank computed above the oracle split of its own steps' speeds (how
well it tracks, apart from what the co-tenant did in its runs), how far its whole step was above that oracle (the
tracking plus the allreduce, optimizer and control plane: the controllers compared on equal machines), rank 1's
mean share, the process CPU time per step against plain's) and writes every run's per-step record to
--out/<scenario>/<runner>-<round>.json; --tabulate prints the table again from those records.

    python3 bench/torch_cotenant.py --scenario steady --repeats 3 --out results/cotenant
"""

import argparse
import json
import os
import socket
import sys
import time

import cotenants  # bench/cotenants.py: the co-tenant processes
import numpy as np
import oracle_split  # bench/oracle_split.py: the oracle and causal splits of measured speeds
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch_peers import Naive, OmniLearn  # bench/torch_peers.py: the published peers (benchmark code)

import lbbsp
from lbbsp.torch import LoadBalancer, sum_allreduce_hook

X, STEPS_PER_EPOCH = 128, 100
RUNNERS = ["plain", "lbbsp", "omnilearn", "naive"]


# ---- the ranks ----

def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 5, padding=2),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(1568, 10))


def data():
    g = torch.Generator().manual_seed(0)
    n = X * STEPS_PER_EPOCH
    return torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


class ComputeClock:
    """Notes when backward computes the first layer's weight gradient (the last one computed): the step's compute
    ends there. A tensor hook, so that plain DDP keeps its own C++ allreduce. FSDP2 computes with unsharded
    copies of the weights, so there the hook is on the first layer's output (its weight gradient follows), and
    the waits in FSDP2's per-layer collectives before it (``waited``, seconds so far) are not compute."""

    def __init__(self, model, sharded=False):
        self.ready = 0.0
        self.waited = self.waited_at_ready = 0.0
        if sharded:
            model[0].register_forward_hook(self.watch)
        else:
            model[0].weight.register_hook(self.mark)

    def watch(self, module, args, out):
        out.register_hook(self.mark)  # returns None: the output stays as it is

    def mark(self, grad):
        self.ready = time.perf_counter()
        self.waited_at_ready = self.waited
        return grad

    def wait(self, seconds):
        self.waited += seconds

    def time_collectives(self, model):
        """FSDP2's default all-gather and reduce-scatter on every module, their blocking calls counted as waits."""
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter
        for m in model.modules():
            if hasattr(m, "set_custom_all_gather"):
                m.set_custom_all_gather(timed(DefaultAllGather, self)())
                m.set_custom_reduce_scatter(timed(DefaultReduceScatter, self)())


def timed(base, clock):
    """FSDP2's collective ``base`` whose blocking calls add to clock's waits (as lbbsp.torch times them)."""
    class Timed(base):
        def __call__(self, *args, **kwargs):
            t0 = time.perf_counter()
            work = super().__call__(*args, **kwargs)
            if work is None or not kwargs.get("async_op", False):
                clock.wait(time.perf_counter() - t0)
            return work
    return Timed


def timed_call(blocking, clock):
    """``blocking`` (a collective that returns when done) whose every call adds to clock's waits."""
    def timed(*args):
        t0 = time.perf_counter()
        blocking(*args)
        clock.wait(time.perf_counter() - t0)
    return timed


def shard(model):
    """FSDP2 as torchtitan applies it: every convolution and linear layer, then the root, over the two ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for m in model:
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            fully_shard(m, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def sum_gradients(model, sharded):
    """The peers' reduction: a SUM of the ranks' gradients (DDP's hook, or FSDP2's reduce-scatter)."""
    if not sharded:
        model.register_comm_hook(None, sum_allreduce_hook)
        return
    for m in model.modules():
        if hasattr(m, "set_force_sum_reduction_for_comms"):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)


def rank_main(rank, world, port, runner, a, out):
    os.sched_setaffinity(0, {rank})
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    x, y = data()
    ddp = shard(make_model()) if a.fsdp else DDP(make_model())  # ddp: the data-parallel model, either
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    lb = ctrl = None
    clock = ComputeClock(ddp if a.fsdp else ddp.module, a.fsdp)
    if runner in ("lbbsp", "lbbsp-b", "lbbsp-python"):
        spec = a.balancer_b if runner == "lbbsp-b" else a.balancer
        os.environ["LBBSP_TORCH_NATIVE"] = "0" if runner == "lbbsp-python" else "auto"
        lb = LoadBalancer(ddp, dataset_size=len(x), global_batch=X, balancer=spec, predictor=a.predictor)
        if a.fsdp:  # its own timed collectives: the waits it counts are the clock's too
            add_wait = lb.clock.add_wait
            lb.clock.add_wait = lambda seconds: (clock.wait(seconds), add_wait(seconds))
            if lb.native is not None:  # the C++ path counts its reduce-scatters' waits in C++: timed here too
                lb.native.scatter = timed_call(lb.native.scatter, clock)
    else:
        if a.fsdp:
            clock.time_collectives(ddp)
        if runner != "plain":
            sum_gradients(ddp, a.fsdp)
            ctrl = (OmniLearn if runner == "omnilearn" else Naive)(world, X)
    rec = {"end": [], "sizes": [], "compute": [], "cpu": [], "lb_step_s": [], "band": []}
    equal, perm = np.full(world, X // world, dtype=np.int64), None
    for k in range(a.steps):
        epoch, step = divmod(k, STEPS_PER_EPOCH)
        t0, waited = time.perf_counter(), clock.waited
        if lb is not None:
            sizes, idx = lb.batch_sizes, lb.indices(epoch, step)
        else:
            sizes = ctrl.sizes if ctrl is not None else equal
            if perm is None or perm[0] != epoch:
                perm = (epoch, lbbsp.epoch_permutation(len(x), 1, epoch))
            idx = lbbsp.rank_indices(perm[1], step, sizes, rank)
        idx = torch.from_numpy(idx)
        out_ = ddp(x[idx])
        if runner == "plain":
            loss = F.cross_entropy(out_, y[idx])  # DDP (FSDP2) averages: the equal split's mean loss
        elif lb is not None:
            loss = F.cross_entropy(out_, y[idx])  # the default loss_reduction: the hook weights it n_r / X
        else:
            loss = F.cross_entropy(out_, y[idx], reduction="sum") / X
        opt.zero_grad()
        loss.backward()
        opt.step()
        if lb is not None:
            s0 = time.perf_counter()
            lb.step()
            rec["lb_step_s"].append(time.perf_counter() - s0)
            rec["band"].append(lb.figures()["lbbsp/noise_band"])  # the band of the decision just made
        compute = clock.ready - t0 - (clock.waited_at_ready - waited)  # FSDP2: less its waits in collectives
        if ctrl is not None:
            ctrl.update(k, compute)
        rec["compute"].append(compute)
        rec["cpu"].append(time.process_time())
        rec["end"].append(time.perf_counter())
        rec["sizes"].append([int(v) for v in sizes])
    if lb is not None:
        rec["lbbsp_timing"] = dict(lb.timing)
    rec["compute_all"] = gather_list(rec["compute"], world)
    rec["cpu_all"] = gather_list(rec["cpu"], world)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(rec, f)
    dist.destroy_process_group()


def gather_list(values, world):
    t = torch.tensor(values, dtype=torch.float64)
    outs = [torch.zeros_like(t) for _ in range(world)]
    dist.all_gather(outs, t)
    return [o.tolist() for o in outs]


# ---- one run, and the table ----

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(runner, a, folder, tag):
    tenant = cotenants.start(a.scenario, core=1, period=a.period, tick=a.tick)
    out = os.path.join(folder, f"{tag}.json")
    try:
        mp.start_processes(rank_main, args=(2, free_port(), runner, a, out), nprocs=2, start_method="fork")
    finally:
        if tenant is not None:
            tenant.kill()
            tenant.join()
    with open(out) as f:
        rec = json.load(f)
    rec["tenant_start"] = cotenants.start_of(tenant)  # onoff, trace: when its phases or series began
    with open(out, "w") as f:
        json.dump(rec, f)
    return rec


def kept(folder, tag):
    try:
        with open(os.path.join(folder, f"{tag}.json")) as f:
            return json.load(f)
    except OSError as e:
        sys.exit(f"torch_cotenant.py: --tabulate: no record {tag}.json in {folder} ({e.strerror}): run the "
                 "benchmark with the same --out, --scenario, --runners and --repeats first")


def counted_steps(rec, a):
    """(lo, hi): the steps lo+1..hi of a run to count: after warm-up; under onoff those of whole cycles, under
    trace those in --trace-window (the same stretch of the series for every runner)."""
    end = np.array(rec["end"])
    start = rec.get("tenant_start")
    if a.scenario == "onoff" and start is not None:
        return cotenants.whole_cycles(end, a.warmup, start, 2 * a.period)
    if a.scenario == "trace" and start is not None:
        return cotenants.counted(end, a.warmup, start + a.trace_window[0], start + a.trace_window[1])
    return a.warmup, len(end) - 1


def summarise(rec, a):
    end = np.array(rec["end"])
    lo, hi = counted_steps(rec, a)
    steps = np.diff(end)[lo:hi]
    sizes = np.array(rec["sizes"])[lo + 1:hi + 1]
    s = {"step_ms": 1e3 * float(steps.mean()), "rank1_share": float(sizes[:, 1].mean()), "steps": hi - lo}
    if rec.get("lb_step_s"):
        s["lb_step_us"] = 1e6 * float(np.mean(rec["lb_step_s"][lo + 1:hi + 1]))
    cpu = np.array(rec["cpu_all"])[:, lo:hi + 1]  # ranks x steps: the process's CPU seconds so far
    s["cpu_ms"] = 1e3 * float(((cpu[:, -1] - cpu[:, 0]) / (cpu.shape[1] - 1)).mean())
    t = np.array(rec["compute_all"])[:, lo + 1:hi + 1]  # ranks x steps
    b = sizes.T
    speeds = b / np.maximum(t, 1e-9)
    oracle = X / speeds.sum(axis=0)  # each step's slower rank at the oracle split of its speeds
    s["saved_ms"] = 1e3 * float((t.max(axis=0) - oracle).mean())
    s["over_oracle_ms"] = 1e3 * float((steps - oracle).mean())
    s["causal_ms"] = 1e3 * oracle_split.causal_above_oracle(speeds, X)
    mid = (end[lo:hi] + end[lo + 1:hi + 1]) / 2  # each counted step's middle, on the co-tenant's clock
    phase = cotenants.phases(a.scenario, mid, rec.get("tenant_start"), a.period, a.tick)
    s["phase_ms"] = 1e3 * oracle_split.by_phase_above_oracle(speeds, phase, X)
    return s


def table(results, a):
    plain = [r["step_ms"] for r in results["plain"]]
    saved = [r["saved_ms"] for r in results["plain"]]
    ideal = np.mean(plain) / (np.mean(plain) - np.mean(saved))
    plain_cpu = np.mean([r["cpu_ms"] for r in results["plain"]])
    causal = [r["causal_ms"] for r in results["plain"]]
    reachable = np.mean(plain) / (np.mean(plain) - np.mean(saved) + np.mean(causal))
    by_phase = np.mean(plain) / (np.mean(plain) - np.mean(saved) + np.mean([r["phase_ms"] for r in results["plain"]]))
    counted = np.mean([r["steps"] for rs in results.values() for r in rs])
    window = {"onoff": f"; whole on/off cycles only: {counted:.0f} steps a run counted",
              "trace": f"; the series' {a.trace_window[0]:g}-{a.trace_window[1]:g} s only: {counted:.0f} steps a run "
                       "counted"}.get(a.scenario, "")
    lines = [f"scenario {a.scenario}: {a.repeats} rounds of {a.steps} steps (first {a.warmup} not counted{window}); "
             f"ideal speed-up over plain {ideal:.2f}x (the per-step oracle split of plain's measured speeds); the best "
             f"causal split of the same speeds (last step's or an EMA's, replayed) {reachable:.2f}x, "
             f"{oracle_split.of_ideal(reachable, ideal, 0.0001):.2f} of the ideal, "
             f"{np.mean(causal):.1f} ms a step above the oracle; the ideal by phase (each rank's mean speed alone "
             f"and under its co-tenant, in each of its phases: on/off, a trace sample, else one) {by_phase:.2f}x",
             "", "| runner | mean step ms (min-max) | vs plain | of ideal | of ideal by phase | compute ms above its "
             "own oracle | step ms above its own oracle | rank 1's share of 128 | lbbsp step() us | CPU ms per step, "
             "vs plain |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for runner, rs in results.items():
        ms = [r["step_ms"] for r in rs]
        speedup = np.mean(plain) / np.mean(ms)
        of_ideal, of_phase = oracle_split.of_ideal(speedup, ideal, 0.01), oracle_split.of_ideal(speedup, by_phase, 0.01)
        lb_us = f"{np.mean([r['lb_step_us'] for r in rs]):.0f}" if "lb_step_us" in rs[0] else ""
        cpu = np.mean([r["cpu_ms"] for r in rs])
        lines.append(f"| {runner} | {np.mean(ms):.1f} ({min(ms):.1f}-{max(ms):.1f}) | {speedup:.2f}x | "
                     f"{of_ideal:.2f} | {of_phase:.2f} | {np.mean([r['saved_ms'] for r in rs]):.1f} | "
                     f"{np.mean([r['over_oracle_ms'] for r in rs]):.1f} | "
                     f"{np.mean([r['rank1_share'] for r in rs]):.1f} | {lb_us} | "
                     f"{cpu:.2f}, {1e3 * (cpu - plain_cpu):+.0f} us |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="steady", choices=["none", "steady", "onoff", "trace", "membw"])
    ap.add_argument("--runners", default=",".join(RUNNERS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--period", type=float, default=1.5, help="onoff: seconds on, then off")
    ap.add_argument("--tick", type=float, default=0.25, help="trace: seconds per trace sample")
    ap.add_argument("--trace-window", type=lambda v: [float(x) for x in v.split(",")], default=[5.0, 11.0],
                    help="trace: the steps counted, FROM,TO seconds after the series began (default 5,11)")
    ap.add_argument("--balancer", default="lbbsp-cpu")
    ap.add_argument("--predictor", default="narx")
    ap.add_argument("--balancer-b", default="lbbsp-cpu;band=1",
                    help="the runner lbbsp-b's balancer (an A/B against --balancer in one run; add it to --runners; "
                         "default: the band lbbsp-cpu had until 2026-12-06)")
    ap.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard) instead of DDP for every runner")
    ap.add_argument("--out", default="results/cotenant")
    ap.add_argument("--tabulate", action="store_true", help="run nothing: the table of the runs kept in --out")
    a = ap.parse_args()
    if (os.cpu_count() or 1) < 2 or len(os.sched_getaffinity(0)) < 2:
        sys.exit("torch_cotenant.py: needs cores 0 and 1")
    runners = a.runners.split(",")
    known = RUNNERS + ["lbbsp-b", "lbbsp-python"]
    if "plain" not in runners or not set(runners) <= set(known):
        sys.exit(f"torch_cotenant.py: --runners {a.runners!r}: a comma-separated list from {', '.join(known)}, "
                 "plain (the baseline) among them")
    folder = os.path.join(a.out, a.scenario + ("-fsdp" if a.fsdp else ""))
    os.makedirs(folder, exist_ok=True)
    results = {r: [] for r in runners}
    for rep in range(a.repeats):
        order = runners[rep % len(runners):] + runners[:rep % len(runners)]  # rotate: no runner always first
        for runner in order:
            rec = kept(folder, f"{runner}-{rep}") if a.tabulate else run(runner, a, folder, f"{runner}-{rep}")
            results[runner].append(summarise(rec, a))
            print(f"round {rep} {runner}: {results[runner][-1]}", file=sys.stderr, flush=True)
    text = table(results, a)
    print(text)
    with open(os.path.join(folder, "summary.json"), "w") as f:
        json.dump({"scenario": a.scenario, "args": vars(a), "results": results, "table": text}, f, indent=1)


if __name__ == "__main__":
    main()
