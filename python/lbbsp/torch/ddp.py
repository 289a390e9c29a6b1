"""The DDP model's side of a LoadBalancer: its communication hook, which SUMS the gradients and, at the last
bucket, sends the step's report (riding in that allreduce where it can) and opens the next step's window when the
allreduce is left; and a forward pre-hook noting the rows of the model's input (the scale() check).

Both hooks hold the LoadBalancer weakly: no reference cycle (model -> hook -> balancer -> model), so a dropped
LoadBalancer and its process groups go at once, in the thread that drops them, and never in a gloo thread's
callback (where tearing down a process group ends the process)."""

import time
import warnings
import weakref
from typing import TYPE_CHECKING, Optional

import torch
import torch.distributed as dist

from .exchange import group_ranks
from .hooks import allreduce_sum, allreduce_sum_coalesced, first_tensor, sum_allreduce_hook, then
from .loss import watch_rows

if TYPE_CHECKING:
    from .controller import LoadBalancer

def orphaned_warning(kind: str, reduction: Optional[str]) -> str:
    """The warning once a model's LoadBalancer is gone (``kind``: "DDP" or "FSDP"; loss_reduction's weighting)."""
    if reduction in (None, "sum"):
        return (f"LoadBalancer: the {kind} model's LoadBalancer is gone (no reference left to it) but its gradient "
                "reduction stays a SUM over ranks, so a mean loss gives gradients world-size times too large. Keep "
                f"the LoadBalancer for as long as the model trains, or train on with a new {kind} model")
    return (f"LoadBalancer: the {kind} model's LoadBalancer is gone (no reference left to it) but its gradient "
            "reduction stays and averages the gradients as DDP does (a mean loss left to the hook), over the "
            f"batches the ranks now read. Keep the LoadBalancer for as long as the model trains, or train on with a "
            f"new {kind} model")


def bucket_tensor(bucket: dist.GradBucket) -> torch.Tensor:
    """The bucket's flat gradients (PyTorch 1.x calls it get_tensor)."""
    return bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()


def weigh(tensor: torch.Tensor, weight: Optional[float]) -> None:
    """loss_reduction's weight on this rank's gradients before the SUM (none: the loss was scaled)."""
    if weight is None:
        return
    if weight == 0.0:  # no samples: a mean of nothing is NaN
        tensor.zero_()
    else:
        tensor.mul_(weight)


def check_model(model: Optional[torch.nn.Module]) -> None:
    """A DistributedDataParallel model or None."""
    if model is not None and not hasattr(model, "register_comm_hook"):
        raise TypeError("LoadBalancer: model must be a DistributedDataParallel, a module with fully_shard applied "
                        f"(FSDP2), or None to sum gradients yourself; got {type(model).__name__}")


def model_ranks(model: Optional[torch.nn.Module], balanced: list) -> list:
    """The global ranks the model reduces its gradients over (``balanced`` where there is no model)."""
    return group_ranks(getattr(model, "process_group", None)) if model is not None else balanced


def attach(lb: "LoadBalancer", model: torch.nn.Module, check_rows: bool) -> None:
    """Registers the SUM hook (and with ``check_rows`` the forward pre-hook) on the DDP model."""
    me, orphaned = weakref.ref(lb), []
    orphan_weight = lb.loss.orphan_weight(lb.world_size)
    message = orphaned_warning("DDP", lb.loss.reduction)

    def hook(state: Optional[dist.ProcessGroup], bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        balancer = me()
        if balancer is not None:
            return _sum_and_report(balancer, me, state, bucket)
        if not orphaned:  # DDP keeps the hook: training on without the LoadBalancer still sums
            orphaned.append(True)
            warnings.warn(message)
        weigh(bucket_tensor(bucket), orphan_weight)
        return sum_allreduce_hook(state, bucket)
    try:
        if lb.native is not None:  # the same hook in C++ (lbbsp.torch.native)
            lb.native.register(model.reducer, getattr(model, "process_group", None) or dist.group.WORLD, message,
                               lb.loss.reduction or "", lb.global_batch)
        else:
            model.register_comm_hook(getattr(model, "process_group", None), hook)
    except RuntimeError as e:  # DDP takes one hook: the user's (a compression hook, say) came first
        raise RuntimeError("LoadBalancer: the model already has a communication hook (register_comm_hook "
                           "was called on it): LB-BSP needs its own, which sums the gradients and carries "
                           "the reports; build the LoadBalancer on a DDP model without one (gradient "
                           f"compression hooks are not supported). PyTorch: {e}") from e
    if check_rows:
        watch_rows(me, model)


def _sum_and_report(lb: "LoadBalancer", me: "weakref.ref", process_group: Optional[dist.ProcessGroup],
                    bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The SUM hook's work on one bucket; at the last one it sends this step's report."""
    k = lb.global_step
    lb.loss.check_scaled(k)
    tensor = bucket_tensor(bucket)
    weigh(tensor, lb.loss.hook_weight(int(lb.sizes[k][lb.rank]), k))
    last = bucket.is_last() if hasattr(bucket, "is_last") else False
    sends = last and not lb.exchange.launched(k)
    ready = lb.clock.ready_marker() if last else None  # this rank's backward ends here (on CUDA read later)
    ready_s = time.perf_counter()
    # On CUDA the report takes the all-gather on the gloo group: no copies between host and device.
    block = work = None
    if sends and not lb.clock.on_device and lb.exchange.can_piggyback(tensor):  # the report rides along
        report = lb.report(k, ready_s)
        block = lb.exchange.piggyback(report, tensor.dtype)
        work = allreduce_sum_coalesced([tensor, block], process_group)
        if work is None:  # the backend has no coalesced allreduce: the reports take the all-gather from now on
            lb.exchange.no_piggyback(block)
            block = None
            lb.exchange.launch(k, report)
    if work is None:
        work = allreduce_sum(tensor, process_group)
        if sends and not lb.exchange.launched(k):
            lb.send_report(k, ready_s, ready)
    # One callback per bucket: each costs the gloo thread a turn at the GIL.
    if not last:
        return then(work, first_tensor)

    def done(f: torch.futures.Future) -> torch.Tensor:
        value = f.value()  # raises what the allreduce raised (a peer gone, a timeout)
        balancer = me()  # not lb: the gloo thread that drops this callback must never drop the last reference
        if balancer is not None:
            balancer.clock.left_barrier(sends, ready, ready_s)
        return value[0]
    fut = then(work, done)
    if block is not None:
        lb.exchange.ride(k, work, block, fut)
    return fut
