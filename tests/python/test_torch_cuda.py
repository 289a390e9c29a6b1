"""lbbsp.torch's CUDA path (the step's time read from events on the device, no device-wide wait, the memory cap,
the model's device, the user's peak-memory statistics left alone), run two ways by the same workers:
- "fake", on any machine: torch.cuda replaced in each rank by FakeCuda (a device queue on the host clock whose
  events complete when the work queued before them is done, memory figures that follow the batch, the device of
  every call kept) and the controller told that its model lives on cuda:1 while cuda:0 is current, so every line
  of the CUDA path runs here and every device it is handed is checked;
- "cuda", on a real GPU: gloo ranks sharing the device(s), each rank's per-sample work a GPU kernel queued
  asynchronously, and NCCL with a rank per device; skipped where torch sees no GPU (dev/device_check.sh
  runs them on a GPU machine).
The memory cap is checked with FakeCuda only: a real device has far more memory than a test can make scarce."""

import os

# torch.cuda.is_available() without initialising CUDA in this process: the other tests' ranks are forked from it
# (the ranks that use CUDA are spawned).
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

import datetime
import time
import types

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from harness import CLASSES, DIM, data, finish, init, make_model, one_process, read_pickle, spawn, write_pickle
from torch.nn.parallel import DistributedDataParallel as DDP

from lbbsp.torch import LoadBalancer
from lbbsp.torch.clock import DeviceClock
from lbbsp.torch.memory import DeviceMemory, cuda_cap

# LBBSP_REQUIRE_CUDA=1 (dev/device_check.sh on a GPU machine): the "cuda" runs fail rather than skip there.
RUN_CUDA = torch.cuda.is_available() or os.environ.get("LBBSP_REQUIRE_CUDA") == "1"
MODES = [pytest.param("fake", id="fake"),
         pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(
             not RUN_CUDA, reason="no CUDA device: dev/device_check.sh runs these on a GPU machine"))]


class _HostEvent:
    """An event on FakeCuda's queue: it completes when the device has run what was queued before it."""

    def __init__(self, fake):
        self.fake, self.t = fake, None

    def record(self, stream=None):
        self.fake.saw(getattr(stream, "device", None))
        self.t = max(time.perf_counter(), self.fake.busy_until)

    def query(self):
        return self.t is not None and time.perf_counter() >= self.t

    def elapsed_time(self, end):
        if not (self.query() and end.query()):  # as CUDA: cudaErrorNotReady
            raise RuntimeError("CUDA error: device not ready (an event not yet completed)")
        return (end.t - self.t) * 1e3

    def synchronize(self):  # the emulated device's queued work takes its time: the host waits it out
        time.sleep(max(0.0, self.t - time.perf_counter()))


