"""LoadBalancer: the facade a training loop talks to. It owns the parts (the step clock, the loss scale, the
decisions and their sizes, the report exchange, the DDP or FSDP2 hooks) and runs the step: the report out, every
rank's reports in, the same decision on every rank (lbbsp.torch.decide); and the state a checkpoint keeps."""

import contextlib
import time
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np
import torch
import torch.distributed as dist

import lbbsp

from .. import _lbbsp
from . import ddp, fsdp, native
from ._util import positive_int, uncompiled
from .checks import BuiltAlike, check_model, check_model_group, settings_of, timeout
from .clock import DeviceClock, HostClock
from .decide import Decisions
from .exchange import ReportExchange, group_ranks
from .loss import LossScale
from .memory import DeviceMemory
from .monitor import ResourceMonitor
from .report import EXO, Report, read_metrics
from .sampler import BalancedBatchSampler, balanced_loader
from .sizes import DecidedSizes, micro_split
from .state import load_into, state_of


class LoadBalancer:
    """Re-sizes every rank's share of a fixed global batch each step (LB-BSP) on torch.distributed.

    Args:
        model: the ``DistributedDataParallel`` model (its gradients get the SUM hook, which also times the step's
            wait in the gradient allreduce; plain BatchNorm layers get a warning once sizes differ); or a module
            with ``fully_shard`` applied (FSDP2 or HSDP: the reductions become SUMs and the wait in every
            all-gather and reduce-scatter is timed; docs/fsdp.md); or None to register no hook (sum the gradients
            yourself; the step is then timed from step() to step()). FSDP1 is refused (TypeError). Either may
            come wrapped by ``torch.compile``: the hooks and settings go on the module it compiled.
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
        check_loss: warn (once) when ``scale()`` without ``count`` (or, the loss left to the hook, ``step()``)
            follows a forward whose first input has another number of rows than this rank's slice (batches not
            read through this balancer's sampler); with ``loss_reduction=None``, also (once) when a backward pass
            reaches the gradient allreduce in a step in which ``scale()`` was not called. False if the loss is
            already weighted by hand (a sum over the rank's samples divided by ``global_batch``): then "auto"
            weights nothing.
        micro_batches: gradient accumulation: each step's slice of this rank is cut into this many micro-batches
            (``micro_sizes()``, sizes differing by at most one, some possibly empty), which the batch sampler
            yields one by one; ``scale()`` called once per micro-batch weights each by its own size, and a step
            whose ``scale()`` calls do not match ends with an error on every rank (with check_loss). Use
            ``model.no_sync()`` for all but the last micro-batch of a step.
        loss_reduction: ``"auto"`` (default): with a DDP or FSDP2 model, ``micro_batches=1`` and check_loss, the
            hook (FSDP2: the reduce-scatter) weights the gradients by n_r / X before the SUM (0 for none) where the
            loss is the mean over its samples as a plain DDP loop writes it (DDP: in C++, 20-120 us a step less CPU
            than ``scale()``), and leaves a step whose loss went through ``scale()`` alone; elsewhere it is None.
            ``"mean"``: the hook weights every step (``scale()`` raises); ``"sum"``: a sum loss, weighted 1 / X
            (both need such a model and ``micro_batches=1``). None: ``lb.scale(loss)`` every step, else a warning.

    Loss: the gradients are SUMMED over ranks, so each rank's loss must be its share of the global batch's. With a
    DDP or FSDP2 model the hook weights a plain mean loss, parameter-only terms (an L2 penalty) included
    (``loss_reduction`` "auto"); elsewhere, or for a sum, ``lb.scale(loss)`` weights it (docs/torch.md, "The loss").
    """

    def __init__(self, model: Optional[torch.nn.Module], dataset_size: int, global_batch: int,
                 balancer: str = "lbbsp-cpu", predictor: str = "narx", seed: int = 1, min_batch: int = 0,
                 lag: Optional[int] = None, process_group: Optional[dist.ProcessGroup] = None,
                 timeout_s: Optional[float] = None,
                 monitor: Optional[Callable[[], List[float]]] = None, check_loss: bool = True,
                 micro_batches: int = 1, loss_reduction: Optional[str] = "auto") -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("LoadBalancer: call torch.distributed.init_process_group() first")
        self._ranks = group_ranks(process_group)
        if dist.get_rank() not in self._ranks:
            raise ValueError(f"LoadBalancer: this process (rank {dist.get_rank()}) is not in process_group "
                             f"{self._ranks}")
        self.rank, self.world_size = self._ranks.index(dist.get_rank()), len(self._ranks)
        # Seconds this rank spent in step() ("step_s"), blocked there waiting for reports ("wait_s") and
        # deciding ("decide_s", the same work on every rank).
        self.timing = {"step_s": 0.0, "wait_s": 0.0, "decide_s": 0.0}
        #: the control plane: every rank's report of a step reaches every rank (lbbsp.torch.exchange)
        self.exchange = ReportExchange(self._ranks, self.rank, timeout(timeout_s, fallback=True))
        with BuiltAlike(self.exchange) as built:  # an argument that raises on one rank raises on every rank
            self.timeout_s = timeout(timeout_s)
            self.dataset_size = positive_int(dataset_size, "dataset_size")
            self.global_batch = positive_int(global_batch, "global_batch")
            if self.global_batch > self.dataset_size:
                raise ValueError(f"LoadBalancer: global_batch {global_batch} exceeds dataset_size {dataset_size}")
            self._auto_lag = lag is None
            self.lag = 0 if lag is None else positive_int(lag, "lag", 0)
            self.seed = positive_int(seed, "seed", 0)
            # Every rank builds the balancer and decides (every rank holds the same state); the reports travel in
            # gloo groups of their own (ReportExchange).
            self._decisions = Decisions(
                dict(name=balancer, workers=self.world_size, global_batch=self.global_batch, predictor=predictor,
                     seed=self.seed, min_batch=min_batch, num_exo=EXO, capacity_exo=lbbsp.RANK_CAPACITY_EXO),
                self._ranks, self.rank, self.exchange, self.timing, self.lag)
            self._resources = ResourceMonitor() if monitor is None else None  # /proc, as the C++ runtime reads it
            self._monitor = monitor if monitor is not None else self._resources.sample
            if not callable(self._monitor):
                raise TypeError(f"LoadBalancer: monitor must be callable, got {type(monitor).__name__}")
            self.micro_batches = positive_int(micro_batches, "micro_batches", 1)
            model = uncompiled(model)
            self._sharded = check_model(model)
            #: the loss's scale and its checks (lbbsp.torch.loss)
            self.loss = LossScale(self.global_batch, self.micro_batches, check_loss, model, loss_reduction,
                                  fsdp.reduce_scatters(model) if self._sharded else model is not None)
            built.settings = settings_of(model, self._sharded, self._ranks, {
                "dataset_size": self.dataset_size, "global_batch": self.global_batch, "seed": self.seed,
                "balancer": balancer, "predictor": predictor, "min_batch": min_batch, "lag": lag,
                "micro_batches": self.micro_batches, "loss_reduction": loss_reduction})
        check_model_group(built.settings["model_group"], self._sharded, self._ranks)
        self.steps_per_epoch = lbbsp.steps_per_epoch(self.dataset_size, self.global_batch)
        self._done_sizes = self.sizes[0]  # the batch vector of the last step closed (figures())
        self._measured_s = float("nan")  # this rank's time in its last report (figures())
        self._step = 0  # global step (over epochs) that the next step() closes
        self._stepped = False  # step() called since construction (or the last load_state_dict)
        self._perm_epoch, self._perm = -1, None
        self._attach(model, check_loss)

    def _attach(self, model: Optional[torch.nn.Module], check_loss: bool) -> None:
        """The clock and memory figures of the model's device, and the hooks on the model."""
        self._model = model
        self._plain_bn = model is not None and any(
            isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and not isinstance(m, torch.nn.SyncBatchNorm)
            for m in model.modules())
        self._warned_bn = False
        # DDP needs its module on the device before wrapping, so where the parameters live is fixed from here on.
        first = next(model.parameters(), None) if model is not None else None
        on_device = first is not None and first.is_cuda
        #: the step clock: host time, or the model's CUDA device's (lbbsp.torch.clock)
        self.clock = DeviceClock(first.device) if on_device else HostClock()
        #: the memory figures on CUDA (lbbsp.torch.memory), None on the CPU
        self.memory = DeviceMemory(first.device) if on_device else None
        self.native = native.attach(self, model)  #: the step path in C++ (lbbsp.torch.native), or None
        if self._sharded:
            fsdp.attach(self, model, check_rows=check_loss)
        elif model is not None:
            ddp.attach(self, model, check_rows=check_loss)

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
    def stepped(self) -> bool:
        """Whether step() has run since construction (or the last load_state_dict)."""
        return self._stepped

    @property
    def sizes(self) -> DecidedSizes:
        """The decided batch vectors by global step, the same on every rank (lbbsp.torch.sizes)."""
        return self._decisions.sizes

    @property
    def batch_sizes(self) -> np.ndarray:
        """Every rank's batch size at the current step (the same array on every rank)."""
        return self.sizes_at(self._step)

    def figures(self) -> Dict[str, float]:
        """What a framework logs after a step: this rank's batch size in the step just done, the time it reported
        for its last measured step (what the balancer sees), its predicted speed (samples/s, where the balancer
        predicts), the noise band of its last decision (lbbsp-cpu; 0 for the others), and the seconds so far
        blocked on reports and spent in step()."""
        out = {"lbbsp/batch_size": float(self._done_sizes[self.rank]), "lbbsp/wait_s": self.timing["wait_s"],
               "lbbsp/step_s": self.timing["step_s"], "lbbsp/measured_s": self._measured_s,
               "lbbsp/noise_band": self._decisions.balancer.noise_band()}
        speeds = self._decisions.balancer.predicted_speeds()
        if len(speeds) == self.world_size:
            out["lbbsp/predicted_speed"] = float(speeds[self.rank])
        return out

    def sizes_at(self, global_step: int) -> np.ndarray:
        """Batch vector of a global step that is already decided (up to ``global_step + lag``)."""
        if global_step not in self.sizes and global_step > self._step:
            # decided from the reports of steps already closed (a DataLoader reading ahead asks here first)
            self._decide_through(min(global_step - self.lag - 1, self._step - 1), block=True)
        if global_step not in self.sizes:
            raise RuntimeError(self.sizes.not_decided(global_step, self._step, self.steps_per_epoch, self.lag,
                                                      self.exchange.launched(self._step)))
        return self.sizes[global_step].copy()

    def permutation(self, epoch: int) -> np.ndarray:
        """The epoch's sample order (lbbsp.epoch_permutation(n, seed, epoch)), cached for the current epoch."""
        if epoch != self._perm_epoch:
            self._perm, self._perm_epoch = lbbsp.epoch_permutation(self.dataset_size, self.seed, epoch), epoch
        return self._perm

    def micro_sizes(self, global_step: Optional[int] = None) -> List[int]:
        """This rank's micro-batch sizes at a step (default the current one): its batch cut into
        ``micro_batches`` parts, the first ones larger by one where it does not divide."""
        n = int(self.sizes_at(self._step if global_step is None else global_step)[self.rank])
        return micro_split(n, self.micro_batches)

    def micro_indices(self, epoch: int, step: int) -> List[np.ndarray]:
        """This rank's sample indices of ``step`` of ``epoch`` cut into ``micro_batches`` micro-batches."""
        idx = self.indices(epoch, step)
        return np.split(idx, np.cumsum(self.micro_sizes(epoch * self.steps_per_epoch + step))[:-1])

    def indices(self, epoch: int, step: int) -> np.ndarray:
        """This rank's sample indices (int64, possibly empty) for ``step`` of ``epoch``."""
        step = positive_int(step, "step", 0)
        if step >= self.steps_per_epoch:
            raise ValueError(f"LoadBalancer: step {step} is past the epoch's {self.steps_per_epoch} steps")
        sizes = self.sizes_at(positive_int(epoch, "epoch", 0) * self.steps_per_epoch + step)
        if self._plain_bn and not self._warned_bn and len(set(sizes.tolist())) > 1:
            warnings.warn("LoadBalancer: the model has plain BatchNorm layers and the ranks' batch sizes differ: "
                          "each rank normalises over its own batch (a rank with 1 sample cannot). On GPUs use "
                          "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model), which weights by count; on the CPU "
                          "(where PyTorch's SyncBatchNorm does not run) GroupNorm or LayerNorm, or a min_batch that "
                          "every rank's statistics can live with.")
            self._warned_bn = True
        # the extension's own call: the permutation and sizes are int64 already, the checks cost ~40 us a step
        return _lbbsp.rank_indices(self.permutation(epoch), step, sizes, self.rank)

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
        scaled = self.loss.scale(loss, reduction, count, self._step, int(self.sizes[self._step][self.rank]))
        if self.native is not None and self.loss.reduction == "auto":
            self.native.note_scaled(self._step)  # the C++ hook leaves this step's gradients as they are
        return scaled

    @contextlib.contextmanager
    def untimed(self) -> Iterator[None]:
        """Work in this block does not count in this rank's step time (a rank-0 evaluation, a checkpoint)."""
        with self.clock.untimed():
            yield

    def record_compute(self, seconds: float) -> None:
        """Reports this step's time as measured by the caller: the sum of the calls in a step replaces the
        step's own measure (for emulated or externally timed work). With a DDP model the report leaves when the
        last gradient bucket is ready: call this before ``backward()``."""
        if not (isinstance(seconds, (int, float)) and np.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"LoadBalancer.record_compute: seconds must be finite and >= 0, got {seconds!r}")
        if self.exchange.launched(self._step):
            raise RuntimeError(f"LoadBalancer.record_compute: step {self._step}'s report has left already (with "
                               "the gradients, when the last bucket was ready): call record_compute before "
                               "backward()")
        self.clock.record(float(seconds))

    def collective_failed(self, error: BaseException, what: str = "the gradient allreduce") -> RuntimeError:
        """The error to raise when a collective of the step failed (a peer hung past the process group's timeout
        or died; ``lbbsp.torch.exchange.is_collective_error(error)`` tells): names the ranks that do not answer a
        health check. Frameworks' backward wrappers use it."""
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        return RuntimeError(f"LoadBalancer: step {self._step}: {what} failed on rank {self._ranks[self.rank]}: "
                            f"{self.exchange.missing_ranks(self._step)}; {first}")

    # ---- the report: this rank's measure of a step ----

    def report(self, k: int, now: float, ready: Any = None) -> np.ndarray:
        """Step k's report, encoded: this step's seconds and exo, or with ``ready`` (CUDA, from the comm hook) the
        previous window's, whose batch it names (step k's window is kept for the next report). An error building
        it (the monitor raising) travels as the failed flag. Called by the DDP hook and by step()."""
        n = int(self.sizes[k][self.rank])
        try:
            self.loss.check_micro_batches(k)
            exo = read_metrics(self._monitor)
            if self.clock.recorded_s is not None:
                compute, measured_n = self.clock.recorded_s, n
            else:
                compute, measured_n, exo = self.clock.measure(k, n, now, ready, exo)
            if self.memory is not None:
                self.memory.note_step(n)  # the allocator's counters, on the host: no wait
            if measured_n >= 0:
                self._measured_s = compute
            cap = self.memory.cap() if self.memory is not None else 0
            return Report(n, compute, exo, cap, measured_n, False, self.sizes[k]).encode()
        except Exception as e:  # noqa: BLE001 - every rank must hear of it, then every rank raises
            self._decisions.report_errors[k] = e  # kept until step k is decided (later with lag >= 1 or an all-gather)
            return Report.of_failure(n, self.sizes[k]).encode()

    def send_report(self, k: int, now: float, ready: Any = None) -> None:
        """Launches step k's report in the control group's all-gather."""
        self.exchange.launch(k, self.report(k, now, ready))

    # ---- the step: every rank decides from the same reports ----

    def step(self) -> np.ndarray:
        """Ends the step and returns the batch vector of the coming one. Step k's report has left already
        (from the comm hook) or leaves now; every rank decides step k+lag+1's sizes from step k's reports with
        the same balancer, so no sizes travel back. With lag 0 that needs step k's reports now (they arrived
        with the gradients, so nothing waits); with lag >= 1 step() takes only what has arrived. An error on
        any rank in its report (its monitor raising, say), a rank using another batch vector, or a decision
        failing ends the step on every rank with a RuntimeError naming the rank."""
        k = self._step
        t0 = time.perf_counter()
        if self.native is not None and native.decide_step(self, k, t0):  # the usual course, in one C++ call
            return self._advance(k, t0, arm=False)
        from_step = not self.exchange.launched(k)
        if from_step:
            self.send_report(k, t0)
        elif self.native is not None:  # the C++ hook sent the report: its window noted there, as below
            native.closed(self, k, t0)
        else:  # the window of step k+1 is open since step k's allreduce: what ran since was step k's work
            self.clock.note_work_after_barrier(k, t0, int(self.sizes[k][self.rank]))
            if self.memory is not None:  # the device may still run step k's optimizer: no waiting for it here
                self.memory.note_resting()
        # On CUDA step k+1's window is open on the device since step k's allreduce: waiting here for other ranks'
        # reports (lag 0) leaves the device idle, which is not this rank's work (two events, ~20 us each: only
        # where the reports have not all arrived).
        blocks = self.clock.on_device and not from_step and not self._decisions.arrived_through(k - self.lag)
        with self.clock.off_the_clock() if blocks else contextlib.nullcontext():
            self._decide_through(k - self.lag, block=True)  # step k+1's sizes
        if self.lag:
            self._decide_through(k, block=False)
        if from_step:
            self.clock.restart()
        return self._advance(k, t0, arm=True)

    def _advance(self, k: int, t0: float, arm: bool) -> np.ndarray:
        """Step k closed (step() began at t0): the next begins (the C++ state armed unless the one call did)."""
        self._step, self._stepped, self._done_sizes = k + 1, True, self.sizes[k]
        self.loss.end_step(k, int(self._done_sizes[self.rank]))
        self.sizes.forget_through(min(k, self._decisions.decided))  # undecided steps keep theirs to check their reports
        if arm:
            native.arm(self)
        self.timing["step_s"] += time.perf_counter() - t0
        return self.sizes[k + 1].copy()

    def _decide_through(self, last: int, block: bool) -> None:
        """Decides from the reports of the steps up to ``last`` that have left (waiting for them if block)."""
        self.clock.add_wait(self._decisions.through(last, block, self.lag))

    # ---- checkpoints ----

    def state_dict(self) -> Dict[str, Any]:
        """The controller's state, the same on every rank (every rank runs the balancer): save it from rank 0
        with ``torch.save`` or from all with ``torch.distributed.checkpoint``."""
        return state_of(self)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continues from ``state`` (from any rank), at any step of an epoch. Another world size starts the
        balancer afresh from an equal split (its history is per rank) with a warning; another lag keeps the
        decided sizes and repeats the last one where more are needed. Dataset size, global batch and seed
        define the samples and must match."""
        load_into(self, state)

    # ---- DataLoader ----

    def batch_sampler(self, epoch: Optional[int] = None, whole_epoch_len: bool = False) -> BalancedBatchSampler:
        """A DataLoader ``batch_sampler`` yielding this rank's indices for every step of an epoch: the epoch of
        ``global_step`` (from its current step, so a resumed run continues mid-epoch) unless ``epoch`` or
        ``set_epoch()`` fixes one. One sampler (and one DataLoader) serves every epoch. ``whole_epoch_len``: its
        len() is the whole epoch's even when resumed mid-epoch (for a loop that counts the steps done itself)."""
        return BalancedBatchSampler(self, epoch, whole_epoch_len)

    def data_loader(self, dataset: Any, *, num_workers: int = 0, prefetch_factor: Optional[int] = None,
                    collate_fn: Optional[Callable[[List[Any]], Any]] = None, epoch: Optional[int] = None,
                    whole_epoch_len: bool = False, **kwargs: Any) -> "torch.utils.data.DataLoader":
        """A DataLoader over ``dataset`` with this balancer's batch sampler (``loader.batch_sampler``), reusable
        over epochs (also with ``persistent_workers=True``); ``collate_fn`` (default PyTorch's) wrapped in
        ``AllowEmpty`` so a rank given 0 samples gets an empty batch. Raises ValueError when the loader would
        read further ahead than ``lag`` decides (``lag < required_lag(num_workers, prefetch_factor)``)."""
        return balanced_loader(self, dataset, num_workers, prefetch_factor, collate_fn, epoch, whole_epoch_len,
                               **kwargs)

    def raise_lag(self, lag: int) -> None:
        """Decides ``lag`` steps ahead from now on, where the lag was left to the balancer (``lag=None``) and no
        step has begun (else nothing changes); the steps not decided yet repeat the last decided vector (the
        initial split in a fresh run). data_loader() calls it with what its DataLoader reads ahead."""
        if lag <= self.lag or not self._auto_lag or self._stepped or self.exchange.launched(self._step):
            return
        self.sizes.extend_to(self._step + lag)
        self.lag = lag
        native.arm(self)
