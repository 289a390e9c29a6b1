"""The loss's side of the invariant: with gradients SUMMED over ranks each rank's loss must be its share of the
global batch's (n_r / X of a mean over its n_r samples), once per micro-batch; and the checks that catch a loss
weighted wrong (no scale() before backward, a forward on other rows than the rank's slice, a mean loss scaled inside
no_sync() as if it were the whole slice's, scale() called another number of times than there are micro-batches).
With ``loss_reduction`` the loss is left as the user wrote it and the gradient hook weights the rank's gradients
instead (``hook_weight``): the same weights, applied to DDP's gradient buckets (in C++) or to the input of FSDP2's
reduce-scatter rather than to the loss; "auto"
(the default) does so in every step whose loss did not go through scale()."""

import warnings
import weakref
from typing import Any, Optional

import torch

from ._util import positive_int
from .sizes import micro_split


class LossScale:
    """Scales a rank's loss to its share of the global batch and checks that every step's loss was."""

    def __init__(self, global_batch: int, micro_batches: int, check: bool, model: Optional[torch.nn.Module],
                 reduction: Optional[str] = None, hooked: bool = False) -> None:
        if not isinstance(check, bool):
            raise TypeError(f"LoadBalancer: check_loss must be True or False, got {check!r}")
        self.global_batch, self.micro_batches, self.check = global_batch, micro_batches, check
        #: loss_reduction: None (scale() weights the loss), "mean" or "sum" (the hook weights the gradients),
        #: "auto" (the hook weights a mean loss where scale() did not weight it)
        # hooked: the model weights this rank's gradients before the SUM (DDP's hook, FSDP2's reduce-scatter)
        self.reduction = _hook_reduction(reduction, micro_batches, hooked, check)
        self._model = model
        self.calls = 0  # scale() calls in the current step (the micro-batch the next one is for)
        self._scaled_step = -1
        self._rows: Optional[int] = None  # the first input's rows in the model's last forward
        self._warned_unscaled = self._warned_rows = False

    def new_step(self) -> None:
        self.calls = 0

    def restart(self) -> None:
        """A loaded state: the steps to come may have numbers of steps already scaled."""
        self.new_step()
        self._scaled_step = -1

    def end_step(self, step: int, batch: int) -> None:
        """Step ``step``, in which this rank had ``batch`` samples, ends (with loss_reduction the rows of its last
        forward are checked here, as scale() checks them); the next begins."""
        if self.reduction is not None and self.check and self._scaled_step != step:
            self._check_rows(batch, step, "LoadBalancer.step")
        self.new_step()

    def hook_weight(self, batch: int, step: int) -> Optional[float]:
        """With loss_reduction, what the hook multiplies this rank's gradients by before the SUM in step ``step``,
        where it has ``batch`` samples: batch / X of a mean loss (0 for none: a mean of nothing is NaN), 1 / X of
        a sum; None (nothing) where the loss went through scale()."""
        if self.reduction is None or self._scaled_step == step:
            return None
        return 1.0 / self.global_batch if self.reduction == "sum" else batch / self.global_batch

    def orphan_weight(self, world: int) -> Optional[float]:
        """The hook's weight once the LoadBalancer is gone: DDP's average of a mean loss, 1 / X of a sum."""
        if self.reduction is None:
            return None
        return 1.0 / self.global_batch if self.reduction == "sum" else 1.0 / world

    def scale(self, loss: torch.Tensor, reduction: str, count: Optional[int], step: int, batch: int) -> torch.Tensor:
        """LoadBalancer.scale for step ``step``, in which this rank has ``batch`` samples."""
        if self.reduction in ("mean", "sum"):
            raise RuntimeError(f"LoadBalancer.scale: this LoadBalancer has loss_reduction={self.reduction!r}: the "
                               "gradient hook weights the rank's gradients already; pass the loss to backward() "
                               "as it is (or build the LoadBalancer without loss_reduction to scale it here)")
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise ValueError("LoadBalancer.scale: loss must be a scalar tensor (reduce it first: the mean or the "
                             f"sum over this rank's samples), got {type(loss).__name__}"
                             f"{' of shape ' + str(tuple(loss.shape)) if isinstance(loss, torch.Tensor) else ''}")
        if reduction not in ("mean", "sum"):
            raise ValueError(f"LoadBalancer.scale: reduction must be 'mean' or 'sum', got {reduction!r}")
        if self.micro_batches > 1 and self.calls >= self.micro_batches:
            raise RuntimeError(f"LoadBalancer.scale: step {step}: called more than micro_batches="
                               f"{self.micro_batches} times; call it once per micro-batch, then lb.step()")
        if count is not None:
            n = positive_int(count, "count", 0)
        elif self.micro_batches > 1:
            n = micro_split(batch, self.micro_batches)[self.calls]
        else:
            self._refuse_unsplit_accumulation(reduction, step, batch)
            n = batch
        if count is None and reduction == "mean":
            self._check_rows(n, step, "LoadBalancer.scale")
        self._scaled_step = step
        self.calls += 1
        if reduction == "sum":
            return loss / self.global_batch
        if n == 0:
            return torch.nan_to_num(loss * 0.0, nan=0.0, posinf=0.0, neginf=0.0)
        return loss * (n / self.global_batch)

    def note_rows(self, rows: Optional[int]) -> None:
        """The rows of the first input of the model's forward (its forward pre-hook)."""
        self._rows = rows

    def check_scaled(self, step: int) -> None:
        """Warns once where backward reaches the gradient allreduce in a step without scale()."""
        if not self.check or self.reduction is not None or self._warned_unscaled or self._scaled_step == step:
            return
        self._warned_unscaled = True
        warnings.warn(f"LoadBalancer: step {step}: backward ran without lb.scale(loss). The gradients are "
                      "SUMMED over ranks, so a loss that is the mean over this rank's samples (PyTorch's "
                      "default reduction='mean') gives gradients world-size times too large and weighted "
                      "unevenly. Write loss = lb.scale(loss) (or lb.scale(loss, reduction='sum') for a sum); "
                      "pass check_loss=False if the loss is already the rank's sum / lb.global_batch.")

    def check_micro_batches(self, step: int) -> None:
        """Raises where a step's scale() calls do not match its micro-batches (travels in the rank's report)."""
        if self.micro_batches > 1 and self.check and self.calls != self.micro_batches:
            raise RuntimeError(f"step {step}: lb.scale() was called {self.calls} times for micro_batches="
                               f"{self.micro_batches}: each micro-batch's loss needs it once, else the "
                               "gradients are weighted wrong")

    def _check_rows(self, n: int, step: int, where: str) -> None:
        """Warns once where the forward before scale() (or step(), the loss left to the hook) saw another batch
        than the n samples it is weighted by."""
        rows, self._rows = self._rows, None
        if rows is None or rows == n or self._warned_rows:  # None too with check_loss=False: no hook then
            return
        self._warned_rows = True
        fix = {"LoadBalancer.scale": "pass count= to scale() (or check_loss=False)",
               "LoadBalancer.step": "pass check_loss=False" if self.reduction != "auto" else
               "pass loss_reduction='mean' and check_loss=False"}[where]
        warnings.warn(f"{where}: step {step}: the model's last forward had {rows} rows in its "
                      f"first input but this rank's share is {n} samples: read the batches through "
                      "lb.data_loader() or lb.batch_sampler() (a DataLoader of your own with batch_size or a "
                      "DistributedSampler does not follow the balancer, which then weights the loss wrongly). If "
                      f"the first input is not batch-first, {fix}")

    def _refuse_unsplit_accumulation(self, reduction: str, step: int, batch: int) -> None:
        """A mean loss scaled inside the DDP model's no_sync() is a micro-batch's (manual accumulation): weighted
        by the whole slice's count once per micro-batch, the step's gradients would come out too large."""
        if reduction != "mean" or getattr(self._model, "require_backward_grad_sync", True):
            return
        raise ValueError(f"LoadBalancer.scale: step {step}: a mean loss inside the DDP model's no_sync() "
                         "(gradient accumulation) with micro_batches=1 and no count would be weighted by this "
                         f"rank's whole slice ({batch} samples) once per "
                         "micro-batch. Pass the micro-batch's size, lb.scale(loss, count=len(y)), or build the "
                         "LoadBalancer with micro_batches=A and read the micro-batches from lb.data_loader(); "
                         "for a loss over the whole slice pass count=int(lb.batch_sizes[lb.rank])")


