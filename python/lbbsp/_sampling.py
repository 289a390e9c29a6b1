"""Which samples each step and each worker get: the epoch's permutation, cut into global batches and then into
each worker's slice, exactly as ``lbbsp train`` cuts them."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import _lbbsp
from ._checks import check_int, int_array


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The order of the n training samples in an epoch, exactly as ``lbbsp train --seed SEED`` visits them."""
    return _lbbsp.epoch_permutation(check_int(n, "n", 0), check_int(seed, "seed", 0),
                                    check_int(epoch, "epoch", 0))


def rank_indices(permutation: Any, step: int, batch: Sequence[int], rank: int) -> np.ndarray:
    """Worker ``rank``'s sample indices at ``step`` of an epoch: positions ``[step*X + b_0+..+b_{rank-1},
    + b_rank)`` of the permutation, X = ``sum(batch)``."""
    perm = int_array(permutation, "permutation", minimum=None)
    b = int_array(batch, "batch")
    rank = check_int(rank, "rank")
    if not 0 <= rank < b.shape[0]:
        raise ValueError(f"rank must be in [0, {b.shape[0]}), got {rank}")
    return _lbbsp.rank_indices(perm, check_int(step, "step", 0), b, rank)


def slice_offset(batch: Sequence[int], rank: int) -> int:
    """``b_0 + ... + b_{rank-1}``: where worker ``rank``'s slice starts inside the global batch."""
    b = int_array(batch, "batch")
    rank = check_int(rank, "rank")
    if not 0 <= rank <= b.shape[0]:
        raise ValueError(f"rank must be in [0, {b.shape[0]}], got {rank}")
    return int(_lbbsp.slice_offset(b, rank))


def steps_per_epoch(n: int, global_batch: int) -> int:
    """Whole global batches in n samples (an epoch's remainder is dropped, as in ``lbbsp train``)."""
    return int(_lbbsp.steps_per_epoch(check_int(n, "n", 0), check_int(global_batch, "global_batch", 1)))
