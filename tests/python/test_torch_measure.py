"""What lbbsp.torch measures and how the balancers act on it, on real gloo process groups: the C++ runtime's
/proc monitor (read at most every min_interval_s), a rank slowed between steps, in loading, in forward or after
backward gets fewer samples (a logging collective in lb.untimed() not counted), a changed size measured on the new
size, every balancer and predictor alike on every rank, step() not waiting for another rank's work after its
backward, the CUDA memory cap's arithmetic, and the extension built for one x86-64 baseline. The shared harness is
harness.py."""

import os
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from harness import (
    CLASSES,
    DIM,
    N,
    appears,
    data,
    dump_rank,
    finish,
    fixed_metrics,
    init,
    load_ranks,
    make_model,
    read_pickle,
    source_dir,
    spawn,
    write_pickle,
)
from torch.nn.parallel import DistributedDataParallel as DDP

import lbbsp
from lbbsp.torch import LoadBalancer


def test_monitor_is_the_runtimes():
    """lbbsp.torch measures with the C++ runtime's /proc monitor (the same code as `lbbsp train`)."""
    m = lbbsp.torch.ResourceMonitor()
    assert isinstance(m.source, lbbsp._lbbsp.ResourceMonitor)
    cpu, mem, load = m.sample()
    assert 0 <= cpu <= 1 and 0 < mem <= 1 and load >= 0, (cpu, mem, load)


def test_monitor_reads_proc_at_most_every_min_interval():
    """Samples closer than min_interval_s repeat the last read (/proc costs ~70 us; its CPU figures move in 10 ms
    ticks); one at the interval reads again."""
    reads = []

    class Proc:
        def sample(self):
            reads.append(len(reads))
            return [1.0, 0.5, float(len(reads))]
    clock = iter([100.0, 100.004, 100.0099, 100.0101, 100.0202])
    m = lbbsp.torch.ResourceMonitor(min_interval_s=0.01, source=Proc(), clock=lambda: next(clock))
    got = [m.sample()[2] for _ in range(5)]
    assert got == [1.0, 1.0, 1.0, 2.0, 3.0], got


# ---- a slowed rank gets fewer samples ----


def _slow_worker(rank, world, store, out):
    init(rank, world, store)
    lb = LoadBalancer(None, dataset_size=4000, global_batch=64, balancer="lbbsp-cpu", predictor="ema", seed=1,
                      monitor=fixed_metrics)
    for g in range(25):
        idx = lb.indices(*divmod(g, lb.steps_per_epoch))
        time.sleep(len(idx) * (2e-4 if rank != world - 1 else 1e-3))  # the last rank is 5x slower
        lb.step()
    if rank == 0:
        np.save(os.path.join(out, "slow.npy"), lb.batch_sizes)
    finish()


def test_slowed_rank_gets_fewer_samples(tmp_path):
    spawn(_slow_worker, 3, tmp_path)
    sizes = np.load(tmp_path / "slow.npy")
    assert sizes.sum() == 64
    assert sizes[2] < 0.5 * min(sizes[0], sizes[1]), sizes


# ---- every balancer and predictor of the C++ side runs through LoadBalancer, alike on every rank ----

BALANCERS = [("bsp", "narx"), ("static:3", "narx"), ("random:4", "narx"), ("lbbsp-gpu", "narx"),
             ("lbbsp-gpu-model", "narx")] + [("lbbsp-cpu", p) for p in ("narx", "arima", "ema", "last")]


def _every_balancer_worker(rank, world, store, out):
    init(rank, world, store)
    got = {}
    for balancer, predictor in BALANCERS:
        lb = LoadBalancer(None, dataset_size=2000, global_batch=60, balancer=balancer, predictor=predictor,
                          seed=2, monitor=fixed_metrics)
        sizes = []
        for _g in range(30):
            sizes.append(lb.batch_sizes.tolist())
            lb.record_compute(1e-3 * lb.batch_sizes[rank] * (3.0 if rank == world - 1 else 1.0))  # last rank 3x
            lb.step()
        got[f"{balancer}/{predictor}"] = sizes
    dump_rank(out, "every", rank, got)
    finish()


