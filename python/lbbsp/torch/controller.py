"""LoadBalancer: the per-step controller (measurement, loss scaling, the exchange, decisions, state)."""

import contextlib
import time
import warnings
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist

import lbbsp

from ._util import _positive_int
from .exchange import CAP, CHECKSUM, EXO, MEASURED, REPORT, STATUS, ReportExchange, checksum, disagreement, group_ranks
from .hooks import first_tensor, sum_allreduce_hook, then
from .monitor import ResourceMonitor
from .sampler import AllowEmpty, BalancedBatchSampler, required_lag


def cuda_cap(free: int, cached: int, bytes_per_sample: float) -> int:
    """Most samples a rank can hold: what its process can still use on the device (free memory plus blocks its
    caching allocator holds unused) over the bytes one sample of a step needs at its peak; at least 1."""
    return max(1, int((free + max(0, cached)) / bytes_per_sample))


def _saved_sizes(sizes: Any, step: int) -> Dict[int, np.ndarray]:
    """A state's decided batch vectors by global step: a list from ``step`` on (version 3) or a dict keyed by
    step (version 2)."""
    pairs = sizes.items() if isinstance(sizes, dict) else enumerate(sizes, start=step)
    return {int(k): np.asarray(v, dtype=np.int64) for k, v in pairs}


