"""lbbsp: per-worker batch sizes for synchronous data-parallel training (LB-BSP, Chen et al., SoCC 2020).

The same C++ balancers, speed predictors and sampling functions that ``lbbsp train`` uses, for any trainer:

    import lbbsp
    b = lbbsp.Balancer("lbbsp-cpu", workers=4, global_batch=256, predictor="ema")
    sizes = b.initial()                                  # NumPy int64, sums to 256
    for step in range(100):
        times = run_step(sizes)                          # each worker's compute seconds for its share
        sizes = b.next(batch=sizes, compute_s=times)     # next iteration's shares

``epoch_permutation`` and ``rank_indices`` cut each step's global batch the way ``lbbsp train`` does, so any
split of the batch over workers gives the same samples in the same order (and, with summed gradients, the same
SGD trajectory).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import numpy as np

from . import _lbbsp
from ._checks import EMPTY_F64, EMPTY_I64, check_int, check_name, float_array, int_array

__version__: str = _lbbsp.__version__
__all__ = [
    "Balancer",
    "Predictor",
    "epoch_permutation",
    "rank_indices",
    "slice_offset",
    "steps_per_epoch",
    "check_batch",
    "assign_by_speed",
    "BALANCERS",
    "PREDICTORS",
    "RANK_EXO",
    "RANK_CAPACITY_EXO",
    "__version__",
]

#: Balancer names (``static:K``, ``random:SEED``, ``lbbsp-cpu:PREDICTOR_SPEC``, ``lbbsp-gpu:W`` take arguments),
#: as the C++ core knows them.
BALANCERS = tuple(_lbbsp.balancer_kinds())
#: Predictor names (``ema:ALPHA``, ``arima:P,D,Q``, ``narx:key=value,...`` take arguments), from the C++ core.
PREDICTORS = tuple(_lbbsp.predictor_kinds())
#: The exogenous inputs ``lbbsp train`` and :mod:`lbbsp.torch` measure on every rank, in ``exo``'s order; the first
#: (``RANK_EXO[RANK_CAPACITY_EXO]``) is the capacity-like CPU share.
RANK_EXO = tuple(_lbbsp.RANK_EXO)
RANK_CAPACITY_EXO: int = _lbbsp.RANK_CAPACITY_EXO


# ---- balancer ----


@dataclasses.dataclass(frozen=True)
class _Config:
    name: str
    workers: int
    global_batch: int
    predictor: str
    seed: int
    min_batch: int
    num_exo: int
    capacity_exo: int
    mem_cap: tuple


class Balancer:
    """Re-sizes each worker's share of a fixed global batch every iteration (rank 0's job in a trainer).

    Args:
        name: ``bsp``, ``static[:K]``, ``random:SEED``, ``lbbsp-cpu[:PREDICTOR]``, ``lbbsp-gpu[:W]``,
            ``lbbsp-gpu-model`` or ``oracle`` (see ``lbbsp train --help``).
        workers: number of workers (ranks).
        global_batch: samples per iteration over all workers; every batch vector sums to it.
        predictor: speed predictor of ``lbbsp-cpu`` (``narx``, ``arima``, ``ema``, ``last``, ``oracle``).
        seed: seeds the predictors and ``random``.
        min_batch: fewest samples any worker gets.
        num_exo: length of each worker's ``exo`` row in :meth:`next` (e.g. 2 for CPU and memory available).
        capacity_exo: index in ``exo`` of a capacity-like availability in (0, 1] (CPU share left by
            co-tenants), or -1 for none; with it a hopeless straggler may get 0 samples and still be tracked.
        mem_cap: most samples each worker can hold (GPU memory), known before the first iteration.
    """

    def __init__(self, name: str, workers: int, global_batch: int, predictor: str = "narx", seed: int = 0,
                 min_batch: int = 0, num_exo: int = 0, capacity_exo: int = -1,
                 mem_cap: Optional[Sequence[int]] = None) -> None:
        check_name(name, "balancer", BALANCERS)
        check_name(predictor, "predictor", PREDICTORS)
        workers = check_int(workers, "workers", 1)
        caps = () if mem_cap is None else tuple(int(c) for c in int_array(mem_cap, "mem_cap", workers))
        self._config = _Config(name, workers, check_int(global_batch, "global_batch", 0), predictor,
                               check_int(seed, "seed", 0), check_int(min_batch, "min_batch", 0),
                               check_int(num_exo, "num_exo", 0), check_int(capacity_exo, "capacity_exo", -1),
                               caps)
        c = _lbbsp.BalancerConfig()
        for field in dataclasses.fields(_Config):
            value = getattr(self._config, field.name)
            setattr(c, field.name, list(value) if field.name == "mem_cap" else value)
        self._impl = _lbbsp.make_balancer(c)
        self._iteration = 0

    @property
    def name(self) -> str:
        """The balancer's name as given."""
        return self._config.name

    @property
    def workers(self) -> int:
        return self._config.workers

    @property
    def global_batch(self) -> int:
        return self._config.global_batch

    @property
    def iteration(self) -> int:
        """Reports seen so far (the index the next report gets)."""
        return self._iteration

    def initial(self) -> np.ndarray:
        """Batch vector for the first iteration, before any report (int64, sums to ``global_batch``)."""
        return self._impl.initial()

    def next(self, batch: Sequence[int], compute_s: Sequence[float], exo: Optional[Any] = None,
             mem_cap: Optional[Sequence[int]] = None, exo_next: Optional[Any] = None,
             capacity: Optional[Sequence[float]] = None,
             capacity_next: Optional[Sequence[float]] = None) -> np.ndarray:
        """Batch vector for the next iteration, given this one's report.

        Args:
            batch: samples each worker processed this iteration.
            compute_s: each worker's compute seconds (without waiting), finite and >= 0.
            exo: ``(workers, num_exo)`` exogenous metrics measured during this iteration (CPU, memory available).
            mem_cap: most samples each worker can hold from now on.
            exo_next: ``(workers, k)`` exogenous inputs already known for the coming iteration.
            capacity, capacity_next: true capacity factors of this and the coming iteration (``oracle`` only).

        Returns:
            NumPy int64 array, one entry per worker, summing to ``global_batch`` within the bounds.
        """
        n, k = self._config.workers, self._config.num_exo
        b = int_array(batch, "batch", n)
        t = float_array(compute_s, "compute_s", (n,))
        if exo is None and k:
            raise ValueError(f"exo is required: this balancer was made with num_exo={k}")
        x = EMPTY_F64 if exo is None else float_array(exo, "exo", (n, k), nonnegative=False).ravel()
        xn = EMPTY_F64 if exo_next is None else float_array(exo_next, "exo_next", (n, None), False).ravel()
        cap = EMPTY_I64 if mem_cap is None else int_array(mem_cap, "mem_cap", n)
        c = EMPTY_F64 if capacity is None else float_array(capacity, "capacity", (n,))
        cn = EMPTY_F64 if capacity_next is None else float_array(capacity_next, "capacity_next", (n,))
        return self._next_checked(b, t, x, xn, cap, c, cn)

    def _next_checked(self, batch: np.ndarray, compute_s: np.ndarray, exo: np.ndarray, exo_next: np.ndarray,
                      mem_cap: np.ndarray, capacity: np.ndarray = EMPTY_F64,
                      capacity_next: np.ndarray = EMPTY_F64) -> np.ndarray:
        """next() for arguments already checked by the caller (contiguous int64 / float64, exo raveled):
        lbbsp.torch checks its reports where they are made, and next()'s checks cost ~60 us a step."""
        out = self._impl.next(self._iteration, batch, compute_s, exo, exo_next, mem_cap, capacity, capacity_next)
        self._iteration += 1
        return np.asarray(out, dtype=np.int64)

    def predicted_speeds(self) -> np.ndarray:
        """Speeds (samples/s) predicted in the last decision, per worker; empty when the balancer has none."""
        return np.asarray(self._impl.predicted_speeds(), dtype=np.float64)

    def save_state(self) -> bytes:
        """Opaque state: ``load_state(save_state())`` on a balancer made the same way continues identically."""
        return _STATE_MAGIC + self._iteration.to_bytes(8, "little") + self._impl.save_state()

    def load_state(self, state: bytes) -> None:
        """Restores :meth:`save_state`'s bytes; ValueError when they come from another kind of balancer."""
        if not isinstance(state, (bytes, bytearray)):
            raise TypeError(f"state must be bytes from Balancer.save_state(), got {type(state).__name__}")
        state = bytes(state)
        if not state.startswith(_STATE_MAGIC) or len(state) < len(_STATE_MAGIC) + 8:
            raise ValueError("state is not from lbbsp.Balancer.save_state()")
        body = state[len(_STATE_MAGIC) + 8:]
        try:
            self._impl.load_state(body)
        except (ValueError, RuntimeError, IndexError) as e:
            raise ValueError(f"state does not fit balancer '{self.name}': {e}") from None
        self._iteration = int.from_bytes(state[len(_STATE_MAGIC):len(_STATE_MAGIC) + 8], "little")

    def __getstate__(self) -> dict:
        return {"config": dataclasses.asdict(self._config), "state": self.save_state()}

    def __setstate__(self, s: dict) -> None:
        cfg = dict(s["config"])
        cfg["mem_cap"] = list(cfg["mem_cap"]) or None
        self.__init__(**cfg)
        self.load_state(s["state"])

    def __repr__(self) -> str:
        c = self._config
        return (f"lbbsp.Balancer({c.name!r}, workers={c.workers}, global_batch={c.global_batch}, "
                f"iteration={self._iteration})")


