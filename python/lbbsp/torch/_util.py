"""Argument checks shared by the modules of lbbsp.torch."""

from typing import Any

import numpy as np


def _positive_int(value: Any, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"LoadBalancer: {name} must be an integer, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"LoadBalancer: {name} must be >= {minimum}, got {value}")
    return int(value)
