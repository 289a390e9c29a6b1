"""The co-tenant benchmarks' yardsticks (bench/oracle_split.py, bench/cotenants.py): what every controller's speed-up
is read against must itself be right. NumPy only."""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import cotenants
import oracle_split


def _onoff_speeds(steps=400, period=40, noise=0.1, seed=3):
    """Rank 0 at 1000 samples/s; rank 1 at 500 while the co-tenant is on (the first ``period`` steps of each
    2 x period), 1000 while off; each step's speed jittered by ``noise`` (relative SD). Returns (speeds, phase)."""
    g = np.random.default_rng(seed)
    phase = (np.arange(steps) // period) % 2
    base = np.vstack([np.full(steps, 1000.0), np.where(phase == 0, 500.0, 1000.0)])
    return base * (1 + noise * g.standard_normal(base.shape)).clip(0.5, 1.5), phase


def test_the_ideal_by_phase_lies_between_the_clairvoyant_split_and_one_split_for_all():
    """Split by each phase's mean speeds, the slower rank computes above the per-step oracle only by what each
    step's noise costs: 0 without noise, less than one split for the whole run (which ignores the phases), and
    more than the per-step oracle (0 by its definition); with the phases labelled wrongly it loses its edge."""
    clean, phase = _onoff_speeds(noise=0.0)
    assert abs(oracle_split.by_phase_above_oracle(clean, phase, 128)) < 1e-12
    speeds, phase = _onoff_speeds()
    by_phase = oracle_split.by_phase_above_oracle(speeds, phase, 128)
    one_split = oracle_split.by_phase_above_oracle(speeds, np.zeros_like(phase), 128)
    shifted = oracle_split.by_phase_above_oracle(speeds, np.roll(phase, 20), 128)  # switches half a phase late
    assert 0 < by_phase < 0.5 * one_split, (by_phase, one_split)
    assert by_phase < 0.5 * shifted, (by_phase, shifted)


def test_phases_follow_the_cotenants_clock():
    """onoff: on (0) for --period s from its start, then off (1); trace: the index of the sample burnt, one per
    --tick s; the kinds that do not change, and a run with no start recorded, one phase."""
    t = 100.0 + np.array([0.1, 1.4, 1.6, 2.9, 3.1, 4.6])
    assert cotenants.phases("onoff", t, 100.0, 1.5, 0.25).tolist() == [0, 0, 1, 1, 0, 1]
    assert cotenants.phases("trace", t, 100.0, 1.5, 0.5).tolist() == [0, 2, 3, 5, 6, 9]
    assert cotenants.phases("steady", t, 100.0, 1.5, 0.5).tolist() == [0] * 6
    assert cotenants.phases("onoff", t, None, 1.5, 0.5).tolist() == [0] * 6
