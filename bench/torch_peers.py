"""The published peers of bench/torch_cotenant.py, as benchmark code (not the product): OmniLearn's controller (TPDS
2025) as its paper gives it, and the naive balancer a user would write. Each keeps the batch vector of the global
batch ``total`` and updates it from this rank's measured compute seconds (an all-gather over the world)."""

import numpy as np
import torch
import torch.distributed as dist


def gather(value):
    """Every rank's float."""
    outs = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(outs, torch.tensor([value], dtype=torch.float64))
    return torch.cat(outs).numpy()


def largest_remainder(weights, total):
    """Integer sizes proportional to weights, summing to total, each >= 1."""
    w = np.maximum(np.asarray(weights, dtype=np.float64), 1e-12)
    raw = w / w.sum() * (total - len(w))
    sizes = np.floor(raw).astype(np.int64)
    sizes[np.argsort(sizes - raw)[: total - len(w) - sizes.sum()]] += 1
    return sizes + 1


class OmniLearn:
    """Every `window` steps: b_r -= (b_r / t_r)(t_r - mean t) where |t_r - mean t| > 5% of mean t."""

    def __init__(self, world, total, window=20, band=0.05):
        self.sizes, self.total = np.full(world, total // world, dtype=np.int64), total
        self.window, self.band, self.times = window, band, []

    def update(self, step, t_mine):
        self.times.append(t_mine)
        if (step + 1) % self.window:
            return
        t = gather(float(np.mean(self.times)))
        self.times = []
        mean = t.mean()
        b = self.sizes.astype(np.float64)
        move = np.where(np.abs(t - mean) > self.band * mean, -(b / t) * (t - mean), 0.0)
        self.sizes = largest_remainder(np.maximum(b + move, 1.0), self.total)


class Naive:
    """Sizes proportional to the measured speeds (samples/s), an EMA of 0.5, every step."""

    def __init__(self, world, total):
        self.sizes, self.total = np.full(world, total // world, dtype=np.int64), total
        self.speed = None

    def update(self, step, t_mine):
        t = gather(t_mine)
        s = self.sizes / np.maximum(t, 1e-6)
        self.speed = s if self.speed is None else 0.5 * self.speed + 0.5 * s
        self.sizes = largest_remainder(self.speed, self.total)