class FakeCuda:
    """What the controller uses of torch.cuda, in one rank: a device queue on the host clock (``queue(seconds)``
    adds work the host does not wait for; an event completes when what was queued before it is done); the device
    holds RESTING bytes between steps, PER_SAMPLE more a sample at a step's peak (``step(n)``), CACHED unused in
    the caching allocator, and has ``free`` bytes free; resetting the peak statistics fails the test; every device
    the controller names is kept in ``devices``; counted: the waits for the whole device (``device_syncs``) and the
    reads of one flattened statistic (``flattened``: memory_allocated & co);
    ``ahead_s`` is the most device work still queued when new work came (0 for a host that waits for its device
    every step)."""
    RESTING, PER_SAMPLE, CACHED = 1 << 20, 1000, 2000
    NAMES = ("Event", "current_stream", "synchronize", "memory_stats_as_nested_dict", "max_memory_allocated",
             "memory_allocated", "memory_reserved", "mem_get_info", "reset_peak_memory_stats",
             "reset_max_memory_allocated")

    def __init__(self, free):
        self.free, self.peak, self.devices = free, self.RESTING, []
        self.device_syncs = self.flattened = 0
        self.ahead_s = 0.0
        self.busy_until = 0.0  # when the device will have run everything queued so far (perf_counter clock)

    def install(self):
        for name in self.NAMES:
            setattr(torch.cuda, name, getattr(self, name))
        return self

    def saw(self, device):
        self.devices.append(device)

    def step(self, n):
        self.peak = max(self.peak, self.RESTING + self.PER_SAMPLE * n)

    def queue(self, seconds):
        now = time.perf_counter()
        self.ahead_s = max(self.ahead_s, self.busy_until - now)
        self.busy_until = max(self.busy_until, now) + seconds

    def Event(self, enable_timing=False):
        return _HostEvent(self)

    def current_stream(self, device=None):
        self.saw(device)
        return types.SimpleNamespace(device=device)

    def synchronize(self, device=None):
        self.saw(device)
        self.device_syncs += 1
        time.sleep(max(0.0, self.busy_until - time.perf_counter()))

    def memory_stats_as_nested_dict(self, device=None):
        self.saw(device)
        return {"allocated_bytes": {"all": {"current": self.RESTING, "peak": self.peak}},
                "reserved_bytes": {"all": {"current": self.RESTING + self.CACHED}}}

    # Each of these builds and flattens every allocator statistic on CUDA (~70-100 us a call): counted.
    def max_memory_allocated(self, device=None):
        self.flattened += 1
        return self.memory_stats_as_nested_dict(device)["allocated_bytes"]["all"]["peak"]

    def memory_allocated(self, device=None):
        self.flattened += 1
        return self.memory_stats_as_nested_dict(device)["allocated_bytes"]["all"]["current"]

    def memory_reserved(self, device=None):
        self.flattened += 1
        return self.memory_stats_as_nested_dict(device)["reserved_bytes"]["all"]["current"]

    def mem_get_info(self, device=None):
        self.saw(device)
        return self.free, 1 << 40

    def reset_peak_memory_stats(self, device=None):
        raise AssertionError("lbbsp.torch reset the user's peak-memory statistics")

    reset_max_memory_allocated = reset_peak_memory_stats


def _no_reset(*args, **kwargs):
    raise AssertionError("lbbsp.torch reset the user's peak-memory statistics")


