"""What the co-tenant benchmarks (torch_cotenant.py, train_cotenant.py) compare every controller with: per step,
the oracle split of the ranks' measured speeds, the best causal split of the same speeds (what a controller
deciding each step from the steps before it could reach), and the split by each co-tenant phase's mean speeds (the
ideal as issue #51 words it: from each rank's speed alone and under its co-tenant). NumPy only."""

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
    return split_above_oracle(speeds[:, 1:], predicted, total)


def split_above_oracle(speeds: np.ndarray, weights: np.ndarray, total: int) -> float:
    """Mean seconds a step's slower rank computes above the oracle split of ``total`` samples when each step is
    split in proportion to ``weights`` (ranks x steps, as ``speeds``), the ranks at their measured speeds."""
    b = total * weights / weights.sum(axis=0)
    return float(((b / speeds).max(axis=0) - total / speeds.sum(axis=0)).mean())


def causal_above_oracle(speeds: np.ndarray, total: int) -> float:
    """The best causal split's mean seconds a step above the oracle (the least over causal_predictions)."""
    return min(above_oracle(speeds, p, total) for p in causal_predictions(speeds))


def by_phase_above_oracle(speeds: np.ndarray, phase: np.ndarray, total: int) -> float:
    """The ideal from each rank's speed alone and under its co-tenant: mean seconds a step's slower rank computes
    above the oracle when each step is split by its co-tenant phase's mean speeds (``phase``: one integer a step,
    cotenants.phases()), the ranks at their measured speeds of that step. It knows when each phase begins, not a
    step's noise. The mean speed of a phase is the harmonic mean of its steps' (samples over seconds at an equal
    split)."""
    mean = np.empty_like(speeds)
    for p in np.unique(phase):
        m = phase == p
        mean[:, m] = (1.0 / (1.0 / speeds[:, m]).mean(axis=1))[:, None]
    return split_above_oracle(speeds, mean, total)


def of_ideal(speedup: float, ideal: float, floor: float) -> float:
    """The fraction of an ideal speed-up reached, (speedup - 1) / (ideal - 1); NaN where the ideal is within
    ``floor`` of 1 (noise over noise)."""
    return (speedup - 1) / (ideal - 1) if ideal > 1 + floor else float("nan")
