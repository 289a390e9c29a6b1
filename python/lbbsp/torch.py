"""LB-BSP for PyTorch: per-rank batch sizes in torch.distributed, re-sized every step, with exact aggregation.

    from lbbsp.torch import LoadBalancer
    lb = LoadBalancer(ddp_model, dataset_size=len(data), global_batch=256, balancer="lbbsp-cpu", predictor="narx")
    for epoch in range(epochs):
        for step in range(lb.steps_per_epoch):
            idx = lb.indices(epoch, step)          # this rank's samples of this global step (may be empty)
            with lb.timed():                       # this rank's compute
                loss = F.cross_entropy(ddp_model(x[idx]), y[idx], reduction="sum") / lb.global_batch
                loss.backward()
            opt.step(); opt.zero_grad()
            lb.step()                              # every rank's time and metrics to rank 0, next sizes back

The global batch of step k is positions [kX, (k+1)X) of ``lbbsp.epoch_permutation(n, seed, epoch)``, cut by
prefix sums of the batch vector: the same samples in the same order as ``lbbsp train``. The constructor registers a
DDP communication hook that SUMS gradients (DDP's default divides by the world size), so with a loss summed over
the rank's samples and divided by the global batch every rank gets the gradient of the global batch's mean loss,
for any split, ranks with 0 samples included: the trajectory equals one process on the same global batches.

Per step, ``step()`` gathers every rank's (batch, compute seconds, CPU and memory availability) on rank 0 in one
small collective of its own process group, rank 0 runs the C++ balancer, and one broadcast returns the sizes: every
rank holds the same sizes at every step. With ``lag=L`` the sizes of step k+L+1 are decided after step k, so a
DataLoader whose workers prefetch P batches ahead needs ``lag >= P`` (``num_workers * prefetch_factor``).
"""

import contextlib
import datetime
import os
import time
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np
import torch
import torch.distributed as dist

import lbbsp

__all__ = ["LoadBalancer", "BalancedBatchSampler", "sum_allreduce_hook", "ResourceMonitor", "init_from_env"]

_EXO = 3  # cpu_avail, mem_avail, load: what the C++ runtime reports (runtime/monitor.cpp)