def _hook_reduction(reduction: Optional[str], micro_batches: int, hooked: bool, check: bool) -> Optional[str]:
    """LoadBalancer's loss_reduction, checked: None, "mean"/"sum" with a hooked model (DDP, or FSDP2 whose
    reduce-scatter runs) and one micro-batch, or "auto": that weight for a mean loss where it applies (and the loss
    is not weighted by hand: check_loss=True), else None."""
    if reduction is None:
        return None
    if reduction not in ("auto", "mean", "sum"):
        raise ValueError(f"LoadBalancer: loss_reduction must be 'auto', 'mean', 'sum' or None, got {reduction!r}")
    if reduction == "auto":
        return "auto" if hooked and micro_batches == 1 and check else None
    if not hooked:
        raise ValueError(f"LoadBalancer: loss_reduction={reduction!r} weights the gradients before they are summed, "
                         "in a DDP model's communication hook or an FSDP2 model's reduce-scatter: it needs one of "
                         "them (FSDP2 with more than one rank in the mesh's shard dimension); without, leave "
                         "loss_reduction=None and call lb.scale(loss)")
    if micro_batches != 1:
        raise ValueError(f"LoadBalancer: loss_reduction={reduction!r} needs micro_batches=1: micro-batches of "
                         "unequal size need a weight each, which lb.scale(loss) gives (leave loss_reduction=None)")
    return reduction


def watch_rows(me: "weakref.ref", model: torch.nn.Module) -> None:
    """A forward pre-hook on ``model`` noting its first input's rows for the LoadBalancer ``me()`` (held weakly:
    the model must not keep it alive)."""
    def note_rows(module: torch.nn.Module, args: Any) -> None:
        lb = me()
        if lb is not None:
            lb.loss.note_rows(args[0].shape[0] if args and torch.is_tensor(args[0]) and args[0].dim() else None)
    model.register_forward_pre_hook(note_rows)
