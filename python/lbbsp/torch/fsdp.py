"""A LoadBalancer over a model sharded with FSDP2 (``fully_shard``, per block and at the root) or HSDP (a 2-D
device mesh, replicate x shard): every data-parallel rank balanced, each step's batch vector re-sized.

What it sets on every FSDP module: the gradient divide factor 1 with SUM reductions (the reduce-scatter, and
HSDP's all-reduce, add the ranks' gradients, which LB-BSP's loss scaling needs), and its own all-gather and
reduce-scatter (FSDP2's public custom-comm hooks), which run PyTorch's default collectives and time what this
rank spends blocked in them: inside the step every layer's all-gather and reduce-scatter make a fast rank wait
for the slow one, and that waiting is not its work. With HSDP the all-reduce over the replicas runs between the
reduce-scatter and FSDP's all-reduce hook: the gap between the two is timed as waiting too. With loss_reduction
(the default "auto": a plain mean loss) the reduce-scatter first weights this rank's gradients, as DDP's hook does.

The report rides in the step's last reduce-scatter where that is one gloo group of the balanced ranks (a 1-D mesh
on the CPU), else leaves at the end of backward in the control group's asynchronous all-gather; either way the next
step's window opens at the end of backward (an autograd engine callback queued at the step's first reduce-scatter,
so it runs after FSDP's own final callback): on the host the last reduce-scatter is the step's barrier, as DDP's
allreduce is. Where lbbsp.torch.native applies (a 1-D gloo mesh, PyTorch 2.x) each reduce-scatter is one C++ call
doing what _StepTiming's weigh, rides_here and ride do here (the reference), the next window opened as it returns."""

import time
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import torch
import torch.distributed as dist

from .ddp import orphaned_warning, weigh
from .exchange import group_ranks
from .loss import watch_rows

if TYPE_CHECKING:
    from .controller import LoadBalancer


def is_fsdp2(model: Optional[torch.nn.Module]) -> bool:
    return model is not None and any(c.__name__ == "FSDPModule" for c in type(model).__mro__)


def is_fsdp1(model: Optional[torch.nn.Module]) -> bool:
    return model is not None and any(c.__name__ == "FullyShardedDataParallel" for c in type(model).__mro__)


def fsdp_modules(model: torch.nn.Module) -> List[torch.nn.Module]:
    return [m for m in model.modules() if is_fsdp2(m)]


def _mesh(model: torch.nn.Module) -> Any:
    """The device mesh of the model's sharded parameters (DTensors)."""
    for p in model.parameters():
        mesh = getattr(p, "device_mesh", None)
        if mesh is not None:
            return mesh
    raise TypeError("LoadBalancer: the fully_shard model has no sharded parameter (no DTensor with a device "
                    "mesh): apply fully_shard to the blocks and the root before building the LoadBalancer")


def model_ranks(model: torch.nn.Module) -> List[int]:
    """The global ranks the sharded model's gradients are reduced over (every rank of its mesh), sorted."""
    return sorted(int(r) for r in _mesh(model).mesh.flatten().tolist())


def is_hsdp(model: torch.nn.Module) -> bool:
    return _mesh(model).ndim == 2


def reduce_scatters(model: torch.nn.Module) -> bool:
    """Whether FSDP2 calls the reduce-scatter (where loss_reduction weights the rank's gradients): not where the
    mesh's shard dimension has one rank (FSDP2 then copies the gradients)."""
    return _mesh(model).size(-1) > 1


def _default_comms() -> Any:
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter
    except ImportError as e:
        raise TypeError(f"LoadBalancer: FSDP2 needs PyTorch >= 2.8 (custom collectives for fully_shard), this is "
                        f"{torch.__version__}: upgrade PyTorch, or use DistributedDataParallel") from e
    return DefaultAllGather, DefaultReduceScatter


def check_settings(model: torch.nn.Module) -> None:
    """Refuses a divide factor of the user's other than 1 (the gradients would not be the sum)."""
    for m in fsdp_modules(model):
        for group in getattr(m._get_fsdp_state(), "_fsdp_param_groups", []):
            factor = getattr(group, "gradient_divide_factor", None)
            if factor not in (None, 1.0):
                raise ValueError(f"LoadBalancer: the FSDP module {type(m).__name__} has gradient divide factor "
                                 f"{factor} (set_gradient_divide_factor): LB-BSP sums the gradients over ranks "
                                 "and weights each rank's loss by its share of the global batch, so the factor must "
                                 "be 1; leave it unset and the LoadBalancer sets it")


