"""A rank's report of a step, the one record every rank sends and every rank decides from: its layout, how it
is encoded into a float64 row (and into rows that ride in a gradient allreduce), and how the world's rows are read
back, checked and named."""

import math
from typing import List, NamedTuple, Optional, Sequence

import numpy as np

from .. import RANK_EXO, _lbbsp

EXO = len(RANK_EXO)  # cpu_avail, mem_avail, load: what the C++ runtime reports, in its order
# The row: batch, compute seconds, exo..., memory cap, measured batch, status, checksum of the batch vector; laid
# out, encoded, written into blocks, read back and decided from by the extension (python/torch_reports.cpp):
# every step, on every rank, where each NumPy call costs microseconds.
_COLUMN = _lbbsp.REPORT_LAYOUT
REPORT = _COLUMN["width"]
CAP, MEASURED, STATUS, CHECKSUM = (_COLUMN[c] for c in ("mem_cap", "measured_batch", "status", "checksum"))


def checksum(sizes: np.ndarray) -> float:
    """The 32-bit checksum (FNV-1a) of a batch vector that each report carries (exact in a float64 report)."""
    return _lbbsp.sizes_checksum(np.ascontiguousarray(sizes, dtype=np.int64))


class Report(NamedTuple):
    """One rank's report of one step.

    batch: the rank's batch size in the step (whole number); compute_s: the seconds of the window measured, over
    ``measured_batch`` samples (the step's batch, or on CUDA the previous step's; -1: no window measured yet);
    exo: the monitor's [cpu_avail, mem_avail, load]; mem_cap: most samples the rank can hold (0: no cap); failed:
    building the report raised on this rank; sizes: the batch vector the rank used (int64: its checksum travels)."""

    batch: int
    compute_s: float
    exo: List[float]
    mem_cap: int
    measured_batch: int
    failed: bool
    sizes: np.ndarray

    @classmethod
    def of_failure(cls, batch: int, sizes: np.ndarray) -> "Report":
        """The report of a rank whose report could not be built (its message travels on its own)."""
        return cls(batch, 0.0, [0.0] * EXO, 0, 0, True, sizes)

    def encode(self) -> np.ndarray:
        """The float64 row that travels (whole numbers are exact in it)."""
        return _lbbsp.encode_report(*self)


class Reports:
    """Every rank's report of a step (a world x REPORT float64 array, row r from group rank r), by column."""

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = rows

    @property
    def batches(self) -> np.ndarray:
        return self.rows[:, 0].astype(np.int64)

    @property
    def compute_s(self) -> np.ndarray:
        return np.ascontiguousarray(self.rows[:, 1])

    @property
    def exo(self) -> np.ndarray:
        """The ranks' exo figures, flat (rank-major), as the C++ balancer takes them."""
        return np.ascontiguousarray(self.rows[:, 2:2 + EXO]).ravel()

    @property
    def mem_caps(self) -> np.ndarray:
        return self.rows[:, CAP]

    @property
    def measured_batches(self) -> np.ndarray:
        return self.rows[:, MEASURED]

    @property
    def failed_ranks(self) -> List[int]:
        return np.flatnonzero(self.rows[:, STATUS]).tolist()

    @property
    def checksums(self) -> np.ndarray:
        return self.rows[:, CHECKSUM]


def write_row(rows: np.ndarray, rank: int, report: np.ndarray) -> None:
    """Fills a world x (REPORT + 1) float32 or float64 block with ``report`` in row ``rank`` and zeros elsewhere,
    the checksum as two 16-bit halves (exact in float32); summed over the ranks it holds every report
    (read_rows)."""
    _lbbsp.write_report_block(rows, rank, report)


def read_rows(rows: np.ndarray) -> np.ndarray:
    """The world x REPORT float64 reports of a block that write_row filled on each rank, summed over the ranks (a
    copy: the block is reused)."""
    return _lbbsp.read_report_block(rows)


def disagreement(step: int, sums: np.ndarray, ranks: Sequence[int]) -> Optional[str]:
    """None when every rank used the same batch vector (same checksum), else a message naming who differs (by
    global rank: ``ranks`` maps the group's ranks to them)."""
    if (sums == sums[0]).all():
        return None
    values, first, counts = np.unique(sums, return_index=True, return_counts=True)
    parts = []
    for v in values[np.lexsort((first, -counts))]:
        who = [ranks[r] for r in np.flatnonzero(sums == v)]
        parts.append(f"{'rank' if len(who) == 1 else 'ranks'} {', '.join(map(str, who))} (checksum {int(v):08x})")
    return (f"LoadBalancer: step {step}: the ranks used different batch vectors: {'; '.join(parts)}. Every rank "
            "decides the sizes from the same reports with the same code, so this means a rank's balancer or "
            "sizes were changed (a load_state_dict on some ranks only, another lbbsp build): restart all ranks "
            "from one checkpoint with one installation")


def read_metrics(monitor) -> List[float]:
    """The monitor's [cpu_avail, mem_avail, load] as floats, checked."""
    m = [float(v) for v in monitor()]
    if len(m) != EXO or not all(map(math.isfinite, m)):  # not NumPy: a list to an array costs 20-40 us cold
        raise ValueError(f"LoadBalancer: monitor must return [cpu_avail, mem_avail, load], got {m}")
    return m
