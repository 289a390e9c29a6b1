"""DataLoader pieces: the batch sampler over a LoadBalancer, the DataLoader built on it, the lag a DataLoader
needs, an empty-batch collate, and the checks every adapter makes of a user's dataset and DataLoader."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator, List, Optional

import numpy as np
import torch

from ._util import positive_int

if TYPE_CHECKING:
    from .controller import LoadBalancer


def required_lag(num_workers: int, prefetch_factor: Optional[int] = None, micro_batches: int = 1) -> int:
    """The steps a DataLoader reads ahead of the one being trained, so the ``lag`` its batch sampler needs:
    0 without workers, else ``num_workers * prefetch_factor`` batches (PyTorch's default prefetch_factor is 2),
    which are that many over ``micro_batches`` steps when each step is several micro-batches."""
    workers = positive_int(num_workers, "num_workers", 0)
    micro = positive_int(micro_batches, "micro_batches", 1)
    if workers == 0:
        return 0
    ahead = workers * (2 if prefetch_factor is None else positive_int(prefetch_factor, "prefetch_factor", 1))
    return -(-ahead // micro)


def step_name(global_step: int, steps_per_epoch: int) -> str:
    """A global step as a user counts it: "epoch E, step S"."""
    epoch, step = divmod(global_step, steps_per_epoch)
    return f"epoch {epoch}, step {step}"


def require_map_style(dataset: Any, who: str) -> None:
    """Raises TypeError for an IterableDataset: the balancer hands each rank the indices of its share."""
    if isinstance(dataset, torch.utils.data.IterableDataset):
        raise TypeError(f"{who}: the dataset is an IterableDataset, and an IterableDataset yields samples in its own "
                        "order, so no rank can be handed the indices of its share; use a map-style Dataset "
                        "(__getitem__ and __len__), or draw each step's samples from lb.indices(epoch, step) "
                        "yourself")


def default_global_batch(loader: torch.utils.data.DataLoader, ranks: int, accumulate: int, who: str,
                         fix: str) -> int:
    """What plain DDP steps on: the DataLoader's batch_size times the ranks times the accumulated micro-batches."""
    if loader.batch_size is None:
        raise ValueError(f"{who}: the DataLoader has no batch_size (it has a batch_sampler): pass {fix}")
    return loader.batch_size * ranks * accumulate


def _empty_like(batch: Any) -> Any:
    """A collated batch of one sample cut to zero samples: tensors and arrays to [:0], containers element-wise."""
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        return batch[:0]
    if isinstance(batch, dict):
        return type(batch)((k, _empty_like(v)) for k, v in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_empty_like(v) for v in batch))
    if isinstance(batch, (list, tuple)):
        if batch and all(isinstance(v, str) for v in batch):
            return type(batch)()  # a batch of strings
        return type(batch)(_empty_like(v) for v in batch)
    return batch


class AllowEmpty:
    """A DataLoader ``collate_fn`` that also collates an empty index list (a rank given 0 samples): the batch of
    ``dataset[0]`` cut to zero samples, so tensors keep their dtype and trailing shape. PyTorch's default collate
    raises IndexError on an empty list. ``LoadBalancer.data_loader`` wraps its collate_fn in this."""

    def __init__(self, dataset: Any, collate_fn: Optional[Callable[[List[Any]], Any]] = None) -> None:
        if collate_fn is None:
            from torch.utils.data import default_collate
            collate_fn = default_collate
        self.dataset, self.collate_fn, self._empty = dataset, collate_fn, None

    def __call__(self, batch: List[Any]) -> Any:
        if len(batch):
            return self.collate_fn(batch)
        if self._empty is None:
            if len(self.dataset) == 0:
                raise ValueError("AllowEmpty: the dataset is empty, so there is no sample to take the batch's "
                                 "layout from")
            self._empty = _empty_like(self.collate_fn([self.dataset[0]]))
        return self._empty