class _Rank:
    """Where a rank computes (``device``), the device its model claims (``model_device``), and its per-sample work
    (``work(n, seconds)``): with FakeCuda the CPU, a claimed cuda:1 and that long on FakeCuda's queue; on a GPU the
    model's device (cuda:1 where there are two, while cuda:0 stays current) and a kernel spinning that long, queued
    without waiting."""

    def __init__(self, mode, rank, free=1 << 40):
        if mode == "fake":
            self.fake = FakeCuda(free).install()
            self.device, self.model_device = torch.device("cpu"), torch.device("cuda", 1)
            self.peak0 = None
            return
        self.fake = None
        if not torch.cuda.is_available():
            raise RuntimeError("LBBSP_REQUIRE_CUDA=1, but torch sees no CUDA device")
        torch.cuda.reset_peak_memory_stats = torch.cuda.reset_max_memory_allocated = _no_reset
        self.device = self.model_device = torch.device("cuda", (rank + 1) % torch.cuda.device_count())
        with torch.cuda.device(self.device):  # a peak of the user's own before training, which must stay
            scratch = torch.empty(64 << 20, dtype=torch.uint8, device=self.device)
            del scratch
            self.peak0 = torch.cuda.max_memory_allocated(self.device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(10 ** 7)
            end.record()
            end.synchronize()
            self.cycles_per_s = 10 ** 7 / (start.elapsed_time(end) / 1e3)

    def balancer(self, model, **kw):
        if self.fake is not None:  # the CUDA path, whose clock replaces the host one below, not the CPU's C++ path
            os.environ["LBBSP_TORCH_NATIVE"] = "0"
        lb = LoadBalancer(model, monitor=lambda: [1.0, 0.5, 0.0], **kw)
        if self.fake is not None:  # the model is on the host: the controller on the stand-in device's clock
            lb.clock, lb.memory = DeviceClock(self.model_device), DeviceMemory(self.model_device)
        assert lb.clock.on_device and lb.clock.device == lb.memory.device == self.model_device, lb.clock
        return lb

    def work(self, n, seconds):
        if self.fake is not None:  # queued on the device, as a kernel is: the host goes on at once
            self.fake.step(n)
            self.fake.queue(seconds)
        elif seconds > 0:
            with torch.cuda.device(self.device):
                torch.cuda._sleep(int(seconds * self.cycles_per_s))

    def checks(self, lb):
        """What every run checks on its rank: the devices named, the user's peak kept, the cap's figures."""
        out = {"bytes_per_sample": lb.memory.bytes_per_sample, "cap": lb.memory.cap(),
               "measured_s": lb.figures()["lbbsp/measured_s"]}
        if self.fake is not None:
            out["devices"] = sorted({str(d) for d in self.fake.devices})
            out["device_syncs"], out["ahead_s"] = self.fake.device_syncs, self.fake.ahead_s
            out["flattened"] = self.fake.flattened
        else:
            out["peak_kept"] = torch.cuda.max_memory_allocated(self.device) >= self.peak0
        return out


def _cuda_worker(rank, world, store, out, mode, what):
    if what == "nccl":  # the backend GPU users run: one rank per device
        torch.set_num_threads(1)
        dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))
    else:
        init(rank, world, store)
    if what in ("exact", "nccl"):  # random:5 sizes (0-sample ranks among them), float64, lag 1: equal to one process
        here, X, steps, kw = _Rank(mode, rank), 24, 20, dict(balancer="random:5", seed=3, lag=1)
        x, y = data()
        cost = [0.0] * world
    elif what in ("slow", "equal"):  # the last rank 5x slower a sample, its work queued on the device
        balancer = dict(balancer="lbbsp-cpu", predictor="ema") if what == "slow" else dict(balancer="bsp")
        here, X, steps, kw = _Rank(mode, rank), 64, 25, dict(seed=1, **balancer)
        g = np.random.default_rng(1)
        x, y = torch.from_numpy(g.normal(size=(64 * 25, DIM))), torch.from_numpy(g.integers(0, CLASSES, 64 * 25))
        cost = [3e-4] * (world - 1) + [1.5e-3]
    else:  # "cap": rank 1 has room for 6 samples free plus 2 cached: (6000 + 2000) / 1000 = 8
        here = _Rank(mode, rank, free=6 * FakeCuda.PER_SAMPLE if rank == 1 else 1 << 40)
        X, steps, kw = 48, 10, dict(balancer="lbbsp-gpu-model", seed=1)
        x, y = data()
        cost = [0.0] * world
    x, y = x.to(here.device), y.to(here.device)
    net = make_model().to(here.device)
    model = DDP(net, device_ids=[here.device.index] if here.device.type == "cuda" else None)
    lb = here.balancer(model, dataset_size=len(x), global_batch=X, **kw)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sizes, measured = [], []
    for g in range(steps):
        idx = torch.from_numpy(lb.indices(*divmod(g, lb.steps_per_epoch))).to(here.device)
        sizes.append(lb.batch_sizes.tolist())
        here.work(len(idx), len(idx) * cost[rank])
        loss = lb.scale(F.cross_entropy(model(x[idx]), y[idx], reduction="sum"), reduction="sum")
        loss.backward()
        opt.step()
        opt.zero_grad()
        lb.step()
        measured.append(lb.figures()["lbbsp/measured_s"])
    params = torch.cat([p.detach().flatten() for p in net.parameters()]).cpu().numpy()
    result = dict(sizes=sizes, params=params, measured=measured, **here.checks(lb))
    write_pickle(os.path.join(out, f"cuda-{what}-{rank}.pkl"), result)
    finish()