def attach(lb: "LoadBalancer", model: torch.nn.Module, check_rows: bool) -> None:
    """Sets SUM reductions and the timed collectives on every FSDP module of ``model``."""
    check_settings(model)
    me = weakref.ref(lb)
    hsdp = is_hsdp(model)
    timing = _StepTiming(me, lb.loss.reduction, lb.loss.orphan_weight(lb.world_size),
                         None if hsdp or lb.clock.on_device else scatters_a_step(model, lb.exchange.ranks))
    if lb.native is not None:  # the weight, the count and the ride of _StepTiming in C++ (lbbsp.torch.native)
        lb.native.register_fsdp(timing.scatters_a_step, lb.loss.reduction or "", lb.global_batch)
    default_all_gather, default_reduce_scatter = _default_comms()
    all_gather, reduce_scatter = _timed(default_all_gather, timing), _timed(default_reduce_scatter, timing, True)
    for m in fsdp_modules(model):
        m.set_gradient_divide_factor(1.0)
        m.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM; a SUM with a factor of 1 is exact
        try:
            m.set_custom_all_gather(all_gather)
            m.set_custom_reduce_scatter(reduce_scatter)
            if hsdp:
                m.set_all_reduce_hook(timing.after_all_reduce)
        except ValueError as e:  # several parameter groups in one module (a shard_placement_fn)
            raise TypeError(f"LoadBalancer: cannot time the FSDP module {type(m).__name__}'s collectives: {e}") from e
    if check_rows:
        watch_rows(me, model)


def shard_group(model: torch.nn.Module) -> dist.ProcessGroup:
    """The process group of a 1-D mesh (FSDP2's reduce-scatters run on it)."""
    return _mesh(model).get_group()


def scatters_a_step(model: torch.nn.Module, balanced: List[int]) -> Optional[int]:
    """The reduce-scatters of a step (one per FSDP parameter group) where the report can ride in the last of them:
    a 1-D mesh over the balanced ranks on gloo (the reduce-scatter's group is then theirs, in their order)."""
    if is_hsdp(model):
        return None
    group = shard_group(model)
    if dist.get_backend(group) != "gloo" or group_ranks(group) != balanced:
        return None
    return sum(len(getattr(m._get_fsdp_state(), "_fsdp_param_groups", [])) for m in fsdp_modules(model)) or None