_STATE_MAGIC = b"lbbsp-balancer-1\n"


# ---- predictor ----


class Predictor:
    """One worker's one-step-ahead speed predictor (``last``, ``ema[:A]``, ``arima[:P,D,Q]``, ``narx[:...]``).

    Args:
        spec: predictor spec, as for ``lbbsp train --predictor``.
        num_exo: length of the exogenous vectors passed to :meth:`observe` (and usually :meth:`predict`).
        seed: seeds the NARX network's initial weights.
    """

    def __init__(self, spec: str, num_exo: int = 0, seed: int = 0) -> None:
        check_name(spec, "predictor", PREDICTORS)
        self._num_exo = check_int(num_exo, "num_exo", 0)
        self._spec = spec
        self._seed = check_int(seed, "seed", 0)
        self._impl = _lbbsp.make_predictor(spec, self._num_exo, self._seed)

    @property
    def name(self) -> str:
        return self._impl.name

    def observe(self, speed: float, exo: Optional[Sequence[float]] = None) -> None:
        """Step t's measured speed (samples/s; NaN or <= 0 mean missing) and its exogenous inputs."""
        if isinstance(speed, bool) or not isinstance(speed, (int, float, np.integer, np.floating)):
            raise TypeError(f"speed must be a number, got {type(speed).__name__}")
        x = float_array([] if exo is None else exo, "exo", (self._num_exo,), nonnegative=False)
        self._impl.observe(float(speed), x.tolist())

    def predict(self, exo_next: Optional[Sequence[float]] = None) -> float:
        """Speed expected at step t+1 given the inputs already known for it; always finite and > 0."""
        x = EMPTY_F64 if exo_next is None else float_array(exo_next, "exo_next", (None,), nonnegative=False)
        return float(self._impl.predict(x.tolist()))

    def save_state(self) -> bytes:
        return self._impl.save_state()

    def load_state(self, state: bytes) -> None:
        if not isinstance(state, (bytes, bytearray)):
            raise TypeError(f"state must be bytes from Predictor.save_state(), got {type(state).__name__}")
        try:
            self._impl.load_state(bytes(state))
        except (ValueError, RuntimeError, IndexError) as e:
            raise ValueError(f"state does not fit predictor '{self._spec}': {e}") from None

    def __getstate__(self) -> dict:
        return {"spec": self._spec, "num_exo": self._num_exo, "seed": self._seed, "state": self.save_state()}

    def __setstate__(self, s: dict) -> None:
        self.__init__(s["spec"], s["num_exo"], s["seed"])
        self.load_state(s["state"])

    def __repr__(self) -> str:
        return f"lbbsp.Predictor({self._spec!r}, num_exo={self._num_exo})"


