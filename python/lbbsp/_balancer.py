"""lbbsp.Balancer: the C++ balancers behind a checked Python interface, with saved state and pickling."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from . import _lbbsp
from ._checks import EMPTY_F64, EMPTY_I64, check_int, check_name, float_array, int_array
from ._names import BALANCERS, PREDICTORS

#: Starts every save_state(); the 8 bytes after it hold the iteration (little-endian), then the C++ state.
_STATE_MAGIC = b"lbbsp-balancer-1\n"


@dataclasses.dataclass(frozen=True)
class _Config:
    """A Balancer's checked constructor arguments (what pickling saves)."""

    name: str
    workers: int
    global_batch: int
    predictor: str
    seed: int
    min_batch: int
    num_exo: int
    capacity_exo: int
    mem_cap: tuple

    @classmethod
    def checked(cls, name: Any, workers: Any, global_batch: Any, predictor: Any, seed: Any, min_batch: Any,
                num_exo: Any, capacity_exo: Any, mem_cap: Any) -> _Config:
        """The config, or the first argument's TypeError / ValueError (checked in the order given)."""
        check_name(name, "balancer", BALANCERS)
        check_name(predictor, "predictor", PREDICTORS)
        workers = check_int(workers, "workers", 1)
        caps = () if mem_cap is None else tuple(int(c) for c in int_array(mem_cap, "mem_cap", workers))
        return cls(name, workers, check_int(global_batch, "global_batch", 0), predictor,
                   check_int(seed, "seed", 0), check_int(min_batch, "min_batch", 0),
                   check_int(num_exo, "num_exo", 0), check_int(capacity_exo, "capacity_exo", -1), caps)

    def to_core(self) -> Any:
        """The same settings as the C++ core's BalancerConfig."""
        c = _lbbsp.BalancerConfig()
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            setattr(c, field.name, list(value) if field.name == "mem_cap" else value)
        return c


class Balancer:
    """Re-sizes each worker's share of a fixed global batch every iteration (rank 0's job in a trainer).

    Args:
        name: ``bsp``, ``static[:K]``, ``random:SEED``, ``lbbsp-cpu[:PREDICTOR][;band=F][;track=F][;follow=0|1]``,
            ``lbbsp-gpu[:W]``, ``lbbsp-gpu-model`` or ``oracle`` (see ``lbbsp train --help``; the noise band's
            factors: docs/balancers.md "Noise").
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
        self._config = _Config.checked(name, workers, global_batch, predictor, seed, min_batch, num_exo,
                                       capacity_exo, mem_cap)
        self._impl = _lbbsp.make_balancer(self._config.to_core())
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
        return self.next_unchecked(b, t, x, xn, cap, c, cn)

    def next_unchecked(self, batch: np.ndarray, compute_s: np.ndarray, exo: np.ndarray = EMPTY_F64,
                       exo_next: np.ndarray = EMPTY_F64, mem_cap: np.ndarray = EMPTY_I64,
                       capacity: np.ndarray = EMPTY_F64, capacity_next: np.ndarray = EMPTY_F64) -> np.ndarray:
        """:meth:`next` without its argument checks (they cost ~60 us a step), for a caller that checks its
        reports where it makes them (lbbsp.torch does).

        The arguments must already be what :meth:`next` makes of its own: C-contiguous NumPy arrays, ``batch`` and
        ``mem_cap`` int64, the others float64; ``batch``, ``compute_s``, ``mem_cap``, ``capacity`` and
        ``capacity_next`` one entry per worker; ``exo`` the ``(workers, num_exo)`` matrix and ``exo_next`` the
        ``(workers, k)`` one, raveled row by row; an empty array for each input not given (the defaults). Values
        are not checked here: give finite ``compute_s`` >= 0 and a ``batch`` of counts >= 0.

        Returns:
            NumPy int64 array, one entry per worker, summing to ``global_batch`` within the bounds.
        """
        out = self._impl.next(self._iteration, batch, compute_s, exo, exo_next, mem_cap, capacity, capacity_next)
        self._iteration += 1
        return np.asarray(out, dtype=np.int64)

    def next_from_report_rows(self, rows: np.ndarray, expected: np.ndarray) -> Optional[np.ndarray]:
        """lbbsp.torch's step: :meth:`next` from the world's report rows (``lbbsp.torch.report``'s layout, a
        ``(workers, width)`` float64 array) where every row is the usual one (built, of the batch ``expected``
        gives it, all of one batch vector, measured), checked and decided in one C++ call; else None and the
        balancer unchanged. ``expected``: the int64 batch vector of the step, C-contiguous."""
        out = _lbbsp.decide_from_reports(self._impl, self._iteration, rows, expected)
        if out is not None:
            self._iteration += 1
        return out

    def c_decider(self) -> Tuple[int, int]:
        """For a C++ caller (lbbsp.torch's C++ step path): (the address of a C function that does
        :meth:`next_from_report_rows`, the address of this balancer's C++ object). Its signature is
        ``int (void* balancer, int64_t iteration, const double* rows, int64_t workers, int64_t width,
        const int64_t* expected, int64_t* out, double* checksum, char* error, size_t error_len)``: 1 decided
        (then call :meth:`advance`), 0 a row not the usual (nothing changed), -1 failed (``error`` says why).
        The caller passes :attr:`iteration` and keeps this Balancer alive while it holds the addresses."""
        return _lbbsp.report_decider(self._impl)

    def advance(self) -> None:
        """Counts a decision made through :meth:`c_decider`'s function (the next report's index)."""
        self._iteration += 1

    def predicted_speeds(self) -> np.ndarray:
        """Speeds (samples/s) predicted in the last decision, per worker; empty when the balancer has none."""
        return np.asarray(self._impl.predicted_speeds(), dtype=np.float64)

    def noise_band(self) -> float:
        """The band of the last decision in relative misses (log of measured / predicted speed, RMS over the
        workers); a new split had to beat ``;band=`` times it, 0.5 by default (lbbsp-cpu, docs/balancers.md
        "Noise"); 0 for the others."""
        return float(self._impl.noise_band())

    def save_state(self) -> bytes:
        """Opaque state: ``load_state(save_state())`` on a balancer made the same way continues identically."""
        return _STATE_MAGIC + self._iteration.to_bytes(8, "little") + self._impl.save_state()

    def load_state(self, state: bytes) -> None:
        """Restores :meth:`save_state`'s bytes; ValueError when they come from another kind of balancer."""
        iteration, body = _split_state(state)
        try:
            self._impl.load_state(body)
        except (ValueError, RuntimeError, IndexError) as e:
            raise ValueError(f"state does not fit balancer '{self.name}': {e}") from None
        self._iteration = iteration

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


def _split_state(state: Any) -> tuple:
    """(iteration, the C++ balancer's state) from save_state()'s bytes; TypeError / ValueError for other input."""
    if not isinstance(state, (bytes, bytearray)):
        raise TypeError(f"state must be bytes from Balancer.save_state(), got {type(state).__name__}")
    state = bytes(state)
    head = len(_STATE_MAGIC) + 8
    if not state.startswith(_STATE_MAGIC) or len(state) < head:
        raise ValueError("state is not from lbbsp.Balancer.save_state()")
    return int.from_bytes(state[len(_STATE_MAGIC):head], "little"), state[head:]