def test_every_balancer_runs_alike_on_every_rank(tmp_path):
    spawn(_every_balancer_worker, 3, tmp_path)
    got = load_ranks(tmp_path, "every", 3)
    assert got[1] == got[0] and got[2] == got[0], "the ranks decided different sizes"
    for name, sizes in got[0].items():
        sizes = np.array(sizes)
        assert (sizes.sum(axis=1) == 60).all() and (sizes >= 0).all(), (name, sizes)
        last = sizes[-1]
        if name.startswith("bsp"):
            assert (sizes == 20).all(), (name, sizes)
        elif name.startswith("random"):
            assert len({tuple(s) for s in sizes}) > 10, (name, sizes)
        else:  # every balancer that measures gives the rank 3x slower fewer samples than the others
            assert last[2] < 0.6 * min(last[0], last[1]), (name, sizes[-5:])


# ---- measurement: the whole step counts, wherever the rank's per-sample cost lands ----


class _SlowDataset(torch.utils.data.Dataset):
    """(x[i], y[i]), sleeping `cost` seconds per sample read (emulated decoding in the main process)."""

    def __init__(self, x, y, cost):
        self.x, self.y, self.cost = x, y, cost

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(self.cost)
        return self.x[i], self.y[i]


class _SlowForward(torch.nn.Module):
    """The model, sleeping `cost` seconds per sample of its input in forward."""

    def __init__(self, net, cost):
        super().__init__()
        self.net, self.cost = net, cost

    def forward(self, x):
        time.sleep(len(x) * self.cost)
        return self.net(x)


def _where_worker(rank, world, store, out, where):
    init(rank, world, store)
    cost = 1.5e-3 if rank == world - 1 else 3e-4  # per sample; the last rank is 5x slower, in `where`
    g = np.random.default_rng(1)
    x, y = torch.from_numpy(g.normal(size=(64 * 25, DIM))), torch.from_numpy(g.integers(0, CLASSES, 64 * 25))
    net = make_model()
    model = DDP(_SlowForward(net, cost if where == "forward" else 0.0))
    lb = LoadBalancer(model, dataset_size=len(x), global_batch=64, balancer="lbbsp-cpu", predictor="ema", seed=1,
                      monitor=fixed_metrics)
    loader = lb.data_loader(_SlowDataset(x, y, cost if where == "load" else 0.0))  # no workers: the main process
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for xb, yb in loader:
        loss = lb.scale(F.cross_entropy(model(xb), yb))
        loss.backward()
        if where.startswith("after_backward"):
            time.sleep(len(xb) * cost)
        if where == "after_backward_logged":  # the fast ranks wait here for the slow one: not their work
            with lb.untimed():
                dist.all_reduce(loss.detach().clone())
        opt.step()
        opt.zero_grad()
        lb.step()
    if rank == 0:
        np.save(os.path.join(out, f"where-{where}.npy"), lb.batch_sizes)
    finish()


@pytest.mark.parametrize("where", ["load", "forward", "after_backward", "after_backward_logged"])
def test_rank_slowed_anywhere_in_the_step_gets_fewer_samples(tmp_path, where):
    """after_backward_logged: a logging all_reduce of the user's own after the slow part, in lb.untimed() as
    docs/torch.md says (without it the fast ranks' wait there counts as their work and they look as slow)."""
    spawn(_where_worker, 3, tmp_path, where)
    sizes = np.load(tmp_path / f"where-{where}.npy")
    assert sizes.sum() == 64
    assert sizes[2] < 0.5 * min(sizes[0], sizes[1]), (where, sizes)


def _change_worker(rank, world, store, out):
    init(rank, world, store)
    cost = 4e-3  # seconds per sample, after backward, on every rank
    x, y = data()
    model = DDP(make_model())
    lb = LoadBalancer(model, dataset_size=N, global_batch=48, balancer="random:5", seed=1, monitor=fixed_metrics)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rows = []
    for g in range(16):
        n = int(lb.batch_sizes[rank])
        idx = torch.from_numpy(lb.indices(*divmod(g, lb.steps_per_epoch)))
        lb.scale(F.cross_entropy(model(x[idx]), y[idx])).backward()
        time.sleep(n * cost)
        opt.step()
        opt.zero_grad()
        lb.step()
        rows.append((n, lb.figures()["lbbsp/measured_s"]))
    np.save(os.path.join(out, f"change-{rank}.npy"), np.array(rows))
    finish()