# ---- sampling: the global batch of each step and each worker's slice ----


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The order of the n training samples in an epoch, exactly as ``lbbsp train --seed SEED`` visits them."""
    return _lbbsp.epoch_permutation(check_int(n, "n", 0), check_int(seed, "seed", 0),
                                    check_int(epoch, "epoch", 0))


def rank_indices(permutation: Any, step: int, batch: Sequence[int], rank: int) -> np.ndarray:
    """Worker ``rank``'s sample indices at ``step`` of an epoch: positions ``[step*X + b_0+..+b_{rank-1},
    + b_rank)`` of the permutation, X = ``sum(batch)``."""
    perm = int_array(permutation, "permutation", minimum=None)
    b = int_array(batch, "batch")
    rank = check_int(rank, "rank")
    if not 0 <= rank < b.shape[0]:
        raise ValueError(f"rank must be in [0, {b.shape[0]}), got {rank}")
    return _lbbsp.rank_indices(perm, check_int(step, "step", 0), b, rank)


def slice_offset(batch: Sequence[int], rank: int) -> int:
    """``b_0 + ... + b_{rank-1}``: where worker ``rank``'s slice starts inside the global batch."""
    b = int_array(batch, "batch")
    rank = check_int(rank, "rank")
    if not 0 <= rank <= b.shape[0]:
        raise ValueError(f"rank must be in [0, {b.shape[0]}], got {rank}")
    return int(_lbbsp.slice_offset(b, rank))


