"""Batch vectors (one sample count per worker): checking one, and the exact split of a global batch by speed."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from . import _lbbsp
from ._checks import check_int, int_array


def check_batch(batch: Sequence[int], global_batch: int, min: Optional[Sequence[int]] = None,
                max: Optional[Sequence[int]] = None) -> None:
    """Raises ValueError unless batch sums to ``global_batch`` and lies within the per-worker bounds."""
    b = int_array(batch, "batch", minimum=None)
    lo, hi = _bounds(min, max, b.shape[0])
    _lbbsp.check_batch(b.tolist(), check_int(global_batch, "global_batch", 0), lo, hi)


def assign_by_speed(speeds: Sequence[float], global_batch: int, min: Optional[Sequence[int]] = None,
                    max: Optional[Sequence[int]] = None) -> np.ndarray:
    """The exact integer split of ``global_batch`` minimising the slowest finish ``b_i / speed_i``."""
    s = np.asarray(speeds, dtype=np.float64)
    if s.ndim != 1:
        raise ValueError(f"speeds must be one-dimensional, got shape {s.shape}")
    lo, hi = _bounds(min, max, s.shape[0])
    return _lbbsp.assign_by_speed(s.tolist(), check_int(global_batch, "global_batch", 0), lo, hi)


def _bounds(lo: Optional[Sequence[int]], hi: Optional[Sequence[int]], workers: int) -> tuple:
    """The per-worker bounds as lists for the C++ core, each empty when not given."""
    lo_list = [] if lo is None else int_array(lo, "min", workers).tolist()
    hi_list = [] if hi is None else int_array(hi, "max", workers).tolist()
    return lo_list, hi_list