def run(tmp_path, mode, what, world):
    # CUDA's ranks are spawned (a forked child cannot initialise CUDA); the stand-in's as the other tests' are.
    spawn(_cuda_worker, world, tmp_path, mode, what, start_method="spawn" if mode == "cuda" else "fork")
    got = [read_pickle(tmp_path / f"cuda-{what}-{r}.pkl") for r in range(world)]
    assert all(g["sizes"] == got[0]["sizes"] for g in got), "the ranks disagree on the sizes"
    for r, g in enumerate(got):
        if mode == "fake":  # every call named the model's device (cuda:1), not the current one or none
            assert g["devices"] == ["cuda:1"], (r, g["devices"])
            # The host never waited for the whole device (which would wait for the step's allreduce, the
            # slowest rank) and not for its own backward either: a rank with device work queued the next
            # step's while its device still ran this one's (its step times are read a step later).
            assert g["device_syncs"] == 0, (r, g["device_syncs"])
            # The allocator's counters are read in one call, not through memory_allocated & co: ~0.3 ms a step.
            assert g["flattened"] == 0, (r, g["flattened"])
            if what in ("slow", "equal") and r == world - 1:
                assert g["ahead_s"] > 2e-3, (r, g["ahead_s"])
        else:
            assert g["peak_kept"], f"rank {r}: the process's peak-memory statistics were reset"
        assert g["bytes_per_sample"] > 0 and np.isfinite(g["measured_s"]) and g["measured_s"] >= 0, (r, g)
    sizes = np.array(got[0]["sizes"])
    # For the device check's log (pytest -rP shows it): what each rank reported, and where the sizes ended.
    print(f"{what} [{mode}]: last sizes {sizes[-1].tolist()}; median step time per rank (ms, steps 2 on): "
          f"{[round(1e3 * float(np.median(g['measured'][2:])), 3) for g in got]}; "
          f"bytes per sample {[round(g['bytes_per_sample']) for g in got]}; cap {[g['cap'] for g in got]}")
    return got, sizes


@pytest.mark.parametrize("mode", MODES)
def test_cuda_path_is_exact_and_keeps_the_users_statistics(tmp_path, mode):
    got, sizes = run(tmp_path, mode, "exact", 3)
    assert (sizes.sum(axis=1) == 24).all() and (sizes == 0).any(), sizes
    ref = one_process(20, 24)
    for r, g in enumerate(got):
        rel = np.linalg.norm(g["params"] - ref) / np.linalg.norm(ref)
        assert rel < 1e-10, f"rank {r}: relative difference {rel:.3g} from one process"
        assert g["cap"] >= sizes.max(), (r, g["cap"])  # memory to spare: no cap below what ran


@pytest.mark.skipif(not RUN_CUDA, reason="no CUDA device: dev/device_check.sh runs these on a GPU machine")
def test_nccl_is_exact(tmp_path):
    """NCCL for the gradients (the reports in gloo groups beside it), a rank per device, up to 3: equal to one
    process (on one GPU a single rank, which checks the path and the exactness, not the balancing)."""
    world = max(1, min(3, torch.cuda.device_count()))
    got, sizes = run(tmp_path, "cuda", "nccl", world)
    assert (sizes.sum(axis=1) == 24).all(), sizes
    ref = one_process(20, 24)
    for r, g in enumerate(got):
        rel = np.linalg.norm(g["params"] - ref) / np.linalg.norm(ref)
        assert rel < 1e-10, f"rank {r}: relative difference {rel:.3g} from one process"


@pytest.mark.parametrize("mode", MODES)
def test_cuda_rank_slowed_on_the_device_gets_fewer_samples(tmp_path, mode):
    """The work a rank queues on its device counts (the step is timed to the device's end), and the others'
    wait for it in the allreduce does not (CUDA events): else all would look alike and keep an equal split."""
    _, sizes = run(tmp_path, mode, "slow", 3)
    last = sizes[-1]
    assert last.sum() == 64
    assert last[2] < 0.5 * min(last[0], last[1]), sizes[-5:]