def test_a_changed_size_is_measured_on_the_new_size(tmp_path):
    """With a DDP model on the CPU a step's window opens as the previous step's allreduce completes, so it starts
    with the previous step's work after backward. Where the size changed, that part counts as the new size
    costs: the time reported is nearer the new size's cost than the old one's (before, it was the old one's)."""
    spawn(_change_worker, 3, tmp_path)
    cost, checked = 4e-3, 0
    for r in range(3):
        rows = np.load(tmp_path / f"change-{r}.npy")
        for (before, _), (n, measured) in zip(rows[:-1], rows[1:]):
            if before >= 4 and 0.5 <= n / before <= 2 and abs(n - before) >= 6:
                checked += 1
                assert abs(measured - cost * n) < abs(measured - cost * before), (r, before, n, measured)
    assert checked >= 3, "random:5 changed the sizes too little: the test lost its point"


# ---- step() does not wait for another rank's work after its backward (the reports left with the gradients) ----


def _no_wait_worker(rank, world, store, out, lag):
    init(rank, world, store)
    x, y = data()
    model = DDP(make_model())
    lb = LoadBalancer(model, dataset_size=N, global_batch=24, balancer="lbbsp-cpu", predictor="ema", lag=lag,
                      monitor=fixed_metrics, timeout_s=30)
    stepped = os.path.join(out, f"stepped-{lag}")
    result = "finished"
    try:
        for g in range(6):
            idx = torch.from_numpy(lb.indices(*divmod(g, lb.steps_per_epoch)))
            lb.scale(F.cross_entropy(model(x[idx]), y[idx])).backward()
            if rank == 1 and g == 3 and not appears(stepped):  # rank 1 holds on until rank 0 is through step()
                result = "rank 0 did not get through step() while rank 1 held on"
            lb.step()
            if rank == 0 and g == 3:
                open(stepped, "w").close()
    except RuntimeError as e:
        result = str(e)
    write_pickle(os.path.join(out, f"nowait-{lag}-{rank}.pkl"), result)
    finish()


@pytest.mark.parametrize("lag", [0, 1])
def test_step_does_not_wait_for_work_after_backward(tmp_path, lag):
    spawn(_no_wait_worker, 2, tmp_path, lag)
    for r in range(2):
        assert read_pickle(tmp_path / f"nowait-{lag}-{r}.pkl") == "finished"


def test_cuda_cap_counts_the_allocators_cache():
    from lbbsp.torch.memory import cuda_cap
    assert cuda_cap(free=1000, cached=200, bytes_per_sample=10.0) == 120
    assert cuda_cap(free=1000, cached=-5, bytes_per_sample=10.0) == 100
    assert cuda_cap(free=0, cached=0, bytes_per_sample=10.0) == 1


# ---- the extension is built for one x86-64 baseline, not for the node that built it ----


def test_extension_is_portable():
    """pyproject.toml sets LBBSP_PORTABLE (no -march=native) and python/CMakeLists.txt one baseline, x86-64-v3: the
    compile flags recorded in the extension (-frecord-gcc-switches) name that -march and no other (a -march=native
    build records the node's own, e.g. -march=znver3), and its code has no AVX-512 (zmm or mask register)."""
    import platform
    import re
    import shutil
    import subprocess
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 only")
    if shutil.which("objdump") is None or shutil.which("readelf") is None:
        pytest.skip("no objdump/readelf (binutils)")
    src = source_dir()
    assert re.search(r'^LBBSP_PORTABLE\s*=\s*"ON"', open(os.path.join(src, "pyproject.toml")).read(), re.M)
    so = lbbsp._lbbsp.__file__
    switches = subprocess.run(["readelf", "-p", ".GCC.command.line", so], capture_output=True, text=True).stdout
    assert "-O" in switches, f"no compile flags recorded in {so}: {switches[:300]}"
    assert set(re.findall(r"-march=(\S+)", switches)) == {"x86-64-v3"}, switches
    assert "native" not in switches, switches
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", so], capture_output=True, text=True,
                          check=True).stdout
    assert len(text) > 10000, "objdump printed almost nothing"
    avx512 = [line for line in text.splitlines() if re.search(r"%zmm\d|%k[1-7]\b", line)]
    assert avx512 == [], f"{len(avx512)} AVX-512 instructions in {so}, e.g. {avx512[:3]}"
