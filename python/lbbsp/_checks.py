"""Argument checks for lbbsp and lbbsp.torch: every bad input is a ValueError or TypeError that names the argument.

Arrays are refused, never coerced: a float array where integers are due is a TypeError, not rounded.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

#: Empty inputs for the C++ core's optional arrays ("not given").
EMPTY_I64 = np.zeros(0, dtype=np.int64)
EMPTY_F64 = np.zeros(0, dtype=np.float64)


def check_int(value: Any, name: str, minimum: Optional[int] = None, prefix: str = "") -> int:
    """value as an int: a Python or NumPy integer (not a bool), >= minimum unless that is None.

    ``prefix`` starts each error message (lbbsp.torch's checks say ``"LoadBalancer: "``)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{prefix}{name} must be an integer, got {type(value).__name__} {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{prefix}{name} must be >= {minimum}, got {value}")
    return int(value)


def check_name(value: Any, name: str, known: Sequence[str]) -> str:
    """value, a string whose kind (the part before the first ``:`` or ``;``) is one of ``known``
    (``lbbsp-cpu:ema`` and ``lbbsp-cpu;band=0.5`` -> ``lbbsp-cpu``); the C++ factory checks the rest."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {type(value).__name__}")
    base = value.split(";", 1)[0].split(":", 1)[0]
    if base not in known:
        raise ValueError(f"unknown {name} '{value}': choose one of {', '.join(known)}")
    return value


def int_array(value: Any, name: str, length: Optional[int] = None, minimum: Optional[int] = 0) -> np.ndarray:
    """A 1-D int64 copy of value; integers only (a float array is refused, not rounded)."""
    a = np.asarray(value)
    if a.dtype == object or not (np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_):
        raise TypeError(f"{name} must be an array of integers, got dtype {a.dtype}")
    if a.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {a.shape}")
    if length is not None and a.shape[0] != length:
        raise ValueError(f"{name} must have one entry per worker ({length}), got {a.shape[0]}")
    if minimum is not None and a.size and a.min() < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {a.min()} at index {int(np.argmin(a))}")
    return np.ascontiguousarray(a, dtype=np.int64)


def float_array(value: Any, name: str, shape: tuple, nonnegative: bool = True) -> np.ndarray:
    """A float64 copy of value with the given shape (None = any), finite and (optionally) >= 0."""
    a = np.asarray(value)
    if a.dtype == object or not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise TypeError(f"{name} must be an array of real numbers, got dtype {a.dtype}")
    if a.ndim != len(shape) or any(want is not None and got != want for got, want in zip(a.shape, shape)):
        raise ValueError(f"{name} must have shape {_shape_text(shape)}, got {a.shape}")
    a = np.ascontiguousarray(a, dtype=np.float64)
    _check_finite(a, name, nonnegative)
    return a


def _shape_text(shape: tuple) -> str:
    """``(3, *)`` for shape (3, None): how an error message spells a wanted shape."""
    return "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"


def _check_finite(a: np.ndarray, name: str, nonnegative: bool) -> None:
    """ValueError naming a's first entry that is not finite (or, when nonnegative, is < 0)."""
    bad = ~np.isfinite(a) | ((a < 0) if nonnegative else False)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        rule = "finite and >= 0" if nonnegative else "finite"
        raise ValueError(f"{name} must be {rule}, got {a[where]} at index {where[0] if len(where) == 1 else where}")