class BalancedBatchSampler:
    """DataLoader ``batch_sampler`` over a LoadBalancer: yields this rank's index list of each step of an epoch
    (with ``micro_batches`` > 1 its micro-batches, one by one), as far ahead as the controller's ``lag`` allows.
    The epoch is the run's (``lb.epoch``) unless
    ``set_epoch()`` fixes it; iteration starts at the run's current step of that epoch (``lb.global_step``), so
    one sampler serves every epoch and a resumed run continues mid-epoch with no user code."""

    def __init__(self, lb: LoadBalancer, epoch: Optional[int] = None, whole_epoch_len: bool = False) -> None:
        self.lb, self._started = lb, None  # (epoch, first step) of the latest iteration
        # A loop that counts the steps done before a resume itself (Lightning's) wants the whole epoch's length.
        self.whole_epoch_len = whole_epoch_len
        self._epoch = None if epoch is None else positive_int(epoch, "epoch", 0)

    def set_epoch(self, epoch: Optional[int]) -> None:
        """The epoch the next iteration covers (None: the run's current epoch), checked when iterating."""
        self._epoch = None if epoch is None else positive_int(epoch, "epoch", 0)

    def _plan(self):
        lb, spe = self.lb, self.lb.steps_per_epoch
        g = lb.global_step
        epoch = g // spe if self._epoch is None else self._epoch
        if g >= (epoch + 1) * spe:
            raise RuntimeError(f"BalancedBatchSampler: epoch {epoch} is past: the run is at step {g} "
                               f"({step_name(g, spe)}); call set_epoch({g // spe}) before iterating, or "
                               "set_epoch(None) to follow the run")
        if g < epoch * spe:
            raise RuntimeError(f"BalancedBatchSampler: epoch {epoch} has not begun: the run is at step {g} "
                               f"({step_name(g, spe)}), and steps are taken in order; call set_epoch({g // spe}) or "
                               "set_epoch(None) to follow the run")
        return epoch, g - epoch * spe

    def __len__(self) -> int:
        """Steps the current (or next) iteration yields: the epoch's, less those done before it began."""
        spe, g = self.lb.steps_per_epoch, self.lb.global_step
        if self.whole_epoch_len:
            return spe * self.lb.micro_batches
        epoch = g // spe if self._epoch is None else self._epoch
        if self._started is not None and self._started[0] == epoch and g < (epoch + 1) * spe:
            return (spe - self._started[1]) * self.lb.micro_batches  # iterating this epoch: from where it began
        return (spe - self._plan()[1]) * self.lb.micro_batches

    def __iter__(self) -> Iterator[List[int]]:
        epoch, start = self._plan()
        self._started = (epoch, start)
        for step in range(start, self.lb.steps_per_epoch):
            if self.lb.micro_batches == 1:
                yield self.lb.indices(epoch, step).tolist()
            else:
                yield from (m.tolist() for m in self.lb.micro_indices(epoch, step))


def balanced_loader(lb: LoadBalancer, dataset: Any, num_workers: int, prefetch_factor: Optional[int],
                    collate_fn: Optional[Callable[[List[Any]], Any]], epoch: Optional[int], whole_epoch_len: bool,
                    **kwargs: Any) -> torch.utils.data.DataLoader:
    """LoadBalancer.data_loader's DataLoader (see there), its dataset and read-ahead checked."""
    require_map_style(dataset, "LoadBalancer.data_loader")
    _check_length(dataset, lb.dataset_size)
    need = required_lag(num_workers, prefetch_factor, lb.micro_batches)
    if need > lb.lag:
        lb.raise_lag(need)
    if need > lb.lag:
        raise ValueError(f"LoadBalancer.data_loader: a DataLoader with num_workers={num_workers} and "
                         f"prefetch_factor={2 if prefetch_factor is None else prefetch_factor} reads {need} "
                         f"batches ahead, but this LoadBalancer decides lag={lb.lag} steps ahead: construct "
                         f"it with lag={need} (lbbsp.torch.required_lag({num_workers}, {prefetch_factor}, "
                         f"{lb.micro_batches})) or read fewer batches ahead")
    for owned in ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"):
        if owned in kwargs:
            raise TypeError(f"LoadBalancer.data_loader: {owned} is set by the balancer's batch sampler; "
                            "leave it out")
    if num_workers > 0 and prefetch_factor is not None:
        kwargs["prefetch_factor"] = prefetch_factor
    return torch.utils.data.DataLoader(dataset, batch_sampler=BalancedBatchSampler(lb, epoch, whole_epoch_len),
                                       num_workers=num_workers, collate_fn=AllowEmpty(dataset, collate_fn),
                                       **kwargs)


def _check_length(dataset: Any, dataset_size: int) -> None:
    """A dataset of another length than dataset_size: indices past its end fail in a worker, or its tail is
    never read (a silent subset)."""
    try:
        size = len(dataset)
    except TypeError:  # no __len__: the indices are all it gets
        return
    if size != dataset_size:
        raise ValueError(f"LoadBalancer.data_loader: the dataset has {size} samples but this LoadBalancer was "
                         f"built with dataset_size={dataset_size}: pass dataset_size=len(dataset) (the "
                         "whole dataset, the same on every rank), or wrap the part to train on in "
                         "torch.utils.data.Subset")
