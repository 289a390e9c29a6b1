"""lbbsp-cpu's noise-band options (``;band=F``, ``;track=F``, ``;follow=0|1``, docs/balancers.md "Noise") through
the Python package: they reach the C++ balancer, and bad ones are refused naming the option."""

import numpy as np
import pytest

import lbbsp


def test_band_option_reaches_the_balancer():
    """lbbsp-cpu;band=0 (no noise band): 4 equal workers whose times jitter 25% a step get a new split every
    step, where band=1 keeps the equal one (steps 30-99: 69 changes against 0-4 for seeds 3-5; the default of
    0.5, 12)."""
    def changes(name):
        g = np.random.default_rng(3)
        b = lbbsp.Balancer(name, workers=4, global_batch=400)
        batch, decided = np.full(4, 100), []
        for _ in range(100):
            batch = b.next(batch=batch, compute_s=batch / 100 * g.lognormal(0, 0.25, 4))
            decided.append(batch.copy())
        return int((np.diff(np.array(decided)[30:], axis=0) != 0).any(axis=1).sum())

    assert changes("lbbsp-cpu;band=0") >= 50 and changes("lbbsp-cpu;band=1") <= 10


def test_follow_option_reaches_the_balancer():
    """Rank 0 at 40% of its speed from step 40 on (5% jitter, seeds 3-8): with ;follow=1 the change is followed
    by step 43 at the latest (suspected on step 40's report, confirmed by 41's and 42's); the default decides
    otherwise (here NARX catches up by step 42-44 alone)."""
    def decided(name, seed):
        g = np.random.default_rng(seed)
        b = lbbsp.Balancer(name, workers=2, global_batch=128, predictor="narx", seed=1)
        batch, out = np.full(2, 64), []
        for step in range(60):
            out.append(batch[0])
            speed = np.array([0.4 if step >= 40 else 1.0, 1.0]) * 1000 * g.lognormal(0, 0.05, 2)
            batch = b.next(batch=batch, compute_s=batch / speed)
        return np.array(out)

    for seed in range(3, 9):
        assert (decided("lbbsp-cpu;follow=1", seed)[43:] < 45).all(), seed  # balanced: 128 x 0.4 / 1.4 = 37
    assert any((decided("lbbsp-cpu", s) != decided("lbbsp-cpu;follow=1", s)).any() for s in range(3, 9))


def test_bad_band_options():
    with pytest.raises(ValueError, match="follow must be 0 or 1"):
        lbbsp.Balancer("lbbsp-cpu;follow=yes", workers=2, global_batch=8)
    with pytest.raises(ValueError, match="track must be a number >= 0"):
        lbbsp.Balancer("lbbsp-cpu;track=-1", workers=2, global_batch=8)
    with pytest.raises(ValueError, match="'lbbsp-gpu' takes no ;KEY=VALUE options, got 'band'"):
        lbbsp.Balancer("lbbsp-gpu;band=1", workers=2, global_batch=8)
