"""lbbsp-cpu's noise-band options (``;band=F``, ``;track=F``, docs/balancers.md "Noise") through the Python
package: they reach the C++ balancer, and bad ones are refused naming the option."""

import numpy as np
import pytest

import lbbsp


def test_band_option_reaches_the_balancer():
    """lbbsp-cpu;band=0 (no noise band): 4 equal workers whose times jitter 25% a step get a new split every
    step, where the default keeps the equal one (steps 30-99: 69 changes against 0-4 for seeds 3-5)."""
    def changes(name):
        g = np.random.default_rng(3)
        b = lbbsp.Balancer(name, workers=4, global_batch=400)
        batch, decided = np.full(4, 100), []
        for _ in range(100):
            batch = b.next(batch=batch, compute_s=batch / 100 * g.lognormal(0, 0.25, 4))
            decided.append(batch.copy())
        return int((np.diff(np.array(decided)[30:], axis=0) != 0).any(axis=1).sum())

    assert changes("lbbsp-cpu;band=0") >= 50 and changes("lbbsp-cpu") <= 10


def test_bad_band_options():
    with pytest.raises(ValueError, match="track must be a number >= 0"):
        lbbsp.Balancer("lbbsp-cpu;track=-1", workers=2, global_batch=8)
    with pytest.raises(ValueError, match="'lbbsp-gpu' takes no ;KEY=VALUE options, got 'band'"):
        lbbsp.Balancer("lbbsp-gpu;band=1", workers=2, global_batch=8)
