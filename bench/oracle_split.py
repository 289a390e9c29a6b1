"""What the co-tenant benchmarks (torch_cotenant.py, train_cotenant.py) compare every controller with: per step,
the oracle split of the ranks' measured speeds, and the best causal split of the same speeds (what a controller
deciding each step from the steps before it could reach). NumPy only."""

from typing import Iterator

import numpy as np


def causal_predictions(speeds: np.ndarray) -> Iterator[np.ndarray]:
    """What a controller deciding step t from the steps before it could know: each rank's speed of the last
    step, and EMAs of the speeds (weights 0.3, 0.5, 0.7 on the newest), as ranks x steps arrays for steps 1..."""
    yield speeds[:, :-1]
    for w in (0.3, 0.5, 0.7):
        ema, out = speeds[:, 0], [speeds[:, 0]]
        for k in range(1, speeds.shape[1] - 1):
            ema = (1 - w) * ema + w * speeds[:, k]
            out.append(ema)
        yield np.array(out).T


def above_oracle(speeds: np.ndarray, predicted: np.ndarray, total: int) -> float:
    """Mean seconds a step's slower rank computes above the oracle split of ``total`` samples when each step
    t >= 1 is split in proportion to ``predicted`` (made before it), the ranks at their measured speeds of that
    step (``speeds``: ranks x steps, samples/s)."""
    s = speeds[:, 1:]
    b = total * predicted / predicted.sum(axis=0)
    return float(((b / s).max(axis=0) - total / s.sum(axis=0)).mean())


def causal_above_oracle(speeds: np.ndarray, total: int) -> float:
    """The best causal split's mean seconds a step above the oracle (the least over causal_predictions)."""
    return min(above_oracle(speeds, p, total) for p in causal_predictions(speeds))