class _StepTiming:
    """The waits of a step in FSDP's collectives, and the report: in the step's last reduce-scatter where it can
    ride there (one collective, not two: on gloo each costs its TCP loop 0.4-1 ms of the rank's core), else in an
    all-gather at the end of backward."""

    def __init__(self, me: "weakref.ref", reduction: Optional[str], orphan_weight: Optional[float],
                 scatters_a_step: Optional[int]) -> None:
        self._me = me
        self._orphan_weight, self._orphaned = orphan_weight, False
        self._orphan_message = orphaned_warning("FSDP", reduction)
        self.scatters_a_step = scatters_a_step
        self._scattered = (-1, 0)  # (step, its reduce-scatters so far)
        self._rode_step = -1  # the last step whose report rode in a reduce-scatter
        self._queued_step = -1
        self._scattered_s = 0.0  # when the last reduce-scatter returned (HSDP: the all-reduce follows)

    def waited(self, seconds: float) -> None:
        lb = self._me()
        if lb is not None:
            lb.clock.add_wait(seconds)

    def weigh(self, gradients: torch.Tensor) -> None:
        """loss_reduction's weight on this rank's gradients, before the reduce-scatter sums them (as ddp's hook)."""
        lb = self._me()
        if lb is not None:
            k = lb.global_step
            weigh(gradients, lb.loss.hook_weight(int(lb.sizes[k][lb.rank]), k))
            return
        if not self._orphaned:  # FSDP keeps the SUM and this collective: training on without the LoadBalancer
            self._orphaned = True
            warnings.warn(self._orphan_message)
        weigh(gradients, self._orphan_weight)

    def in_native(self, scatter: Dict[str, Any]) -> bool:
        """Runs the reduce-scatter in the C++ step path where there is one (it weighs, counts, and carries the
        report in the step's last one as ride() does, and opens the next window there); whether it did."""
        lb = self._me()
        if lb is None or lb.native is None or scatter.get("async_op", False):
            return False
        lb.native.scatter(scatter["group"], scatter["output_tensor"], scatter["input_tensor"])
        return True

    def rides_here(self, gradients: torch.Tensor, async_op: bool) -> bool:
        """Counts a reduce-scatter of the step: whether it is the step's last, the report to ride in it (the same
        verdict on every rank: FSDP2 runs the same reduce-scatters, of the same sizes and dtypes, everywhere)."""
        lb = self._me()
        if lb is None or self.scatters_a_step is None:
            return False
        k = lb.global_step
        n = self._scattered[1] + 1 if self._scattered[0] == k else 1
        self._scattered = (k, n)
        return n == self.scatters_a_step and not async_op and not lb.exchange.launched(k) and \
            lb.exchange.can_piggyback(gradients)

    def ride(self, scatter: Any, output_tensor: torch.Tensor, input_tensor: torch.Tensor, **kwargs: Any) -> None:
        """The reduce-scatter with the report block beside each rank's chunk of the input: the SUM gives every
        rank its shard and every rank's report (the block holds this rank's row, zeros elsewhere)."""
        lb = self._me()
        k, now = lb.global_step, time.perf_counter()
        block = lb.exchange.piggyback(lb.report(k, now), input_tensor.dtype)
        shard, world, extra = output_tensor.numel(), lb.world_size, block.numel()
        wide_in = torch.empty(world, shard + extra, dtype=input_tensor.dtype)
        wide_in[:, :shard].copy_(input_tensor.view(world, shard))
        wide_in[:, shard:].copy_(block.view(1, extra))
        wide_out = torch.empty(shard + extra, dtype=input_tensor.dtype)
        t0 = time.perf_counter()
        scatter(output_tensor=wide_out, input_tensor=wide_in.view(-1), **kwargs)
        self.waited(time.perf_counter() - t0)
        output_tensor.copy_(wide_out[:shard])
        arrived: torch.futures.Future = torch.futures.Future()
        arrived.set_result(None)
        lb.exchange.ride(k, None, wide_out[shard:].view(block.shape), arrived)
        self._rode_step = k

    def reduce_scattered(self) -> None:
        """A reduce-scatter of a step's backward returned: at the first, queue the report for the end of it."""
        self._scattered_s = time.perf_counter()
        lb = self._me()
        if lb is None or self._queued_step == lb.global_step:
            return
        self._queued_step = lb.global_step
        torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)

    def after_all_reduce(self, reduced: torch.Tensor) -> None:
        """HSDP: FSDP's all-reduce hook, called when the all-reduce over the replicas is done."""
        self.waited(time.perf_counter() - self._scattered_s)

    def _end_of_backward(self) -> None:
        lb = self._me()
        if lb is None:
            return
        k = lb.global_step
        if lb.exchange.launched(k) and self._rode_step != k:
            return
        lb.loss.check_scaled(k)
        if self._rode_step != k:
            lb.send_report(k, time.perf_counter())
        lb.clock.restart()  # the next window opens as the step's last reduce-scatter is left


def _timed(base: type, timing: _StepTiming, scatters: bool = False) -> Any:
    """An instance of FSDP's default collective ``base`` whose blocking calls count as waiting."""
    class Timed(base):  # type: ignore[misc, valid-type]
        def __call__(self, *args: Any, **kwargs: Any) -> Optional[dist.Work]:
            if scatters:  # (output_tensor, input_tensor, group, op): the input is this rank's unsharded gradients
                kwargs.update(zip(("output_tensor", "input_tensor", "group", "op", "async_op"), args))
                args = ()
                if timing.in_native(kwargs):
                    return None
                timing.weigh(kwargs["input_tensor"])
                if timing.rides_here(kwargs["input_tensor"], kwargs.get("async_op", False)):
                    timing.ride(super().__call__, **kwargs)
                    timing.reduce_scattered()
                    return None
            t0 = time.perf_counter()
            work = super().__call__(*args, **kwargs)
            if work is None or not kwargs.get("async_op", False):
                timing.waited(time.perf_counter() - t0)
            if scatters:
                timing.reduce_scattered()
            return work
    Timed.__name__ = f"LoadBalancer{base.__name__}"
    return Timed()