class LoadBalancer:
    """Re-sizes every rank's share of a fixed global batch each step (LB-BSP) on torch.distributed.

    Args:
        model: the ``DistributedDataParallel`` model (its gradients get the SUM hook, which also times the step's
            wait in the gradient allreduce; plain BatchNorm layers get a warning once sizes differ), or None to
            register no hook (sum the gradients yourself; the step is then timed from step() to step()). FSDP
            models are refused (TypeError; docs/torch.md, FSDP).
        dataset_size: training samples n; an epoch is ``n // global_batch`` steps of the seeded permutation.
        global_batch: samples per step over all ranks (X).
        balancer, predictor, seed, min_batch: as for ``lbbsp train`` (``bsp``, ``static[:K]``, ``random:SEED``,
            ``lbbsp-cpu``, ``lbbsp-gpu``, ``lbbsp-gpu-model``; predictors ``narx``, ``arima``, ``ema``, ``last``).
        lag: 0 decides step k+1's sizes after step k; L > 0 decides step k+L+1's (a DataLoader with workers
            needs ``lag >= required_lag(num_workers, prefetch_factor, micro_batches)``). None (default): 0, raised by
            ``data_loader()`` to what its DataLoader needs when it is built before the first step.
        process_group: the data-parallel group to balance over (default: the whole world). With subgroups
            every process of the world builds its LoadBalancer at the same point, each with its own group
            (the control groups are made by every process, as PyTorch requires).
        timeout_s: a rank whose report does not arrive within this many seconds ends the step with an error
            naming it. None (default): PyTorch's default process-group timeout (``dist.default_pg_timeout``,
            30 min), so a long phase on one rank between steps (a rank-0-only evaluation or checkpoint) ends the
            job no sooner than a collective of PyTorch's own would; set it lower to name a hung rank sooner.
        monitor: a callable returning this rank's [cpu_avail, mem_avail, load] for the step just done
            (default: ResourceMonitor().sample, from /proc as the C++ runtime measures them).
        check_loss: warn (once) when a backward pass reaches the gradient allreduce in a step in which
            ``scale()`` was not called: an unscaled mean loss gives wrong gradients; and (once) when ``scale()``
            without ``count`` follows a forward whose first input has another number of rows than this rank's
            slice (batches not read through this balancer's sampler). False if the loss is already scaled by
            hand (a sum over the rank's samples divided by ``global_batch``).
        micro_batches: gradient accumulation: each step's slice of this rank is cut into this many micro-batches
            (``micro_sizes()``, sizes differing by at most one, some possibly empty), which the batch sampler
            yields one by one; ``scale()`` called once per micro-batch weights each by its own size, and a step
            whose ``scale()`` calls do not match ends with an error on every rank (with check_loss). Use
            ``model.no_sync()`` for all but the last micro-batch of a step.

    Loss: the gradients are SUMMED over ranks, so each rank's loss must be its share of the global batch's loss.
    ``loss = lb.scale(loss)`` does that for a loss that is the mean over this rank's samples (PyTorch's default
    ``reduction="mean"``), ``lb.scale(loss, reduction="sum")`` for a sum. A term that depends on the parameters
    only (an L2 penalty, a KL to a prior) goes inside ``scale()`` with the data loss, ``lb.scale(mean + l2)``: it
    is weighted n_r / X on each rank, which adds up to one over the ranks; added outside ``scale()`` on every rank
    it counts world-size times. (Weight decay in the optimizer acts after the allreduce and needs nothing.)
    """

    def __init__(self, model: Optional[torch.nn.Module], dataset_size: int, global_batch: int,
                 balancer: str = "lbbsp-cpu", predictor: str = "narx", seed: int = 1, min_batch: int = 0,
                 lag: Optional[int] = None, process_group: Optional[dist.ProcessGroup] = None,
                 timeout_s: Optional[float] = None,
                 monitor: Optional[Callable[[], List[float]]] = None, check_loss: bool = True,
                 micro_batches: int = 1) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("LoadBalancer: call torch.distributed.init_process_group() first")
        self.dataset_size = _positive_int(dataset_size, "dataset_size")
        self.global_batch = _positive_int(global_batch, "global_batch")
        if self.global_batch > self.dataset_size:
            raise ValueError(f"LoadBalancer: global_batch {global_batch} exceeds dataset_size {dataset_size}")
        self._auto_lag = lag is None
        self.lag = 0 if lag is None else _positive_int(lag, "lag", 0)
        self.seed = _positive_int(seed, "seed", 0)
        if timeout_s is None:
            timeout_s = dist.default_pg_timeout.total_seconds()
        if isinstance(timeout_s, bool) or not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ValueError(f"LoadBalancer: timeout_s must be a positive number of seconds or None (PyTorch's "
                             f"default process-group timeout), got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self._ranks = group_ranks(process_group)
        if dist.get_rank() not in self._ranks:
            raise ValueError(f"LoadBalancer: this process (rank {dist.get_rank()}) is not in process_group "
                             f"{self._ranks}")
        self.rank, self.world_size = self._ranks.index(dist.get_rank()), len(self._ranks)
        # Every rank builds the balancer and decides (so bad arguments raise everywhere alike, and every rank
        # holds the same state); the reports travel in gloo groups of their own (ReportExchange).
        self._balancer_args = dict(name=balancer, workers=self.world_size, global_batch=self.global_batch,
                                   predictor=predictor, seed=self.seed, min_batch=min_batch, num_exo=EXO,
                                   capacity_exo=lbbsp.RANK_CAPACITY_EXO)
        self._balancer = lbbsp.Balancer(**self._balancer_args)
        self._no_cap = np.full(self.world_size, np.iinfo(np.int64).max, dtype=np.int64)  # mem_cap: none
        self._exchange = ReportExchange(self._ranks, self.rank, self.timeout_s)
        self.steps_per_epoch = lbbsp.steps_per_epoch(self.dataset_size, self.global_batch)
        self._sizes: Dict[int, np.ndarray] = {k: self._balancer.initial() for k in range(self.lag + 1)}
        self._done_sizes = self._sizes[0]  # the batch vector of the last step closed (figures())
        self._after_barrier: Optional[tuple] = None  # (step, seconds, batch) of the work after its allreduce
        self._measured_s = float("nan")  # this rank's time in its last report (figures())
        self._step = 0  # global step (over epochs) that the next step() closes
        self._decided = -1  # the last step whose reports were decided from
        self._stepped = False  # step() called since construction (or the last load_state_dict)
        self._report_errors: Dict[int, BaseException] = {}  # step -> this rank's error building its report
        self._perm_epoch, self._perm = -1, None
        self._monitor = monitor if monitor is not None else ResourceMonitor().sample
        if not callable(self._monitor):
            raise TypeError(f"LoadBalancer: monitor must be callable, got {type(monitor).__name__}")
        if not isinstance(check_loss, bool):
            raise TypeError(f"LoadBalancer: check_loss must be True or False, got {check_loss!r}")
        self._check_loss, self._warned_loss, self._scaled_step = check_loss, False, -1
        self.micro_batches = _positive_int(micro_batches, "micro_batches", 1)
        self._micro = 0  # scale() calls in the current step (the micro-batch the next one is for)
        self._bytes_per_sample, self._max_batch, self._cached_bytes = 0.0, 0, 0
        self._resting: Optional[int] = None  # bytes allocated on the device at the last step() (CUDA)
        # CUDA: the window that closed at the last bucket (batch, opened, ready, exo), and the last closed window not
        # yet reported (the same and its waits' events): read one step later, when the device has run it.
        self._closing: Optional[tuple] = None
        self._unread: Optional[tuple] = None
        # Seconds this rank spent in step() ("step_s"), blocked there waiting for reports ("wait_s") and
        # deciding ("decide_s", the same work on every rank).
        self.timing = {"step_s": 0.0, "wait_s": 0.0, "decide_s": 0.0}
        fsdp = {"FullyShardedDataParallel", "FSDPModule"}  # PyTorch's two FSDP APIs (no import: not in 1.13)
        if model is not None and fsdp & {c.__name__ for c in type(model).__mro__}:
            raise TypeError("LoadBalancer: FSDP (FullyShardedDataParallel, fully_shard) is not supported: its "
                            "all-gathers in every layer make each rank wait for the others inside the step, so a "
                            "rank's own time cannot be told from its waiting, and it averages the gradients where "
                            "LB-BSP needs their sum. Use DistributedDataParallel")
        if model is not None and not hasattr(model, "register_comm_hook"):
            raise TypeError("LoadBalancer: model must be a DistributedDataParallel (or None to sum gradients "
                            f"yourself), got {type(model).__name__}")
        model_ranks = group_ranks(getattr(model, "process_group", None)) if model is not None else self._ranks
        # One all-gather at construction: settings that differ by rank would cut other samples (or sum the
        # gradients over other ranks) while every rank's sizes still agree.
        self._exchange.check_same({
            "dataset_size": self.dataset_size, "global_batch": self.global_batch, "seed": self.seed,
            "balancer": balancer, "predictor": predictor, "min_batch": min_batch, "lag": lag,
            "micro_batches": self.micro_batches, "model": type(model).__name__ if model is not None else None,
            "model_group": model_ranks})
        if model_ranks != self._ranks:  # the same on every rank of the group (checked just above)
            raise ValueError(f"LoadBalancer: the DDP model reduces its gradients over ranks {model_ranks} but "
                             f"process_group balances over ranks {self._ranks}: pass the DDP model's process_group "
                             "(DDP(module, process_group=g) and LoadBalancer(..., process_group=g))")
        self._model = model
        self._weak_self = weakref.ref(self)
        self._plain_bn = model is not None and any(
            isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and not isinstance(m, torch.nn.SyncBatchNorm)
            for m in model.modules())
        self._warned_bn = self._warned_timed = False
        # DDP needs its module on the device before wrapping, so where the parameters live is fixed from here on.
        first = next(model.parameters(), None) if model is not None else None
        self._cuda = first is not None and first.is_cuda
        self._device = first.device if self._cuda else None
        if model is not None:
            # The hook holds the LoadBalancer weakly: no reference cycle (model -> hook -> self -> model), so a
            # dropped LoadBalancer and its process groups go at once, in the thread that drops them, and not in
            # a garbage collection that may run anywhere (in a gloo thread's callback, say).
            me, orphaned = self._weak_self, []

            def hook(state: Optional[dist.ProcessGroup], bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
                lb = me()
                if lb is not None:
                    return lb._sum_hook(state, bucket)
                if not orphaned:  # DDP keeps the hook: training on without the LoadBalancer still sums
                    orphaned.append(True)
                    warnings.warn("LoadBalancer: the DDP model's LoadBalancer is gone (no reference left to it) "
                                  "but its hook stays: the gradients are still SUMMED over ranks, so a mean loss "
                                  "gives gradients world-size times too large. Keep the LoadBalancer for as long "
                                  "as the model trains, or train on with a new DDP model")
                return sum_allreduce_hook(state, bucket)
            try:
                model.register_comm_hook(getattr(model, "process_group", None), hook)
            except RuntimeError as e:  # DDP takes one hook: the user's (a compression hook, say) came first
                raise RuntimeError("LoadBalancer: the model already has a communication hook (register_comm_hook "
                                   "was called on it): LB-BSP needs its own, which sums the gradients and carries "
                                   "the reports; build the LoadBalancer on a DDP model without one (gradient "
                                   f"compression hooks are not supported). PyTorch: {e}") from e
            if check_loss:
                def note_rows(module: torch.nn.Module, args: Tuple[Any, ...]) -> None:
                    lb = me()
                    if lb is not None:
                        lb._rows = args[0].shape[0] if args and torch.is_tensor(args[0]) and args[0].dim() else None
                model.register_forward_pre_hook(note_rows)
        self._rows: Optional[int] = None  # the first input's rows in the model's last forward
        self._warned_rows = False
        self._restart_clock()

    # ---- what a training loop asks for ----

    @property
    def global_step(self) -> int:
        """Steps completed so far over all epochs (the step the next indices() call is for)."""
        return self._step

    @property
    def epoch(self) -> int:
        """The epoch of ``global_step`` (where a resumed run continues)."""
        return self._step // self.steps_per_epoch

    @property
    def batch_sizes(self) -> np.ndarray:
        """Every rank's batch size at the current step (the same array on every rank)."""
        return self.sizes_at(self._step)

    def _where(self, global_step: int) -> str:
        epoch, step = divmod(global_step, self.steps_per_epoch)
        return f"epoch {epoch}, step {step}"

    def figures(self) -> Dict[str, float]:
        """What a framework logs after a step: this rank's batch size in the step just done, the time it reported
        for its last measured step (what the balancer sees), its predicted speed (samples/s, where the balancer
        predicts), and the seconds so far blocked on reports and spent in step()."""
        out = {"lbbsp/batch_size": float(self._done_sizes[self.rank]), "lbbsp/wait_s": self.timing["wait_s"],
               "lbbsp/step_s": self.timing["step_s"], "lbbsp/measured_s": self._measured_s}
        speeds = self._balancer.predicted_speeds()
        if len(speeds) == self.world_size:
            out["lbbsp/predicted_speed"] = float(speeds[self.rank])
        return out

    def sizes_at(self, global_step: int) -> np.ndarray:
        """Batch vector of a global step that is already decided (up to ``global_step + lag``)."""
        if global_step not in self._sizes and global_step > self._step:
            # decided from the reports of steps already closed (a DataLoader reading ahead asks here first)
            self._decide_through(min(global_step - self.lag - 1, self._step - 1), block=True)
        if global_step not in self._sizes:
            epoch, step = divmod(global_step, self.steps_per_epoch)
            if global_step < self._step:
                raise RuntimeError(f"LoadBalancer: step {step} of epoch {epoch} is past: the run is at step "
                                   f"{self._step} ({self._where(self._step)}); continue from lb.global_step "
                                   "(a sampler from lb.batch_sampler() starts there by itself)")
            known = sorted(self._sizes)
            why = (f"step {self._step}'s backward has run but lb.step() has not: call lb.step() once per step, "
                   "after opt.step()" if self._exchange.launched(self._step) else
                   "a DataLoader prefetching P batches ahead needs lag >= P (num_workers * prefetch_factor: "
                   "lbbsp.torch.required_lag)")
            raise RuntimeError(f"LoadBalancer: the sizes of step {step} of epoch {epoch} (global step "
                               f"{global_step}) are not decided yet: the run is at step {self._step} and decides "
                               f"lag={self.lag} steps ahead (known: steps {known[0]}..{known[-1]}); {why}")
        return self._sizes[global_step].copy()

    def permutation(self, epoch: int) -> np.ndarray:
        """The epoch's sample order (lbbsp.epoch_permutation(n, seed, epoch)), cached for the current epoch."""
        if epoch != self._perm_epoch:
            self._perm, self._perm_epoch = lbbsp.epoch_permutation(self.dataset_size, self.seed, epoch), epoch
        return self._perm

    def micro_sizes(self, global_step: Optional[int] = None) -> List[int]:
        """This rank's micro-batch sizes at a step (default the current one): its batch cut into
        ``micro_batches`` parts, the first ones larger by one where it does not divide."""
        n = int(self.sizes_at(self._step if global_step is None else global_step)[self.rank])
        q, r = divmod(n, self.micro_batches)
        return [q + 1] * r + [q] * (self.micro_batches - r)

    def micro_indices(self, epoch: int, step: int) -> List[np.ndarray]:
        """This rank's sample indices of ``step`` of ``epoch`` cut into ``micro_batches`` micro-batches."""
        idx = self.indices(epoch, step)
        return np.split(idx, np.cumsum(self.micro_sizes(epoch * self.steps_per_epoch + step))[:-1])

    def indices(self, epoch: int, step: int) -> np.ndarray:
        """This rank's sample indices (int64, possibly empty) for ``step`` of ``epoch``."""
        step = _positive_int(step, "step", 0)
        if step >= self.steps_per_epoch:
            raise ValueError(f"LoadBalancer: step {step} is past the epoch's {self.steps_per_epoch} steps")
        sizes = self.sizes_at(_positive_int(epoch, "epoch", 0) * self.steps_per_epoch + step)
        if self._plain_bn and not self._warned_bn and len(set(sizes.tolist())) > 1:
            warnings.warn("LoadBalancer: the model has plain BatchNorm layers and the ranks' batch sizes differ: "
                          "each rank normalises over its own batch (a rank with 1 sample cannot). On GPUs use "
                          "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model), which weights by count; on the CPU "
                          "(where PyTorch's SyncBatchNorm does not run) GroupNorm or LayerNorm, or a min_batch that "
                          "every rank's statistics can live with.")
            self._warned_bn = True
        return lbbsp.rank_indices(self.permutation(epoch), step, sizes, self.rank)

    def scale(self, loss: torch.Tensor, reduction: str = "mean", count: Optional[int] = None) -> torch.Tensor:
        """This rank's share of the global batch's loss, for the SUM of gradients over ranks.

        ``reduction="mean"`` (PyTorch's default): ``loss`` is the mean over this rank's samples of the step
        (``count`` of them if given; default this rank's batch size, or with ``micro_batches`` > 1 the size of
        the micro-batch this call is for: the i-th call of a step is for micro-batch i) and is multiplied by
        count / global_batch; with 0 samples (a mean of nothing, NaN) the result is 0 with a zero gradient.
        ``reduction="sum"``: ``loss`` is the sum over the rank's samples and is divided by global_batch.
        Terms that depend on parameters only (an L2 penalty) belong inside: ``lb.scale(mean_loss + l2)`` weights
        them n_r / X on each rank, which sums to one over the ranks; outside, every rank adds them in full.
        A mean loss inside ``ddp_model.no_sync()`` without ``count`` (and ``micro_batches=1``) raises: there it is
        a micro-batch's, and the whole slice's count would weight it too much."""
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise ValueError("LoadBalancer.scale: loss must be a scalar tensor (reduce it first: the mean or the "
                             f"sum over this rank's samples), got {type(loss).__name__}"
                             f"{' of shape ' + str(tuple(loss.shape)) if isinstance(loss, torch.Tensor) else ''}")
        if reduction not in ("mean", "sum"):
            raise ValueError(f"LoadBalancer.scale: reduction must be 'mean' or 'sum', got {reduction!r}")
        if self.micro_batches > 1 and self._micro >= self.micro_batches:
            raise RuntimeError(f"LoadBalancer.scale: step {self._step}: called more than micro_batches="
                               f"{self.micro_batches} times; call it once per micro-batch, then lb.step()")
        if count is not None:
            n = _positive_int(count, "count", 0)
        elif self.micro_batches > 1:
            n = self.micro_sizes()[self._micro]
        else:
            self._refuse_unsplit_accumulation(reduction)
            n = int(self._sizes[self._step][self.rank])
        if count is None and reduction == "mean":
            self._check_rows(n)
        self._scaled_step = self._step
        self._micro += 1
        if reduction == "sum":
            return loss / self.global_batch
        if n == 0:
            return torch.nan_to_num(loss * 0.0, nan=0.0, posinf=0.0, neginf=0.0)
        return loss * (n / self.global_batch)

    def _check_rows(self, n: int) -> None:
        """Warns once where the forward before scale() saw another batch than the n samples it is weighted by."""
        rows, self._rows = self._rows, None
        if rows is None or rows == n or self._warned_rows:  # None too with check_loss=False: no hook then
            return
        self._warned_rows = True
        warnings.warn(f"LoadBalancer.scale: step {self._step}: the model's last forward had {rows} rows in its "
                      f"first input but this rank's share is {n} samples: read the batches through "
                      "lb.data_loader() or lb.batch_sampler() (a DataLoader of your own with batch_size or a "
                      "DistributedSampler does not follow the balancer, which then weights the loss wrongly). If "
                      "the first input is not batch-first, pass count= to scale() (or check_loss=False)")

    def _refuse_unsplit_accumulation(self, reduction: str) -> None:
        """A mean loss scaled inside the DDP model's no_sync() is a micro-batch's (manual accumulation): weighted
        by the whole slice's count once per micro-batch, the step's gradients would come out too large."""
        if reduction != "mean" or getattr(self._model, "require_backward_grad_sync", True):
            return
        raise ValueError(f"LoadBalancer.scale: step {self._step}: a mean loss inside the DDP model's no_sync() "
                         "(gradient accumulation) with micro_batches=1 and no count would be weighted by this "
                         f"rank's whole slice ({int(self._sizes[self._step][self.rank])} samples) once per "
                         "micro-batch. Pass the micro-batch's size, lb.scale(loss, count=len(y)), or build the "
                         "LoadBalancer with micro_batches=A and read the micro-batches from lb.data_loader(); "
                         "for a loss over the whole slice pass count=int(lb.batch_sizes[lb.rank])")

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        """Deprecated, does nothing: every step is now measured from leaving one step() to entering the next,
        less the gradient allreduce's wait (so no work of the step can fall outside the measure)."""
        if not self._warned_timed:
            self._warned_timed = True
            warnings.warn("LoadBalancer.timed() is deprecated and does nothing: the whole step is measured (from "
                          "step() to step(), less the wait in the gradient allreduce); remove the `with "
                          "lb.timed():`, and use lb.untimed() for work that should not count", DeprecationWarning,
                          stacklevel=3)
        yield

    @contextlib.contextmanager
    def untimed(self) -> Iterator[None]:
        """Work in this block does not count in this rank's step time (a rank-0 evaluation, a checkpoint)."""
        if self._cuda:  # the device's time across the block: what it ran of the block's work, or sat idle
            with self._off_the_device_clock():
                yield
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._untimed_s += time.perf_counter() - t0

    @contextlib.contextmanager
    def _off_the_device_clock(self) -> Iterator[None]:
        """On CUDA, a host block whose time must not count: the device's time between events recorded at its start
        and end is subtracted from the window. That is the time the device sat idle while the host waited (a
        device still busy with work queued before is not idle, and that work still counts), plus the device work
        queued inside the block."""
        start = self._device_event()
        try:
            yield
        finally:
            self._events.append((start, self._device_event()))

    def record_compute(self, seconds: float) -> None:
        """Reports this step's time as measured by the caller: the sum of the calls in a step replaces the
        step's own measure (for emulated or externally timed work). With a DDP model the report leaves when the
        last gradient bucket is ready: call this before ``backward()``."""
        if not (isinstance(seconds, (int, float)) and np.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"LoadBalancer.record_compute: seconds must be finite and >= 0, got {seconds!r}")
        if self._exchange.launched(self._step):
            raise RuntimeError(f"LoadBalancer.record_compute: step {self._step}'s report has left already (with "
                               "the gradients, when the last bucket was ready): call record_compute before "
                               "backward()")
        self._recorded_s = (self._recorded_s or 0.0) + float(seconds)

    def collective_failed(self, error: BaseException, what: str = "the gradient allreduce") -> RuntimeError:
        """The error to raise when a collective of the step failed (a peer hung past the process group's timeout
        or died; ``lbbsp.torch.exchange.is_collective_error(error)`` tells): names the ranks that do not answer a
        health check. Frameworks' backward wrappers use it."""
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        return RuntimeError(f"LoadBalancer: step {self._step}: {what} failed on rank {self._ranks[self.rank]}: "
                            f"{self._exchange.missing_ranks(self._step)}; {first}")

    # ---- measurement: a window from leaving one barrier to reaching the next, less its waits ----
    # With a DDP model the barrier is the gradient allreduce: the window of step k runs from the moment the
    # last bucket's allreduce of step k-1 completed to the moment the last bucket of step k is ready, and the
    # report leaves from the comm hook then (work after backward(), the optimizer step and step() itself,
    # counts in the next window). On CUDA both moments are events on the model's device: the window is the
    # device's time between them, read when the device has run it, so step k's report carries window k-1 (the
    # host never waits for its own backward; it waits for window k-1's end only when it runs over a step ahead).
    # Otherwise (no model, a step without backward) the window runs from leaving step() to entering the next and
    # the report leaves from step().

    def _restart_clock(self, opened: Optional[Any] = None) -> None:
        """Opens the next step's window (``opened``: on CUDA, the event after the allreduce that opens it); on
        CUDA the window just closed, with the events of its waits, waits to be read."""
        self._unread = None if self._closing is None else (*self._closing, self._events)
        self._closing = None
        self._untimed_s, self._recorded_s, self._wait_s = 0.0, None, 0.0
        self._events, self._opened = [], opened
        self._exchange.waited_s = 0.0
        self._clock_s = time.perf_counter()

    def _sum_hook(self, process_group: Optional[dist.ProcessGroup],
                  bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """The SUM hook; at the last bucket it sends this step's report."""
        k = self._step
        if self._check_loss and not self._warned_loss and self._scaled_step != k:
            self._warned_loss = True
            warnings.warn(f"LoadBalancer: step {k}: backward ran without lb.scale(loss). The gradients are "
                          "SUMMED over ranks, so a loss that is the mean over this rank's samples (PyTorch's "
                          "default reduction='mean') gives gradients world-size times too large and weighted "
                          "unevenly. Write loss = lb.scale(loss) (or lb.scale(loss, reduction='sum') for a sum); "
                          "pass check_loss=False if the loss is already the rank's sum / lb.global_batch.")
        tensor = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
        group = process_group if process_group is not None else dist.group.WORLD
        last = bucket.is_last() if hasattr(bucket, "is_last") else False
        sends = last and not self._exchange.launched(k)
        ready = self._device_event() if last and self._cuda else None  # this rank's backward ends here (read later)
        ready_s = time.perf_counter()
        # On CUDA the report takes the all-gather on the gloo group: no copies between host and device.
        if sends and not self._cuda and self._exchange.can_piggyback(tensor):  # the report rides in this allreduce
            combined, gradients = self._exchange.piggyback(self._report(k, ready_s), tensor)
            work = dist.all_reduce(combined, group=group, async_op=True)
        else:
            work = dist.all_reduce(tensor, group=group, async_op=True)
            gradients = None
            if sends:
                if ready is not None:
                    self._note_memory()  # the allocator's counters, on the host: no wait
                self._send_report(k, ready_s, ready)
        # One callback per bucket: each costs the gloo thread a turn at the GIL.
        if not last:
            return then(work, first_tensor)
        me = self._weak_self  # not self: the gloo thread that drops this callback must never drop the last
        # reference to the LoadBalancer (its teardown, with its process groups', would then run in that thread)

        def done(f: torch.futures.Future) -> torch.Tensor:
            value = f.value()  # raises what the allreduce raised (a peer gone, a timeout)
            lb = me()
            if lb is not None:
                lb._left_barrier(sends, ready, ready_s)
            return value[0] if gradients is None else gradients
        fut = then(work, done)
        if gradients is not None:
            self._exchange.ride(k, work, combined, fut)
        return fut

    def _left_barrier(self, sends: bool, ready: Optional[Any], ready_s: float) -> None:
        """This rank left the gradient allreduce (in the thread that completed it)."""
        if sends:  # step k+1's window opens as the barrier is left (on CUDA: where the device leaves it)
            self._restart_clock(self._device_event() if self._cuda else None)
        elif self._cuda:
            self._events.append((ready, self._device_event()))
        else:
            self._wait_s += time.perf_counter() - ready_s  # a second backward in one step

    def _device_event(self) -> Any:
        """A timing event recorded on the model's device's current stream (whichever device is current here)."""
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self._device))
        return event

    def _window_s(self, now: float) -> float:
        """This step's time so far on the host's clock: since the window opened, less the waits and the
        untimed() blocks. On CUDA (no DDP model, a step without backward) the device's queued work is waited
        for first, and the events' spans (queued before it) are subtracted."""
        if self._cuda:
            torch.cuda.synchronize(self._device)
            now = time.perf_counter()
            self._note_memory()
        device_waits = sum(a.elapsed_time(b) for a, b in self._events) / 1e3 if self._cuda else 0.0
        waits = device_waits + self._wait_s + self._untimed_s
        return max(0.0, now - self._clock_s - waits - self._exchange.waited_s)

    def _read_unread(self) -> Optional[Tuple[float, int, List[float]]]:
        """On CUDA: the last closed window's (seconds on the device, batch, exo), or None where there is none
        (the first step, after a step without backward or a resume). The device has run it by now unless the
        host is over a step ahead: then this waits for its end, which keeps the host at most a step ahead."""
        if self._unread is None or self._unread[1] is None:  # the first window opened on the host: not measured
            return None
        n, opened, ready, exo, events = self._unread
        self._unread = None
        for event in (ready, opened, *(e for pair in events for e in pair)):
            if not event.query():
                event.synchronize()
        waits = sum(a.elapsed_time(b) for a, b in events) / 1e3
        return max(0.0, opened.elapsed_time(ready) / 1e3 - waits), n, exo

    def _on_this_batch(self, k: int, n: int, window_s: float) -> float:
        """With a DDP model on the CPU step k's window opened as step k-1's allreduce completed: it began with
        step k-1's work after backward (the optimizer step, anything after backward()), done on step k-1's batch.
        Where the size changed that part is scaled to step k's batch, as it will cost from now on; otherwise a
        rank cut from 128 to 49 samples would report the 128's work over 49 and look slow, once per change.
        The scale is bounded to [1/4, 4]: a per-step constant in that part (the optimizer) does not scale."""
        if self._after_barrier is None:
            return window_s
        step, after_s, before = self._after_barrier
        if step != k - 1 or before <= 0 or n <= 0 or before == n:
            return window_s
        ratio = min(4.0, max(0.25, n / before))
        return max(0.0, window_s + min(after_s, window_s) * (ratio - 1.0))

    def _send_report(self, k: int, now: float, ready: Optional[Any] = None) -> None:
        """Launches step k's report in the control group's all-gather."""
        self._exchange.launch(k, self._report(k, now, ready))

    def _report(self, k: int, now: float, ready: Optional[Any] = None) -> np.ndarray:
        """Step k's report: this step's seconds and exo, or with ``ready`` (CUDA, from the comm hook) the previous
        window's, whose batch it names (step k's window is kept for the next report). An error building it (the
        monitor raising) travels as the status flag."""
        n = float(self._sizes[k][self.rank])
        try:
            if self.micro_batches > 1 and self._check_loss and self._micro != self.micro_batches:
                raise RuntimeError(f"step {k}: lb.scale() was called {self._micro} times for micro_batches="
                                   f"{self.micro_batches}: each micro-batch's loss needs it once, else the "
                                   "gradients are weighted wrong")
            exo, measured_n = self._metrics(), n
            if self._recorded_s is not None:
                compute = self._recorded_s
            elif ready is not None:
                self._closing = (int(n), self._opened, ready, exo)
                window = self._read_unread()
                compute, measured_n, exo = (0.0, -1.0, exo) if window is None else window
            else:
                compute = self._on_this_batch(k, int(n), self._window_s(now))
            if measured_n >= 0:
                self._measured_s = compute
            report = [n, compute, *exo, float(self._mem_cap()), float(measured_n), 0.0, checksum(self._sizes[k])]
        except Exception as e:  # noqa: BLE001 - every rank must hear of it, then every rank raises
            self._report_errors[k] = e  # kept until step k is decided (later with lag >= 1 or an all-gather)
            report = [n] + [0.0] * (REPORT - 3) + [1.0, checksum(self._sizes[k])]
        return np.array(report, dtype=np.float64)

    # ---- the exchange: every rank decides from the same reports ----

    def step(self) -> np.ndarray:
        """Ends the step and returns the batch vector of the coming one. Step k's report has left already
        (from the comm hook) or leaves now; every rank decides step k+lag+1's sizes from step k's reports with
        the same balancer, so no sizes travel back. With lag 0 that needs step k's reports now (they arrived
        with the gradients, so nothing waits); with lag >= 1 step() takes only what has arrived. An error on
        any rank in its report (its monitor raising, say), a rank using another batch vector, or a decision
        failing ends the step on every rank with a RuntimeError naming the rank."""
        k = self._step
        t0 = time.perf_counter()
        from_step = not self._exchange.launched(k)
        if from_step:
            self._send_report(k, t0)
        elif self._cuda:  # the device may still run step k's optimizer: no waiting for it here
            self._after_barrier, self._resting = None, self._allocator()[0]
        else:  # the window of step k+1 is open since step k's allreduce: what ran since was step k's work
            self._after_barrier = (k, self._window_s(t0), int(self._sizes[k][self.rank]))
        # On CUDA step k+1's window is open on the device since step k's allreduce: waiting here for other ranks'
        # reports (lag 0) leaves the device idle, which is not this rank's work (two events, ~20 us each: only
        # where the reports have not all arrived).
        blocks = self._cuda and not from_step and not self._arrived_through(k - self.lag)
        waiting = self._off_the_device_clock() if blocks else contextlib.nullcontext()
        with waiting:
            self._decide_through(k - self.lag, block=True)  # step k+1's sizes
        if self.lag:
            self._decide_through(k, block=False)
        self._step, self._stepped, self._micro, self._done_sizes = k + 1, True, 0, self._sizes[k]
        for g in [g for g in self._sizes if g <= min(k, self._decided)]:
            del self._sizes[g]  # decided from and past; undecided steps keep theirs to check their reports
        if from_step:
            self._restart_clock()
        self.timing["step_s"] += time.perf_counter() - t0
        return self._sizes[k + 1].copy()

    def _arrived_through(self, last: int) -> bool:
        """Whether the reports _decide_through(last, block=True) takes are all here (it would not wait)."""
        j = self._decided + 1
        while j <= last and self._exchange.launched(j):
            if not self._exchange.arrived(j):
                return False
            j += 1
        return True

    def _decide_through(self, last: int, block: bool) -> None:
        """Decides from the reports of the steps up to ``last`` that have left (waiting for them if block)."""
        while self._decided < last and self._exchange.launched(self._decided + 1):
            j = self._decided + 1
            if not block and not self._exchange.arrived(j):
                return
            before = self._exchange.waited_s
            reports = self._exchange.take(j)
            self.timing["wait_s"] += self._exchange.waited_s - before
            self._apply(j, reports)
            self._decided = j

    def _apply(self, j: int, reports: np.ndarray) -> None:
        """Checks step j's reports (every rank sees the same, so every rank raises alike) and decides j+lag+1.
        Few NumPy calls: this runs every step, on every rank, where each costs microseconds."""
        error = self._report_errors.pop(j, None)
        if reports[:, STATUS].any():
            failed = np.flatnonzero(reports[:, STATUS]).tolist()
            self._exchange.fail(j, failed, error if self.rank == failed[0] else None)
        sums = reports[:, CHECKSUM]
        if not (sums == sums[0]).all():
            raise RuntimeError(disagreement(j, sums, self._ranks))
        batch = reports[:, 0].astype(np.int64)  # whole numbers (float32 holds them to 2^24)
        if not np.array_equal(batch, self._sizes[j]):
            raise RuntimeError(f"LoadBalancer: step {j}: the ranks report batches {batch.tolist()}, not the "
                               f"decided {self._sizes[j].tolist()}")
        # Each rank checked its own report before sending it (the monitor's metrics, record_compute's seconds).
        compute, exo, caps, measured = reports[:, 1], reports[:, 2:2 + EXO], reports[:, CAP], reports[:, MEASURED]
        mem_cap = self._no_cap  # 0 reported: no cap
        if caps.any():
            mem_cap = mem_cap.copy()
            mem_cap[caps > 0] = caps[caps > 0]
        t = time.perf_counter()
        x = np.ascontiguousarray(exo).ravel()
        try:
            if (measured < 0).any():  # on CUDA the first window is read a step late: keep the sizes, capped
                decided = self._keep_within(self._sizes[j + self.lag], mem_cap)
            else:
                decided = self._balancer._next_checked(measured.astype(np.int64), np.ascontiguousarray(compute),
                                                       x, x, mem_cap)
        except Exception as e:  # the same on every rank: name the step (re-raised)
            raise RuntimeError(f"LoadBalancer: step {j}: deciding the sizes of step {j + self.lag + 1} failed "
                               f"on every rank: {type(e).__name__}: {e}") from e
        self._sizes[j + self.lag + 1] = decided
        self.timing["decide_s"] += time.perf_counter() - t

    def _keep_within(self, sizes: np.ndarray, mem_cap: np.ndarray) -> np.ndarray:
        """The same sizes again, or where a rank's memory cap is below its size the nearest split in the same
        proportions that fits the caps (and min_batch)."""
        if (sizes <= mem_cap).all():
            return sizes.copy()
        floor = self._balancer_args["min_batch"]
        return lbbsp.assign_by_speed(np.maximum(sizes, 1).astype(np.float64), self.global_batch,
                                     min=[floor] * self.world_size if floor else None,
                                     max=np.minimum(mem_cap, self.global_batch))

    # ---- checkpoints ----

    def state_dict(self) -> Dict[str, Any]:
        """The controller's state, the same on every rank (every rank runs the balancer): save it from rank 0
        with ``torch.save`` or from all with ``torch.distributed.checkpoint``."""
        self._decide_through(self._step - 1, block=True)
        # "sizes": the batch vectors of steps step..step+lag, a list of lists (no tensors): one leaf for
        # torch.distributed.checkpoint, which a template of another lag or world size can load.
        return {"version": 3, "world_size": self.world_size, "global_batch": self.global_batch,
                "dataset_size": self.dataset_size, "seed": self.seed, "lag": self.lag, "step": self._step,
                "sizes": [self._sizes[k].tolist() for k in range(self._step, self._step + self.lag + 1)],
                "balancer": self._balancer.save_state()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continues from ``state`` (from any rank), at any step of an epoch. Another world size starts the
        balancer afresh from an equal split (its history is per rank) with a warning; another lag keeps the
        decided sizes and repeats the last one where more are needed. Dataset size, global batch and seed
        define the samples and must match."""
        if not isinstance(state, dict) or "step" not in state:
            raise TypeError("LoadBalancer.load_state_dict: state must be the dict from LoadBalancer.state_dict()")
        for key in ("global_batch", "dataset_size", "seed"):
            if state.get(key) != getattr(self, key):
                raise ValueError(f"LoadBalancer.load_state_dict: {key} is {state.get(key)!r} in the state and "
                                 f"{getattr(self, key)!r} here: they define the samples of every step; resume "
                                 "with the same ones")
        self._exchange.drain()
        step = int(state["step"])
        if self._auto_lag and not self._stepped:
            self.lag = max(self.lag, int(state.get("lag", 0)))
        if state.get("world_size") != self.world_size:
            warnings.warn(f"LoadBalancer.load_state_dict: the state was saved at {state.get('world_size')} ranks "
                          f"and this run has {self.world_size}: the balancer starts afresh from an equal split "
                          "(its speed history is per rank); the samples of every step stay the same")
            self._balancer, saved = lbbsp.Balancer(**self._balancer_args), {}
        else:
            if state.get("balancer") is None:
                raise ValueError("LoadBalancer.load_state_dict: the state has no balancer state: save it on rank 0")
            self._balancer.load_state(state["balancer"])
            saved = _saved_sizes(state["sizes"], step)
        # initial() only where nothing was saved: it draws from the random balancer's generator
        sizes, last = {}, saved[step] if step in saved else self._balancer.initial()
        for g in range(step, step + self.lag + 1):
            last = saved.get(g, last)
            sizes[g] = last
        self._sizes, self._step, self._decided, self._stepped, self._micro = sizes, step, step - 1, False, 0
        self._report_errors.clear()
        self._after_barrier = None
        self._restart_clock()

    # ---- DataLoader ----

    def batch_sampler(self, epoch: Optional[int] = None) -> "BalancedBatchSampler":
        """A DataLoader ``batch_sampler`` yielding this rank's indices for every step of an epoch: the epoch of
        ``global_step`` (from its current step, so a resumed run continues mid-epoch) unless ``epoch`` or
        ``set_epoch()`` fixes one. One sampler (and one DataLoader) serves every epoch."""
        return BalancedBatchSampler(self, epoch)

    def data_loader(self, dataset: Any, *, num_workers: int = 0, prefetch_factor: Optional[int] = None,
                    collate_fn: Optional[Callable[[List[Any]], Any]] = None, epoch: Optional[int] = None,
                    **kwargs: Any) -> "torch.utils.data.DataLoader":
        """A DataLoader over ``dataset`` with this balancer's batch sampler (``loader.batch_sampler``), reusable
        over epochs (also with ``persistent_workers=True``); ``collate_fn`` (default PyTorch's) wrapped in
        ``AllowEmpty`` so a rank given 0 samples gets an empty batch. Raises ValueError when the loader would
        read further ahead than ``lag`` decides (``lag < required_lag(num_workers, prefetch_factor)``)."""
        if isinstance(dataset, torch.utils.data.IterableDataset):
            raise TypeError("LoadBalancer.data_loader: an IterableDataset yields samples in its own order, so no "
                            "rank can be handed the indices of its share; use a map-style Dataset (__getitem__ "
                            "and __len__), or draw each step's samples from lb.indices(epoch, step) yourself")
        self._check_length(dataset)
        need = required_lag(num_workers, prefetch_factor, self.micro_batches)
        if need > self.lag and self._auto_lag and not self._stepped and not self._exchange.launched(self._step):
            self._raise_lag(need)
        if need > self.lag:
            raise ValueError(f"LoadBalancer.data_loader: a DataLoader with num_workers={num_workers} and "
                             f"prefetch_factor={2 if prefetch_factor is None else prefetch_factor} reads {need} "
                             f"batches ahead, but this LoadBalancer decides lag={self.lag} steps ahead: construct "
                             f"it with lag={need} (lbbsp.torch.required_lag({num_workers}, {prefetch_factor}, "
                             f"{self.micro_batches})) or "
                             "read fewer batches ahead")
        for owned in ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"):
            if owned in kwargs:
                raise TypeError(f"LoadBalancer.data_loader: {owned} is set by the balancer's batch sampler; "
                                "leave it out")
        if num_workers > 0 and prefetch_factor is not None:
            kwargs["prefetch_factor"] = prefetch_factor
        return torch.utils.data.DataLoader(dataset, batch_sampler=self.batch_sampler(epoch),
                                           num_workers=num_workers, collate_fn=AllowEmpty(dataset, collate_fn),
                                           **kwargs)

    # ---- internals ----

    def _check_length(self, dataset: Any) -> None:
        """A dataset of another length than dataset_size: indices past its end fail in a worker, or its tail is
        never read (a silent subset)."""
        try:
            size = len(dataset)
        except TypeError:  # no __len__: the indices are all it gets
            return
        if size != self.dataset_size:
            raise ValueError(f"LoadBalancer.data_loader: the dataset has {size} samples but this LoadBalancer was "
                             f"built with dataset_size={self.dataset_size}: pass dataset_size=len(dataset) (the "
                             "whole dataset, the same on every rank), or wrap the part to train on in "
                             "torch.utils.data.Subset")

    def _raise_lag(self, lag: int) -> None:
        """Before the first step here: decide ``lag`` steps ahead; the steps not decided yet repeat the last
        decided vector (the initial split in a fresh run)."""
        last = self._sizes[self._step + self.lag]
        for g in range(self._step + self.lag + 1, self._step + lag + 1):
            self._sizes[g] = last.copy()
        self.lag = lag

    def _metrics(self) -> List[float]:
        m = [float(v) for v in self._monitor()]
        if len(m) != EXO or not all(np.isfinite(m)):
            raise ValueError(f"LoadBalancer: monitor must return [cpu_avail, mem_avail, load], got {m}")
        return m

    def _allocator(self) -> Tuple[int, int, int]:
        """Bytes allocated now, at the peak and reserved on the model's device, in one read of the caching
        allocator's counters (torch.cuda.memory_allocated and its kin each build and flatten all ~120 of them:
        ~70-100 us a call, where this step needs three)."""
        stats = torch.cuda.memory_stats_as_nested_dict(self._device)
        allocated = stats.get("allocated_bytes", {}).get("all", {})
        reserved = stats.get("reserved_bytes", {}).get("all", {})
        return allocated.get("current", 0), allocated.get("peak", 0), reserved.get("current", 0)

    def _note_memory(self) -> None:
        """Bytes per sample on CUDA from the process's peak since the start (never reset: the user's statistics
        stay) over the largest batch seen, above what stays allocated between steps (read at the last step(),
        or now where the step's work is done); and the allocator's cached bytes, for the cap."""
        n = int(self._sizes[self._step][self.rank])
        self._max_batch = max(self._max_batch, n)
        allocated, peak, reserved = self._allocator()
        resting = self._resting if self._resting is not None else allocated
        if self._max_batch > 0 and peak > resting:
            self._bytes_per_sample = (peak - resting) / self._max_batch
        self._cached_bytes = reserved - allocated

    def _mem_cap(self) -> int:
        """Most samples this rank can hold: 0 (no cap) on the CPU; on CUDA what the process can still use (free
        device memory plus the allocator's cached blocks) over the bytes per sample."""
        if not self._cuda or self._bytes_per_sample <= 0:
            return 0
        free, _ = torch.cuda.mem_get_info(self._device)
        return cuda_cap(free, self._cached_bytes, self._bytes_per_sample)
