"""Real co-tenants for the interference benchmarks: a process pinned to one core that takes its CPU (or its memory
bandwidth) as a neighbour on a shared machine does. Plain Python and NumPy: no torch, no lbbsp.

    steady   spinning for the whole run
    onoff    spinning PERIOD s, idle PERIOD s
    trace    a real utilisation series replayed: the share u of each tick burnt in 10 ms slices (Alibaba 2018
             co-located machine m_1937 from sample 6200: mean share 0.56, SD 0.25, from ../shared/traces; else a
             built-in series)
    membw    a STREAM-like copy of two 64 MB arrays (memory bandwidth and the core)
    none     no co-tenant
"""

import gzip
import itertools
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any, List, Optional, Tuple

import numpy as np

KINDS = ["none", "steady", "onoff", "trace", "membw"]
TRACE = Path(__file__).resolve().parents[1].parent / "shared/traces/alibaba_v2018_machine_usage/machine_usage.csv.gz"


def spin_until(t: float) -> None:
    while time.perf_counter() < t:
        pass


def trace_shares(machine: str = "m_1937", start: int = 6200, count: int = 600) -> List[float]:
    """CPU shares in [0, 1] of one machine's utilisation series (the real trace where present)."""
    if TRACE.exists():
        with gzip.open(TRACE, "rt") as f:
            rows = [line.split(",") for line in f if line.startswith(machine + ",")]
        return [float(r[2]) / 100.0 for r in rows[start:start + count]]
    g = np.random.default_rng(1)
    return list(np.clip(0.5 + 0.4 * np.sin(np.arange(count) / 3.0) + g.normal(0, 0.1, count), 0, 1))


def run(kind: str, core: int, period: float, tick: float, anchor: Any = None) -> None:
    """The co-tenant's body (never returns): ``kind`` on CPU ``core``. ``anchor``: two shared doubles that onoff
    sets to when its first on-phase began, trace to when its series began: time.perf_counter() (the machine's
    CLOCK_MONOTONIC, the same in every process) and time.time() (Unix time, as `lbbsp train`'s telemetry's
    time_s); onoff's phases then follow from it, on time."""
    os.sched_setaffinity(0, {core})
    if kind == "steady":
        while True:
            pass
    elif kind == "onoff":
        t0 = time.perf_counter()
        if anchor is not None:
            anchor[:] = [t0, time.time()]
        for cycle in itertools.count():
            spin_until(t0 + (2 * cycle + 1) * period)
            time.sleep(max(0.0, t0 + (2 * cycle + 2) * period - time.perf_counter()))
    elif kind == "trace":
        shares = trace_shares()
        t0 = time.perf_counter()
        if anchor is not None:
            anchor[:] = [t0, time.time()]
        for i in itertools.count():  # sample i from t0 + i * tick on, on time (phases() labels the steps so)
            u, end = shares[i % len(shares)], t0 + (i + 1) * tick
            while time.perf_counter() < end:  # u of each 10 ms slice busy
                spin_until(min(end, time.perf_counter() + 0.01 * u))
                time.sleep(max(0.0, min(0.01 * (1.0 - u), end - time.perf_counter())))
    elif kind == "membw":
        a, b = np.ones(1 << 23), np.empty(1 << 23)
        while True:
            np.copyto(b, a)
            np.copyto(a, b)


def start(kind: str, core: int = 1, period: float = 1.5, tick: float = 0.5) -> Optional[multiprocessing.Process]:
    """Starts the co-tenant in a process of its own (None for "none"); stop it with .kill()."""
    if kind == "none":
        return None
    if kind not in KINDS:
        raise ValueError(f"co-tenant {kind!r}: choose one of {', '.join(KINDS)}")
    ctx = multiprocessing.get_context("spawn")
    anchor = ctx.Array("d", [float("nan")] * 2, lock=False)
    p = ctx.Process(target=run, args=(kind, core, period, tick, anchor), daemon=True)
    p.start()
    p.anchor = anchor  # type: ignore[attr-defined]
    return p


def start_of(tenant: Optional[multiprocessing.Process], unix: bool = False) -> Optional[float]:
    """When an onoff or trace co-tenant began its first phase or sample, in seconds of time.perf_counter() (or
    with ``unix`` of time.time()); None for the other kinds (or where it never started)."""
    if tenant is None:
        return None
    value = float(tenant.anchor[1 if unix else 0])
    return None if value != value else value  # NaN: not set


def phases(kind: str, t: np.ndarray, start: Optional[float], period: float, tick: float) -> np.ndarray:
    """The co-tenant's phase at each time in ``t`` (the clock of ``start``, start_of()'s), as integers: onoff 0
    (spinning) or 1 (idle), trace the index of the sample being burnt, 0 for the kinds that do not change (and
    where ``start`` is None)."""
    if start is None or kind not in ("onoff", "trace"):
        return np.zeros(len(t), dtype=np.int64)
    if kind == "onoff":
        return (np.floor((t - start) / period) % 2).astype(np.int64)
    return np.floor((t - start) / tick).astype(np.int64)


def counted(end: np.ndarray, first: int, lo_s: float, hi_s: float) -> Tuple[int, int]:
    """The steps that end within [lo_s, hi_s], as (lo, hi): steps j+1 for j in [lo, hi), ``end`` each step's end
    time; none before step ``first`` (warm-up)."""
    lo = int(np.searchsorted(end, lo_s))
    hi = int(np.searchsorted(end, hi_s, side="right")) - 1
    if lo < first or hi >= len(end) or end[-1] < hi_s or hi - lo < 2:
        raise ValueError(f"the counted window ({lo_s - end[0]:+.1f} to {hi_s - end[0]:+.1f} s from the first step) "
                         f"is not within the run's steps after warm-up ({end[first] - end[0]:.1f} to "
                         f"{end[-1] - end[0]:.1f} s): give more steps or another window")
    return lo, hi


def whole_cycles(end: np.ndarray, first: int, start: float, length: float) -> Tuple[int, int]:
    """counted()'s steps of the whole on/off cycles (of ``length`` s, the first from ``start``) after step
    ``first``: so that every runner's mean step weighs the phases alike (a fixed number of steps ends mid-cycle,
    and a faster runner's steps fall more in its slow phase)."""
    begin = start + length * np.ceil((end[first] - start) / length)
    cycles = np.floor((end[-1] - begin) / length)
    if cycles < 1:
        raise ValueError(f"the run's steps after warm-up ({end[-1] - end[first]:.1f} s) hold no whole on/off cycle "
                         f"of {length:.1f} s: give more steps")
    return counted(end, first, begin, begin + cycles * length)