def test_cuda_fast_ranks_do_not_count_their_wait_for_the_slow_one(tmp_path):
    """An equal split (bsp), the last rank 5x slower on its device: the fast ranks wait for its report in step()
    (lag 0) while their window on the device is open; that idle time is not their work. Their reported time stays
    near a fifth of the slow rank's (counting the wait, it was as long as the slow rank's). Stand-in only: ranks
    sharing one real GPU time-slice its kernels, so there a fast rank's own work takes longer too."""
    got, sizes = run(tmp_path, "fake", "equal", 3)
    assert (sizes == sizes[0]).all(), sizes
    fast = np.median([got[r]["measured"][2:] for r in (0, 1)])
    slow = np.median(got[2]["measured"][2:])
    assert fast < 0.5 * slow, (fast, slow, [g["measured"][-3:] for g in got])


def test_cuda_memory_cap_bounds_the_batch(tmp_path):
    """The cap from the allocator's figures: (free + cached) / bytes per sample at the peak = 8 on rank 1, which
    then never gets more than 8 of the 48 samples."""
    got, sizes = run(tmp_path, "fake", "cap", 2)
    assert got[1]["cap"] == cuda_cap(6 * FakeCuda.PER_SAMPLE, FakeCuda.CACHED, FakeCuda.PER_SAMPLE) == 8
    assert got[0]["cap"] > 48, got[0]["cap"]
    assert sizes[0].tolist() == [24, 24], sizes[0]  # before any report: the equal split
    assert (sizes.sum(axis=1) == 48).all() and (sizes[1:, 1] <= 8).all(), sizes


def _fsdp_worker(rank, world, store, out):
    from torch.distributed.fsdp import fully_shard
    torch.set_num_threads(1)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    x, y = (t.to(device) for t in data())
    net = make_model().to(device)
    for m in net:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m)
    model = fully_shard(net)
    lb = LoadBalancer(model, dataset_size=len(x), global_batch=24, balancer="random:5", seed=3, lag=1,
                      monitor=lambda: [1.0, 0.5, 0.0])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sizes = []
    for g in range(20):
        idx = torch.from_numpy(lb.indices(*divmod(g, lb.steps_per_epoch))).to(device)
        sizes.append(lb.batch_sizes.tolist())
        lb.scale(F.cross_entropy(model(x[idx]), y[idx], reduction="sum"), reduction="sum").backward()
        opt.step()
        opt.zero_grad()
        lb.step()
    params = torch.cat([p.full_tensor().detach().flatten() for p in model.parameters()]).cpu().numpy()
    write_pickle(os.path.join(out, f"cuda-fsdp-{rank}.pkl"), dict(
        sizes=sizes, params=params, on_device=lb.clock.on_device, bytes_per_sample=lb.memory.bytes_per_sample,
        measured_s=lb.figures()["lbbsp/measured_s"]))
    finish()


@pytest.mark.skipif(not RUN_CUDA, reason="no CUDA device: dev/device_check.sh runs these on a GPU machine")
def test_fsdp2_on_the_device_is_exact(tmp_path):
    """FSDP2 (fully_shard per layer and at the root) on NCCL, a rank per device up to 3 (one GPU: world size 1):
    the step timed on the device's clock, the memory per sample read, equal to one process."""
    world = max(1, min(3, torch.cuda.device_count()))
    spawn(_fsdp_worker, world, tmp_path, start_method="spawn")
    got = [read_pickle(tmp_path / f"cuda-fsdp-{r}.pkl") for r in range(world)]
    ref = one_process(20, 24)
    for r, g in enumerate(got):
        assert g["sizes"] == got[0]["sizes"] and g["on_device"], (r, g["sizes"][-1], g["on_device"])
        assert g["bytes_per_sample"] > 0 and np.isfinite(g["measured_s"]), (r, g)
        rel = np.linalg.norm(g["params"] - ref) / np.linalg.norm(ref)
        assert rel < 1e-10, f"rank {r}: relative difference {rel:.3g} from one process"