def sum_allreduce_hook(process_group: Optional[dist.ProcessGroup],
                       bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the gradient SUM over ranks (DDP's default hook divides it by the world size)."""
    tensor = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
    group = process_group if process_group is not None else dist.group.WORLD
    work = dist.all_reduce(tensor, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


class ResourceMonitor:
    """CPU share left by other processes on this rank's CPUs, memory available and run-queue load, measured
    over the last interval from /proc as the C++ runtime measures them (1.0, 1.0, 0.0 where /proc is absent)."""

    def __init__(self) -> None:
        self._cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._last = self._cpu_times()
        self._last_own = time.process_time()

    def _cpu_times(self):
        busy = total = running = 0
        try:
            with open("/proc/stat") as f:
                for line in f:
                    if line.startswith("procs_running "):
                        running = int(line.split()[1])
                    if not line.startswith("cpu") or not line[3].isdigit():
                        continue
                    parts = line.split()
                    cpu = int(parts[0][3:])
                    if self._cpus and cpu not in self._cpus:
                        continue
                    v = [int(x) for x in parts[1:9]] + [0] * max(0, 9 - len(parts))
                    user, nice, sys_, idle, iowait, irq, softirq, steal = v[:8]
                    b = user + nice + sys_ + irq + softirq + steal
                    busy += b
                    total += b + idle + iowait
        except OSError:
            return None
        return busy, total, running

    def sample(self) -> List[float]:
        now, own = self._cpu_times(), time.process_time()
        cpu, mem, load = 1.0, 1.0, 0.0
        if now is not None and self._last is not None:
            total_s = (now[1] - self._last[1]) / self._tick
            others = max(0.0, (now[0] - self._last[0]) / self._tick - (own - self._last_own))
            if total_s > 0:
                cpu = min(1.0, max(0.0, 1.0 - others / total_s))
            load = now[2] / max(1, os.cpu_count() or 1)
        try:
            with open("/proc/meminfo") as f:
                info = {line.split(":")[0]: float(line.split()[1]) for line in f if ":" in line}
            mem = info["MemAvailable"] / info["MemTotal"]
        except (OSError, KeyError, ValueError, ZeroDivisionError):
            pass
        self._last, self._last_own = now, own
        return [cpu, mem, load]


def _launcher_env() -> Dict[str, str]:
    """RANK, WORLD_SIZE, LOCAL_RANK from torchrun, mpirun (Open MPI, MPICH) or srun, whichever set them."""
    env = os.environ
    for rank, size, local in (("RANK", "WORLD_SIZE", "LOCAL_RANK"),
                              ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
                              ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
                              ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")):
        if rank in env and size in env:
            return {"RANK": env[rank], "WORLD_SIZE": env[size], "LOCAL_RANK": env.get(local, "0")}
    raise RuntimeError("init_from_env: no launcher environment found: start with torchrun, mpirun or srun "
                       "(RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, PMI_*, or SLURM_PROCID/SLURM_NTASKS)")


def init_from_env(backend: Optional[str] = None, timeout_s: float = 300.0) -> int:
    """init_process_group from the launcher's environment; returns the local rank. The backend defaults to NCCL
    when CUDA is available, else gloo. Under mpirun/srun set MASTER_ADDR (rank 0's host; default the Slurm
    job's first node or 127.0.0.1) and MASTER_PORT (default 29500)."""
    ids = _launcher_env()
    os.environ.setdefault("MASTER_ADDR", _first_slurm_node() or "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    local = int(ids["LOCAL_RANK"])
    if backend == "nccl":
        torch.cuda.set_device(local % torch.cuda.device_count())
    dist.init_process_group(backend, rank=int(ids["RANK"]), world_size=int(ids["WORLD_SIZE"]),
                            timeout=datetime.timedelta(seconds=timeout_s))
    return local


def _first_slurm_node() -> Optional[str]:
    nodes = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodes:
        return None
    try:
        import subprocess
        out = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True, text=True, timeout=10)
        return out.stdout.split()[0] if out.returncode == 0 and out.stdout.split() else None
    except (OSError, subprocess.SubprocessError):
        return None


def _positive_int(value: Any, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"LoadBalancer: {name} must be an integer, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"LoadBalancer: {name} must be >= {minimum}, got {value}")
    return int(value)


class LoadBalancer:
    """Re-sizes every rank's share of a fixed global batch each step (LB-BSP) on torch.distributed.

    Args:
        model: the ``DistributedDataParallel`` model (its gradients get the SUM hook; plain BatchNorm layers get a
            warning once sizes differ), or None to register no hook (sum the gradients yourself).
        dataset_size: training samples n; an epoch is ``n // global_batch`` steps of the seeded permutation.
        global_batch: samples per step over all ranks (X).
        balancer, predictor, seed, min_batch: as for ``lbbsp train`` (``bsp``, ``static[:K]``, ``random:SEED``,
            ``lbbsp-cpu``, ``lbbsp-gpu``, ``lbbsp-gpu-model``; predictors ``narx``, ``arima``, ``ema``, ``last``).
        lag: 0 decides step k+1's sizes after step k; L > 0 decides step k+L+1's (DataLoader prefetching).
        process_group: the group to balance over (default: the whole world).
        timeout_s: a rank that does not report within this many seconds ends the step with an error naming it.
        monitor: a callable returning this rank's [cpu_avail, mem_avail, load] for the step just done
            (default: ResourceMonitor().sample, from /proc as the C++ runtime measures them).
    """

    def __init__(self, model: Optional[torch.nn.Module], dataset_size: int, global_batch: int,
                 balancer: str = "lbbsp-cpu", predictor: str = "narx", seed: int = 1, min_batch: int = 0,
                 lag: int = 0, process_group: Optional[dist.ProcessGroup] = None, timeout_s: float = 300.0,
                 monitor: Optional[Callable[[], List[float]]] = None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("LoadBalancer: call torch.distributed.init_process_group() first")
        self.dataset_size = _positive_int(dataset_size, "dataset_size")
        self.global_batch = _positive_int(global_batch, "global_batch")
        if self.global_batch > self.dataset_size:
            raise ValueError(f"LoadBalancer: global_batch {global_batch} exceeds dataset_size {dataset_size}")
        self.lag = _positive_int(lag, "lag", 0)
        self.seed = _positive_int(seed, "seed", 0)
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ValueError(f"LoadBalancer: timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        parent = process_group if process_group is not None else dist.group.WORLD
        self.rank, self.world_size = dist.get_rank(parent), dist.get_world_size(parent)
        self._ranks = dist.get_process_group_ranks(parent) if hasattr(dist, "get_process_group_ranks") else \
            list(range(self.world_size))
        self._root = self._ranks[0]  # global rank of the group's rank 0
        timeout = datetime.timedelta(seconds=self.timeout_s)
        # Control traffic in groups of their own (gloo: small CPU tensors), so a timeout here is ours to report.
        self._group = dist.new_group(ranks=self._ranks, backend="gloo", timeout=timeout)
        self._health = dist.new_group(ranks=self._ranks, backend="gloo", timeout=timeout)
        # Every rank builds the balancer (so bad arguments raise everywhere alike); only rank 0's decides.
        self._balancer = lbbsp.Balancer(balancer, workers=self.world_size, global_batch=self.global_batch,
                                        predictor=predictor, seed=self.seed, min_batch=min_batch, num_exo=_EXO,
                                        capacity_exo=0)
        self.steps_per_epoch = lbbsp.steps_per_epoch(self.dataset_size, self.global_batch)
        self._sizes: Dict[int, np.ndarray] = {k: self._balancer.initial() for k in range(self.lag + 1)}
        self._step = 0  # global step (over epochs) that the next step() closes
        self._perm_epoch, self._perm = -1, None
        self._monitor = monitor if monitor is not None else ResourceMonitor().sample
        if not callable(self._monitor):
            raise TypeError(f"LoadBalancer: monitor must be callable, got {type(monitor).__name__}")
        self._compute_s = 0.0
        self._bytes_per_sample = 0.0
        self._ready_s, self._ready_event = None, None
        # Seconds this rank spent in step(): in all ("step_s": the exchange, which also waits for ranks still
        # finishing their step) and, on rank 0, deciding ("decide_s").
        self.timing = {"step_s": 0.0, "decide_s": 0.0}
        if model is not None and not hasattr(model, "register_comm_hook"):
            raise TypeError("LoadBalancer: model must be a DistributedDataParallel (or None to sum gradients "
                            f"yourself), got {type(model).__name__}")
        self._model = model
        self._plain_bn = model is not None and any(
            isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and not isinstance(m, torch.nn.SyncBatchNorm)
            for m in model.modules())
        self._warned_bn = False
        if model is not None:
            model.register_comm_hook(getattr(model, "process_group", None), self._sum_hook)
        # DDP needs its module on the device before wrapping, so where the parameters live is fixed from here on.
        first = next(model.parameters(), None) if model is not None else None
        self._cuda = first is not None and first.is_cuda

    # ---- what a training loop asks for ----

    @property
    def global_step(self) -> int:
        """Steps completed so far over all epochs (the step the next indices() call is for)."""
        return self._step

    @property
    def batch_sizes(self) -> np.ndarray:
        """Every rank's batch size at the current step (the same array on every rank)."""
        return self.sizes_at(self._step)

    def sizes_at(self, global_step: int) -> np.ndarray:
        """Batch vector of a global step that is already decided (up to ``global_step + lag``)."""
        if global_step not in self._sizes:
            known = sorted(self._sizes)
            raise RuntimeError(f"LoadBalancer: the sizes of step {global_step} are not decided yet (known: steps "
                               f"{known[0]}..{known[-1]}); a DataLoader prefetching P batches ahead needs lag >= P "
                               f"(num_workers * prefetch_factor), lag is {self.lag}")
        return self._sizes[global_step].copy()

    def permutation(self, epoch: int) -> np.ndarray:
        """The epoch's sample order (lbbsp.epoch_permutation(n, seed, epoch)), cached for the current epoch."""
        if epoch != self._perm_epoch:
            self._perm, self._perm_epoch = lbbsp.epoch_permutation(self.dataset_size, self.seed, epoch), epoch
        return self._perm

    def indices(self, epoch: int, step: int) -> np.ndarray:
        """This rank's sample indices (int64, possibly empty) for ``step`` of ``epoch``."""
        step = _positive_int(step, "step", 0)
        if step >= self.steps_per_epoch:
            raise ValueError(f"LoadBalancer: step {step} is past the epoch's {self.steps_per_epoch} steps")
        sizes = self.sizes_at(_positive_int(epoch, "epoch", 0) * self.steps_per_epoch + step)
        if self._plain_bn and not self._warned_bn and len(set(sizes.tolist())) > 1:
            warnings.warn("LoadBalancer: the model has plain BatchNorm layers and the ranks' batch sizes differ: "
                          "each rank normalises over its own batch (a rank with 1 sample cannot). Use "
                          "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model), which weights by count.")
            self._warned_bn = True
        return lbbsp.rank_indices(self.permutation(epoch), step, sizes, self.rank)

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        """Measures this rank's compute: the block's time, or with DDP up to the moment its last gradient
        bucket was ready (the allreduce inside backward waits for the slowest rank, which is not compute).
        CUDA events time it when the model's parameters are on a GPU."""
        cuda = self._cuda
        self._ready_s, self._ready_event = None, None
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            start.record()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if cuda:
                end.record()
                end.synchronize()
                self._compute_s += start.elapsed_time(self._ready_event or end) / 1e3
                n = int(self._sizes[self._step][self.rank])
                if n > 0:
                    self._bytes_per_sample = (torch.cuda.max_memory_allocated() - base) / n
            else:
                self._compute_s += (self._ready_s or time.perf_counter()) - t0

    def _sum_hook(self, process_group: Optional[dist.ProcessGroup],
                  bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """The SUM hook, noting when this rank's gradient bucket was ready (the end of its own compute)."""
        self._ready_s = time.perf_counter()
        if self._cuda:
            self._ready_event = torch.cuda.Event(enable_timing=True)
            self._ready_event.record()
        return sum_allreduce_hook(process_group, bucket)

    def record_compute(self, seconds: float) -> None:
        """Adds compute time measured by the caller (instead of, or on top of, ``timed()``)."""
        if not (isinstance(seconds, (int, float)) and np.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"LoadBalancer.record_compute: seconds must be finite and >= 0, got {seconds!r}")
        self._compute_s += float(seconds)

    def step(self) -> np.ndarray:
        """Ends the step: every rank's report reaches rank 0, which decides and broadcasts the next sizes.
        Returns the batch vector of the coming step."""
        k = self._step
        report = torch.tensor([float(self._sizes[k][self.rank]), self._compute_s, *self._metrics(),
                               float(self._mem_cap())], dtype=torch.float64)
        gathered = [torch.zeros_like(report) for _ in range(self.world_size)] if self.rank == 0 else None
        t_exchange = time.perf_counter()
        self._collective(lambda: dist.gather(report, gathered, dst=self._root, group=self._group), k, "report")
        decided = torch.zeros(self.world_size, dtype=torch.int64)
        failure = None
        if self.rank == 0:
            try:
                t_decide = time.perf_counter()
                decided = torch.from_numpy(self._decide(torch.stack(gathered).numpy(), k))
                self.timing["decide_s"] += time.perf_counter() - t_decide
            except Exception as e:  # noqa: BLE001 - every rank must hear of it, then rank 0 re-raises
                failure, decided = e, torch.full((self.world_size,), -1, dtype=torch.int64)
        self._collective(lambda: dist.broadcast(decided, src=self._root, group=self._group), k, "sizes")
        self.timing["step_s"] += time.perf_counter() - t_exchange
        if failure is not None:
            raise failure
        if int(decided[0]) < 0:
            raise RuntimeError(f"LoadBalancer: step {k}: rank 0 could not decide the next sizes (its error says why)")
        self._sizes[k + self.lag + 1] = decided.numpy().copy()
        del self._sizes[k]
        self._step, self._compute_s = k + 1, 0.0
        return self._sizes[k + 1].copy()

    def _decide(self, reports: np.ndarray, k: int) -> np.ndarray:
        batch = reports[:, 0].round().astype(np.int64)
        if not np.array_equal(batch, self._sizes[k]):
            raise RuntimeError(f"LoadBalancer: step {k}: the ranks report batches {batch.tolist()}, not the "
                               f"decided {self._sizes[k].tolist()} (were indices() and step() called in order?)")
        exo = reports[:, 2:2 + _EXO]
        caps = reports[:, 2 + _EXO]
        mem_cap = np.full(len(caps), np.iinfo(np.int64).max, dtype=np.int64)  # 0 reported: no cap
        mem_cap[caps > 0] = caps[caps > 0].astype(np.int64)
        return self._balancer.next(batch=batch, compute_s=reports[:, 1], exo=exo, exo_next=exo, mem_cap=mem_cap)

    # ---- checkpoints ----

    def state_dict(self) -> Dict[str, Any]:
        """The controller's state; save rank 0's (it alone holds the balancer's), load it on every rank."""
        return {"version": 1, "world_size": self.world_size, "global_batch": self.global_batch,
                "dataset_size": self.dataset_size, "seed": self.seed, "lag": self.lag, "step": self._step,
                "sizes": {k: v.tolist() for k, v in self._sizes.items()},
                "balancer": self._balancer.save_state() if self.rank == 0 else None}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        for key in ("world_size", "global_batch", "dataset_size", "seed", "lag"):
            if state.get(key) != getattr(self, key):
                raise ValueError(f"LoadBalancer.load_state_dict: {key} is {state.get(key)!r} in the state and "
                                 f"{getattr(self, key)!r} here: resume with the same settings")
        if self.rank == 0:
            if state.get("balancer") is None:
                raise ValueError("LoadBalancer.load_state_dict: the state has no balancer state: save it on rank 0")
            self._balancer.load_state(state["balancer"])
        self._step = int(state["step"])
        self._sizes = {int(k): np.asarray(v, dtype=np.int64) for k, v in state["sizes"].items()}
        self._compute_s = 0.0

    # ---- DataLoader ----

    def batch_sampler(self, epoch: int) -> "BalancedBatchSampler":
        """A DataLoader ``batch_sampler`` yielding this rank's indices for every step of ``epoch``."""
        return BalancedBatchSampler(self, epoch)

    # ---- internals ----

    def _metrics(self) -> List[float]:
        m = [float(v) for v in self._monitor()]
        if len(m) != _EXO or not all(np.isfinite(m)):
            raise ValueError(f"LoadBalancer: monitor must return [cpu_avail, mem_avail, load], got {m}")
        return m

    def _mem_cap(self) -> int:
        """Most samples this rank can hold: 0 (no cap) on the CPU; on CUDA the free memory
        (torch.cuda.mem_get_info) over the bytes per sample seen at the last step's peak, plus that batch."""
        if not self._cuda or self._bytes_per_sample <= 0:
            return 0
        free, _ = torch.cuda.mem_get_info()
        return max(1, int(free / self._bytes_per_sample) + int(self._sizes[self._step][self.rank]))

    def _collective(self, run, k: int, what: str) -> None:
        try:
            run()
        except RuntimeError as e:
            raise RuntimeError(f"LoadBalancer: step {k}: exchanging {what} failed on rank {self.rank}: "
                               f"{self._missing_ranks()}; {str(e).splitlines()[0]}") from None

    def _missing_ranks(self) -> str:
        """Which ranks do not answer: a monitored barrier on the health group names them."""
        try:
            dist.monitored_barrier(group=self._health, timeout=datetime.timedelta(seconds=min(10.0, self.timeout_s)),
                                   wait_all_ranks=True)
        except RuntimeError as e:
            text = str(e).splitlines()[0]
            return f"not answering: {text}"
        except Exception as e:  # noqa: BLE001 - report whatever the barrier said
            return f"health check failed: {e}"
        return "every rank answered a health check afterwards"


class BalancedBatchSampler:
    """DataLoader ``batch_sampler`` over a LoadBalancer: yields this rank's index list of each step of an epoch,
    as far ahead as the controller's ``lag`` allows."""

    def __init__(self, lb: LoadBalancer, epoch: int) -> None:
        self.lb, self.epoch = lb, _positive_int(epoch, "epoch", 0)

    def __len__(self) -> int:
        return self.lb.steps_per_epoch

    def __iter__(self) -> Iterator[List[int]]:
        for step in range(self.lb.steps_per_epoch):
            yield self.lb.indices(self.epoch, step).tolist()
