"""lbbsp-cpu on what real runs measured: reports recorded from runs under real co-tenants, replayed through the
installed package's balancer (run by tests/python/run_package_tests.sh, as test_package.py)."""

import csv
import os

import numpy as np

import lbbsp


def test_replayed_real_cotenant_reports_balance_and_hold():
    """Reports recorded from a real run (bench/torch_cotenant.py's ranks: 2 gloo ranks pinned to cores 0 and 1, a
    process spinning on core 1, lbbsp.torch with lbbsp-cpu/narx; tests/fixtures/cotenant_steady_reports.csv: per
    step and rank the batch, the measured seconds and the /proc metrics) replayed through a fresh balancer. The
    measured speeds jitter about 10% per step (time slicing); the split must settle near the one the mean speeds
    give (lbbsp-cpu/narx: 44.4 against 44.8 of 128) and not chase the jitter (9 changes in steps 100-299; a split
    proportional to each step's speeds changes 180 times, lbbsp-cpu with the `last` predictor 44)."""
    rep = _recorded("cotenant_steady_reports.csv")
    steps = len(rep)
    decided = _replayed(rep, "lbbsp-cpu")
    speed = (rep[60:, :, 2] / rep[60:, :, 3]).mean(axis=0)
    balanced = 128 * speed[1] / speed.sum()  # rank 1's share by the mean measured speeds
    share = decided[100:, 1].mean()
    assert abs(share - balanced) < 4, (share, balanced, decided[100::10, 1].tolist())
    changes = int((np.diff(decided[100:, 1]) != 0).sum())
    assert changes <= 0.2 * (steps - 100), (changes, decided[100::10, 1].tolist())


def _recorded(name):
    """(steps x 2 ranks x [step, rank, batch, seconds, cpu_avail, mem_avail, load]) of tests/fixtures/<name>."""
    path = os.path.join(os.path.dirname(__file__), "..", "fixtures", name)
    with open(path) as f:
        rows = [r for r in csv.reader(f) if r and not r[0].startswith("#")]
    data = np.array([[float(v) for v in r] for r in rows[1:]])
    steps = int(data[:, 0].max()) + 1
    return data[np.lexsort((data[:, 1], data[:, 0]))].reshape(steps, 2, -1)


def test_replayed_onoff_cotenant_reports_are_followed_phase_by_phase():
    """Reports recorded from a real run under a co-tenant on core 1 spinning 1.5 s and idle 1.5 s (as above,
    tests/fixtures/cotenant_onoff_reports.csv: 300 steps, 6 switches) replayed through a fresh lbbsp-cpu/narx.
    The phases are read from the recording (rank 1's time per sample over rank 0's, a 9-step median, above 1.6:
    on); each phase's balanced share of rank 1 comes from its mean measured speeds (about 40 of 128 on, 55-62
    off). From step 60 on, leaving out the 8 steps after each switch, the decided share must be within 6 samples
    of its phase's balanced share in 90% of the steps (99% here; the equal split: 39%; lbbsp-cpu's own decisions
    arriving 20 steps late, as a controller re-sizing every 20 steps would: 63%), off by 3 samples or less on
    average (1.6; late by 20 steps: 8.5), and lose at most 3% to the balanced split in time, at the phase's mean
    speeds (2.4%, with 77 changes of the split in 192 steps; with the band of 1 it had by default until
    2026-12: 2.2%, 22 changes; each step's speeds followed without a band, the `last` predictor: 3.5%). In the 8
    steps after each switch, lbbsp-cpu;follow=1's share must be off by 7 samples or less on average, and by 0.3
    less than the default's."""
    rep = _recorded("cotenant_onoff_reports.csv")
    steps = len(rep)
    per_sample = rep[:, :, 3] / rep[:, :, 2]
    ratio = per_sample[:, 1] / per_sample[:, 0]
    on = np.array([np.median(ratio[max(0, i - 4):i + 5]) for i in range(steps)]) > 1.6
    switches = np.flatnonzero(np.diff(on)) + 1
    assert len(switches) >= 5, switches  # the recording holds the co-tenant's phases
    phase = np.cumsum(np.r_[0, np.diff(on.astype(int)) != 0])
    speeds = rep[:, :, 2] / rep[:, :, 3]
    phase_mean = np.empty((steps, 2))  # each step's phase's mean measured speeds
    for p in np.unique(phase):
        phase_mean[phase == p] = speeds[phase == p].mean(axis=0)
    balanced = 128 * phase_mean[:, 1] / phase_mean.sum(axis=1)
    settled = np.arange(steps) >= 60
    for s in switches:
        settled[s:s + 8] = False
    decided = _replayed(rep, "lbbsp-cpu")
    miss = np.abs(decided[:-1, 1] - balanced[1:])  # decided after step i: the sizes of step i + 1
    assert np.mean(miss[settled[1:]] <= 6) >= 0.9, (np.mean(miss[settled[1:]] <= 6), decided[::10, 1].tolist())
    assert miss[settled[1:]].mean() <= 3, (miss[settled[1:]].mean(), decided[::10, 1].tolist())
    lost = (decided[:-1] / phase_mean[1:]).max(axis=1) * phase_mean[1:].sum(axis=1) / 128 - 1
    assert lost[settled[1:]].mean() <= 0.03, (lost[settled[1:]].mean(), decided[::10, 1].tolist())
    # The 8 steps after each switch: with ;follow=1 a confirmed change of phase is followed on the measured
    # speeds (6.3 samples off on average; the predictors alone, the default, 6.7; with the band of 1, 7.4 and 8.4)
    after = np.zeros(steps, bool)
    for s in switches:
        after[s:s + 8] = True
    followed = np.abs(_replayed(rep, "lbbsp-cpu;follow=1")[:-1, 1] - balanced[1:])[after[1:]].mean()
    assert followed <= min(7, miss[after[1:]].mean() - 0.3), (followed, miss[after[1:]].mean())


def _replayed(rep, name):
    """rank 0's and 1's sizes decided after each recorded step by a fresh lbbsp-cpu/narx balancer `name`."""
    b = lbbsp.Balancer(name, workers=2, global_batch=128, predictor="narx", seed=1, num_exo=3,
                       capacity_exo=lbbsp.RANK_CAPACITY_EXO)
    return np.array([b.next(batch=r[:, 2].astype(np.int64), compute_s=r[:, 3], exo=r[:, 4:7]) for r in rep])