def steps_per_epoch(n: int, global_batch: int) -> int:
    """Whole global batches in n samples (an epoch's remainder is dropped, as in ``lbbsp train``)."""
    return int(_lbbsp.steps_per_epoch(check_int(n, "n", 0), check_int(global_batch, "global_batch", 1)))


def check_batch(batch: Sequence[int], global_batch: int, min: Optional[Sequence[int]] = None,
                max: Optional[Sequence[int]] = None) -> None:
    """Raises ValueError unless batch sums to ``global_batch`` and lies within the per-worker bounds."""
    b = int_array(batch, "batch", minimum=None)
    lo = [] if min is None else int_array(min, "min", b.shape[0]).tolist()
    hi = [] if max is None else int_array(max, "max", b.shape[0]).tolist()
    _lbbsp.check_batch(b.tolist(), check_int(global_batch, "global_batch", 0), lo, hi)


def assign_by_speed(speeds: Sequence[float], global_batch: int, min: Optional[Sequence[int]] = None,
                    max: Optional[Sequence[int]] = None) -> np.ndarray:
    """The exact integer split of ``global_batch`` minimising the slowest finish ``b_i / speed_i``."""
    s = np.asarray(speeds, dtype=np.float64)
    if s.ndim != 1:
        raise ValueError(f"speeds must be one-dimensional, got shape {s.shape}")
    lo = [] if min is None else int_array(min, "min", s.shape[0]).tolist()
    hi = [] if max is None else int_array(max, "max", s.shape[0]).tolist()
    return _lbbsp.assign_by_speed(s.tolist(), check_int(global_batch, "global_batch", 0), lo, hi)

